"""One interleaved bench run of both engines (our loop and a real vLLM) on the embedded default
pair, read by several tests. In a module of its own so that `pytest -n 2 --dist loadfile` builds
its LLMs once, on one worker, while the other vLLM tests run on the other.
"""

from __future__ import annotations

import json

import pytest
from tiny import random_dflash
from vllm_setup import COMMON, records

from draftlab.cli import main
from draftlab.drafters.dflash.io import save_dflash
from draftlab.models.loading import ModelSpec, load_model, resolve_path


def _random_dflash(folder):
    """A DFlash drafter for the default target in the published layout, drawn at random: vLLM must
    load it and draft with it (a trained one's round trip is measured in docs/results.md)."""
    path = resolve_path("smollm2-135m-instruct")
    save_dflash(random_dflash(load_model(ModelSpec(path)), block_size=4), folder, path)
    return folder


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("vllm") / "bench"
    # Both engines in one interleaved run (our loop with a fixed k: no cost profile to measure).
    # eagle: the EAGLE-3 head draftlab trained and ships, on our loop and as vLLM's eagle3;
    # dflash: a DFlash drafter in the layout vLLM's method "dflash" reads.
    drafter = _random_dflash(tmp_path_factory.mktemp("dflash"))
    argv = [
        "bench",
        "--engines",
        "hf,vllm",
        "--methods",
        "ar,pld,sps,eagle,dflash",
        "--dflash",
        str(drafter),
        "--subtasks",
        "qa,rag,summarization",
    ]
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
    ours = ["ar", "pld", "sps", "eagle", "dflash"]
    assert set(by_label) == {*ours, *(f"{m}@vllm" for m in ours)}
    for engine in ("", "@vllm"):
        ar = {r["example_id"]: r["tokens"] for r in by_label[f"ar{engine}"]}
        for method in ours[1:]:
            for r in by_label[method + engine]:
                assert r["tokens"] == ar[r["example_id"]], (method + engine, r["example_id"])
                assert r["greedy_match"] is True
    # vLLM loaded our drafter's files and drafted blocks with it (at random: none accepted).
    assert sum(r["drafted"] for r in by_label["dflash@vllm"]) > 0
    assert all(len(r["tokens"]) > 0 for r in rows)


def test_counters_are_consistent(bench_run):
    speculative = [r for r in records(bench_run) if r["label"] in ("pld@vllm", "sps@vllm")]
    assert sum(r["drafted"] for r in speculative if r["method"] == "sps") > 0  # the draft drafted
    heads = [r for r in records(bench_run) if r["label"] == "eagle@vllm"]
    assert sum(r["accepted"] for r in heads) > 0  # vLLM ran our head, and the target accepted its drafts
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
