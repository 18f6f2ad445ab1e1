"""A GGUF's first run on a machine happens in a child process, so that a crash in llama.cpp's native
code (a segfault takes the whole process, and with it every result not yet written) becomes a
one-line error naming the file and the CPU.

llama.cpp picks its kernels by CPU and by the file's storage: on a Xeon with AMX the default target's
Q4_1 file crashed in `ggml_backend_amx_mul_mat`, where the same file ran on every other CPU. So each
(file, CPU, llama.cpp version, load parameters) is probed once: the child loads the file as draftlab
would, and runs a prompt pass, a pass of several tokens and a one-token pass. A probe that passed is
remembered under the draftlab home; one that failed is tried again next time (a rebuilt llama.cpp may
fix it).

`python -m draftlab.engines.llamacpp.probe FILE THREADS` is the child.
"""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from draftlab.children import run_child
from draftlab.errors import DraftlabError
from draftlab.files import write_text
from draftlab.hardware import cpu_model_and_flags
from draftlab.models.cache import home

PROBE_TIMEOUT_S = 600
PROBE_PASSES = (8, 4, 1)  # tokens per pass: a prompt, a verification, a plain step


def cpu_flags() -> list[str]:

    return cpu_model_and_flags()[2]


def _cpu_words() -> str:

    name, cpu_id, flags = cpu_model_and_flags()
    return f"{name}, {cpu_id}; {' '.join(flags) or 'no listed ISA flags'}"


def probe_key(gguf: Path, params: dict[str, bool]) -> str:
    """What decides whether a file runs: the file itself, the CPU, llama.cpp and how it is loaded."""
    stat = gguf.stat()
    parts = {
        "file": str(gguf.resolve()),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "cpu": _cpu_words(),
        "llama_cpp": _llama_cpp_version(),
        "params": params,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]


def _llama_cpp_version() -> str:
    try:
        return metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        return "unknown"


def _marker(gguf: Path, params: dict[str, bool]) -> Path:

    return home() / "llamacpp-probes" / f"{probe_key(gguf, params)}.json"


def ensure_runs(
    gguf: Path | str,
    name: str,
    threads: int,
    params: dict[str, bool],
    command: list[str] | None = None,
) -> None:
    """Probe `gguf`, loaded with `params` (llamacpp.model_params), in a child process unless it
    already ran so on this machine; raise a one-line DraftlabError if the child crashed or failed.
    `command` replaces the child (tests)."""
    gguf = Path(gguf)
    marker = _marker(gguf, params)
    if marker.is_file():
        return
    argv = command or [
        sys.executable,
        "-m",
        "draftlab.engines.llamacpp.probe_child",
        str(gguf),
        str(threads),
        json.dumps(params),
    ]
    try:
        done = run_child(argv, PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise DraftlabError(
            f"llama.cpp did not finish a probe of '{name}' ({gguf}) within {PROBE_TIMEOUT_S} s on this CPU "
            f"({_cpu_words()})"
        ) from None
    if done.returncode != 0:
        raise DraftlabError(probe_failure(done.returncode, done.stderr, name, gguf))
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        write_text(
            marker, json.dumps({"file": str(gguf), "cpu": _cpu_words(), "llama_cpp": _llama_cpp_version()})
        )
    except OSError:
        pass  # unwritable home: probed again next time, which costs a second, not a result


def probe_failure(returncode: int, stderr: str, name: str, gguf: Path) -> str:
    """One line for a probe that did not pass: a signal names the crash, anything else its last line."""
    where = f"'{name}' ({gguf}) on this CPU ({_cpu_words()}; llama-cpp-python {_llama_cpp_version()})"
    if returncode < 0:
        try:
            what = signal.Signals(-returncode).name
        except ValueError:
            what = f"signal {-returncode}"
        return f"llama.cpp crashed ({what}) running {where}; run it with the hf engine instead"
    lines = [line.strip() for line in (stderr or "").splitlines() if line.strip()]
    return f"llama.cpp failed to run {where}: {lines[-1] if lines else f'exit code {returncode}'}"
