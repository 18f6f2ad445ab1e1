"""llama-server's decisions and figures without a server: the settings chosen per subtask from
calibration rates, the round cost split from a cost curve, and the audit's judgement of a difference
from its Q4_1 one-thread rerun (any CPU's figures: these are synthetic)."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
from test_metrics_unit import rec, run_info

from draftlab.audit.checks import MethodAudit
from draftlab.decode.stats import Generation, GenerationStats
from draftlab.engines.llama_server.audit import RECHECK, ServerAudit
from draftlab.engines.llama_server.report import server_rounds_table, server_section, server_settings_table
from draftlab.engines.llama_server.tuning import (
    ALL,
    CANDIDATES,
    Calibration,
    candidates_for,
    choose_per_subtask,
    length_args,
)
from draftlab.models.cost_curve import CostCurve

SPEC = ["--spec-type", "ngram-mod"]


def test_settings_are_chosen_per_subtask_and_off_where_none_pays():
    plain = {"rag": 100.0, "qa": 100.0, ALL: 100.0}
    rates = {
        "n 1-4": {"rag": 120.0, "qa": 95.0, ALL: 107.5},
        "n 4-16": {"rag": 130.0, "qa": 102.0, ALL: 116.0},
    }
    options = {label: CANDIDATES["ngram-mod"][label] for label in rates}
    chosen = choose_per_subtask(rates, plain)
    # qa's best (1.02×) does not clear the margin: it decodes plainly; rag drafts up to 16.
    assert chosen == {"rag": "n 4-16", "qa": None, ALL: "n 4-16"}
    calibration = Calibration(plain, rates, chosen, options)
    longer = ["--spec-ngram-mod-n-min", "4", "--spec-ngram-mod-n-max", "16"]
    assert calibration.server_args(SPEC, "rag") == [*SPEC, *longer]
    assert calibration.server_args(SPEC, "qa") == []
    # A subtask the calibration prompts lack takes the pooled choice.
    assert calibration.server_args(SPEC, "translation") == [*SPEC, *longer]
    # Written to run.json and read back by a resumed run: the same choice.
    again = Calibration.from_dict(json.loads(json.dumps(calibration.to_dict())))
    assert again == calibration
    summary = {"llama_server": {"settings": {"ngram-mod": calibration.to_dict()}}}
    table = server_settings_table(summary)
    assert table.headers == ["method", "rag", "qa", "other subtasks (pooled)"]
    assert table.rows == [["ngram-mod", "n 4-16 (1.30×)", "off (best 1.02×)", "n 4-16 (1.16×)"]]


def test_each_drafter_is_tuned_by_its_own_length_knob_and_its_default_is_a_candidate():
    """llama.cpp caps a draft model's chain with --spec-draft-n-max but each n-gram drafter with its
    own setting (common/speculative.cpp); --spec-draft-n-max does nothing to them."""
    assert length_args("draft-eagle3", 3) == ["--spec-draft-n-max", "3"]
    assert length_args("draft-eagle3,ngram-mod", 2) == ["--spec-draft-n-max", "2"]
    assert length_args("ngram-simple", 16) == ["--spec-ngram-simple-size-m", "16"]
    assert length_args("ngram-mod", 8) == ["--spec-ngram-mod-n-min", "1", "--spec-ngram-mod-n-max", "8"]
    assert length_args("ngram-cache", 4) is None  # a fixed 8 tokens
    assert candidates_for("draft-simple") is CANDIDATES["draft"]
    assert candidates_for("draft-eagle3,ngram-mod") is CANDIDATES["draft"]
    assert candidates_for("ngram-cache") == {"on": []}
    assert length_args("draft-dflash", 5) == ["--spec-draft-n-max", "5"]
    assert candidates_for("draft-dflash") is CANDIDATES["draft"]
    # llama-server's defaults are among the candidates: draft n-max 3, ngram-mod 48-64, size-m 48.
    assert ["--spec-draft-n-max", "3"] in CANDIDATES["draft"].values()
    assert ["--spec-ngram-mod-n-min", "48", "--spec-ngram-mod-n-max", "64"] in CANDIDATES[
        "ngram-mod"
    ].values()
    for kind in ("ngram-simple", "ngram-map-k"):
        assert [f"--spec-{kind}-size-m", "48"] in CANDIDATES[kind].values()


def _curve(ms_per_token: float) -> CostCurve:
    # A pass of n tokens costs 10 ms + ms_per_token · (n - 1), at every context.
    sizes = [1, 2, 4, 8]
    row = [10.0 + ms_per_token * (n - 1) for n in sizes]
    return CostCurve(sizes, [0, 1024], [row, row], [16], [20.0])


def test_a_rounds_cost_splits_into_verification_from_the_curve_and_drafting_from_the_rest():
    """Plain server: 10 ms a step. The drafter's rounds take 16 ms, draft 3 tokens each (a pass of 4
    tokens costs 1.3 plain steps on the curve) and write 2.5 tokens: verification 13 ms, drafting
    3 ms, so 1.6 plain steps for 2.5 tokens, a 1.56× decode speed-up."""
    server = {"engine": "llama-server"}
    # 65 tokens: the prompt's pass writes the first, 64 decode steps at 10 ms.
    plain = [
        rec(
            "ar@llama-server",
            example_id=e,
            method="ar",
            new_tokens=65,
            rounds=65,
            decode_s=0.64,
            params=server,
        )
        for e in "ab"
    ]
    # 66 tokens: the first from the prompt's pass, then 26 rounds of 2.5 tokens at 16 ms.
    fast = [
        rec(
            "ngram-mod@llama-server",
            example_id=e,
            method="ngram-mod",
            new_tokens=66,
            rounds=27,
            first_tokens=1,
            drafted=78,
            accepted=39,
            decode_s=26 * 0.016,
            params=server,
        )
        for e in "ab"
    ]
    run = run_info(baseline="ar@llama-server", extra={"llama_server": {"cost_curve": asdict(_curve(1.0))}})
    section = server_section([*plain, *fast], run)
    m = section["rounds"]["ngram-mod@llama-server"]
    assert m["rounds"] == 52 and m["drafted_per_round"] == pytest.approx(3.0)
    assert m["plain_step_ms"] == pytest.approx(10.0)
    assert m["tokens_per_round"] == pytest.approx(2.5)
    assert m["verify_ms"] == pytest.approx(13.0) and m["draft_ms"] == pytest.approx(3.0)
    assert m["round_steps"] == pytest.approx(1.6) and m["verify_steps"] == pytest.approx(1.3)
    # A dearer verification on another CPU's curve leaves less of the round to drafting.
    steep = run_info(baseline="ar@llama-server", extra={"llama_server": {"cost_curve": asdict(_curve(2.0))}})
    assert server_section([*plain, *fast], steep)["rounds"]["ngram-mod@llama-server"]["draft_ms"] == (
        pytest.approx(0.0)
    )
    table = server_rounds_table({"llama_server": section})
    assert [row[0] for row in table.rows] == ["ar@llama-server", "ngram-mod@llama-server"]
    # Without a cost curve the settings are still reported, the split is not.
    assert server_section(plain, run_info(baseline="ar@llama-server"))["rounds"] == {}


class _Pool:
    def close(self) -> None:
        pass


class _Decoder:
    """Writes fixed tokens, like a server of a given file and drafter would."""

    def __init__(self, tokens: list[int], pool: _Pool) -> None:
        self.tokens, self.pool, self.paused = tokens, pool, 0

    def generate(self, ids, max_new_tokens, params) -> Generation:
        return Generation(list(self.tokens), "", GenerationStats(new_tokens=len(self.tokens)))

    def pause(self) -> None:
        self.paused += 1


class _Bar:
    def add(self, n: int) -> None: ...
    def say(self, text: str) -> None: ...
    def step(self) -> None: ...


class _Target:
    """The file as llama.cpp loads it in-process: only its tokenizer is read for texts here."""

    engine = "hf"

    class tokenizer:  # noqa: N801 - stands in for an attribute
        @staticmethod
        def decode(ids):
            return f"<{ids[0]}>"


@pytest.mark.parametrize(
    ("on_q4_1", "one_pass", "verdict", "status"),
    [
        ([1, 2, 3], None, "matches", "lossless (Q4_1 on 1 thread)"),
        # Differs on Q4_1 too, but its token is the target's own when the prefix is one pass: rounding.
        ([1, 2, 4], 4, "in a pass", "lossless (Q4_1 on 1 thread)"),
        ([1, 2, 4], 3, "diverges", "NOT lossless"),
    ],
)
def test_a_server_difference_is_rounding_only_if_the_q4_1_one_thread_rerun_explains_it(
    on_q4_1, one_pass, verdict, status, monkeypatch
):
    """The drafter differs from the plain server at token 1 on the served file. Rerun on the Q4_1
    copy: matching the plain server there is rounding; differing there with the token a one-pass
    scoring of the prefix picks is rounding too; any other token is a defect."""
    monkeypatch.setattr("draftlab.audit.runner.logit_gap", lambda *a: 0.01)
    monkeypatch.setattr("draftlab.engines.llama_server.audit.one_pass_choice", lambda lm, prefix: one_pass)
    served, copy = _Pool(), _Pool()
    decoders = {"ar": _Decoder([1, 2, 3], served), "ngram-mod": _Decoder([1, 5, 3], served)}
    made = []

    def rechecks():
        made.append(1)
        return {"ar": _Decoder([1, 2, 3], copy), "ngram-mod": _Decoder(on_q4_1, copy)}

    audit = MethodAudit("ngram-mod", lossless_claim=True)
    server_audit = ServerAudit(3, _Bar(), decoders, rechecks, lambda: object())
    server_audit.greedy([audit], _Target(), [[7, 8]])
    assert made == [1] and audit.divergences[0]["position"] == 1
    assert audit.divergences[0][RECHECK] == verdict
    assert audit.judge(1.0) == status
    # One server at a time: the served file's server stopped before the copy's ran.
    assert decoders["ngram-mod"].paused == 1


def test_dflash_runs_on_llama_server_with_the_drafter_it_is_given(tmp_path):
    """Our dflash is llama-server's draft-dflash; a user's DFlash GGUF goes to -md as it is, and
    the method needs --dflash (a one-line error names it)."""
    import argparse

    from draftlab.decode.spec import method_spec
    from draftlab.engines.llama_server import methods
    from draftlab.engines.llama_server.server_args import default_methods, method_server_args
    from draftlab.errors import DraftlabError

    assert methods.counterpart(method_spec("dflash")) == "draft-dflash"
    gguf = tmp_path / "my-dflash.gguf"
    gguf.write_bytes(b"GGUF")
    args = argparse.Namespace(target="t.gguf", draft=None, head=None, dflash=str(gguf), methods=None)
    assert "dflash" in default_methods(args).split(",")
    assert method_server_args("dflash", args, None, None, tmp_path) == [
        "--spec-type",
        "draft-dflash",
        "-md",
        str(gguf),
    ]
    with pytest.raises(DraftlabError, match="needs a DFlash drafter"):
        method_server_args("dflash", argparse.Namespace(dflash=None), None, None, tmp_path)
