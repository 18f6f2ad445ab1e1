#!/usr/bin/env bash
# llama-cpp-python, for `--engine llamacpp`, into the active virtual environment (default: .venv).
#
# PyPI has only its sdist, so its wheel is compiled here with cmake, once per machine: 4 min on a
# 2-core AMD Zen5 with these flags, up to ~8 on slower cores. The wheel is kept outside the clone,
# in a folder named by the version, the Python, the build flags and this CPU (its model and flags:
# GGML_NATIVE compiles for this CPU only), so a second run, another clone or another environment
# on this machine installs it in seconds and a machine with another CPU builds its own.
#
#   DRAFTLAB_BUILD_CACHE  where built wheels are kept (default ~/.cache/draftlab/builds)
#   LLAMACPP_REBUILD=1    build again even where a wheel is cached
#   LLAMACPP_OPTIONAL=1   a failed build (no compiler) warns and exits 0: draftlab then runs without
#                         the llama.cpp engine and its reports say so
#   CMAKE_ARGS            more flags for cmake (e.g. -DGGML_CUDA=ON on a CUDA machine), appended
#
# Build flags, and why:
#   GGML_NATIVE=ON   -march=native: the kernels use this CPU's own ISA (AVX2, AVX-512, VNNI, AMX),
#                    as torch's do, so the two engines are compared on the same hardware features.
#   LLAVA_BUILD=OFF  skips the multimodal library (mtmd), which text decoding never loads.
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
python_tag="$(python -c 'import sys; print(f"py{sys.version_info.major}{sys.version_info.minor}")')"
cpu_key="$( (grep -m1 '^model name' /proc/cpuinfo; grep -m1 '^flags' /proc/cpuinfo; echo "$CMAKE_ARGS") 2>/dev/null \
    | sha256sum | cut -c1-12)"
cache="${DRAFTLAB_BUILD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/draftlab/builds}"
wheels="$cache/llama-cpp-python-$version-$python_tag-$cpu_key"

# Runs "$@" in the background with its output in log $1, printing ninja's "[done/total]" counter every 20 s.
watch_build() {
    local what="$1" log="$2" t0
    shift 2
    t0=$(date +%s)
    "$@" > "$log" 2>&1 &
    local pid=$!
    while kill -0 "$pid" 2>/dev/null; do
        sleep 20
        step="$(grep -o '\[[0-9]*/[0-9]*\]' "$log" 2>/dev/null | tail -n 1 || true)"
        echo "  building $what: ${step:-configuring} after $(( $(date +%s) - t0 )) s"
    done
    wait "$pid"
}

start=$(date +%s)
wheel="$(ls "$wheels"/llama_cpp_python-"$version"-*.whl 2>/dev/null | head -n 1 || true)"
if [ -z "$wheel" ] || [ -n "${LLAMACPP_REBUILD:-}" ]; then
    echo "building llama-cpp-python==$version from its sdist for this CPU, once (CMAKE_ARGS: $CMAKE_ARGS;" \
        "$CMAKE_BUILD_PARALLEL_LEVEL jobs; about 4-8 min on 2 cores); the wheel is kept in $wheels"
    mkdir -p "$cache"
    work="$(mktemp -d "$cache/.build-XXXXXX")"
    log="$work/build.log"
    if ! watch_build llama.cpp "$log" pip wheel -v --no-deps --no-cache-dir -w "$work" "llama-cpp-python==$version"; then
        tail -n 30 "$log" >&2
        rm -rf "$work"
        if [ -n "${LLAMACPP_OPTIONAL:-}" ]; then
            echo "WARNING: llama-cpp-python could not be built (log above); draftlab runs without the" \
                "llama.cpp engine. Install a C++ compiler and cmake, then run scripts/install-llamacpp.sh" >&2
            exit 0
        fi
        exit 1
    fi
    rm -rf "$wheels"
    mkdir -p "$wheels"
    mv "$work"/llama_cpp_python-*.whl "$wheels"/
    rm -rf "$work"
    wheel="$(ls "$wheels"/llama_cpp_python-"$version"-*.whl | head -n 1)"
    echo "built in $(( $(date +%s) - start )) s: $wheel"
fi
pip install -q --force-reinstall --no-deps "$wheel"
pip install -q "$wheel"  # its dependencies, from PyPI or pip's cache
after="$(python -c 'import torch, transformers; print(torch.__version__, transformers.__version__)')"
if [ "$before" != "$after" ]; then
    echo "llama-cpp-python changed torch/transformers: $before -> $after" >&2
    exit 1
fi

# llama-server, from the same sdist's vendored llama.cpp, for `--engine llama-server` (its own
# drafters: n-gram, draft model, EAGLE-3, ...). pip builds the wheel in a temporary tree, so the
# server is a second cmake tree, building that one target; kept beside the wheel, per CPU.
#   LLAMA_SERVER=0  skip it
if [ "${LLAMA_SERVER:-1}" != "0" ]; then
    server_dir="$cache/llama-server-$version-$cpu_key"
    if [ ! -x "$server_dir/bin/llama-server" ] || [ -n "${LLAMACPP_REBUILD:-}" ]; then
        s_start=$(date +%s)
        echo "building llama-server (llama.cpp vendored by llama-cpp-python==$version) for this CPU, once;" \
            "about 5-9 min on 2 cores; kept in $server_dir"
        mkdir -p "$cache"
        swork="$(mktemp -d "$cache/.server-XXXXXX")"
        slog="$swork/build.log"
        build_server() {
            pip download -q --no-binary :all: --no-deps -d "$swork" "llama-cpp-python==$version" &&
                tar -xzf "$swork"/llama_cpp_python-"$version".tar.gz -C "$swork" &&
                cmake -S "$swork/llama_cpp_python-$version/vendor/llama.cpp" -B "$swork/build" -G Ninja \
                    -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=ON \
                    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF &&
                cmake --build "$swork/build" --target llama-server -j "$CMAKE_BUILD_PARALLEL_LEVEL"
        }
        if watch_build llama-server "$slog" build_server; then
            rm -rf "$server_dir"
            mkdir -p "$server_dir/bin"
            mv "$swork/build/bin/llama-server" "$server_dir/bin/"
            # draftlab uses a server built for this CPU only (GGML_NATIVE): these lines name it.
            (grep -m1 '^model name' /proc/cpuinfo; grep -m1 '^flags' /proc/cpuinfo) > "$server_dir/cpu.txt" 2>/dev/null || true
            # The converter that writes our EAGLE-3 head (and drafts) as GGUF for it, with its gguf-py.
            cp -r "$swork/llama_cpp_python-$version/vendor/llama.cpp/convert_hf_to_gguf.py" \
                "$swork/llama_cpp_python-$version/vendor/llama.cpp/conversion" \
                "$swork/llama_cpp_python-$version/vendor/llama.cpp/gguf-py" "$server_dir/" 2>/dev/null || true
            echo "llama-server built in $(( $(date +%s) - s_start )) s: $server_dir/bin/llama-server"
        else
            tail -n 30 "$slog" >&2
            echo "WARNING: llama-server could not be built (log above); --engine llama-server is unavailable" >&2
        fi
        rm -rf "$swork"
    fi
    # llama.cpp's converter imports sentencepiece even for BPE tokenizers (our head's conversion).
    python -c "import sentencepiece" 2>/dev/null || pip install -q sentencepiece
fi

python - "$(( $(date +%s) - start ))" <<'EOF'
import sys

import llama_cpp

info = llama_cpp.llama_print_system_info().decode().strip()
print(f"llama-cpp-python {llama_cpp.__version__} installed in {sys.argv[1]} s")
print(f"llama.cpp CPU features: {info}")
EOF
