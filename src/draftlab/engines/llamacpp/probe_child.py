"""The probe's child process: loads a GGUF as draftlab does and runs passes of each size once, so
that a native crash kills this process, not the run (probe.py reads its exit)."""

from __future__ import annotations

import json
import sys

import llama_cpp

from draftlab.engines.llamacpp.load import open_llama
from draftlab.engines.llamacpp.probe import PROBE_PASSES


def _child(gguf: str, threads: int, params: dict[str, bool]) -> None:
    llm = open_llama(llama_cpp, gguf, gguf, 64, threads, params=params)
    position = 0
    for n in PROBE_PASSES:
        llm.eval([1 + (position + i) % max(2, llm.n_vocab() - 1) for i in range(n)])
        position += n


if __name__ == "__main__":
    try:
        _child(sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]))
    except Exception as exc:  # noqa: BLE001 - the parent reads the last line
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)
