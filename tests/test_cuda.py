"""On a CUDA GPU: every method stays lossless, mixed placements work, and the CLI runs end to end.

CI has no GPU, so these skip there; on a GPU machine run `python -m pytest tests/test_cuda.py`
(docs/engines.md). They are the checks behind the GPU commands that docs/engines.md gives.
"""

from __future__ import annotations

import json

import pytest
import torch
from helpers import QUIET, noisy_copy, pair_args, write_suite
from tolerance import assert_greedy_equal

from draftlab.bench.records import read_records
from draftlab.cli import main
from draftlab.decode.build import build_decoder
from draftlab.decode.spec import DecoderConfig
from draftlab.models.loading import ModelSpec, load_model
from draftlab.models.prompting import encode_prompt
from draftlab.sampling import SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

GREEDY = SamplingParams()
PROMPTS = ["Once upon a time, there was a little dog named Max.", "Lily and Tom went to the park to play"]
LOSSLESS = ("sps", "pld", "pld-tree", "sps-tree", "hybrid", "suffix", "hf-greedy", "hf-assisted")


@pytest.fixture(scope="module")
def story_pair(stories, tmp_path_factory):
    """stories260K as the target and a perturbed copy as its draft: a real pair whose drafts are often
    right and sometimes wrong, so that acceptance and rollback are both exercised."""
    draft = noisy_copy(stories, tmp_path_factory.mktemp("cuda-draft") / "draft")
    return str(stories), str(draft)


def load(path: str, device: str = "cuda", dtype: str = "float32"):
    model = load_model(ModelSpec(path, dtype=dtype, device=device))
    model.eos_token_ids = set()  # every generation is as long as asked
    return model


def generate(method: str, target, draft, prompt: str, max_new: int = 48, **kw):
    ids = encode_prompt(target, prompt, chat=False)
    config = DecoderConfig.of(method=method, gamma=4, **kw)
    return ids, build_decoder(config, target, draft).generate(ids, max_new, GREEDY)


def test_every_lossless_method_writes_ar_tokens_on_cuda(story_pair):
    target, draft = load(story_pair[0]), load(story_pair[1])
    assert target.model.device.type == "cuda" and draft.model.device.type == "cuda"
    for prompt in PROMPTS:
        ids, ar = generate("ar", target, draft, prompt)
        assert len(ar.tokens) == 48
        for method in LOSSLESS:
            _, out = generate(method, target, draft, prompt)
            assert_greedy_equal(target, ids, out.tokens, ar.tokens, f"cuda {method}")
            if method == "sps":
                assert 0 < out.stats.accepted < out.stats.drafted, "both acceptance and rollback"


def test_target_on_cuda_with_its_draft_on_the_cpu(story_pair):
    target, draft = load(story_pair[0]), load(story_pair[1], device="cpu")
    assert draft.model.device.type == "cpu"
    ids, ar = generate("ar", target, None, PROMPTS[0])
    for method in ("sps", "sps-tree"):
        _, out = generate(method, target, draft, PROMPTS[0])
        assert out.stats.drafted > 0
        assert_greedy_equal(target, ids, out.tokens, ar.tokens, f"cuda target, cpu draft: {method}")


def test_device_map_auto_places_the_target_through_accelerate(story_pair):
    target = load(story_pair[0], device="auto")
    # One GPU: accelerate's map puts every weight on it (transformers keeps no hf_device_map then).
    assert {p.device.type for p in target.model.parameters()} == {"cuda"}
    ids, ar = generate("ar", target, None, PROMPTS[1])
    _, pld = generate("pld", target, None, PROMPTS[1])
    reference = generate("ar", load(story_pair[0]), None, PROMPTS[1])[1]
    assert_greedy_equal(target, ids, ar.tokens, reference.tokens, "device_map=auto ar")
    assert_greedy_equal(target, ids, pld.tokens, ar.tokens, "device_map=auto pld")


def test_seeded_sampling_on_cuda_repeats_itself(story_pair):
    target, draft = load(story_pair[0]), load(story_pair[1])
    ids = encode_prompt(target, PROMPTS[0], chat=False)
    params = SamplingParams(temperature=1.0, seed=7)
    decoder = build_decoder(DecoderConfig(method="sps", gamma=4), target, draft)
    first, second = decoder.generate(ids, 40, params), decoder.generate(ids, 40, params)
    assert first.tokens == second.tokens and len(first.tokens) == 40
    assert first.stats.drafted > 0


def test_audit_on_cuda_finds_the_methods_lossless(story_pair, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    argv = ["audit", "--target", story_pair[0], "--draft", story_pair[1], "--prompts", str(prompts)]
    argv += ["--device", "cuda", "--dtype", "float32", "--quiet", "--fixed-k", "--max-new-tokens", "24"]
    argv += ["--methods", "sps,pld", "--samples", "300", "--prefixes", "1"]
    argv += ["--json", str(tmp_path / "a.json")]
    assert main(argv) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "audit: lossless: sps, pld"


def test_bench_in_float16_on_cuda_end_to_end(tiny_pair, tmp_path, capsys):
    suite = write_suite(
        tmp_path / "suite.jsonl",
        [
            {"id": "c1", "category": "code", "prompt": "the cat sat on the mat and then the dog ran"},
            {"id": "q1", "category": "qa", "prompt": "the big red tree and the small blue house"},
        ],
    )
    out = tmp_path / "run"
    args = [*pair_args(tiny_pair)[:-2], "--dtype", "float16", "--device", "cuda", "--suite", str(suite)]
    methods = "ar,sps,pld,pld-tree,sps-tree,hf-assisted"
    argv = ["bench", *args, "--full", "--max-new-tokens", "16", "--methods", methods, "--out", str(out)]
    assert main([*argv, *QUIET]) == 0
    records = read_records(out / "results.jsonl")
    assert {r.method for r in records} >= set(methods.split(","))
    assert all(r.new_tokens > 0 for r in records)
    run = json.loads((out / "run.json").read_text())
    assert run["extra"]["hardware"]["kind"] == "cuda"
    report = (out / "report.md").read_text()
    assert "NVIDIA" in report or "cuda" in report


def test_profile_on_cuda_measures_the_gpus_curve(tiny_pair, tmp_path, capsys):
    target, draft = tiny_pair["llama"]
    out = tmp_path / "prof"
    argv = ["profile", "--target", str(target), "--draft", str(draft), "--device", "cuda"]
    assert main([*argv, "--repeats", "1", "--out", str(out)]) == 0
    data = json.loads((out / "profile.json").read_text())
    assert data["hardware"]["kind"] == "cuda"
    assert any(key.startswith("target/") for key in data["profiles"])


def test_compile_on_cuda_is_a_one_line_error(story_pair, capsys):
    """AOTInductor packages built for CUDA crashed the process as they loaded (H100, torch 2.11):
    --compile refuses a GPU model before building one."""
    argv = ["generate", "--target", story_pair[0], "--method", "ar", "--device", "cuda", "--dtype", "float32"]
    assert main([*argv, "--compile", "--max-new-tokens", "8", "Once upon a time"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--compile builds CPU packages" in err and "cuda" in err
