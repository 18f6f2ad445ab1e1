"""`draftlab distill --head dflash` end to end on a real trained model (stories260K), from the CLI:
features at the taps, block training, resume, held-out metrics, the drafter's use by `draftlab
generate --method dflash`, which must write the target's own greedy tokens, and the round trip to
llama-server's draft-dflash."""

from __future__ import annotations

import json

import pytest
from conftest import SHARED
from helpers import server_round_trip

from draftlab.cli import main

STEPS = 300
TEXT = SHARED / "corpus" / "tinystories_validation_head.txt"


def _distill(stories, out, work, steps, *extra):
    return [
        "distill", "--head", "dflash", "--target", str(stories), "--target-dtype", "float32",
        "--out", str(out), "--work-dir", str(work), "--no-default-prompts", "--text", str(TEXT),
        "--corpus-prompts", "0", "--raw-chunks", "60", "--raw-chars", "500", "--steps", str(steps),
        "--batch-tokens", "2048", "--lr", "0.004", "--warmup", "10", "--block-size", "6",
        "--save-every", "50", "--eval-per-category", "0", "--quiet", "--json", *extra,
    ]  # fmt: skip


def _ar_and_dflash(stories, drafter, capsys) -> tuple[dict, dict]:
    """`draftlab generate`'s records for plain decoding and for `dflash` with `drafter`, float32."""
    prompt = ["--target", str(stories), "--dtype", "float32", "Once upon a time, there was a little",
              "--max-new-tokens", "40", "--json"]  # fmt: skip
    assert main(["generate", "--method", "ar", *prompt]) == 0
    ar = json.loads(capsys.readouterr().out)
    argv = ["generate", "--method", "dflash", "--dflash", str(drafter), "--fixed-k", "--gamma", "5", *prompt]
    assert main(argv) == 0
    return ar, json.loads(capsys.readouterr().out)


def test_a_dflash_drafter_learns_resumes_and_drafts_for_its_target(stories, tmp_path, capsys):
    if not TEXT.exists():
        pytest.fail(f"{TEXT} is missing: ../shared/corpus must be beside the clone", pytrace=False)
    out, work = tmp_path / "dflash", tmp_path / "work"
    assert main(_distill(stories, out, work, 2)) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(_distill(stories, out, work, STEPS, "--resume")) == 0
    later = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1)), "the resumed run continues at step 3"
    seen = [r["tokens"] for r in rows]
    assert seen == sorted(seen) and seen[2] > seen[1] > 0, "tokens trained on count on across the resume"
    assert (out / "accepted_vs_training_tokens.png").stat().st_size > 1000
    held = later["held_out"]
    assert held["blocks"] > 50, "some sequences are held out, never trained on"
    # Trained, the drafter's blocks agree with the target far more often than after two steps.
    assert held["first_token_top1"] > first["held_out"]["first_token_top1"] + 0.1, (first, later)
    assert held["mean_accepted_length"] > 1.2
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["block_size"] == 6
    recipe = json.loads((out / "recipe.json").read_text())
    assert recipe["trained_steps"] == STEPS and recipe["data"]["train_tokens"] > 0

    ar, dflash = _ar_and_dflash(stories, out, capsys)
    assert dflash["tokens"] == ar["tokens"]
    assert dflash["stats"]["accepted"] > 0

    # Where llama-server is built, the drafter also ends as a GGUF beside it (llama.cpp's own
    # converter), and llama-server drafts with it (--spec-type draft-dflash) for the same target:
    # accepted tokens show that both read the layout alike, and the output is the plain server's.
    ran = server_round_trip(stories, out / "head-dflash-bf16.gguf", "draft-dflash", tmp_path, 60)
    if ran is None:
        return
    assert later["gguf"] == str(out / "head-dflash-bf16.gguf")
    plain, drafted = ran
    assert drafted.stats.accepted > 0, drafted.stats
    assert drafted.tokens == plain.tokens  # float32 target: passes of any size round alike


def test_dflash_distill_refuses_a_block_of_one(stories, tmp_path, capsys):
    assert main(_distill(stories, tmp_path / "o", tmp_path / "w", 2, "--block-size", "1")) == 2
    err = capsys.readouterr().err
    assert "--block-size must be at least 2" in err and "Traceback" not in err


def test_a_pruned_dflash_drafter_trains_on_its_answers_tokens_and_drafts_losslessly(
    stories, tmp_path, capsys
):
    """--draft-vocab: the drafter proposes from the answers' most frequent tokens only, trains, and
    still writes the target's greedy tokens; llama.cpp's converter reads no pruned vocabulary, so no
    GGUF is written, with a warning that says so."""
    out = tmp_path / "pruned"
    argv = _distill(stories, out, tmp_path / "work", 60, "--draft-vocab", "160")
    assert main(argv) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out.strip().splitlines()[-1])
    config = json.loads((out / "config.json").read_text())
    assert config["draft_vocab_size"] == 160 and config["vocab_size"] == 512
    assert result.get("gguf") is None and "full-vocabulary drafters only" in captured.err.replace("\n", " ")
    assert result["held_out"]["mean_accepted_length"] > 1.0

    ar, dflash = _ar_and_dflash(stories, out, capsys)
    assert dflash["tokens"] == ar["tokens"] and dflash["stats"]["accepted"] > 0
