"""Silence what native code prints on standard error (llama.cpp's quantizer, inductor's compilers)."""

from __future__ import annotations

import contextlib
import os
import sys


@contextlib.contextmanager
def quiet_stderr():
    """File descriptor 2 to /dev/null for the block (what C++ code prints there too)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
