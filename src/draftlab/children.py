"""Children draftlab starts (llama-server, a llama.cpp probe, llama.cpp's converter) die with it."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

# prctl's PR_SET_PDEATHSIG: the signal the kernel sends a child when the thread that started it ends.
_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int):
    """A preexec_fn that has the kernel kill the child when draftlab dies, `kill -9` included, which
    no handler of ours sees (a server in its own session otherwise lives on, re-parented to init,
    its threads spinning). Linux only; elsewhere the atexit and signal paths stop it."""
    if not sys.platform.startswith("linux"):
        return None
    # Loaded here, in the parent: between fork and exec the child runs as little Python as it can
    # (another thread, a progress bar's, may have held a lock at the fork).
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # draftlab died before the signal was armed
            os._exit(1)

    return arm


def run_child(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    """`argv` to its end (its output captured as text), killed with draftlab if draftlab dies."""
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, preexec_fn=die_with_parent(os.getpid())
    )
