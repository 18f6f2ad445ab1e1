"""`draftlab distill --head eagle3` end to end on a real trained model (stories260K), from the CLI:
features, training with the training-time test, resume, held-out metrics, and the head's use by
`draftlab generate --method eagle`, which must write the target's own greedy tokens."""

from __future__ import annotations

import json

import pytest
from conftest import SHARED
from helpers import server_round_trip

from draftlab.cli import main

STEPS = 80
TEXT = SHARED / "corpus" / "tinystories_validation_head.txt"


def _distill(stories, out, work, steps, *extra):
    return [
        "distill", "--head", "eagle3", "--target", str(stories), "--target-dtype", "float32",
        "--out", str(out), "--work-dir", str(work), "--no-default-prompts", "--text", str(TEXT),
        "--corpus-prompts", "0", "--raw-chunks", "60", "--raw-chars", "500", "--steps", str(steps),
        "--batch-tokens", "2048", "--lr", "0.004", "--warmup", "2", "--draft-vocab", "192",
        "--ttt-steps", "2", "--save-every", "5", "--eval-per-category", "0", "--quiet", "--json", *extra,
    ]  # fmt: skip


def test_a_head_learns_resumes_and_drafts_for_its_target(stories, tmp_path, capsys):
    if not TEXT.exists():
        pytest.fail(f"{TEXT} is missing: ../shared/corpus must be beside the clone", pytrace=False)
    out, work = tmp_path / "head", tmp_path / "work"
    assert main(_distill(stories, out, work, 2)) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(_distill(stories, out, work, STEPS, "--resume")) == 0
    later = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    log = [json.loads(line)["step"] for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert log == list(range(1, STEPS + 1)), "the resumed run continues at step 3"
    held = later["held_out"]
    assert held["positions"] > 100, "some sequences are held out, never trained on"
    # Trained, the head agrees with the target far more often than after two steps.
    assert held["first_token_top1"] > first["held_out"]["first_token_top1"] + 0.1, (first, later)
    assert held["chain_mean_accepted_length"] > 1.2
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["draft_vocab_size"] == 192
    recipe = json.loads((out / "recipe.json").read_text())
    assert recipe["trained_steps"] == STEPS and recipe["data"]["train_sequences"] > 0
    assert "first-token top-1" in (out / "README.md").read_text()

    # A new work folder, started from the trained head: it drafts as well as the head it came from
    # after two steps, where a new head after two steps did not.
    again = tmp_path / "again"
    init = ["--init-from", str(out), "--autocast", "on"]  # bfloat16 autocast trains on every CPU
    assert main(_distill(stories, again, tmp_path / "work2", 2, *init)) == 0
    warm = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["held_out"]
    assert warm["first_token_top1"] > first["held_out"]["first_token_top1"] + 0.1, (first, warm)
    assert json.loads((again / "recipe.json").read_text())["init"].startswith(str(out))

    prompt = ["--target", str(stories), "--dtype", "float32", "Once upon a time, there was a little",
              "--max-new-tokens", "40", "--json"]  # fmt: skip
    assert main(["generate", "--method", "ar", *prompt]) == 0
    ar = json.loads(capsys.readouterr().out)
    assert main(["generate", "--method", "eagle", "--head", str(out), "--fixed-k", *prompt]) == 0
    eagle = json.loads(capsys.readouterr().out)
    assert eagle["tokens"] == ar["tokens"]
    assert eagle["stats"]["accepted"] > 0 and eagle["stats"]["mean_accepted_length"] > 1.2
    # Where llama-server is built, the head also ends as a GGUF beside it (llama.cpp's converter),
    # and llama-server drafts with it for the same target: the round trip to llama.cpp users.
    ran = server_round_trip(stories, out / "head-eagle3-bf16.gguf", "draft-eagle3", tmp_path, 40)
    if ran is None:
        return
    assert later["gguf"] == str(out / "head-eagle3-bf16.gguf")
    plain, drafted = ran
    assert drafted.stats.accepted > 0, drafted.stats
    assert drafted.tokens == plain.tokens  # float32 files: passes of any size round alike


def test_head_errors_are_one_line(stories, tmp_path, capsys):
    base = ["generate", "--target", str(stories), "--dtype", "float32", "hi"]
    assert main([*base, "--method", "eagle"]) == 2
    assert "needs an EAGLE-3 head: pass --head" in capsys.readouterr().err
    assert main([*base, "--method", "eagle", "--head", str(stories)]) == 2
    err = capsys.readouterr().err
    assert "is not an EAGLE-3 head folder" in err and err.count("\n") == 1
    assert main(["distill", "--head", "eagle3", "--target", str(stories), "--out", str(tmp_path / "o"),
                 "--time-budget", "soon"]) == 2  # fmt: skip
    assert "--time-budget" in capsys.readouterr().err
