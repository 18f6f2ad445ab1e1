"""Adding a drafter needs no edit of draftlab: a module registers its row and its builder, and the
CLI, the cost-aware sizer and the lossless rule take it from there. Here the module is this test."""

from __future__ import annotations

import json

import pytest
from helpers import check_error

from draftlab.cli import main
from draftlab.decode.build import chain_decoder
from draftlab.decode.spec import REGISTRY, Setting, register, unregister
from draftlab.proposers import Proposal, Proposer


class RepeatLast(Proposer):
    """Drafts k copies of the sequence's last token: cheap, often wrong, and a real proposal."""

    def propose(self, sequence, k, params, sampler):
        return Proposal([sequence[-1]] * k) if k > 0 and sequence else Proposal()


def build_repeat(config, target, draft, cost):
    return chain_decoder(config, target, cost, RepeatLast(), config.pld_tokens, free_drafts=True)


@pytest.fixture()
def toy_method():
    register(
        "repeat-last", "REPEAT", build_repeat, "a toy drafter from a test module", "sized", ("pld_tokens",)
    )
    yield "repeat-last"
    del REGISTRY["repeat-last"]


def _generate(capsys, models, method: str, *extra: str) -> dict:
    target, _ = models
    argv = ["generate", "--target", str(target), "--dtype", "float32", "--json", "--max-new-tokens", "24"]
    assert main([*argv, *extra, "--method", method, "the cat sat on the mat and the cat"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_drafter_registered_from_outside_runs_from_the_cli_losslessly(capsys, tiny_pair, toy_method):
    models = tiny_pair["llama"]
    plain = _generate(capsys, models, "ar")
    toy = _generate(capsys, models, toy_method, "--fixed-k", "--pld-tokens", "3")
    assert toy["method"] == toy_method and toy["gamma"] == 3 and toy["sizing"] == "fixed k"
    assert 0 < toy["stats"]["drafted"] <= 3 * toy["stats"]["rounds"]
    assert toy["tokens"] == plain["tokens"]  # greedy, float32: exactly the target's own tokens


def test_an_unregistered_drafter_is_a_one_line_error(capsys, tiny_pair):
    target, _ = tiny_pair["llama"]
    check_error(capsys, ["generate", "--target", str(target), "--method", "repeat-last", "hi"], "repeat-last")


class RepeatBack(Proposer):
    """Drafts k copies of the token `back` places from the end: a toy with a setting of its own."""

    def __init__(self, back: int):
        self.back = back

    def propose(self, sequence, k, params, sampler):
        return Proposal([sequence[-self.back]] * k) if k > 0 and len(sequence) >= self.back else Proposal()


def build_repeat_back(config, target, draft, cost):
    proposer = RepeatBack(config.option("repeat_back"))
    return chain_decoder(config, target, cost, proposer, config.pld_tokens, free_drafts=True)


@pytest.fixture()
def toy_with_setting():
    back = Setting("repeat_back", int, 1, "repeat-back: draft the token this many places back", minimum=1)
    register(
        "repeat-back",
        "REPEAT-BACK",
        build_repeat_back,
        "a toy drafter with a setting of its own",
        "sized",
        ("pld_tokens", "repeat_back"),
        settings=(back,),
    )
    yield "repeat-back"
    unregister("repeat-back")


def test_a_drafters_own_setting_becomes_its_cli_option(capsys, tiny_pair, toy_with_setting):
    """The setting is declared with the row: the CLI option, its default, its check and its record
    come from the declaration, with no edit of cli/ or decode/."""
    models = tiny_pair["llama"]
    plain = _generate(capsys, models, "ar")
    toy = _generate(capsys, models, toy_with_setting, "--fixed-k", "--pld-tokens", "3", "--repeat-back", "2")
    assert toy["settings"]["repeat_back"] == 2 and toy["settings"]["pld_tokens"] == 3
    assert toy["stats"]["drafted"] > 0
    assert toy["tokens"] == plain["tokens"]
    assert _generate(capsys, models, toy_with_setting, "--fixed-k")["settings"]["repeat_back"] == 1
    target, _ = models
    bad = ["generate", "--target", str(target), "--method", toy_with_setting, "--repeat-back", "0", "hi"]
    check_error(capsys, bad, "repeat_back", "0")
    with pytest.raises(SystemExit) as done:
        main(["generate", "--help"])
    assert done.value.code == 0 and "--repeat-back" in capsys.readouterr().out


def test_a_setting_that_clashes_with_another_is_refused(toy_with_setting):
    with pytest.raises(ValueError, match="pld_tokens"):
        register("clash", "CLASH", build_repeat_back, "x", settings=(Setting("pld_tokens", int, 1, "x"),))
    assert "clash" not in REGISTRY
