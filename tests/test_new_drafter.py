"""Adding a drafter needs no edit of draftlab: a module registers its row and its builder, and the
CLI, the cost-aware sizer and the lossless rule take it from there. Here the module is this test."""

from __future__ import annotations

import json

import pytest
from helpers import check_error

from draftlab.cli import main
from draftlab.decode.build import chain_decoder
from draftlab.decode.spec import REGISTRY, register
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
