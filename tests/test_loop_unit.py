"""The decode loop against scripted models: every round's bookkeeping, without a real network.

The fake target's greedy next token after t is NEXT[t]; the fake proposers draft from their own
table, so which tokens are accepted, and when, is known in advance.
"""

from __future__ import annotations

import dataclasses
import time
from types import SimpleNamespace

import pytest
import torch

from draftlab.decode.loop import SpeculativeDecoder
from draftlab.decode.round_sizer import Choice
from draftlab.decode.stats import Generation, GenerationStats
from draftlab.decode.tree_sizer import TreeSizer
from draftlab.errors import DraftlabError
from draftlab.proposal import Proposal
from draftlab.proposers.base import Proposer
from draftlab.sampling import Sampler, SamplingParams
from draftlab.verify.rules import BildRule, SpeculativeRule

V = 16
EOS = 1
GREEDY = SamplingParams()


def nxt(t: int) -> int:
    """The target's greedy successor: 2 → 3 → … → 15 → 2 (never the end token)."""
    return 2 + (t - 1) % (V - 2)


class FakeTokenizer:
    def decode(self, tokens, skip_special_tokens=False):
        return " ".join(str(t) for t in tokens if not (skip_special_tokens and t == EOS))


class FakeTarget:
    """Enough of CachedModel for the loop: a cache of tokens and one-hot-ish greedy logits."""

    def __init__(self, table=None, trees=True, context_length=None, encoder_decoder=False, peak=10.0):
        self.table = table or {}
        self.peak = peak
        self.trees_fed: list = []
        self.trees = trees
        self.device = torch.device("cpu")
        self.forward_calls = 0
        self.lm = SimpleNamespace(
            tokenizer=FakeTokenizer(),
            eos_token_ids={EOS},
            context_length=context_length,
            is_encoder_decoder=encoder_decoder,
            spec=SimpleNamespace(dtype="float32"),
        )
        self.cache: list[int] = []
        self.fed: list[list[int]] = []
        self.kept_paths: list[tuple[int, list[int]]] = []
        self.crops: list[int] = []

    def next_token(self, t: int) -> int:
        return self.table.get(t, nxt(t))

    @property
    def length(self) -> int:
        return len(self.cache)

    def supports_trees(self) -> bool:
        return self.trees

    def start(self, prompt_ids):
        self.cache = []
        return list(prompt_ids)

    def forward(self, fed, keep, tree=None):
        self.forward_calls += 1
        self.fed.append(list(fed))
        self.trees_fed.append(tree)
        self.cache += fed
        logits = torch.zeros(keep, V)
        for row, t in enumerate(self.cache[-keep:]):
            logits[row, self.next_token(t)] = self.peak
        return logits

    def keep_path(self, base, path):
        self.kept_paths.append((base, list(path)))
        self.cache = self.cache[:base] + [self.cache[base + i] for i in path]

    def crop(self, length):
        self.crops.append(length)
        self.cache = self.cache[:length]


class TableProposer(Proposer):
    """Drafts k tokens, each the table's successor of the one before (the target's unless overridden)."""

    def __init__(self, table=None, fell_back=False, kind=None, delay=0.0):
        self.table = table or {}
        self.fell_back = fell_back
        self.kind = kind
        self.delay = delay  # seconds each proposal takes
        self.calls: list[tuple[int, int]] = []
        self.rollbacks: list[int] = []
        self.finished = None
        self.started = None
        self.samplers: list[Sampler] = []

    def start(self, prompt_ids, prefix):
        self.started = (list(prompt_ids), list(prefix))

    def check(self, params, sampler):
        """The loop hands the proposer the generation's own parameters and sampler."""
        assert isinstance(params, SamplingParams), params
        assert isinstance(sampler, Sampler), sampler
        assert sampler.seed == params.seed
        self.samplers.append(sampler)
        if self.delay:
            time.sleep(self.delay)

    def propose(self, sequence, k, params, sampler):
        self.check(params, sampler)
        self.calls.append((len(sequence), k))
        self.forward_calls += k
        out, t = [], sequence[-1]
        for _ in range(k):
            t = self.table.get(t, nxt(t))
            out.append(t)
        return Proposal(out, fell_back=self.fell_back, kind=self.kind)

    def rollback(self, length):
        self.rollbacks.append(length)

    def finish(self, prompt_ids, output_ids):
        self.finished = (list(prompt_ids), list(output_ids))

    def info(self):
        return {"name": "table"}


def chain(start: int, n: int, table=None) -> list[int]:
    out, t = [], start
    for _ in range(n):
        t = (table or {}).get(t, nxt(t))
        out.append(t)
    return out


# --- GenerationStats ---------------------------------------------------------------------------


def test_stats_ratios():
    s = GenerationStats(new_tokens=12, rounds=4, drafted=10, accepted=7, draft_tokens_kept=6)
    s.prefill_s, s.decode_s = 1.0, 2.0
    assert s.total_s == 3.0
    assert s.acceptance_rate == 0.7
    assert s.mean_accepted_length == 3.0
    assert s.draft_share == 0.5
    assert s.tokens_per_s == 4.0


def test_stats_ratios_are_none_without_a_denominator():
    s = GenerationStats()
    assert s.acceptance_rate is None
    assert s.mean_accepted_length is None
    assert s.draft_share is None
    assert s.tokens_per_s is None
    assert s.total_s == 0.0
    # A zero numerator is a real 0, not None.
    s = GenerationStats(drafted=3, rounds=2, new_tokens=2, prefill_s=0.5)
    assert s.acceptance_rate == 0.0
    assert s.mean_accepted_length == 1.0
    assert s.draft_share == 0.0
    assert s.tokens_per_s == 4.0


def test_record_round_counts_per_position():
    s = GenerationStats()
    s.record_round(3, 1)
    s.record_round(2, 2)
    s.record_round(0, 0)
    s.record_round(4, 0)
    assert s.rounds == 4
    assert s.drafted == 9 and s.accepted == 3
    assert s.drafted_per_position == [3, 3, 2, 1]
    assert s.accepted_per_position == [2, 1, 0, 0]


def test_record_choice_counts_k_and_sums_the_predictions():
    s = GenerationStats()
    s.record_choice(2, 2.5, 10.0, 3.0, False)
    s.record_choice(0, 1.0, 3.0, 3.0, True)
    s.record_choice(2, 1.5, 8.0, 2.0, False)
    assert s.k_counts == [1, 0, 2]
    assert s.probes == 1
    assert s.predicted_tokens == 5.0
    assert s.predicted_ms == 21.0
    assert s.predicted_plain_ms == 2.5 * 3.0 + 1.0 * 3.0 + 1.5 * 2.0
    s.record_choice(4, 1.0, 1.0, 1.0, True)
    assert s.k_counts == [1, 0, 2, 0, 1]
    assert s.probes == 2


def test_record_tree_counts_nodes_and_branch_wins():
    s = GenerationStats()
    tree = Proposal([5, 6, 7, 8], parents=[-1, -1, 0, 1])  # first-child chain: 0, 2
    s.record_tree(tree, [0, 2])
    s.record_tree(tree, [0])
    s.record_tree(tree, [])
    assert (s.tree_rounds, s.tree_nodes, s.branch_wins) == (3, 12, 0)
    s.record_tree(tree, [1, 3])
    s.record_tree(tree, [1])
    assert (s.tree_rounds, s.tree_nodes, s.branch_wins) == (5, 20, 2)
    # A plain step (no node) is not a tree round.
    s.record_tree(Proposal(parents=[]), [])
    assert (s.tree_rounds, s.tree_nodes, s.branch_wins) == (5, 20, 2)


def test_to_dict_has_the_fields_and_the_derived_figures():
    s = GenerationStats(new_tokens=6, rounds=3, drafted=4, accepted=2, draft_tokens_kept=3, prefill_s=2.0)
    s.record_round(2, 1)
    d = s.to_dict()
    assert d["new_tokens"] == 6 and d["drafted"] == 6 and d["rounds"] == 4
    assert d["drafted_per_position"] == [1, 1]
    assert d["total_s"] == 2.0
    assert d["acceptance_rate"] == 0.5
    assert d["mean_accepted_length"] == 1.5
    assert d["draft_share"] == 0.5
    assert d["tokens_per_s"] == 3.0
    assert d["k_counts"] == [] and d["tree_rounds"] == 0


# --- construction and prompt checks --------------------------------------------------------------


def test_gamma_must_be_positive():
    with pytest.raises(DraftlabError, match="gamma"):
        SpeculativeDecoder(FakeTarget(), TableProposer(), SpeculativeRule(), gamma=0)
    assert SpeculativeDecoder(FakeTarget(), TableProposer(), SpeculativeRule(), gamma=1).gamma == 1


def test_the_default_gamma_drafts_four_tokens_a_round():
    proposer = TableProposer()
    out = SpeculativeDecoder(FakeTarget(), proposer, SpeculativeRule()).generate([5], 10, GREEDY)
    assert proposer.calls == [(1, 4), (6, 4)]
    assert out.tokens == chain(5, 10)


def test_check_prompt():
    dec = SpeculativeDecoder(FakeTarget(context_length=10), TableProposer(), SpeculativeRule())
    with pytest.raises(DraftlabError, match="^empty prompt$"):
        dec.check_prompt([], 5)
    with pytest.raises(DraftlabError, match="max_new_tokens must be >= 1, got 0"):
        dec.check_prompt([3], 0)
    dec.check_prompt([3], 1)
    dec.check_prompt([3] * 5, 5)  # exactly the context
    with pytest.raises(
        DraftlabError, match="prompt of 5 tokens plus max_new_tokens=6 exceeds the model's context of 10"
    ):
        dec.check_prompt([3] * 5, 6)
    # Encoder-decoder: the prompt goes to the encoder, only it counts.
    enc = SpeculativeDecoder(
        FakeTarget(context_length=10, encoder_decoder=True), TableProposer(), SpeculativeRule()
    )
    enc.check_prompt([3] * 10, 100)
    with pytest.raises(DraftlabError):
        enc.check_prompt([3] * 11, 1)
    # No known context: anything goes.
    SpeculativeDecoder(FakeTarget(), TableProposer(), SpeculativeRule()).check_prompt([3] * 1000, 1000)


def test_generate_checks_the_prompt_first():
    dec = SpeculativeDecoder(FakeTarget(), TableProposer(), SpeculativeRule())
    with pytest.raises(DraftlabError):
        dec.generate([], 4, GREEDY)
    with pytest.raises(DraftlabError):
        dec.generate([3], 0, GREEDY)


def test_the_clock_waits_for_the_cuda_devices_of_target_and_draft():
    """The devices a clock reading synchronizes: the CUDA ones among the target's and the draft
    model's, once each (a CPU's work is done when its call returns)."""
    dec = SpeculativeDecoder(FakeTarget(), TableProposer(), SpeculativeRule())
    assert dec._devices() == []
    proposer = TableProposer()
    proposer.draft = SimpleNamespace(device=torch.device("cuda", 1))
    dec = SpeculativeDecoder(FakeTarget(), proposer, SpeculativeRule())
    assert dec._devices() == [torch.device("cuda", 1)]
    target = FakeTarget()
    target.device = torch.device("cuda", 1)
    assert SpeculativeDecoder(target, proposer, SpeculativeRule())._devices() == [torch.device("cuda", 1)]


# --- generate: chains ------------------------------------------------------------------------------


def test_plain_decoding_is_one_token_a_round():
    target = FakeTarget()
    proposer = TableProposer()
    dec = SpeculativeDecoder(target, proposer, SpeculativeRule(), gamma=1)
    proposer.propose = lambda sequence, k, params, sampler: Proposal()
    out = dec.generate([2, 5], 4, GREEDY)
    assert isinstance(out, Generation)
    assert out.tokens == [6, 7, 8, 9]
    assert out.text == "6 7 8 9"
    s = out.stats
    assert (s.prompt_tokens, s.new_tokens, s.rounds, s.target_calls) == (2, 4, 4, 4)
    assert (s.drafted, s.accepted, s.draft_tokens_kept, s.rollbacks) == (0, 0, 0, 0)
    assert s.mean_accepted_length == 1.0
    assert s.first_tokens == 1
    assert s.dtype == "float32"
    # Round 1 feeds the whole prompt, later rounds the one token the target lacks.
    assert target.fed == [[2, 5], [6], [7], [8]]
    assert target.crops == [2, 3, 4, 5]


def test_a_perfect_draft_is_kept_with_a_bonus_token_and_the_budget_caps_the_last_round():
    target, proposer = FakeTarget(), TableProposer()
    dec = SpeculativeDecoder(target, proposer, SpeculativeRule(), gamma=3)
    out = dec.generate([2, 5], 10, GREEDY)
    assert out.tokens == chain(5, 10)
    # Rounds of 3 + bonus, 3 + bonus, then 2 left: 2 drafted (the bonus is cut by the budget).
    assert proposer.calls == [(2, 3), (6, 3), (10, 2)]
    s = out.stats
    assert (s.rounds, s.drafted, s.accepted, s.draft_tokens_kept) == (3, 8, 8, 8)
    assert s.first_tokens == 4
    assert s.rollbacks == 0
    assert s.target_calls == 3 and s.draft_calls == 8
    assert s.propose_calls == 8
    assert s.drafted_per_position == [3, 3, 2] and s.accepted_per_position == [3, 3, 2]
    assert target.fed == [[2, 5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15]]
    assert target.crops == [5, 9, 11]
    assert proposer.rollbacks == [5, 9, 11]
    assert proposer.finished == ([2, 5], out.tokens)
    assert s.proposer_info == {"name": "table"}
    assert s.tree_fallback is None
    assert s.prefill_s > 0 and s.decode_s > 0
    assert s.propose_s > 0


def test_a_wrong_draft_token_is_corrected_by_the_target():
    # The draft thinks 7 follows 6; the target says 7 → 8 … , and 6 → 7. Draft: 6, 9?, …
    proposer = TableProposer({6: 9})
    target = FakeTarget()
    dec = SpeculativeDecoder(target, proposer, SpeculativeRule(), gamma=3)
    out = dec.generate([5], 6, GREEDY)
    assert out.tokens == chain(5, 6)
    s = out.stats
    # Round 1 drafts 6, 9, 10: keeps 6, corrects to 7. Round 2 from 7: 8 9 10 + bonus 11 (budget 4).
    assert proposer.calls == [(1, 3), (3, 3)]
    assert (s.rounds, s.drafted, s.accepted) == (2, 6, 4)
    assert s.rollbacks == 1
    assert s.draft_tokens_kept == 4  # 6; then 8, 9, 10 (11 is the target's)
    assert s.first_tokens == 2
    assert s.accepted_per_position == [2, 1, 1]


def test_draft_tokens_kept_counts_only_what_the_budget_keeps():
    proposer = TableProposer()
    dec = SpeculativeDecoder(FakeTarget(), proposer, SpeculativeRule(), gamma=4)
    out = dec.generate([5], 2, GREEDY)
    assert out.tokens == [6, 7]
    assert out.stats.draft_tokens_kept == 2
    assert proposer.calls == [(1, 2)]


def test_generation_stops_at_an_end_token_and_nothing_past_it_is_verified():
    target = FakeTarget({8: EOS})
    proposer = TableProposer({8: EOS})
    dec = SpeculativeDecoder(target, proposer, SpeculativeRule(), gamma=6)
    out = dec.generate([5], 20, GREEDY)
    assert out.tokens == [6, 7, 8, EOS]
    assert out.text == "6 7 8"
    s = out.stats
    # The draft's 6 7 8 EOS 2 3 is cut after EOS: 4 tokens verified, all accepted, no bonus kept.
    assert target.fed == [[5, 6, 7, 8, EOS]]
    assert (s.rounds, s.drafted, s.accepted, s.new_tokens) == (1, 4, 4, 4)
    assert s.draft_tokens_kept == 4


def test_the_targets_end_token_ends_the_generation():
    target = FakeTarget({7: EOS})
    dec = SpeculativeDecoder(target, TableProposer({7: 3}), SpeculativeRule(), gamma=2)
    out = dec.generate([5], 20, GREEDY)
    assert out.tokens == [6, 7, EOS]
    assert out.stats.rounds == 1
    assert out.stats.draft_tokens_kept == 2


def test_an_end_token_in_the_prompt_does_not_stop_the_first_round():
    dec = SpeculativeDecoder(FakeTarget(), TableProposer(), SpeculativeRule(), gamma=2)
    out = dec.generate([5, EOS], 3, GREEDY)
    assert out.tokens == [2, 3, 4]


def test_bild_counts_fallbacks_and_keeps_the_pen_without_one():
    proposer = TableProposer(fell_back=True)
    dec = SpeculativeDecoder(FakeTarget(), proposer, BildRule(), gamma=2)
    out = dec.generate([5], 6, GREEDY)
    assert out.tokens == chain(5, 6)
    assert out.stats.fallbacks == 2 and out.stats.rollbacks == 0
    # Without a fallback the small model keeps the pen: no target token, drafts only.
    proposer = TableProposer()
    out = SpeculativeDecoder(FakeTarget(), proposer, BildRule(), gamma=2).generate([5], 6, GREEDY)
    assert out.tokens == chain(5, 6)
    assert out.stats.fallbacks == 0 and out.stats.rounds == 3
    assert out.stats.draft_tokens_kept == 6 and out.stats.draft_share == 1.0


# --- _cut_at_eos and _stop_at_eos ------------------------------------------------------------------


def test_cut_at_eos_for_chains():
    dec = SpeculativeDecoder(FakeTarget(), TableProposer(), SpeculativeRule())
    probs = torch.rand(4, V)
    cut = dec._cut_at_eos(Proposal([5, EOS, 7, 8], probs, fell_back=True, kind="3-gram"))
    assert cut.tokens == [5, EOS]
    assert torch.equal(cut.probs, probs[:2])
    assert cut.fell_back
    assert cut.kind == "3-gram"  # the sizer learns into the kind it chose for
    cut = dec._cut_at_eos(Proposal([EOS, 7]))
    assert cut.tokens == [EOS] and cut.probs is None
    whole = Proposal([5, 6, EOS])
    assert dec._cut_at_eos(whole) is whole
    plain = Proposal([5, 6])
    assert dec._cut_at_eos(plain) is plain


def test_cut_at_eos_for_trees_drops_every_descendant_of_an_end_token():
    dec = SpeculativeDecoder(FakeTarget(), TableProposer(), SpeculativeRule())
    #   0:EOS   1:5
    #   2:6     3:7 (child of 1)   4:8 (child of 2)
    tree = Proposal([EOS, 5, 6, 7, 8], parents=[-1, -1, 0, 1, 2])
    cut = dec._cut_at_eos(tree)
    assert cut.tokens == [EOS, 5, 7]
    assert cut.parents == [-1, -1, 1]
    kept = Proposal([5, EOS, 6], parents=[-1, 0, 0])
    assert dec._cut_at_eos(kept) is kept


def test_stop_at_eos():
    dec = SpeculativeDecoder(FakeTarget(), TableProposer(), SpeculativeRule())
    assert dec._stop_at_eos([3, EOS, 4, EOS]) == [3, EOS]
    assert dec._stop_at_eos([EOS, 4]) == [EOS]
    assert dec._stop_at_eos([3, 4]) == [3, 4]
    assert dec._stop_at_eos([]) == []


# --- trees -----------------------------------------------------------------------------------------


class TreeProposer(TableProposer):
    """A root with two children: the draft's wrong guess first, the target's token second."""

    makes_trees = True

    def propose(self, sequence, k, params, sampler):
        self.check(params, sampler)
        self.calls.append((len(sequence), k))
        right = nxt(sequence[-1])
        wrong = 1 if right != 1 else 2
        wrong = wrong if wrong != EOS else 0
        # 0: wrong, 1: right, 2: right's successor (child of 1), 3: child of 0
        return Proposal([wrong, right, nxt(right), 4], parents=[-1, -1, 1, 0], scores=[0.9, 0.5, 0.9, 0.1])


def test_a_tree_proposer_without_a_budget_verifies_its_first_chain():
    target, proposer = FakeTarget(), TreeProposer()
    dec = SpeculativeDecoder(target, proposer, SpeculativeRule(), gamma=2)
    assert dec.trees
    out = dec.generate([5], 4, GREEDY)
    assert out.tokens == chain(5, 4)
    # Top path: node 0 (wrong) then node 3: both verified as a chain of 2, the first rejected.
    assert target.fed[0] == [5, 0, 4]
    # Still a tree proposal (explicit parents), but a chain: no tree mask, no path to keep.
    assert out.stats.rounds == 4 and out.stats.tree_rounds == 4 and out.stats.tree_nodes == 8
    assert out.stats.branch_wins == 0 and out.stats.accepted == 0
    assert target.kept_paths == []


def test_a_tree_budget_keeps_the_best_nodes_and_the_accepted_path():
    target, proposer = FakeTarget(), TreeProposer()
    dec = SpeculativeDecoder(target, proposer, SpeculativeRule(), gamma=3, tree_budget=3)
    out = dec.generate([5], 6, GREEDY)
    assert out.tokens == chain(5, 6)
    # Path values: 0.9, 0.5, 0.45, 0.09: nodes 0, 1, 2 kept; the target takes 1 then 2, plus a bonus.
    assert target.fed[0] == [5, 0, 6, 7]
    assert target.kept_paths[0] == (1, [1, 2])
    assert proposer.calls == [(1, 3), (4, 3)]
    s = out.stats
    assert s.rounds == 2 and s.tree_rounds == 2 and s.tree_nodes == 6
    assert s.branch_wins == 2
    assert s.accepted == 4 and s.draft_tokens_kept == 4
    assert s.rollbacks == 2


def test_no_tree_support_falls_back_to_chains():
    sizer = TreeSizer.__new__(TreeSizer)
    dec = SpeculativeDecoder(FakeTarget(trees=False), TreeProposer(), SpeculativeRule(), tree_budget=3)
    assert not dec.trees and dec.tree_budget is None and dec.sizer is None
    assert dec.tree_fallback == "the target cannot verify token trees (no 4D-mask support): chains"
    out = dec.generate([5], 3, GREEDY)
    assert out.tokens == chain(5, 3)
    assert out.stats.tree_fallback == dec.tree_fallback
    # A tree sizer stays: it cuts the best chain to what pays (tests/engines/llamacpp/test_llamacpp.py runs it).
    dec = SpeculativeDecoder(FakeTarget(trees=False), TreeProposer(), SpeculativeRule(), sizer=sizer)
    assert not dec.trees and dec.sizer is sizer
    # The supporting target keeps all three.
    dec = SpeculativeDecoder(FakeTarget(), TreeProposer(), SpeculativeRule(), sizer=sizer, tree_budget=3)
    assert dec.trees and dec.tree_budget == 3 and dec.sizer is sizer and dec.tree_fallback is None
    # A chain sizer is kept on a target without trees.
    chain_sizer = SimpleNamespace()
    dec = SpeculativeDecoder(FakeTarget(trees=False), TreeProposer(), SpeculativeRule(), sizer=chain_sizer)
    assert dec.sizer is chain_sizer


# --- sized rounds -------------------------------------------------------------------------------------


class FakeSizer:
    """A RoundSizer's interface: scripted choices, and a log of everything the loop reports."""

    def __init__(self, ks, free_drafts=False, probe=False):
        self.ks = list(ks)
        self.free_drafts = free_drafts
        self.probe = probe
        self.log: list[tuple] = []
        self.times: list[float] = []
        self.propose_times: list[float] = []

    def start(self):
        self.log.append(("start",))

    def clock(self):
        return time.perf_counter()  # looked up per call: a test may replace it

    def choose(self, context, limit, kind=None, pending=2, remaining=None):
        k = min(self.ks.pop(0), limit)
        self.log.append(("choose", context, limit, kind, pending, remaining))
        return Choice(k, 1.0 + k, 2.0 + k, 1.5, self.probe and k == 0)

    def observe(self, drafted, accepted, kind=None, probe=False):
        self.log.append(("observe", drafted, accepted, kind, probe))

    def observe_gain(self, choice, accepted):
        self.log.append(("gain", choice.k, accepted))

    def observe_time(self, choice, ms, proposed_ms=0.0):
        self.times.append(ms)
        self.log.append(("time", choice.k, ms > 0))
        return choice.cost_ms  # what the profile predicted for the round

    def observe_propose_time(self, ms):
        self.propose_times.append(ms)
        self.log.append(("propose_time", ms >= 0))

    def look_share(self, context):
        return 0.0  # looking is cheap: every round proposes (pacing: test_pacing.py)


def test_a_sized_draft_model_round_proposes_the_chosen_k():
    proposer = TableProposer({7: 3})
    proposer.lag = lambda sequence: len(sequence) % 4
    sizer = FakeSizer([2, 0, 3])
    dec = SpeculativeDecoder(FakeTarget(), proposer, SpeculativeRule(), gamma=4, sizer=sizer)
    out = dec.generate([5], 7, GREEDY)
    assert out.tokens == chain(5, 7)
    # k = 2: 6 7 + 8; k = 0: a plain step (9), the proposer not asked; k = 3: 10 11 12 + 13 (budget 4).
    assert proposer.calls == [(1, 2), (5, 3)]
    s = out.stats
    assert s.k_counts == [1, 0, 1, 1]
    assert s.predicted_tokens == 3.0 + 1.0 + 4.0
    assert s.predicted_ms == 4.0 + 2.0 + 5.0
    assert s.predicted_plain_ms == 1.5 * 8.0
    assert s.probes == 0
    chooses = [e for e in sizer.log if e[0] == "choose"]
    # The tokens left to write come along: what a lagging draft's catch-up must be repaid over.
    assert chooses == [
        ("choose", 1, 7, None, 1, 7),
        ("choose", 4, 4, None, 0, 4),
        ("choose", 5, 3, None, 1, 3),
    ]
    observes = [e for e in sizer.log if e[0] == "observe"]
    assert observes == [
        ("observe", 2, 2, None, False),
        ("observe", 0, 0, None, False),
        ("observe", 3, 3, None, False),
    ]
    # Round 1 (the prefill) is not timed.
    assert [e for e in sizer.log if e[0] == "time"] == [("time", 0, True), ("time", 3, True)]
    assert sizer.log[0] == ("start",)


def test_probes_are_counted():
    sizer = FakeSizer([0, 0], probe=True)
    dec = SpeculativeDecoder(FakeTarget(), TableProposer(), SpeculativeRule(), sizer=sizer)
    out = dec.generate([5], 2, GREEDY)
    assert out.stats.probes == 2
    assert ("observe", 0, 0, None, True) in sizer.log


def test_free_drafts_propose_first_and_unused_ones_become_a_shadow():
    proposer = TableProposer({8: 3}, kind="n2")
    sizer = FakeSizer([0, 0, 0, 1, 5], free_drafts=True)
    dec = SpeculativeDecoder(FakeTarget(), proposer, SpeculativeRule(), gamma=3, sizer=sizer)
    out = dec.generate([5], 6, GREEDY)
    assert out.tokens == chain(5, 6)
    # Every round proposes γ (capped by the budget) first, then the sizer trims.
    assert proposer.calls == [(1, 3), (2, 3), (3, 3), (4, 3), (5, 2)]
    chooses = [e[1:4] for e in sizer.log if e[0] == "choose"]
    assert chooses == [(1, 3, "n2"), (2, 3, "n2"), (3, 3, "n2"), (4, 3, "n2"), (5, 2, "n2")]
    assert [e for e in sizer.log if e[0] == "propose_time"] == [("propose_time", True)] * 5
    observes = [e[1:] for e in sizer.log if e[0] == "observe"]
    # Rounds 1-3 at k = 0: the shadow 6 7 8 begins in round 1 (not again in rounds 2 and 3), and
    # the target writes 6, 7, 8: all matched, (3, 3) reported when it ends. Round 4 at k = 1
    # drafts 3 (8 → 3 in the draft's table): rejected. Round 5: 10 11, both accepted.
    assert observes == [
        (0, 0, "n2", False),
        (0, 0, "n2", False),
        (0, 0, "n2", False),
        (3, 3, "n2", False),
        (1, 0, "n2", False),
        (2, 2, "n2", False),
    ]
    assert out.stats.k_counts == [3, 1, 1]
    assert out.stats.drafted == 3 and out.stats.accepted == 2


def test_a_shadow_miss_is_reported_when_the_target_disagrees():
    proposer = TableProposer({6: 9}, kind="n1")
    sizer = FakeSizer([0, 0, 0], free_drafts=True)
    dec = SpeculativeDecoder(FakeTarget(), proposer, SpeculativeRule(), gamma=3, sizer=sizer)
    dec.generate([5], 3, GREEDY)
    observes = [e[1:] for e in sizer.log if e[0] == "observe"]
    # Shadow 6 9 10: the target writes 6 (match) then 7 (miss): tried 2, accepted 1.
    assert (2, 1, "n1", False) in observes


# --- tree rounds sized by a TreeSizer -------------------------------------------------------------


class FakeTreeSizer(TreeSizer):
    """A TreeSizer's interface with scripted answers; every call is logged with its arguments."""

    def __init__(self, free_drafts=False, wants=None, budget=None):
        self.free_drafts = free_drafts
        self.wants = wants  # what wants_draft returns: None (draft) or a plain-step Choice
        self.budget = budget  # nodes fit() keeps (None: all)
        self.log: list[tuple] = []

    def start(self):
        self.log.append(("start",))

    def clock(self):
        return time.perf_counter()

    def preview(self, proposal, context):
        self.log.append(("preview", proposal.tokens, context))
        return (1.5, 2)

    def wants_draft(self, context, depth, pending, base, remaining=None):
        self.log.append(("wants_draft", context, depth, pending, base, remaining))
        return self.wants

    def expand_threshold(self, context):
        return 0.25 + context

    def look_share(self, context):
        return 0.0  # every round proposes

    def tree_draft_ms(self, context, pending):
        self.log.append(("tree_draft_ms", context, pending))
        return 7.0

    def fit(self, proposal, context, drafted_ms=0.0, draft_passes=0):
        self.log.append(("fit", list(proposal.tokens), context, drafted_ms, draft_passes))
        n = len(proposal.tokens) if self.budget is None else self.budget
        return proposal.select(list(range(n))), Choice(n, 1.0 + n, 3.0, 2.0, False)

    def observe_propose_time(self, ms):
        self.propose_ms = getattr(self, "propose_ms", []) + [ms]
        self.log.append(("propose_time", ms >= 0))

    def observe_tree(self, proposal, path):
        self.log.append(("observe_tree", list(proposal.tokens), list(path)))

    def observe_time(self, choice, ms, proposed_ms=0.0):
        self.log.append(("time", choice.k))
        return choice.cost_ms

    def observe(self, *args, **kwargs):  # chains only: trees learn node by node
        raise AssertionError("a tree round must not call observe()")

    def observe_gain(self, choice, accepted):
        self.log.append(("gain", choice.k, accepted))

    def written(self, tokens, plain):
        self.log.append(("written", list(tokens), plain))


class SizedTreeProposer(TreeProposer):
    """A tree proposer whose drafting is free (a lookup tree): the sizer only fits its tree."""

    def __init__(self):
        super().__init__()
        self.lookups: list[int] = []
        self.seen: list[tuple] = []

    def lag(self, sequence):
        return len(sequence) + 2

    def propose(self, sequence, k, params, sampler):
        self.seen.append((getattr(self, "use_draft", None), getattr(self, "min_value", None)))
        self.forward_calls += 2
        return super().propose(sequence, k, params, sampler)


class DraftTreeFake(SizedTreeProposer):
    """SizedDrafting (proposers/capabilities.py): the sizer decides whether it drafts."""

    use_draft = True
    min_value = 0.0


class HybridFake(DraftTreeFake):
    """SizedDrafting and LookupPart: a free lookup tree beside the draft's."""

    def lookup_tree(self, sequence):
        self.lookups.append(len(sequence))
        return Proposal([sequence[-1]], parents=[-1])


def test_a_free_tree_round_is_fitted_by_the_sizer():
    sizer = FakeTreeSizer(free_drafts=True)
    proposer = SizedTreeProposer()
    target = FakeTarget()
    dec = SpeculativeDecoder(target, proposer, SpeculativeRule(), gamma=3, sizer=sizer)
    out = dec.generate([5], 3, GREEDY)
    assert out.tokens == chain(5, 3)
    # The whole tree of 4 nodes is verified: node 1 then node 2 accepted, then the bonus 8.
    assert target.fed[0] == [5, 0, 6, 7, 4]
    assert target.kept_paths == [(1, [1, 2])]
    assert proposer.calls == [(1, 3)]
    assert ("fit", [0, 6, 7, 4], 1, 0.0, 2) in sizer.log
    assert ("propose_time", True) in sizer.log
    assert ("observe_tree", [0, 6, 7, 4], [1, 2]) in sizer.log
    assert ("written", [6, 7, 8], False) in sizer.log  # what the round wrote; it verified a tree
    assert not any(e[0] in ("wants_draft", "preview", "tree_draft_ms") for e in sizer.log)
    s = out.stats
    assert s.k_counts == [0, 0, 0, 0, 1] and s.predicted_tokens == 5.0 and s.predicted_ms == 3.0
    assert s.tree_rounds == 1 and s.tree_nodes == 4 and s.branch_wins == 1
    assert s.draft_tokens_kept == 2


def test_a_tree_round_without_free_drafts_times_nothing_and_respects_the_budget():
    sizer = FakeTreeSizer(free_drafts=False)
    proposer = SizedTreeProposer()
    dec = SpeculativeDecoder(FakeTarget(), proposer, SpeculativeRule(), gamma=4, sizer=sizer)
    out = dec.generate([5], 2, GREEDY)
    assert out.tokens == chain(5, 2)
    assert proposer.calls == [(1, 2)]  # depth = min(γ, budget)
    assert not any(e[0] == "propose_time" for e in sizer.log)


def test_a_draft_tree_round_asks_the_sizer_whether_to_draft():
    sizer = FakeTreeSizer(wants=None)
    proposer = DraftTreeFake()
    dec = SpeculativeDecoder(FakeTarget(), proposer, SpeculativeRule(), gamma=3, sizer=sizer)
    out = dec.generate([5], 3, GREEDY)
    assert out.tokens == chain(5, 3)
    # No lookup part: the base is a plain step's (1 token, 0 nodes); the draft is used.
    assert ("wants_draft", 1, 3, 3, (1.0, 0), 3) in sizer.log  # 3 tokens left to write
    assert proposer.lookups == []
    assert proposer.seen == [(True, 1.25)]
    assert ("tree_draft_ms", 1, 3) in sizer.log
    assert ("fit", [0, 6, 7, 4], 1, 7.0, 2) in sizer.log


def test_a_draft_tree_round_the_sizer_declines_is_a_plain_step():
    plain = Choice(0, 1.0, 2.0, 2.0, False)
    sizer = FakeTreeSizer(wants=plain)
    proposer = DraftTreeFake()
    target = FakeTarget()
    dec = SpeculativeDecoder(target, proposer, SpeculativeRule(), gamma=3, sizer=sizer)
    out = dec.generate([5], 2, GREEDY)
    assert out.tokens == chain(5, 2)
    assert proposer.calls == [] and proposer.use_draft is False
    assert target.fed == [[5], [6]]
    assert out.stats.k_counts == [2] and out.stats.rounds == 2 and out.stats.tree_rounds == 0
    assert not any(e[0] in ("fit", "tree_draft_ms") for e in sizer.log)
    assert [e for e in sizer.log if e[0] == "time"] == [("time", 0)]  # round 1 (the prefill) untimed
    # Each plain step is still a (node-less) tree round for the sizer.
    assert [e for e in sizer.log if e[0] == "observe_tree"] == [("observe_tree", [], [])] * 2
    assert sizer.log[0] == ("start",)


def test_a_hybrid_tree_keeps_its_lookups_when_the_draft_does_not_pay():
    plain = Choice(0, 1.0, 2.0, 2.0, False)
    sizer = FakeTreeSizer(wants=plain)
    proposer = HybridFake()
    dec = SpeculativeDecoder(FakeTarget(), proposer, SpeculativeRule(), gamma=3, sizer=sizer)
    out = dec.generate([5], 3, GREEDY)
    assert out.tokens == chain(5, 3)
    assert proposer.lookups == [1]
    assert ("preview", [5], 1) in sizer.log
    assert ("wants_draft", 1, 3, 3, (1.5, 2), 3) in sizer.log
    # Proposes without the draft; neither the draft's time nor its level threshold is priced.
    assert proposer.seen == [(False, 0.0)]
    assert ("fit", [0, 6, 7, 4], 1, 0.0, 2) in sizer.log
    assert not any(e[0] == "tree_draft_ms" for e in sizer.log)


def test_a_hybrid_lookup_tree_counts_as_drafting_not_as_the_draft_models_step():
    """The lookup tree a hybrid builds before the sizer decides is its free drafting, as a lookup
    method's propose is: the round split counts it as drafting, not as the loop's overhead, and c
    (the draft model's step, from propose_s) leaves it out."""

    class SlowLookups(HybridFake):
        def lookup_tree(self, sequence):
            time.sleep(0.02)
            return super().lookup_tree(sequence)

    sizer = FakeTreeSizer(wants=Choice(0, 1.0, 2.0, 2.0, False))
    proposer = SlowLookups()
    out = SpeculativeDecoder(FakeTarget(), proposer, SpeculativeRule(), gamma=3, sizer=sizer).generate(
        [5], 9, GREEDY
    )
    assert out.tokens == chain(5, 9)
    decode_rounds = len(proposer.lookups) - 1  # round 1 is the prefill, outside the split
    assert decode_rounds >= 1
    assert out.stats.draft_s >= 0.02 * decode_rounds
    assert out.stats.propose_s < 0.02


# --- arguments, timing and reuse ----------------------------------------------------------------------


def test_the_proposer_starts_with_the_prompt_and_the_targets_sequence():
    proposer = TableProposer()
    SpeculativeDecoder(FakeTarget(), proposer, SpeculativeRule(), gamma=2).generate([4, 5], 5, GREEDY)
    assert proposer.started == ([4, 5], [4, 5])
    # One sampler for the whole generation.
    assert len(proposer.samplers) == 2 and proposer.samplers[0] is proposer.samplers[1]


def test_chains_are_verified_without_a_tree_mask_and_trees_with_their_parents():
    target = FakeTarget()
    SpeculativeDecoder(target, TableProposer(), SpeculativeRule(), gamma=2).generate([5], 5, GREEDY)
    assert target.trees_fed == [None, None]
    target = FakeTarget()
    dec = SpeculativeDecoder(target, TreeProposer(), SpeculativeRule(), gamma=3, tree_budget=3)
    dec.generate([5], 3, GREEDY)
    assert target.trees_fed == [[-1, -1, 1]]


def test_a_tree_proposer_with_a_chain_sizer_records_no_choice():
    sizer = FakeSizer([])
    dec = SpeculativeDecoder(
        FakeTarget(), TreeProposer(), SpeculativeRule(), gamma=3, sizer=sizer, tree_budget=3
    )
    out = dec.generate([5], 3, GREEDY)
    assert out.tokens == chain(5, 3)
    assert out.stats.k_counts == [] and out.stats.predicted_ms == 0.0
    assert [e[0] for e in sizer.log] == ["start"]


def test_sampling_is_reproducible_for_a_seed():
    def sample(seed):
        dec = SpeculativeDecoder(FakeTarget(peak=1.0), TableProposer(), SpeculativeRule(), gamma=2)
        return dec.generate([5], 8, SamplingParams(temperature=1.0, seed=seed)).tokens

    assert sample(3) == sample(3)
    assert len({tuple(sample(seed)) for seed in range(6)}) > 1


def test_calls_are_counted_per_generation():
    target, proposer = FakeTarget(), TableProposer()
    dec = SpeculativeDecoder(target, proposer, SpeculativeRule(), gamma=2)
    first = dec.generate([5], 6, GREEDY).stats
    second = dec.generate([5], 6, GREEDY).stats
    assert (first.target_calls, first.draft_calls) == (2, 4)
    assert (second.target_calls, second.draft_calls) == (2, 4)
    assert target.forward_calls == 4 and proposer.forward_calls == 8


def test_times_are_measured_per_phase():
    delay = 0.004
    proposer = TableProposer(delay=delay)
    dec = SpeculativeDecoder(FakeTarget(), proposer, SpeculativeRule(), gamma=1)
    t0 = time.perf_counter()
    s = dec.generate([5], 6, GREEDY).stats
    wall = time.perf_counter() - t0
    assert s.rounds == 3
    assert 3 * delay <= s.propose_s <= wall
    assert delay <= s.prefill_s <= wall
    assert 2 * delay <= s.decode_s <= wall
    assert s.total_s <= wall


def test_propose_time_is_the_proposers_own_not_the_sizers_choice():
    """c's draft step is Σ propose_s / Σ draft passes: a sizer that thinks long before choosing a
    plain step must not be charged to the few passes that ran."""
    delay, thinking = 0.004, 0.03

    class SlowSizer(FakeSizer):
        def choose(self, *args, **kwargs):
            time.sleep(thinking)
            return super().choose(*args, **kwargs)

    proposer = TableProposer(delay=delay)
    sizer = SlowSizer([2, 0, 0, 0])
    s = (
        SpeculativeDecoder(FakeTarget(), proposer, SpeculativeRule(), gamma=2, sizer=sizer)
        .generate([5], 6, GREEDY)
        .stats
    )
    assert proposer.calls == [(1, 2)]  # one proposal, then three plain steps the sizer chose
    assert delay <= s.propose_s < thinking  # the four choices took 4 x 30 ms


def test_a_drafts_catch_up_on_the_prompt_is_its_prefill_not_its_step():
    """A lazily prefilled draft lags by the prompt in its first drafting round: that round's
    proposing goes to catch_up_s, and c's step (propose_s over propose_calls) counts the others."""
    delay = 0.004
    proposer = TableProposer(delay=delay)
    prompt = list(range(5, 5 + 20))
    seen = {"fed": 0}

    def lag(sequence):  # the draft has read nothing until it first drafts, then keeps up
        return len(sequence) - seen["fed"]

    def propose(sequence, k, params, sampler, inner=proposer.propose):
        seen["fed"] = len(sequence)
        return inner(sequence, k, params, sampler)

    proposer.lag, proposer.propose = lag, propose
    s = (
        SpeculativeDecoder(FakeTarget(), proposer, SpeculativeRule(), gamma=2)
        .generate(prompt, 8, GREEDY)
        .stats
    )
    assert proposer.calls == [(20, 2), (23, 2), (26, 2)]
    assert delay <= s.catch_up_s < 2 * delay + 0.02  # the first round alone
    assert s.propose_calls == 4  # the two later rounds' passes
    assert 2 * delay <= s.propose_s


def test_sized_rounds_report_their_times_in_milliseconds():
    delay = 0.004
    sizer = FakeSizer([1, 1, 1])
    dec = SpeculativeDecoder(
        FakeTarget(), TableProposer(delay=delay), SpeculativeRule(), gamma=1, sizer=sizer
    )
    t0 = time.perf_counter()
    dec.generate([5], 6, GREEDY)
    wall_ms = (time.perf_counter() - t0) * 1000
    assert len(sizer.times) == 2
    assert all(delay * 1000 <= ms <= wall_ms for ms in sizer.times)
    free = FakeSizer([1, 1, 1], free_drafts=True)
    dec = SpeculativeDecoder(FakeTarget(), TableProposer(delay=delay), SpeculativeRule(), gamma=1, sizer=free)
    t0 = time.perf_counter()
    dec.generate([5], 6, GREEDY)
    wall_ms = (time.perf_counter() - t0) * 1000
    assert len(free.propose_times) == 3
    assert all(delay * 1000 <= ms <= wall_ms for ms in free.propose_times)


class UnscoredTreeProposer(TreeProposer):
    def propose(self, sequence, k, params, sampler):
        return dataclasses.replace(super().propose(sequence, k, params, sampler), scores=None)


def test_a_tree_without_scores_keeps_its_first_nodes():
    target = FakeTarget()
    dec = SpeculativeDecoder(target, UnscoredTreeProposer(), SpeculativeRule(), gamma=3, tree_budget=2)
    out = dec.generate([5], 2, GREEDY)
    assert out.tokens == chain(5, 2)
    # Every node counts 1: the two root children (ties go to the earlier node).
    assert target.fed[0] == [5, 0, 6]
    assert target.trees_fed[0] == [-1, -1]


def test_tree_draft_passes_are_counted_per_round():
    sizer = FakeTreeSizer(free_drafts=True)
    dec = SpeculativeDecoder(FakeTarget(), SizedTreeProposer(), SpeculativeRule(), gamma=3, sizer=sizer)
    out = dec.generate([5], 6, GREEDY)
    assert out.tokens == chain(5, 6)
    fits = [e for e in sizer.log if e[0] == "fit"]
    assert [e[2] for e in fits] == [1, 4] and [e[4] for e in fits] == [2, 2]


class FakeClock:
    """time.perf_counter that advances one second a call: every measured span is whole seconds."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        self.now += 1.0
        return self.now


def test_times_are_reported_in_milliseconds(monkeypatch):
    monkeypatch.setattr(time, "perf_counter", FakeClock())
    chain_sizer = FakeSizer([1, 1, 1])
    SpeculativeDecoder(FakeTarget(), TableProposer(), SpeculativeRule(), gamma=1, sizer=chain_sizer).generate(
        [5], 6, GREEDY
    )
    free = FakeSizer([1, 1, 1], free_drafts=True)
    SpeculativeDecoder(FakeTarget(), TableProposer(), SpeculativeRule(), gamma=1, sizer=free).generate(
        [5], 6, GREEDY
    )
    tree = FakeTreeSizer(free_drafts=True)
    SpeculativeDecoder(FakeTarget(), SizedTreeProposer(), SpeculativeRule(), gamma=3, sizer=tree).generate(
        [5], 6, GREEDY
    )
    spans = chain_sizer.times + free.times + free.propose_times + tree.propose_ms
    assert len(spans) == 2 + 2 + 3 + 2
    # Whole fake seconds (× 1000, not 1001), and spans of a few calls, not clock readings.
    assert all(1000 <= ms <= 100_000 and ms % 1000 == 0 for ms in spans), spans
