"""Every bad input ends in one line on stderr naming the value, exit code 2, no traceback."""

from __future__ import annotations

import pytest
from helpers import check_error

from draftlab.cli import main


@pytest.fixture()
def models(tiny_pair):
    return tiny_pair["llama"]


def gen(models, *extra, prompt="the cat sat"):
    target, draft = models
    return ["generate", "--target", str(target), "--draft", str(draft), "--dtype", "float32", *extra, prompt]


def test_unknown_model_path(capsys, tmp_path):
    check_error(
        capsys,
        ["generate", "--target", str(tmp_path / "missing"), "--method", "ar", "x"],
        "missing",
        "not found",
    )


def test_unknown_hub_id_offline(capsys):
    check_error(
        capsys,
        ["generate", "--target", "no-such-org/no-such-model", "--method", "ar", "x"],
        "no-such-org/no-such-model",
        "offline",
    )


def test_incompatible_tokenizers(capsys, models, stories):
    target, _ = models
    check_error(
        capsys,
        ["generate", "--target", str(target), "--draft", str(stories), "--dtype", "float32", "x"],
        "incompatible tokenizers",
        str(stories),
    )


@pytest.mark.parametrize(
    "extra, fragment",
    [
        (["--gamma", "0"], "gamma must be >= 1, got 0"),
        (["--max-new-tokens", "0"], "max_new_tokens must be >= 1, got 0"),
        (["--temperature", "-0.5"], "temperature must be >= 0, got -0.5"),
        (["--temperature", "1", "--top-p", "0"], "top_p must be in (0, 1], got 0.0"),
        (["--temperature", "1", "--top-p", "1.5"], "top_p must be in (0, 1], got 1.5"),
        (
            ["--method", "bild", "--fallback-threshold", "1.5"],
            "fallback_threshold must be in [0, 1], got 1.5",
        ),
        (
            ["--method", "bild", "--rollback-threshold", "-1"],
            "rollback_threshold must be > 0 (or inf), got -1.0",
        ),
        (["--method", "bild", "--rollback-threshold", "abc"], "'abc'"),
        (["--method", "pld", "--pld-tokens", "0"], "pld_tokens must be >= 1, got 0"),
        (["--gamma", "two"], "'two'"),
        (["--method", "nope"], "'nope'"),
    ],
)
def test_bad_numbers_and_names(capsys, models, extra, fragment):
    check_error(capsys, gen(models, *extra), fragment)


def test_empty_prompt(capsys, models):
    check_error(capsys, gen(models, prompt="   "), "empty prompt")


def test_prompt_longer_than_context(capsys, models):
    check_error(
        capsys,
        gen(models, "--method", "ar", prompt="the cat sat on the mat " * 200),
        "exceeds the model's context of 512",
    )


def test_generate_prints_text_and_json(capsys, models):
    import json

    assert main(gen(models, "--json", "--max-new-tokens", "5")) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["method"] == "sps" and len(record["tokens"]) <= 5
    assert record["stats"]["new_tokens"] == len(record["tokens"])
    assert main(gen(models, "--method", "pld", "--max-new-tokens", "5", "--chat")) == 0


def test_a_bug_is_one_line_with_its_traceback_kept(models, capsys, tmp_path, monkeypatch):
    """An unexpected exception (a bug, not bad input) never shows the user a traceback: one line,
    exit code 1, and the traceback saved under the draftlab home for a report."""
    import draftlab.decode.build as build

    def broken(*args, **kwargs):
        raise AttributeError("'NoneType' object has no attribute 'share'")

    monkeypatch.setenv("DRAFTLAB_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(build, "build_decoder", broken)
    monkeypatch.setattr("draftlab.cli.generate.build_decoder", broken, raising=False)
    assert main(gen(models, "--method", "ar", "--max-new-tokens", "2")) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("draftlab: internal error: AttributeError") and "\n" not in err, err
    assert "Traceback" not in err and str(tmp_path / "home" / "last-error.txt") in err
    assert "Traceback" in (tmp_path / "home" / "last-error.txt").read_text()


def test_an_engine_a_command_cannot_run_is_a_one_line_error(capsys, models):
    """One --engine option, each command offering only the engines it runs: generate has no vLLM path
    and no llama-server one (they would have run our loop and recorded another engine's name)."""
    for engine in ("vllm", "llama-server"):
        check_error(capsys, gen(models, "--engine", engine), "--engine", engine)
