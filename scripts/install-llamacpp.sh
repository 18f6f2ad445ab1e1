#!/usr/bin/env bash
# llama.cpp for draftlab's two llama.cpp engines, compiled once per CPU and version:
#   - llama-cpp-python (`--engines llamacpp`), into the active virtual environment (default: .venv);
#   - llama-server (`--engines llama-server`), with llama.cpp's converter beside it.
#
# PyPI has only llama-cpp-python's sdist. Its vendored llama.cpp is configured once, in one cmake
# tree, as shared libraries (libllama, libggml*, libllama-common) and the llama-server that links
# them; only those targets are built. llama-cpp-python itself is then packaged without a build of
# its own (its LLAMA_BUILD=OFF), and those same libraries are put into its wheel. Everything lands
# in one folder outside the clone, named by the version, the Python, the build flags and this CPU
# (GGML_NATIVE compiles for this CPU only), so another clone or environment on this machine
# installs in seconds and a machine with another CPU builds its own:
#   <cache>/llama.cpp-<version>-<py>-<cpu key>/{bin/llama-server, bin/lib*.so*, wheel/*.whl,
#                                               cpu.txt, convert_hf_to_gguf.py, conversion/, gguf-py/}
#
#   DRAFTLAB_BUILD_CACHE  where builds are kept (default ~/.cache/draftlab/builds)
#   LLAMACPP_REBUILD=1    build again even where a build is cached
#   LLAMACPP_OPTIONAL=1   a failed build (no compiler) warns and exits 0: draftlab then runs without
#                         the llama.cpp engines and its reports say so
#   CMAKE_ARGS            more flags for cmake (e.g. -DGGML_NATIVE=OFF -DGGML_AVX512=OFF to build
#                         for an AVX2-only CPU; -DGGML_CUDA=ON on a CUDA machine), appended
#
# Build flags, and why:
#   GGML_NATIVE=ON          -march=native: the kernels use this CPU's own ISA (AVX2, AVX-512, VNNI,
#                           AMX), as torch's do, so engines are compared on the same hardware.
#   BUILD_SHARED_LIBS=ON    one copy of ggml and llama, loaded by Python and linked by the server.
#   INSTALL_RPATH=$ORIGIN   the server and each library find the others in their own folder,
#                           wherever the folder (or the wheel's llama_cpp/lib) is.
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
jobs="${CMAKE_BUILD_PARALLEL_LEVEL:-$cores}"
flags="-DGGML_NATIVE=ON ${CMAKE_ARGS:-}"
python_tag="$(python -c 'import sys; print(f"py{sys.version_info.major}{sys.version_info.minor}")')"
cpu_key="$( (grep -m1 '^model name' /proc/cpuinfo; grep -m1 '^flags' /proc/cpuinfo; echo "$flags") 2>/dev/null \
    | sha256sum | cut -c1-12)"
cache="${DRAFTLAB_BUILD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/draftlab/builds}"
dest="$cache/llama.cpp-$version-$python_tag-$cpu_key"

# Runs "$@" in the background with its output in log $2, printing ninja's "[done/total]" step
# counter every 20 s with an ETA from the steps done so far.
watch_build() {
    local what="$1" log="$2" t0 step done total eta
    shift 2
    t0=$(date +%s)
    "$@" > "$log" 2>&1 &
    local pid=$!
    while kill -0 "$pid" 2>/dev/null; do
        sleep 20
        step="$(grep -o '\[[0-9]*/[0-9]*\]' "$log" 2>/dev/null | tail -n 1 | tr -d '[]' || true)"
        local elapsed=$(( $(date +%s) - t0 ))
        if [ -n "$step" ]; then
            done="${step%/*}"
            total="${step#*/}"
            eta=""
            [ "$done" -gt 0 ] && eta=", about $(( (elapsed * (total - done) / done + 30) / 60 )) min left"
            echo "  building $what: step $done of $total after $elapsed s$eta"
        else
            echo "  building $what: configuring after $elapsed s"
        fi
    done
    wait "$pid"
}

build() {
    local work="$1"
    # Every step ends the build on failure: `set -e` does not hold inside `if ! watch_build ...`.
    pip download -q --no-binary :all: --no-deps -d "$work" "llama-cpp-python==$version" || return 1
    tar -xzf "$work/llama_cpp_python-$version.tar.gz" -C "$work" || return 1
    local src="$work/llama_cpp_python-$version"
    # shellcheck disable=SC2086  # $flags is a list of cmake flags
    cmake -S "$src/vendor/llama.cpp" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_SHARED_LIBS=ON -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN' \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF $flags || return 1
    cmake --build "$work/build" --target llama ggml llama-server -j "$jobs" || return 1
    # The Python package without a compile of its own: its bindings, then our libraries inside.
    CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" pip wheel -q --no-deps --no-cache-dir -w "$work/pure" "$src" \
        || return 1
    mkdir -p "$work/out/bin" "$work/out/wheel"
    cp -a "$work/build/bin/llama-server" "$work/build/bin/"lib*.so* "$work/out/bin/" || return 1
    python - "$work/pure"/llama_cpp_python-*.whl "$work/out/bin" "$work/out/wheel" <<'EOF'
"""Copies a wheel, adding the build's libraries under llama_cpp/lib and listing them in RECORD: the
names Python loads (libllama.so, libggml.so) and the sonames they link (libggml-base.so.0, ...); a
wheel holds no symlinks, and the server's own libraries stay beside the server."""
import base64
import hashlib
import re
import sys
import zipfile
from pathlib import Path

wheel, libs, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
server_only = ("libllama-common", "libllama-server-impl", "libmtmd")
added = {
    f"llama_cpp/lib/{p.name}": p.read_bytes()
    for p in sorted(libs.glob("lib*.so*"))
    if re.fullmatch(r"lib[\w.-]+?\.so(\.\d+)?", p.name) and not p.name.startswith(server_only)
}
with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out / wheel.name, "w", zipfile.ZIP_DEFLATED) as dst:
    record_name = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
    record = src.read(record_name).decode()
    for item in src.infolist():
        if item.filename != record_name:
            dst.writestr(item, src.read(item.filename))
    for name, data in added.items():
        info = zipfile.ZipInfo(name)
        info.external_attr = 0o755 << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        dst.writestr(info, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record += f"{name},sha256={digest},{len(data)}\n"
    dst.writestr(record_name, record)
EOF
    [ -n "$(ls "$work/out/wheel"/*.whl 2>/dev/null)" ] || return 1
    # draftlab uses a server built for this CPU only (GGML_NATIVE): these lines name it.
    (grep -m1 '^model name' /proc/cpuinfo; grep -m1 '^flags' /proc/cpuinfo) > "$work/out/cpu.txt" 2>/dev/null || true
    # The converter that writes our EAGLE-3 head (and drafts) as GGUF for the server, with its gguf-py.
    cp -r "$src/vendor/llama.cpp/convert_hf_to_gguf.py" "$src/vendor/llama.cpp/conversion" \
        "$src/vendor/llama.cpp/gguf-py" "$work/out/" 2>/dev/null || true
}

start=$(date +%s)
wheel="$(ls "$dest"/wheel/llama_cpp_python-"$version"-*.whl 2>/dev/null | head -n 1 || true)"
if [ -z "$wheel" ] || [ ! -x "$dest/bin/llama-server" ] || [ -n "${LLAMACPP_REBUILD:-}" ]; then
    echo "building llama.cpp (vendored by llama-cpp-python==$version) for this CPU, once: its libraries" \
        "and llama-server in one cmake tree ($flags; $jobs jobs; about 4-10 min on 2 cores); kept in $dest"
    mkdir -p "$cache"
    work="$(mktemp -d "$cache/.build-XXXXXX")"
    trap 'rm -rf "$work"' EXIT
    if ! watch_build llama.cpp "$work/build.log" build "$work"; then
        tail -n 30 "$work/build.log" >&2
        if [ -n "${LLAMACPP_OPTIONAL:-}" ]; then
            echo "WARNING: llama.cpp could not be built (log above); draftlab runs without the llama.cpp" \
                "engines. Install a C++ compiler and cmake, then run scripts/install-llamacpp.sh" >&2
            exit 0
        fi
        exit 1
    fi
    rm -rf "$dest"
    mv "$work/out" "$dest"
    wheel="$(ls "$dest"/wheel/llama_cpp_python-"$version"-*.whl | head -n 1)"
    echo "built in $(( $(date +%s) - start )) s: $dest"
fi
pip install -q --force-reinstall --no-deps "$wheel"
pip install -q "$wheel"  # its dependencies, from PyPI or pip's cache
after="$(python -c 'import torch, transformers; print(torch.__version__, transformers.__version__)')"
if [ "$before" != "$after" ]; then
    echo "llama-cpp-python changed torch/transformers: $before -> $after" >&2
    exit 1
fi
# Which build this environment's llama-cpp-python came from: draftlab runs that build's server
# (a native and an AVX2-only build of the same CPU can sit side by side in the cache).
echo "$dest" > "$(python -c 'import sys; print(sys.prefix)')/draftlab-llama.cpp-build"
# llama.cpp's converter imports sentencepiece even for BPE tokenizers (our head's conversion).
python -c "import sentencepiece" 2>/dev/null || pip install -q sentencepiece

python - "$(( $(date +%s) - start ))" <<'EOF'
import sys

import llama_cpp

info = llama_cpp.llama_print_system_info().decode().strip()
print(f"llama-cpp-python {llama_cpp.__version__} installed in {sys.argv[1]} s")
print(f"llama.cpp CPU features: {info}")
EOF
