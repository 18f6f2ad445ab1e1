#!/usr/bin/env bash
# llama-cpp-python, for `--engine llamacpp`, into the active virtual environment (default: .venv).
#
# PyPI has only its sdist, so pip compiles llama.cpp with cmake: 215 s on a 2-core AVX-512 Xeon with
# these flags (up to ~8 minutes on slower cores). pip caches the wheel it built, so a second run, or
# another environment of the same Python on this machine, installs in about a second. That cache is
# keyed by the sdist and the Python version only, not by CMAKE_ARGS or the CPU: to rebuild with other
# flags run with LLAMACPP_REBUILD=1 (no cache, forced reinstall), and never copy the cache to a
# machine with another CPU (see GGML_NATIVE).
#
# Build flags, and why:
#   GGML_NATIVE=ON   -march=native: the kernels use this CPU's own ISA (AVX2, AVX-512, VNNI, AMX),
#                    as torch's do, so the two engines are compared on the same hardware features.
#                    The wheel then runs only on CPUs with at least those features (hence the cache
#                    note above).
#   LLAVA_BUILD=OFF  skips the multimodal library (mtmd), which text decoding never loads.
# LLAMACPP_WHEEL_DIR=DIR only builds the wheel into DIR (for scripts/run-tests.sh).
# Extra flags for cmake go in CMAKE_ARGS (e.g. -DGGML_CUDA=ON on a CUDA machine); they are appended.
#
# Dependencies: numpy, typing-extensions, diskcache and jinja2, none of which torch 2.13.0 or
# transformers 5.24 pin; the check below fails the script if pip changed torch or transformers.
set -euo pipefail
cd "$(dirname "$0")/.."
version="0.3.36"
if [ -z "${VIRTUAL_ENV:-}" ]; then
    [ -x .venv/bin/python ] || { echo "no active virtual environment and no .venv here" >&2; exit 1; }
    . .venv/bin/activate
fi
before="$(python -c 'import torch, transformers; print(torch.__version__, transformers.__version__)')"
cores="$(nproc 2>/dev/null || echo 2)"
export CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF ${CMAKE_ARGS:-}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$cores}"
echo "installing llama-cpp-python==$version into $VIRTUAL_ENV (CMAKE_ARGS: $CMAKE_ARGS; $CMAKE_BUILD_PARALLEL_LEVEL jobs; ~4 min on 2 cores unless pip has the wheel cached)"
start=$(date +%s)
if [ -n "${LLAMACPP_WHEEL_DIR:-}" ]; then
    # Build only (scripts/run-tests.sh builds while the suite runs, and installs the wheel after it,
    # so that no test collects a half-installed package).
    pip wheel -q --no-deps -w "$LLAMACPP_WHEEL_DIR" "llama-cpp-python==$version"
    echo "llama-cpp-python==$version wheel in $LLAMACPP_WHEEL_DIR after $(( $(date +%s) - start )) s"
    exit 0
fi
if [ -n "${LLAMACPP_REBUILD:-}" ]; then
    pip install -q --no-cache-dir --force-reinstall --no-deps "llama-cpp-python==$version"
fi
pip install -q "llama-cpp-python==$version"
seconds=$(( $(date +%s) - start ))
after="$(python -c 'import torch, transformers; print(torch.__version__, transformers.__version__)')"
if [ "$before" != "$after" ]; then
    echo "llama-cpp-python changed torch/transformers: $before -> $after" >&2
    exit 1
fi
python - "$seconds" <<'EOF'
import sys

import llama_cpp

info = llama_cpp.llama_print_system_info().decode().strip()
print(f"llama-cpp-python {llama_cpp.__version__} installed in {sys.argv[1]} s (a cached wheel: seconds)")
print(f"llama.cpp CPU features: {info}")
EOF
