"""Past one core: the vllm engine with tensor parallel size 2 on the CPU, two ranks on a core each
(the engine sets VLLM_CPU_OMP_THREADS_BIND), plain decoding and draft-model speculation. In a
module of its own, so that `--dist loadfile` runs it on one worker beside the other vLLM tests.

The target is a tiny Llama built from a config: its 4 attention heads and 2 KV heads split over two
ranks, and its head size (64) is one vLLM's CPU attention has kernels for (the default target's 9
heads do not divide by 2). Its own copy is the draft, so every drafted token is the target's
choice: the rounds exercise acceptance across the ranks, not only rejection.
"""

from __future__ import annotations

import json

import pytest
from tiny import make_model
from vllm_setup import COMMON, records

from draftlab.cli import main


@pytest.fixture(scope="module")
def parallel_run(tmp_path_factory, monkeypatch_module):
    model = make_model("llama", tmp_path_factory.mktemp("tp_model"), seed=0, hidden=256, context=4096)
    out = tmp_path_factory.mktemp("vllm_tp") / "bench"
    monkeypatch_module.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)  # the engine's own binding
    argv = ["bench", "--engines", "vllm", "--target", str(model), "--draft", str(model)]
    argv += ["--methods", "ar,sps", "--subtasks", "qa,rag", "--limit", "1", *COMMON, "--out", str(out)]
    argv += ["--tensor-parallel-size", "2", "--distributed-executor-backend", "mp"]
    argv += ["--vllm-arg", "max_model_len=4096"]  # the tiny tokenizer writes long prompts
    assert main(argv) == 0
    return out


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_two_ranks_write_the_same_tokens_with_and_without_a_draft(parallel_run):
    rows = records(parallel_run)
    assert {r["label"] for r in rows} == {"ar@vllm", "sps@vllm"}
    plain = {r["example_id"]: r["tokens"] for r in rows if r["label"] == "ar@vllm"}
    spec = [r for r in rows if r["label"] == "sps@vllm"]
    assert len(plain) == len(spec) == 2
    for r in rows:
        assert r["proposer_info"]["tensor_parallel_size"] == 2  # what vLLM ran with, not what we asked
        assert r["proposer_info"]["distributed_executor_backend"] == "mp"
    for r in spec:
        assert r["tokens"] == plain[r["example_id"]] and r["greedy_match"] is True
        assert 0 < r["accepted"] <= r["drafted"]  # the draft is the target: its tokens are kept


def test_the_run_records_the_ranks_and_their_cores(parallel_run):
    run = json.loads((parallel_run / "run.json").read_text())
    vllm = run["extra"]["vllm"]
    assert vllm["tensor_parallel_size"] == 2 and vllm["distributed_executor_backend"] == "mp"
    assert vllm["cpu_threads_bind"] is not None and vllm["cpu_threads_bind"].count("|") == 1
