"""`--magpie-prompts`: the target writes user requests from its chat template's user header, they are
kept as written, a resumed run asks only for the rest, and the requests are answered as data."""

from __future__ import annotations

import json

import pytest
from tiny import EOS, make_model

from draftlab.cli import main
from draftlab.distill import magpie
from draftlab.errors import DraftlabError
from draftlab.models.loading import ModelSpec, load_model


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return make_model("llama", tmp_path_factory.mktemp("magpie") / "target", seed=3, hidden=32, layers=2)


def test_the_user_header_and_its_closing_token_come_from_the_chat_template(target):
    tokenizer = load_model(ModelSpec(str(target), "float32", "cpu")).tokenizer
    prefix, ends = magpie.user_turn_prefix(tokenizer)
    assert tokenizer.decode(prefix) == "<s>user: "  # tests/tiny.py's template
    assert ends == [EOS]
    tokenizer.chat_template = None
    with pytest.raises(DraftlabError, match="chat template"):
        magpie.user_turn_prefix(tokenizer)


def test_requests_are_distinct_closed_turns_kept_on_disk_and_resumed(target, tmp_path):
    lm = load_model(ModelSpec(str(target), "float32", "cpu"))
    first = magpie.write_prompts(
        lm.model, lm.tokenizer, tmp_path, 5, seed=0, batch_size=16, max_new_tokens=96
    )
    assert len(first) == 5 and len(set(first)) == 5
    assert all(len(p) >= magpie.MIN_CHARS for p in first)
    assert magpie.read_prompts(tmp_path) == first
    # Each request is what the target wrote before closing its turn: asked again after the header
    # and the request, the target's prompt is a user turn the template renders back unchanged.
    rendered = lm.tokenizer.apply_chat_template([{"role": "user", "content": first[0]}], tokenize=False)
    assert rendered == f"<s>user: {first[0]}</s>"
    # A run that resumes keeps the five and writes only what is missing.
    more = magpie.write_prompts(lm.model, lm.tokenizer, tmp_path, 8, seed=0, batch_size=16, max_new_tokens=96)
    assert more[:5] == first and len(more) == 8 and len(set(more)) == 8
    # A line cut short by an interrupted write is skipped, not fatal.
    with (tmp_path / magpie.FILE).open("a") as f:
        f.write('{"prompt": "cut sho')
    assert magpie.read_prompts(tmp_path) == more
    # Turns cut off at the token limit are not requests: a target that may never close a turn
    # writes none (and gives up after a bounded number of tries).
    lm.model.generation_config.suppress_tokens = [EOS]
    none = magpie.write_prompts(lm.model, lm.tokenizer, tmp_path / "open", 3, 0, 16, max_new_tokens=24)
    assert none == [] and not (tmp_path / "open" / magpie.FILE).exists()


def test_distill_answers_the_targets_own_requests(target, tmp_path, capsys):
    out, work = tmp_path / "head", tmp_path / "work"
    args = [
        "distill", "--head", "eagle3", "--target", str(target), "--target-dtype", "float32",
        "--out", str(out), "--work-dir", str(work), "--no-default-prompts", "--magpie-prompts", "6",
        "--samples-per-prompt", "1", "--max-new-tokens", "12", "--gen-batch-size", "8",
        "--corpus-prompts", "0", "--raw-chunks", "0", "--steps", "2", "--batch-tokens", "256",
        "--draft-vocab", "64", "--ttt-steps", "2", "--eval-per-category", "0", "--quiet", "--json",
    ]  # fmt: skip
    assert main(args) == 0
    capsys.readouterr()
    recipe = json.loads((out / "recipe.json").read_text())
    assert recipe["data"]["magpie_prompts"] == 6
    assert recipe["data"]["magpie_seconds_this_run"] > 0
    assert "Magpie requests written by the target: 6" in (out / "README.md").read_text()
    assert recipe["data"]["sequences"] == {"magpie": 12}, "a greedy and a sampled answer to each request"
    assert len(magpie.read_prompts(work / "data")) == 6


def test_a_target_without_a_chat_template_is_a_one_line_error(stories, tmp_path, capsys):
    args = [
        "distill", "--head", "eagle3", "--target", str(stories), "--target-dtype", "float32",
        "--out", str(tmp_path / "h"), "--no-default-prompts", "--magpie-prompts", "4",
        "--corpus-prompts", "0", "--raw-chunks", "0", "--quiet",
    ]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--magpie-prompts" in err and "chat template" in err


def test_readme_says_where_the_requests_came_from():
    """A run that wrote no requests (all on disk) says so, not "0.0 s this run"."""
    from draftlab.drafters.eagle3.distill import _readme

    def readme(seconds: float) -> str:
        recipe = {
            "data": {"magpie_prompts": 25, "magpie_seconds_this_run": seconds, "train_sequences": 1,
                     "held_out_sequences": 0},
            "held_out": None, "train_config": {"batch_tokens": 64, "ttt_steps": 2, "lr": 0.001},
            "target": {"name": "t", "dtype": "float32", "aux_layers": [0, 1, 2], "layers": 3},
            "head": {"parameters": 1e6, "draft_vocab_size": 64}, "trained_steps": 2, "train_seconds": 1.0,
        }  # fmt: skip
        return _readme(recipe)

    assert "Magpie requests written by the target: 25 (12.5 s this run)" in readme(12.5)
    assert "Magpie requests written by the target: 25 (all written by an earlier run)" in readme(0.0)
