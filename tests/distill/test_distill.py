"""`draftlab distill` end to end on a tiny target: the draft it writes loads, fits and decodes losslessly."""

from __future__ import annotations

import json
import os

import pytest
import torch
from tiny import corpus, make_model

from draftlab.cli import main
from draftlab.decode.build import build_decoder
from draftlab.decode.spec import DecoderConfig
from draftlab.distill import train as T
from draftlab.models.loading import ModelSpec, check_compatible, load_model
from draftlab.models.prompting import encode_prompt
from draftlab.sampling import SamplingParams


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("distill")
    target = make_model("llama", root / "target", seed=1, hidden=32, layers=2)
    prompts = root / "prompts.jsonl"
    lines = [
        {"category": "qa", "prompt": "the cat sat on the mat and then"},
        {"category": "qa", "prompt": "a big dog ran under the tree"},
        {"category": "multi-turn", "turns": ["translate the red house", "summary of the court contract"]},
    ]
    prompts.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    text = root / "text.txt"
    text.write_text("\n\n".join(" ".join(corpus(60)[i : i + 6]) for i in range(0, 60, 6)))
    suite = root / "suite.jsonl"
    suite.write_text(
        "\n".join(
            json.dumps({"category": c, "prompt": p}) for c, p in [("a", "the law court"), ("b", "a cat ran")]
        )
    )
    return root, target, prompts, text, suite


def _args(target, out, prompts, text, *extra):
    return [
        "distill",
        "--target", str(target),
        "--out", str(out),
        "--prompts", str(prompts),
        "--text", str(text),
        "--corpus-prompts", "3",
        "--raw-chunks", "2",
        "--raw-chars", "200",
        "--max-new-tokens", "8",
        "--top-k", "5",
        "--gen-batch-size", "4",
        "--hidden-size", "16",
        "--layers", "1",
        "--intermediate-size", "32",
        "--heads", "2",
        "--kv-heads", "1",
        "--batch-tokens", "128",
        "--target-dtype", "float32",
        "--autocast", "off",
        "--log-every", "1",
        "--quiet",
        *extra,
    ]  # fmt: skip


def test_distill_end_to_end(inputs, capsys):
    root, target, prompts, text, suite = inputs
    out = root / "draft"
    code = main(
        _args(target, out, prompts, text, "--steps", "6", "--save-every", "3", "--eval-prompts", str(suite))
        + ["--eval-per-category", "1", "--json"]
    )
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["evaluation"]["prompts"] == 2
    assert result["evaluation"]["all_outputs_match"]

    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "recipe.json",
        "README.md",
        "train_log.jsonl",
    ):
        assert (out / name).exists(), name
    umask = os.umask(0)
    os.umask(umask)
    assert (out / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask, "readable as usual"
    assert not (out / T.CHECKPOINT).exists()  # checkpoints stay in the work folder
    assert (root / "draft.work" / T.CHECKPOINT).exists()
    recipe = json.loads((out / "recipe.json").read_text())
    assert recipe["trained_steps"] == 6
    assert recipe["data"]["prompts"] == 3 and recipe["data"]["multi_turn_prompts"] == 1
    assert (
        recipe["data"]["text_files"][0]["name"] == "text.txt"
        and len(recipe["data"]["text_files"][0]["sha256"]) == 64
    )
    assert sum(recipe["data"]["shards"]["sequences"].values()) == 3 * 2 + 3 * 2 + 2
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4, 5, 6]
    assert all(r["loss"] > 0 and "tokens_per_s" in r for r in log)

    config = json.loads((out / "config.json").read_text())
    assert config["tie_word_embeddings"] and config["hidden_size"] == 16 and config["dtype"] == "bfloat16"
    t = load_model(ModelSpec(str(target)))
    d = load_model(ModelSpec(str(out)))
    check_compatible(t, d)
    params = SamplingParams()
    for prompt in ("the cat sat", "a dog ran under the big tree"):
        ids = encode_prompt(t, prompt, chat=True)
        ar = build_decoder(DecoderConfig(method="ar"), t).generate(ids, 12, params)
        sps = build_decoder(DecoderConfig(method="sps", gamma=3), t, d).generate(ids, 12, params)
        assert sps.tokens == ar.tokens
        assert sps.stats.drafted > 0


def test_distill_resumes_from_checkpoint(inputs, monkeypatch):
    root, target, prompts, text, _ = inputs
    out = root / "resume"
    base = _args(target, out, prompts, text, "--steps", "6", "--save-every", "2", "--eval-per-category", "0")
    real_lr = T._lr_at

    def interrupt_at_step_4(step, cfg):
        if step == 4:
            raise KeyboardInterrupt
        return real_lr(step, cfg)

    monkeypatch.setattr(T, "_lr_at", interrupt_at_step_4)
    assert main(base) == 130  # interrupted during step 5 (index 4): checkpoint of step 4 is on disk
    assert torch.load(root / "resume.work" / T.CHECKPOINT, weights_only=False)["step"] == 4
    shards = sorted((root / "resume.work" / "data").glob("shard-*.pt"))
    monkeypatch.setattr(T, "_lr_at", real_lr)

    assert main([*base, "--resume"]) == 0
    steps = [json.loads(line)["step"] for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]  # continued after step 4, not from scratch
    assert sorted((root / "resume.work" / "data").glob("shard-*.pt")) == shards  # data reused
    assert torch.load(root / "resume.work" / T.CHECKPOINT, weights_only=False)["step"] == 6
    assert json.loads((out / "recipe.json").read_text())["trained_steps"] == 6


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--steps", "0"], "--steps"),
        (["--hidden-size", "15"], "multiple of --heads"),
        (["--lr", "nan"], "--lr"),
        (["--resume", "--restart"], "contradict"),
    ],
)
def test_distill_bad_numbers(inputs, capsys, extra, message):
    root, target, prompts, text, _ = inputs
    assert main(_args(target, root / "bad", prompts, text, *extra)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("draftlab: error:") and message in err and len(err.splitlines()) == 1


def test_distill_bad_inputs(inputs, tmp_path, capsys):
    root, target, prompts, text, _ = inputs
    assert main(_args(tmp_path / "no-such-target", tmp_path / "o", prompts, text)) == 2
    assert "not found" in capsys.readouterr().err
    assert main(_args(target, tmp_path / "o", tmp_path / "missing.jsonl", text)) == 2
    assert "cannot read prompt file" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"category": "x"}\n')
    assert main(_args(target, tmp_path / "o", bad, text)) == 2
    assert "needs a 'prompt'" in capsys.readouterr().err
    assert main(_args(target, tmp_path / "o2", prompts, text, "--resume")) == 2
    assert "no checkpoint" in capsys.readouterr().err


def test_distill_can_start_from_an_existing_draft(inputs):
    root, target, prompts, text, _ = inputs
    first, second = root / "first", root / "second"
    assert main(_args(target, first, prompts, text, "--steps", "2", "--eval-per-category", "0")) == 0
    assert main(
        _args(target, second, prompts, text, "--steps", "1", "--lr", "1e-9", "--warmup", "0",
              "--eval-per-category", "0", "--init-from", str(first), "--work-dir", str(root / "second.work"))
    ) == 0  # fmt: skip
    import torch
    from safetensors.torch import load_file

    a, b = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    # A near-zero learning rate keeps the weights where --init-from put them: one Adam step moves
    # each by about lr, and saving rounds them to the saved dtype's precision.
    key = "model.embed_tokens.weight"
    eps = torch.finfo(a[key].dtype).eps
    assert torch.allclose(a[key].float(), b[key].float(), rtol=eps, atol=10 * 1e-9)
