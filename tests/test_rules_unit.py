"""Acceptance rules called directly: hand-made proposals and logits, and a sampler whose draws we set.

These pin the rule's arithmetic (accept iff u·q < p, the residual max(0, p − q) normalised, the
bonus token, greedy longest prefix, tree recursion order, BiLD's thresholds) without decoding.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from tolerance import sum_tol

from draftlab.proposal import Proposal
from draftlab.sampling import Sampler, SamplingParams, argmax_rows, warp_probs
from draftlab.verify.rules import AcceptanceRule, BildRule, SpeculativeRule, Verdict

GREEDY = SamplingParams()


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Rows of a few cells through a subtraction, a clamp and a normalisation: (cells + 2)·eps."""
    return torch.allclose(got, want.to(got.dtype), rtol=0.0, atol=sum_tol(got.shape[-1] + 2))


T1 = SamplingParams(temperature=1.0)


class ScriptedSampler:
    """uniform() returns the scripted values in turn; draw() records its argument and returns `token`
    (or, with token=None, the index of the largest probability)."""

    def __init__(self, uniforms=(), token=None):
        self.uniforms = list(uniforms)
        self.token = token
        self.drawn: list[torch.Tensor] = []
        self.uniform_calls = 0

    def uniform(self, device):
        # The rule asks for the coins of the device its probabilities live on.
        assert isinstance(device, torch.device) and device.type == "cpu", device
        self.uniform_calls += 1
        return self.uniforms.pop(0)

    def draw(self, probs, position=None):
        self.drawn.append(probs.clone())
        return int(torch.argmax(probs)) if self.token is None else self.token


def logits_of(*rows):
    """Logits whose softmax (temperature 1) is each given distribution."""
    return torch.log(torch.tensor(rows, dtype=torch.float32))


P = [0.5, 0.3, 0.2, 0.0]  # a target row: token 3 impossible
P2 = [0.1, 0.2, 0.3, 0.4]
P3 = [0.25, 0.25, 0.25, 0.25]


# --- Verdict ---------------------------------------------------------------------------------


def test_verdict_kept_is_the_prefix_for_chains_and_the_path_for_trees():
    assert Verdict(3, 7).kept() == [0, 1, 2]
    assert Verdict(0, 7).kept() == []
    assert Verdict(2, None, [0, 4]).kept() == [0, 4]
    assert Verdict(0, 1, []).kept() == []
    assert Verdict(2, 5).path is None


def test_the_base_rule_is_abstract():
    with pytest.raises(NotImplementedError):
        AcceptanceRule().verify(Proposal([1]), logits_of(P, P), T1, ScriptedSampler())


# --- SpeculativeRule, chains, greedy ---------------------------------------------------------------


def test_greedy_chain_keeps_the_longest_agreeing_prefix_and_adds_the_target_token():
    logits = logits_of(P2, P, P3[:3] + [0.26], P2)  # argmaxes: 3, 0, 3, 3
    rule = SpeculativeRule()
    assert rule.verify(Proposal([3, 0, 3]), logits, GREEDY, None) == Verdict(3, 3)
    assert rule.verify(Proposal([3, 0, 1]), logits, GREEDY, None) == Verdict(2, 3)
    assert rule.verify(Proposal([3, 1, 3]), logits, GREEDY, None) == Verdict(1, 0)
    assert rule.verify(Proposal([2, 0, 3]), logits, GREEDY, None) == Verdict(0, 3)
    # A later agreement after a disagreement does not count.
    assert rule.verify(Proposal([0, 0, 3]), logits, GREEDY, None) == Verdict(0, 3)
    # No proposal: a plain step.
    assert rule.verify(Proposal([]), logits[:1], GREEDY, None) == Verdict(0, 3)


def test_greedy_verification_reads_only_the_rows_up_to_the_first_mismatch(monkeypatch):
    """An argmax over a real vocabulary costs microseconds a row, and most rounds stop early: the
    rows after the first disagreement (or past a tree's path) are never read."""
    from draftlab.verify import rules

    read: list[int] = []

    def counting(rows):
        read.append(rows.shape[0])
        return argmax_rows(rows)

    monkeypatch.setattr(rules, "argmax_rows", counting)
    logits = logits_of(P2, P, P3[:3] + [0.26], P2, P, P2)  # argmaxes: 3, 0, 3, 3, 0, 3
    assert SpeculativeRule().verify(Proposal([3, 1, 3, 3, 0]), logits, GREEDY, None) == Verdict(1, 0)
    assert sum(read) == 2
    read.clear()
    tree = Proposal([3, 2, 0, 1, 1], parents=[-1, -1, 0, 0, 2])  # the path 3, 0 is the target's
    assert SpeculativeRule().verify(tree, logits, GREEDY, None) == Verdict(2, 3, [0, 2])
    assert sum(read) == 3


def test_greedy_rules_read_the_argmax_a_pass_made_instead_of_its_logits(monkeypatch):
    """A compiled pass returns each row's argmax (models/compiled.py): greedy verification then reads
    no logits at all. The ids given here disagree with the logits on purpose, so a rule that read
    the logits would give another verdict."""
    from draftlab.verify import rules

    read: list[int] = []
    monkeypatch.setattr(rules, "argmax_rows", lambda rows: read.append(1) or argmax_rows(rows))
    logits = logits_of(P2, P, P3[:3] + [0.26], P2)  # argmaxes 3, 0, 3, 3
    made = [3, 1, 2, 0]
    rule = SpeculativeRule()
    assert rule.verify(Proposal([3, 0, 3]), logits, GREEDY, None) == Verdict(3, 3)
    read.clear()
    assert rule.verify(Proposal([3, 0, 3]), logits, GREEDY, None, argmax=made) == Verdict(1, 1)
    assert rule.verify(Proposal([3, 1, 2]), logits, GREEDY, None, argmax=made) == Verdict(3, 0)
    tree = Proposal([3, 1, 2], parents=[-1, 0, -1])  # root -> 3 -> 1; root -> 2
    assert rule.verify(tree, logits, GREEDY, None) == Verdict(1, 0, [0])
    read.clear()
    assert rule.verify(tree, logits, GREEDY, None, argmax=made) == Verdict(2, 2, [0, 1])
    assert BildRule().verify(Proposal([]), logits[:1], GREEDY, None, argmax=made) == Verdict(0, 3)
    fell_back = Proposal([2], fell_back=True)
    assert BildRule(math.inf).verify(fell_back, logits[:2], GREEDY, None, argmax=made) == Verdict(1, 1)
    assert read == []


def test_greedy_bonus_token_is_the_row_after_the_last_accepted():
    logits = logits_of(P, P2)  # argmaxes 0, 3
    assert SpeculativeRule().verify(Proposal([0]), logits, GREEDY, None) == Verdict(1, 3)


# --- SpeculativeRule, chains, sampling -----------------------------------------------------------


def test_deterministic_draft_is_accepted_iff_u_is_below_p():
    p = warp_probs(logits_of(P, P), T1)
    p0 = p[0, 0].item()
    rule = SpeculativeRule()
    # u just below p(token): accepted, then the bonus token drawn from row 1.
    s = ScriptedSampler([p0 - 1e-6], token=2)
    assert rule.verify(Proposal([0]), logits_of(P, P), T1, s) == Verdict(1, 2)
    assert _close(s.drawn[0], p[1])
    # u == p(token) exactly: rejected (strict inequality), the residual drawn.
    s = ScriptedSampler([p0], token=1)
    assert rule.verify(Proposal([0]), logits_of(P, P), T1, s) == Verdict(0, 1)
    # u above: rejected.
    s = ScriptedSampler([p0 + 1e-3], token=1)
    assert rule.verify(Proposal([0]), logits_of(P, P), T1, s).accepted == 0


def test_a_deterministic_rejection_resamples_p_without_the_token():
    s = ScriptedSampler([0.9], token=2)
    verdict = SpeculativeRule().verify(Proposal([0, 1]), logits_of(P, P, P), T1, s)
    assert verdict == Verdict(0, 2)
    assert len(s.drawn) == 1
    assert _close(s.drawn[0], torch.tensor([0.0, 0.6, 0.4, 0.0]))


def test_draft_probabilities_scale_the_acceptance_test():
    # p(0) = 0.5, q(0) = 0.8: accept iff u < 0.625.
    q = torch.tensor([[0.8, 0.1, 0.05, 0.05]])
    proposal = Proposal([0], q)
    rule = SpeculativeRule()
    s = ScriptedSampler([0.6], token=1)
    assert rule.verify(proposal, logits_of(P, P2), T1, s) == Verdict(1, 1)
    assert _close(s.drawn[0], torch.tensor(P2))
    s = ScriptedSampler([0.65], token=1)
    assert rule.verify(proposal, logits_of(P, P2), T1, s) == Verdict(0, 1)
    # Residual: max(0, p − q) = [0, 0.2, 0.15, 0] normalised.
    assert _close(s.drawn[0], torch.tensor([0.0, 0.2 / 0.35, 0.15 / 0.35, 0.0]))


def test_q_below_p_is_always_accepted():
    # p(1) = 0.3 > q(1) = 0.1: any u < 1 accepts; u = 0.99 would reject if the rule divided by q.
    q = torch.tensor([[0.3, 0.1, 0.3, 0.3], [0.25, 0.25, 0.25, 0.25]])
    s = ScriptedSampler([0.99, 0.99], token=0)
    verdict = SpeculativeRule().verify(Proposal([1, 0], q), logits_of(P, P, P3), T1, s)
    assert verdict == Verdict(2, 0)
    assert s.uniform_calls == 2
    assert _close(s.drawn[0], torch.tensor(P3))


def test_the_second_position_uses_its_own_row_of_p_and_q():
    q = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.0, 0.0, 0.1, 0.9]])
    # Row 0: p = q, accepted for any u. Row 1: p(3) = 0.4, q(3) = 0.9: accept iff u < 4/9.
    rule = SpeculativeRule()
    s = ScriptedSampler([0.999, 0.4], token=0)
    assert rule.verify(Proposal([0, 3], q), logits_of(P, P2, P3), T1, s) == Verdict(2, 0)
    s = ScriptedSampler([0.999, 0.5], token=0)
    assert rule.verify(Proposal([0, 3], q), logits_of(P, P2, P3), T1, s) == Verdict(1, 0)
    # Row 1's residual: max(0, P2 − q1) = [0.1, 0.2, 0.2, 0] normalised.
    assert _close(s.drawn[0], torch.tensor([0.2, 0.4, 0.4, 0.0]))


def test_sampling_respects_the_warp():
    # Top-k 1: p is one-hot on token 0, so token 1 is rejected whatever u is, and the residual is p.
    params = SamplingParams(temperature=1.0, top_k=1)
    s = ScriptedSampler([0.0], token=0)
    assert SpeculativeRule().verify(Proposal([1]), logits_of(P, P), params, s) == Verdict(0, 0)
    assert _close(s.drawn[0], torch.tensor([1.0, 0.0, 0.0, 0.0]))


def test_chain_output_follows_the_target_distribution():
    """Direct calls with a real sampler: the first emitted token is distributed as p."""
    p_row = [0.4, 0.3, 0.2, 0.1]
    logits = logits_of(p_row, P3)
    q_row = torch.tensor([0.1, 0.1, 0.2, 0.6])
    rule = SpeculativeRule()
    sampler = Sampler(0)
    gen = torch.Generator().manual_seed(1)
    counts = Counter()
    n = 4000
    for _ in range(n):
        token = int(torch.multinomial(q_row, 1, generator=gen))
        verdict = rule.verify(Proposal([token], q_row[None]), logits, T1, sampler)
        counts[token if verdict.accepted else verdict.next_token] += 1
    for t, expect in enumerate(p_row):
        assert abs(counts[t] / n - expect) < 0.03, (t, counts)


# --- residual ---------------------------------------------------------------------------------


def test_residual_of_a_deterministic_draft_zeroes_its_token():
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    out = SpeculativeRule.residual(p, Proposal([1]), 0, 1)
    assert _close(out, torch.tensor([0.5 / 0.7, 0.0, 0.2 / 0.7, 0.0]))
    assert torch.equal(p, torch.tensor([0.5, 0.3, 0.2, 0.0]))  # the input row is not modified


def test_residual_is_max_of_p_minus_q_normalised_and_uses_row_i():
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.2, 0.4, 0.1, 0.3]])
    out = SpeculativeRule.residual(p, Proposal([9, 1], q), 1, 1)
    assert _close(out, torch.tensor([0.3 / 0.4, 0.0, 0.1 / 0.4, 0.0]))
    assert out.sum().item() == pytest.approx(1.0, abs=sum_tol(out.shape[-1] + 2))


def test_residual_when_p_equals_q_is_p_itself():
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    out = SpeculativeRule.residual(p, Proposal([0], p[None].clone()), 0, 0)
    assert torch.equal(out, p)
    # One-hot p and a deterministic draft of that token: nothing left, p itself.
    one = torch.tensor([0.0, 1.0, 0.0])
    assert torch.equal(SpeculativeRule.residual(one, Proposal([1]), 0, 1), one)


# --- SpeculativeRule, trees ----------------------------------------------------------------------

#        root
#       /    \
#     0:a    1:b
#     /  \     \
#   2:c  3:d   4:e
TREE_TOKENS = [0, 1, 2, 3, 1]
TREE_PARENTS = [-1, -1, 0, 0, 1]


def test_greedy_tree_follows_the_target_argmax_through_any_branch():
    rule = SpeculativeRule()
    # rows: root -> 1, node0 -> 3, node1 -> 1, node2 -> 0, node3 -> 2, node4 -> 2
    rows = [[0.1, 0.6, 0.2, 0.1], [0.1, 0.1, 0.1, 0.7], [0.1, 0.6, 0.2, 0.1]]
    rows += [[0.7, 0.1, 0.1, 0.1], [0.1, 0.1, 0.7, 0.1], [0.1, 0.1, 0.7, 0.1]]
    verdict = rule.verify(Proposal(TREE_TOKENS, parents=TREE_PARENTS), logits_of(*rows), GREEDY, None)
    assert verdict == Verdict(2, 2, [1, 4])
    assert verdict.kept() == [1, 4]
    # The root wants 0: through node 0, whose row wants 3 = node 3, a leaf whose row wants 2.
    rows[0] = [0.7, 0.1, 0.1, 0.1]
    verdict = rule.verify(Proposal(TREE_TOKENS, parents=TREE_PARENTS), logits_of(*rows), GREEDY, None)
    assert verdict == Verdict(2, 2, [0, 3])
    # The root wants a token no child has: nothing kept.
    rows[0] = [0.1, 0.1, 0.1, 0.7]
    verdict = rule.verify(Proposal(TREE_TOKENS, parents=TREE_PARENTS), logits_of(*rows), GREEDY, None)
    assert verdict == Verdict(0, 3, [])


def test_tree_tries_siblings_in_order_against_the_residual():
    rule = SpeculativeRule()
    proposal = Proposal(TREE_TOKENS, parents=TREE_PARENTS)
    rows = [P, P3, P2, P3, P3, P3]  # row 0: the root's children; row i + 1: node i's
    # Root: p = P. Child 0 (token 0, p 0.5) rejected at u = 0.6; the residual is [0, .6, .4, 0];
    # child 1 (token 1) accepted at u = 0.55 < 0.6. Node 1's row is P2; its child 4 (token 1,
    # p 0.2) is rejected at u = 0.3; the residual [0.1, 0, 0.3, 0.4] / 0.8 is drawn.
    s = ScriptedSampler([0.6, 0.55, 0.3], token=3)
    verdict = rule.verify(proposal, logits_of(*rows), T1, s)
    assert verdict == Verdict(1, 3, [1])
    assert s.uniform_calls == 3
    assert _close(s.drawn[0], torch.tensor([0.125, 0.0, 0.375, 0.5]))


def test_tree_rejection_of_every_child_draws_the_final_residual():
    rule = SpeculativeRule()
    proposal = Proposal(TREE_TOKENS, parents=TREE_PARENTS)
    rows = [P, P2, P3, P3, P3, P2]
    # Child 0 rejected (u 0.6 ≥ 0.5); child 1 against [0, .6, .4, 0]: rejected at u = 0.7.
    s = ScriptedSampler([0.6, 0.7], token=2)
    verdict = rule.verify(proposal, logits_of(*rows), T1, s)
    assert verdict == Verdict(0, 2, [])
    assert _close(s.drawn[0], torch.tensor([0.0, 0.0, 1.0, 0.0]))


def test_tree_accepts_down_to_a_leaf_and_draws_the_bonus_from_its_row():
    rule = SpeculativeRule()
    proposal = Proposal(TREE_TOKENS, parents=TREE_PARENTS)
    rows = [P, P2, P3, P3, [0.0, 0.0, 0.0, 1.0], P2]
    # Child 0 accepted (u 0.1 < 0.5); node 0's row P2: child 2 (token 2, p 0.3) rejected at 0.5,
    # child 3 (token 3) against [1/7, 2/7, 0, 4/7]: accepted at 0.5 < 4/7. Node 3 is a leaf.
    s = ScriptedSampler([0.1, 0.5, 0.5], token=None)
    verdict = rule.verify(proposal, logits_of(*rows), T1, s)
    assert verdict == Verdict(2, 3, [0, 3])
    assert _close(s.drawn[0], torch.tensor([0.0, 0.0, 0.0, 1.0]))


def test_tree_with_draft_probabilities_uses_each_nodes_row():
    rule = SpeculativeRule()
    q = torch.tensor(
        [[0.9, 0.1, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.25] * 4, [0.25] * 4, [0.0, 0.5, 0.5, 0.0]]
    )
    proposal = Proposal(TREE_TOKENS, q, parents=TREE_PARENTS)
    rows = [P, P3, P2, P3, P3, P2]
    # Child 0: p 0.5, q 0.9: accept iff u < 5/9; u = 0.6 rejects. Residual: max(0, P − q0) =
    # [0, 0.2, 0.2, 0] → [0, .5, .5, 0]. Child 1: p 0.5, q(1) = 1: u = 0.45 accepts.
    # Node 1 (row P2): child 4 token 1, p 0.2, q 0.5: u = 0.35 → 0.175 < 0.2 accepts.
    s = ScriptedSampler([0.6, 0.45, 0.35], token=None)
    verdict = rule.verify(proposal, logits_of(*rows), T1, s)
    assert verdict == Verdict(2, 3, [1, 4])
    assert _close(s.drawn[0], torch.tensor(P2))
    # The same with u = 0.45 at node 4: 0.225 ≥ 0.2 rejects; residual max(0, P2 − q4) normalised.
    s = ScriptedSampler([0.6, 0.45, 0.45], token=None)
    verdict = rule.verify(proposal, logits_of(*rows), T1, s)
    assert verdict == Verdict(1, 3, [1])
    assert _close(s.drawn[0], torch.tensor([0.2, 0.0, 0.0, 0.8]))


def test_tree_acceptance_boundary_is_strict():
    p = warp_probs(logits_of(P), T1)[0]
    proposal = Proposal([0, 1], parents=[-1, -1])
    s = ScriptedSampler([p[0].item(), 0.0], token=None)
    verdict = SpeculativeRule().verify(proposal, logits_of(P, P, P), T1, s)
    assert verdict.path == [1]


def test_a_chain_with_explicit_parents_is_not_a_tree():
    proposal = Proposal([0, 1], parents=[-1, 0])
    assert not proposal.is_tree
    verdict = SpeculativeRule().verify(proposal, logits_of(P, P2, P3), GREEDY, None)
    assert verdict == Verdict(1, 3)


def test_tree_output_follows_the_target_distribution():
    """Two deterministic candidates at the root, a real sampler: the emitted token is distributed as p."""
    p_row = [0.4, 0.3, 0.2, 0.1]
    logits = logits_of(p_row, P3, P3)
    rule = SpeculativeRule()
    sampler = Sampler(0)
    proposal = Proposal([3, 1], parents=[-1, -1])
    counts = Counter()
    n = 3000
    for _ in range(n):
        verdict = rule.verify(proposal, logits, T1, sampler)
        counts[proposal.tokens[verdict.path[0]] if verdict.path else verdict.next_token] += 1
    for t, expect in enumerate(p_row):
        assert abs(counts[t] / n - expect) < 0.03, (t, counts)


# --- BildRule ------------------------------------------------------------------------------------


def nll_logits(nlls, vocab=4):
    """Rows whose token 0 has the given negative log-likelihood (the rest shared evenly)."""
    rows = []
    for nll in nlls:
        p0 = math.exp(-nll)
        rest = (1 - p0) / (vocab - 1)
        rows.append([p0] + [rest] * (vocab - 1))
    return logits_of(*rows)


def test_bild_default_threshold_is_five_nats():
    rule = BildRule()
    assert rule.rollback_threshold == 5.0
    # nll 5.2 > 5 at position 1: rolled back there; nll 4.8 everywhere: kept.
    logits = nll_logits([0.1, 5.2, 0.1, 0.1])
    assert rule.verify(Proposal([0, 0, 0]), logits, GREEDY, None) == Verdict(1, 1)
    logits = nll_logits([0.1, 4.8, 4.8, 0.1])
    assert rule.verify(Proposal([0, 0, 0], fell_back=True), logits, GREEDY, None) == Verdict(3, 0)


def test_bild_rolls_back_at_the_first_token_above_the_threshold():
    rule = BildRule(rollback_threshold=1.0)
    logits = nll_logits([0.5, 2.0, 3.0, 0.1])
    # Greedy: the large model's argmax at the first bad position (token 1 of the even rest).
    assert rule.verify(Proposal([0, 0, 0]), logits, GREEDY, None) == Verdict(1, 1)
    s = ScriptedSampler(token=2)
    assert rule.verify(Proposal([0, 0, 0]), logits, T1, s) == Verdict(1, 2)
    assert _close(s.drawn[0], warp_probs(logits[1], T1))
    # The first position bad: nothing kept.
    assert rule.verify(Proposal([0, 0, 0]), nll_logits([2.0, 2.0, 0.1, 0.1]), GREEDY, None) == Verdict(0, 1)


def test_bild_threshold_is_strict():
    logits = nll_logits([0.5, 0.5])
    nll = -torch.log_softmax(logits.float(), dim=-1)[0, 0].item()
    # nll exactly at the threshold: not a rollback; the small model keeps the pen (no fallback).
    assert BildRule(rollback_threshold=nll).verify(Proposal([0]), logits, GREEDY, None) == Verdict(1, None)
    assert BildRule(rollback_threshold=nll * 0.99).verify(Proposal([0]), logits, GREEDY, None) == Verdict(
        0, 0
    )


def test_bild_checks_the_proposed_tokens_not_token_zero():
    # Row 0 likes token 2 (nll small), token 0 unlikely.
    logits = logits_of([0.001, 0.001, 0.997, 0.001], P3)
    rule = BildRule(rollback_threshold=1.0)
    assert rule.verify(Proposal([2]), logits, GREEDY, None) == Verdict(1, None)
    assert rule.verify(Proposal([0]), logits, GREEDY, None) == Verdict(0, 2)


def test_bild_fallback_and_empty_proposals_let_the_large_model_write():
    logits = torch.cat([nll_logits([0.1, 0.1]), logits_of(P2)])  # the row after the block wants 3
    rule = BildRule(rollback_threshold=1.0)
    assert rule.verify(Proposal([0, 0], fell_back=True), logits, GREEDY, None) == Verdict(2, 3)
    s = ScriptedSampler(token=1)
    assert rule.verify(Proposal([0, 0], fell_back=True), logits, T1, s) == Verdict(2, 1)
    assert _close(s.drawn[0], warp_probs(logits[2], T1))
    assert rule.verify(Proposal([]), logits[2:], GREEDY, None) == Verdict(0, 3)
    # Confident and not fallen back: no target token.
    assert rule.verify(Proposal([0, 0]), logits, GREEDY, None) == Verdict(2, None)


def test_bild_infinite_threshold_never_rolls_back():
    logits = torch.cat([nll_logits([9.0, 9.0]), logits_of(P2)])
    rule = BildRule(rollback_threshold=float("inf"))
    assert rule.verify(Proposal([0, 0]), logits, GREEDY, None) == Verdict(2, None)
    assert rule.verify(Proposal([0, 0], fell_back=True), logits, GREEDY, None) == Verdict(2, 3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_argmax_rows_is_torch_argmax_first_of_ties(dtype):
    """Greedy verification's argmax (numpy's on CPU, over half precision widened to float32) picks
    what torch.argmax picks: the first of equal maxima, in every row (-0 ties +0); a NaN wins."""
    from draftlab.sampling import argmax_rows

    gen = torch.Generator().manual_seed(0)
    logits = torch.randint(-3, 4, (64, 50), generator=gen).to(dtype)  # small ints: many tied maxima
    logits[5, 7] = float("nan")
    logits[6] = -1.0
    logits[6, 2], logits[6, 4] = -0.0, 0.0
    want = torch.argmax(logits, dim=-1).tolist()
    assert want[5] == 7 and want[6] == 2 and len(set(want)) > 1
    assert argmax_rows(logits) == want
    assert argmax_rows(logits[3]) == [want[3]]
    with torch.inference_mode():  # the decode loop's logits are inference tensors
        assert argmax_rows(logits.clone()) == want
