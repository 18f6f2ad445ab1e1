"""The answer store of `draftlab distill`: llama-server's parallel slots or the target here write the
target's answers into one store, versioned per run; a later run answers only what is new; `auto`
races both on real batches and keeps the faster. On stories260K (a real trained model), from the CLI."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import torch
from helpers import check_error

from draftlab.cli import main
from draftlab.distill.data import load_shards
from draftlab.distill.inputs import generation_dtype
from draftlab.distill.teacher import Teacher
from draftlab.engines.llama_server.binary import find_server
from draftlab.hardware import native_bf16
from draftlab.models.loading import ModelSpec, load_model

MAX_NEW = 24


@pytest.fixture
def server():
    found = find_server()
    if found is None:
        if os.environ.get("DRAFTLAB_REQUIRE_LLAMACPP"):
            pytest.fail("llama-server is not built (scripts/install-llamacpp.sh)", pytrace=False)
        pytest.skip("llama-server is not built")
    return found


def _prompts(path: Path, n: int) -> Path:
    starts = [
        "Once upon a time, there was a little",
        "One day, a girl named",
        "Tom had a big red",
        "The sun was",
    ]
    names, things = ["Lily", "Tom", "Sue", "Max", "Anna", "Ben"], ["ball", "kite", "box", "cake", "tree"]
    lines = []
    for i in range(n):
        r = random.Random(i)
        lines.append(
            json.dumps({"prompt": f"{r.choice(starts)} {r.choice(names)} and the {r.choice(things)}"})
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def _distill(target, tmp_path: Path, prompts: Path, *extra: str) -> list[str]:
    return [
        "distill", "--head", "dflash", "--target", str(target), "--target-dtype", "float32",
        "--out", str(tmp_path / "out"), "--work-dir", str(tmp_path / "work"), "--no-default-prompts",
        "--prompts", str(prompts), "--corpus-prompts", "0", "--raw-chunks", "0", "--samples-per-prompt", "0",
        "--max-new-tokens", str(MAX_NEW), "--steps", "1", "--block-size", "4", "--eval-per-category", "0",
        "--quiet", "--json", *extra,
    ]  # fmt: skip


# Who answers here for `--gen-dtype auto`: bfloat16 on a CPU with native bfloat16, else float32 (the
# choice itself is tested on synthetic CPUs in test_distill_data_unit.py).
HERE = f"draftlab {generation_dtype('auto', 'float32', 'cpu', native_bf16(), False)}"


def _store(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "work" / "data" / "store.json").read_text())


def _shard_authors(tmp_path: Path) -> list[str]:
    shards = sorted((tmp_path / "work" / "data").glob("shard-*.pt"))
    return [torch.load(s, weights_only=True)["answered_by"] for s in shards]


def test_server_answers_are_the_targets_and_a_later_run_answers_only_new_prompts(
    stories, server, tmp_path, capsys
):
    assert (
        main(
            _distill(stories, tmp_path, _prompts(tmp_path / "p.jsonl", 12), "--answers-with", "llama-server")
        )
        == 0
    )
    (first,) = _store(tmp_path)["versions"]
    assert first["version"] == 1 and first["sequences"] == 12
    (by,) = first["answered_by"].values()
    assert by["by"].startswith("llama-server stories260K") and by["by"].endswith("-f32.gguf, 8 slots")

    # The server's answers are the target's: greedy, float32 on both sides, token for token; and the
    # labels the target here scored are aligned (their top-1 is the next token of a greedy answer).
    target = load_model(ModelSpec(str(stories), "float32", "cpu"))
    teacher = Teacher(target.model, target.tokenizer, 4, MAX_NEW, 768)
    records = load_shards(tmp_path / "work" / "data")
    for r in records:
        prompt, answer = r["ids"][: r["start"]].tolist(), r["ids"][r["start"] :].tolist()
        assert teacher.respond([prompt], 0.0, 0)[0][0] == answer
        assert r["offset"] == r["start"] - 1 and len(r["topk_ids"]) == len(answer)
        assert r["topk_ids"][:, 0].tolist() == answer

    # More prompts later, answered here: only the six new ones, as the store's second version.
    more = _prompts(tmp_path / "p.jsonl", 18)
    assert main(_distill(stories, tmp_path, more, "--answers-with", "hf", "--resume")) == 0
    versions = _store(tmp_path)["versions"]
    assert [v["sequences"] for v in versions] == [12, 6]
    assert list(versions[1]["answered_by"]) == [HERE]
    keys = [r["key"] for r in load_shards(tmp_path / "work" / "data")]
    assert len(keys) == len(set(keys)) == 18
    # The same prompts again: nothing to answer, no new version.
    assert main(_distill(stories, tmp_path, more, "--resume")) == 0
    assert len(_store(tmp_path)["versions"]) == 2
    capsys.readouterr()


def test_auto_races_both_on_real_batches_and_the_faster_answers_the_rest(stories, server, tmp_path):
    prompts = _prompts(tmp_path / "p.jsonl", 140)  # over the race's 128 jobs
    assert main(_distill(stories, tmp_path, prompts, "--gen-batch-size", "20")) == 0
    (version,) = _store(tmp_path)["versions"]
    rates = version["answered_by"]
    assert set(rates) == {HERE, "llama-server"} and all(r["tokens"] > 0 for r in rates.values())
    authors = _shard_authors(tmp_path)
    # The race: two batches each, in turn; then the one faster over its race batches answers the rest.
    (winner,) = [r for r in rates.values() if r["won"]]
    (loser,) = [r for r in rates.values() if not r["won"]]
    assert winner["race_tokens_per_s"] >= loser["race_tokens_per_s"] > 0
    assert len(authors) == 7 and authors[:4] == [authors[0], authors[1]] * 2 and authors[0] != authors[1]
    assert authors[4:] == [winner["by"]] * 3


def test_a_store_holds_one_targets_answers(stories, tiny_pair, tmp_path, capsys):
    prompts = _prompts(tmp_path / "p.jsonl", 4)
    assert main(_distill(stories, tmp_path, prompts, "--answers-with", "hf")) == 0
    capsys.readouterr()
    other = tiny_pair["llama"][0]
    check_error(
        capsys, _distill(other, tmp_path, prompts, "--restart"), "answers in", "give another --work-dir"
    )
    check_error(
        capsys, _distill(stories, tmp_path, prompts, "--answers-with", "vllm"), "--answers-with 'vllm'"
    )
