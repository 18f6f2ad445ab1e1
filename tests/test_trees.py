"""Token trees: one pass scores every branch, the cache keeps only the accepted path, every tree
method reproduces `ar` token for token in float32, and tree sampling is exact."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from test_lossless import loaded as loaded  # noqa: F401 - the tiny pairs, loaded once per family
from test_sampling_exact import PARAMS, PROMPT, VOCAB, chi_square_p
from test_sampling_exact import pair as pair  # noqa: F401 - the vocab-6 fixture, shared
from test_sizing import FLAT, HEAD_LIKE, MODERATE, STEEP, curve
from tiny import FAMILIES
from tolerance import FALSE_FAILURE, SHOWN_POWER, assert_greedy_equal, logits_tol

from draftlab.audit.law import ResampleFromTargetRule
from draftlab.decode.build import build_decoder
from draftlab.decode.cost import CostModel
from draftlab.decode.loop import SpeculativeDecoder
from draftlab.decode.spec import DecoderConfig
from draftlab.decode.timing import TickClock
from draftlab.decode.tree_sizer import TreeSizer
from draftlab.drafters.draft_model.tree import DraftTreeProposer
from draftlab.drafters.hybrid.proposer import merge_trees
from draftlab.drafters.lookup.ngram import PromptLookupProposer, agreement_kind
from draftlab.drafters.lookup.tree import LookupTreeProposer
from draftlab.drafters.suffix.proposer import SuffixProposer
from draftlab.errors import DraftlabError
from draftlab.models.cached import CachedModel
from draftlab.models.loading import ModelSpec, load_model
from draftlab.models.prompting import encode_prompt
from draftlab.proposal import Proposal
from draftlab.proposers.base import Proposer
from draftlab.sampling import SamplingParams, warp_probs
from draftlab.verify.rules import SpeculativeRule

GREEDY = SamplingParams()
TREE_METHODS = ("pld-tree", "sps-tree", "hybrid", "suffix")
DECODER_ONLY = tuple(f for f in FAMILIES if f != "t5")
PROMPT_TEXT = "the cat sat on the mat and then the dog ran on the mat and then the cat sat on the"


# ------------------------------------------------------------------ the tree pass and the cache


def _fed(model: CachedModel, prefix: list[int]) -> None:
    model.start(prefix)
    model.forward(prefix[:-1])


@pytest.mark.parametrize("family", DECODER_ONLY)
def test_a_tree_pass_scores_each_branch_as_that_branch_alone(family, loaded):
    target, _ = loaded(family)
    model = CachedModel(target)
    if not model.supports_trees():
        assert family == "bloom", "only ALiBi-from-the-2D-mask Bloom is expected to refuse trees"
        return
    prefix = [5, 9, 14, 20, 7, 33]
    #        root ─ 40 ─ 41 ─ 42
    #             └ 50 ─ 51
    #             │    └ 52
    #             └ 60
    tokens = [40, 50, 60, 41, 51, 52, 42]
    parents = [-1, -1, -1, 0, 1, 1, 3]
    _fed(model, prefix)
    tree = model.forward(prefix[-1:] + tokens, tree=parents)
    for branch in ([0, 3, 6], [1, 4], [1, 5], [2]):
        _fed(model, prefix)
        alone = model.forward(prefix[-1:] + [tokens[i] for i in branch])
        rows = [0] + [i + 1 for i in branch]
        torch.testing.assert_close(tree[rows], alone, atol=logits_tol(target.model, alone), rtol=0)


@pytest.mark.parametrize("family", ("llama", "gpt2", "opt", "qwen2", "gpt_neox"))
def test_after_a_non_first_branch_wins_the_cache_is_that_path_alone(family, loaded):
    target, _ = loaded(family)
    model = CachedModel(target)
    prefix = [5, 9, 14, 20, 7, 33]
    tokens = [40, 50, 60, 51, 52]
    parents = [-1, -1, -1, 1, 1]
    _fed(model, prefix)
    model.forward(prefix[-1:] + tokens, tree=parents)
    model.keep_path(len(prefix), [1, 4])  # 50 -> 52: the second child, then a second grandchild
    next_logits = model.forward([77])
    reference = CachedModel(target)
    reference.start(prefix)
    reference.forward(prefix + [50, 52])
    for got, want in zip(model._cache.layers, reference._cache.layers, strict=True):
        for kept, full in ((got.keys, want.keys), (got.values, want.values)):
            # Keys and values are partial sums of the logits' reduction: the same bound holds.
            torch.testing.assert_close(
                kept[..., : len(prefix) + 2, :], full, atol=logits_tol(target.model, full), rtol=0
            )
    want = reference.forward([77])
    torch.testing.assert_close(next_logits, want, atol=logits_tol(target.model, want), rtol=0)


def test_a_draft_grows_a_tree_over_several_calls(loaded):
    """Level by level, as EAGLE-2 drafts: a later call's nodes see the earlier calls' ancestors."""
    target, _ = loaded("llama")
    model = CachedModel(target)
    prefix = [5, 9, 14, 20]
    _fed(model, prefix)
    model.forward(prefix[-1:], keep=1)
    first = model.forward([40, 50], tree=[-1, -1])
    second = model.forward([41, 51], tree=[0, 1])
    for branch, rows in (([40, 41], (first[0], second[0])), ([50, 51], (first[1], second[1]))):
        _fed(model, prefix)
        alone = model.forward(prefix[-1:] + branch)[1:]
        torch.testing.assert_close(torch.stack(rows), alone, atol=logits_tol(target.model, alone), rtol=0)


def test_proposal_tree_helpers():
    p = Proposal([1, 2, 3, 4, 5], parents=[-1, -1, 0, 0, 2], scores=[0.6, 0.25, 0.5, 0.4, 0.9])
    assert p.is_tree and p.depths() == [1, 1, 2, 2, 3]
    assert p.children()[-1] == [0, 1] and p.children()[0] == [2, 3]
    assert p.top_path() == [0, 2, 4]
    values = p.path_values(p.scores)
    assert values == pytest.approx([0.6, 0.25, 0.3, 0.24, 0.27])
    best = p.best(values, 3)
    assert best.tokens == [1, 3, 5] and best.parents == [-1, 0, 1]  # ancestor-closed, re-indexed
    chain = Proposal([7, 8, 9])
    assert not chain.is_tree and chain.parent_list() == [-1, 0, 1]
    assert not Proposal([7, 8], parents=[-1, 0]).is_tree


# ------------------------------------------------------------------ the greedy rule on trees


def test_greedy_tree_rule_follows_the_targets_argmax_through_any_branch():
    vocab = 8
    tokens = [3, 5, 6, 2]
    parents = [-1, -1, 1, 1]  # root -> 3 | 5 -> {6, 2}
    logits = torch.full((5, vocab), -5.0)
    logits[0, 5] = 5.0  # at the root the target wants 5: the second child
    logits[2, 2] = 5.0  # after 5 it wants 2: node 3, again a second child
    logits[4, 7] = 5.0  # after 2 it wants 7: nothing proposed, so 7 is its own token
    verdict = SpeculativeRule().verify(Proposal(tokens, parents=parents), logits, GREEDY, None)
    assert verdict.path == [1, 3] and verdict.accepted == 2 and verdict.next_token == 7


# ------------------------------------------------------------------ greedy equality with ar


def _tree_decoder(method, target, draft, budget=None, cost=None, gamma=4):
    config = DecoderConfig.of(method=method, gamma=gamma, tree_budget=budget, pld_tokens=6)
    return build_decoder(config, target, draft, cost)


@pytest.mark.parametrize("family", DECODER_ONLY)
def test_every_tree_method_matches_ar(family, loaded):
    target, draft = loaded(family)
    ids = encode_prompt(target, PROMPT_TEXT, chat=False)
    ar = build_decoder(DecoderConfig(method="ar"), target).generate(ids, 48, GREEDY)
    cost = CostModel(MODERATE, curve({1: 1.0, 2: 1.1, 16: 2.0}), clock=TickClock())
    for method in TREE_METHODS:
        for budget, shape in ((16, None), (3, None), (None, cost), (None, None)):
            decoder = _tree_decoder(method, target, draft, budget, shape)
            out = decoder.generate(ids, 48, GREEDY)
            assert_greedy_equal(target, ids, out.tokens, ar.tokens, f"{family} {method} budget={budget}")
            if family == "bloom":
                assert out.stats.tree_fallback, "bloom cannot take a tree mask: the report must say so"
            elif budget == 16 and method in ("sps-tree", "hybrid"):
                assert out.stats.tree_nodes > 1.5 * out.stats.tree_rounds, "trees, not chains, were verified"


def _noisy_copy(model_dir, out_dir, scale=0.6, seed=0):
    """A draft that is close to the target but not equal: the target's weights plus noise."""
    lm = load_model(ModelSpec(str(model_dir), dtype="float32"))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in lm.model.parameters():
            if p.dim() > 1:
                p.add_(torch.randn(p.shape, generator=gen) * p.std() * scale)
    lm.model.save_pretrained(out_dir)
    lm.tokenizer.save_pretrained(out_dir)
    return load_model(ModelSpec(str(out_dir), dtype="float32"))


def test_tree_methods_match_ar_over_1000_tokens_with_stories(stories, tmp_path):
    model = load_model(ModelSpec(str(stories), dtype="float32"))
    model.model.config.max_position_embeddings = 1200
    model.eos_token_ids = set()
    draft = _noisy_copy(stories, tmp_path / "noisy")
    ids = encode_prompt(model, "Once upon a time, there was a little dog named Max.", chat=False)
    ar = build_decoder(DecoderConfig(method="ar"), model).generate(ids, 1000, GREEDY)
    assert len(ar.tokens) == 1000
    cost = CostModel(FLAT, curve({1: 4.0, 2: 4.2, 16: 6.0}), clock=TickClock())
    for method, budget in (("pld-tree", None), ("sps-tree", 32), ("hybrid", None), ("suffix", 16)):
        out = _tree_decoder(method, model, draft, budget, cost).generate(ids, 1000, GREEDY)
        assert_greedy_equal(model, ids, out.tokens, ar.tokens, f"{method} budget={budget}")
        assert out.stats.tree_rounds > 0
        if method == "sps-tree":
            assert out.stats.branch_wins > 10, "a noisy draft's second choices must win some rounds"


def test_tree_methods_match_ar_over_1000_tokens_random_init(tiny_pair):
    target = load_model(ModelSpec(str(tiny_pair["llama"][0]), dtype="float32"))
    draft = load_model(ModelSpec(str(tiny_pair["llama"][1]), dtype="float32"))
    target.eos_token_ids = set()
    target.model.config.max_position_embeddings = 1200
    ids = encode_prompt(target, PROMPT_TEXT, chat=False)
    ar = build_decoder(DecoderConfig(method="ar"), target).generate(ids, 1000, GREEDY)
    for method, shape in (("pld-tree", STEEP), ("sps-tree", FLAT), ("hybrid", STEEP), ("suffix", FLAT)):
        cost = CostModel(shape, curve({1: 1.0, 2: 1.1, 16: 2.0}), clock=TickClock())
        out = _tree_decoder(method, target, draft, None, cost).generate(ids, 1000, GREEDY)
        assert_greedy_equal(target, ids, out.tokens, ar.tokens, method)


def test_tree_methods_refuse_an_encoder_decoder_target(loaded):
    target, draft = loaded("t5")
    for method in TREE_METHODS:
        with pytest.raises(DraftlabError, match="decoder-only"):
            _tree_decoder(method, target, draft)


# ------------------------------------------------------------------ proposers


def test_lookup_tree_holds_every_match_most_frequent_first():
    proposer = LookupTreeProposer(max_ngram=2, depth=3)
    seq = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 7, 8, 1, 2]
    proposer.start(seq, seq)
    tree = proposer.propose(seq, 3, GREEDY, None)
    paths = {tuple(tree.tokens[i] for i in _path(tree, leaf)) for leaf in _leaves(tree)}
    assert paths == {(3, 4, 1), (3, 5, 1), (7, 8, 1)}
    assert tree.tokens[tree.children()[-1][0]] == 3, "3 followed '1 2' twice: it comes first"
    assert tree.kind == "2-gram tree"


def test_suffix_uses_earlier_outputs_but_never_one_for_the_same_prompt():
    proposer = SuffixProposer(max_depth=4, min_score=0.0)
    earlier = [10, 11, 12, 13, 14, 15]
    proposer.start([1, 2], [1, 2])
    proposer.finish([1, 2], earlier)
    proposer.start([3, 4, 10, 11], [3, 4, 10, 11])  # another prompt: output #1 may be used
    tree = proposer.propose([3, 4, 10, 11], 4, GREEDY, None)
    assert tree.tokens[:2] == [12, 13] and proposer.info()["earlier_outputs_used"] == {"output #1": 1}
    proposer.start([1, 2], [1, 2])  # the same prompt again: its own earlier output is off limits
    assert proposer.propose([1, 2, 10, 11], 4, GREEDY, None).tokens == []


def test_lookups_are_classed_by_how_far_their_match_agrees():
    """A copy in progress (the hit agrees with the text for many tokens) is another kind of proposal
    than a short match, so that the round sizer learns its acceptance apart."""
    copied = list(range(20, 40))
    short = [7, 1, 2, 3, 9, 8, 5, 1, 2, 3]  # '1 2 3' matched, preceded by different tokens
    long = [*copied, 9, *copied[:12]]  # the last 12 tokens repeat text written before
    chain = PromptLookupProposer(max_ngram=3)
    chain.start(short, short)
    assert chain.propose(short, 4, GREEDY, None).kind == "3-gram/agrees on 3"
    chain.start(long, long)
    first = chain.propose(long, 4, GREEDY, None)
    assert first.tokens == copied[12:16] and first.kind == "3-gram/agrees on 8-15"
    assert chain.propose([*long, *copied[12:16]], 4, GREEDY, None).kind == "3-gram/agrees on 16+"
    suffix = SuffixProposer(max_depth=4, min_score=0.0)
    for text, kind in ((short, "suffix 3"), (long, "suffix 8-15"), ([*long, *copied[12:16]], "suffix 16+")):
        suffix.start(text, text)
        assert suffix.propose(text, 4, GREEDY, None).kind == kind
    assert [agreement_kind(n) for n in (2, 4, 7, 8, 15, 16, 99)] == [
        "agrees on 2",
        "agrees on 4-7",
        "agrees on 4-7",
        "agrees on 8-15",
        "agrees on 8-15",
        "agrees on 16+",
        "agrees on 16+",
    ]


def test_suffix_continuations_stop_where_an_earlier_output_ends():
    """Earlier outputs are searched as one joined array: a match at the end of one output must not
    continue into the next, and each continuation is credited to its own output."""
    proposer = SuffixProposer(max_depth=4, min_score=0.0)
    for prompt, output in (([1], [7, 8, 9]), ([2], [4, 5, 6]), ([3], [8, 9, 3, 3])):
        proposer.start(prompt, prompt)
        proposer.finish(prompt, output)
    proposer.start([5, 5], [5, 5])
    tree = proposer.propose([5, 5, 8, 9], 4, GREEDY, None)
    # '8 9' ends output #1 (nothing follows: not '4 5 6' of output #2) and is followed by '3 3' in #3
    assert tree.tokens == [3, 3] and proposer.info()["earlier_outputs_used"] == {"output #3": 1}


def test_merged_trees_share_common_paths():
    a = Proposal([5, 6], parents=[-1, 0], scores=[0.9, 0.8], sources=["draft"] * 2)
    b = Proposal([5, 7, 8], parents=[-1, 0, -1], scores=[1.0, 1.0, 0.5], sources=["lookup"] * 3)
    merged = merge_trees([a, b], 16)
    assert sorted(merged.tokens) == [5, 6, 7, 8]
    five = merged.tokens.index(5)
    assert merged.sources[five] == "draft+lookup" and merged.parents[five] == -1


def test_a_draft_tree_branches_and_leaves_the_draft_cache_as_it_was(loaded):
    target, draft = loaded("llama")
    proposer = DraftTreeProposer(CachedModel(draft), width=3)
    ids = encode_prompt(target, PROMPT_TEXT, chat=False)
    proposer.start(ids, ids)
    tree = proposer.propose(ids, 3, GREEDY, None)
    assert tree.is_tree and len(tree.children()[-1]) == 3 and max(tree.depths()) == 3
    assert proposer.draft.length == len(ids)


def test_the_tree_sizer_chooses_more_nodes_where_a_pass_is_flat():
    tree = Proposal(list(range(30)), parents=[-1] * 3 + [i // 3 for i in range(27)], scores=[0.5] * 30)
    sizes = {}
    for name, shape in (("flat", FLAT), ("steep", STEEP)):
        sizer = TreeSizer(CostModel(shape), depth=4, width=3, free_drafts=True)
        chosen, choice = sizer.fit(tree, 256)
        sizes[name] = len(chosen.tokens)
        assert choice.k == len(chosen.tokens)
    assert sizes["flat"] > 4 and sizes["steep"] <= 1
    # Compiled, a tree verifies in one package pass of at most 8 tokens: 7 nodes after the root.
    capped = TreeSizer(CostModel(FLAT), depth=4, width=3, free_drafts=True, max_nodes=7)
    chosen, choice = capped.fit(tree, 256)
    assert len(chosen.tokens) == choice.k == 7


def test_a_lookup_tree_stops_drafting_in_a_generation_whose_lookups_fail():
    """The run's record says these lookups are accepted; this generation's are not. Within a few
    rounds the sizer believes the generation, and a new generation starts from the record again."""
    llama_like = curve({1: 10.0, 2: 15.0, 4: 23.0, 8: 38.0})
    sizer = TreeSizer(CostModel(llama_like), depth=4, width=1, free_drafts=True)
    chain = Proposal([5, 6, 7, 8], kind="suffix 3", parents=[-1, 0, 1, 2], scores=[1.0] * 4)
    for _ in range(20):
        sizer.observe_tree(chain, [0, 1, 2, 3])  # earlier generations: every node accepted
    sizer.start()
    assert sizer.fit(chain, 256)[1].k == 4
    rounds = 0
    while sizer.fit(chain, 256)[1].k > 0:
        sizer.observe_tree(chain, [])  # this generation: the first node rejected every time
        rounds += 1
    assert rounds <= 2 and sizer.example_factor() < 0.6
    sizer.start()
    assert sizer.fit(chain, 256)[1].k == 4
    draft_tree = TreeSizer(CostModel(llama_like), depth=4, width=1, free_drafts=False)
    draft_tree.observe_tree(chain, [])
    assert draft_tree.example_factor() == 1.0  # draft trees follow `tree_draft_gain` instead


def test_a_tree_kind_whose_drafted_rounds_bring_less_than_expected_verifies_less():
    """As for chains (test_sizing): the tree sizer scales a kind's expected gain by what its
    drafted rounds brought, across generations, and another kind keeps its own record."""
    llama_q41 = curve({1: 6.4, 2: 12.8, 4: 17.6, 8: 26.8, 16: 43.7})
    sizer = TreeSizer(CostModel(llama_q41), depth=6, width=1, free_drafts=True)
    weak = Proposal([5, 6, 7, 8, 9, 10], kind="suffix 4", parents=[-1, 0, 1, 2, 3, 4], scores=[0.9] * 6)
    other = Proposal(weak.tokens, kind="suffix 3", parents=weak.parents, scores=weak.scores)
    sizer.start()
    chosen, choice = sizer.fit(weak, 256)
    assert choice.k == 6 and choice.kind == "suffix 4" and choice.gain == 1.0
    for _ in range(3):
        sizer.start()  # a new generation: the per-generation factor starts again, this one does not
        sizer.observe_gain(choice, 0)
    assert sizer.fit(weak, 256)[1].k == 0
    assert sizer.fit(other, 256)[1].k == 6


def test_a_lookup_tree_left_unverified_is_scored_against_what_the_target_writes():
    """Once a generation's lookups failed, the sizer stops verifying them; shadows of its best
    chain, scored for free against the target's tokens, let it find out that they match again."""
    llama_like = curve({1: 10.0, 2: 15.0, 4: 23.0, 8: 38.0})
    sizer = TreeSizer(CostModel(llama_like), depth=4, width=1, free_drafts=True)
    tree = Proposal([5, 6, 7, 8, 9], kind="suffix 3", parents=[-1, 0, 1, 2, -1], scores=[1.0] * 5)
    for _ in range(20):
        sizer.observe_tree(tree, [0, 1, 2, 3])
    sizer.start()
    while sizer.fit(tree, 256)[1].k > 0:
        sizer.observe_tree(tree, [])  # this generation's lookups fail at first
        sizer.written([1], plain=False)
    low = sizer.example_factor()
    for _ in range(6):  # then they match: each plain round's shadow chain 5 6 7 8 is written
        assert sizer.fit(tree, 256)[1].k == 0 or sizer.example_factor() > low
        sizer.written([5], plain=True)
        sizer.written([6, 7], plain=True)  # several tokens in one round, as after a verified round
        sizer.written([8], plain=True)  # the chain ends: 4 reached, 4 accepted
    assert sizer.example_factor() > low and sizer.fit(tree, 256)[1].k > 0
    # a miss ends the shadow with the nodes reached; a verified round ends it with what matched
    sizer.start()
    assert sizer.fit(Proposal([5, 6], kind="suffix 3", parents=[-1, 0], scores=[0.01, 0.01]), 256)[1].k == 0
    before = [list(c.reached) for c in sizer.scores.values()]
    sizer.written([5], plain=True)
    sizer.written([9], plain=True)
    after = [list(c.reached) for c in sizer.scores.values()]
    assert sum(map(sum, after)) - sum(map(sum, before)) == 2 and sizer._shadow is None


def _leaves(tree):
    kids = tree.children()
    return [i for i in range(len(tree.tokens)) if not kids[i]]


def _path(tree, node):
    parents, out = tree.parent_list(), []
    while node >= 0:
        out.append(node)
        node = parents[node]
    return out[::-1]


# ------------------------------------------------------------------ sampling is exact on trees


class _MixedTreeProposer(Proposer):
    """A root with a sampled first child (q = the draft's) and deterministic siblings (q one-hot),
    each with a deterministic child of its own: recursive rejection over mixed candidates."""

    makes_trees = True

    def __init__(self, draft):
        self.draft = draft

    def start(self, prompt_ids, prefix):
        self.draft.start(prompt_ids)

    def rollback(self, length):
        self.draft.crop(length)

    def propose(self, sequence, k, params, sampler):
        self.draft.crop(0)
        self.draft.start(sequence)
        q = warp_probs(self.draft.forward(sequence, keep=1)[-1], params)
        first = sampler.draw(q)
        others = [t for t in torch.argsort(q, descending=True).tolist() if t != first][:2]
        tokens = [first, *others, (first + 1) % len(VOCAB), (others[0] + 2) % len(VOCAB)]
        probs = torch.zeros(len(tokens), q.shape[-1])
        probs[0] = q
        for i in range(1, len(tokens)):
            probs[i, tokens[i]] = 1.0
        self.draft.crop(len(sequence) - 1)
        return Proposal(tokens, probs, parents=[-1, -1, -1, 0, 1])


def _sample(decoder, samples):
    counts: Counter = Counter()
    wins = 0
    for seed in range(samples):
        out = decoder.generate(PROMPT, 2, SamplingParams(temperature=PARAMS.temperature, seed=seed))
        counts[(out.tokens[0], out.tokens[1])] += 1
        wins += out.stats.branch_wins
    return counts, wins


def _draft_tree_decoder(target, draft, rule):
    proposer = DraftTreeProposer(CachedModel(draft), width=3)
    return SpeculativeDecoder(CachedModel(target), proposer, rule, gamma=2, tree_budget=9)


@pytest.mark.statistical
def test_draft_tree_sampling_follows_the_target_distribution(pair):  # noqa: F811
    target, draft = pair
    counts, wins = _sample(_draft_tree_decoder(target, draft, SpeculativeRule()), 6000)
    assert wins > 300, "non-first branches must win often, or the multi-draft rule is not exercised"
    assert chi_square_p(target, counts) > FALSE_FAILURE


@pytest.mark.statistical
def test_mixed_sampled_and_deterministic_children_are_exact(pair):  # noqa: F811
    target, draft = pair
    proposer = _MixedTreeProposer(CachedModel(draft))
    decoder = SpeculativeDecoder(CachedModel(target), proposer, SpeculativeRule(), tree_budget=5)
    counts, wins = _sample(decoder, 6000)
    assert wins > 50, "rejected sampled children must hand over to their siblings sometimes"
    assert chi_square_p(target, counts) > FALSE_FAILURE


@pytest.mark.statistical
def test_the_tree_chi_square_test_rejects_a_wrong_rule(pair):  # noqa: F811
    """Resampling from p after a rejected child (instead of the residual) must be caught."""
    target, draft = pair
    # 2,000 draws (p ~ 3e-227 here) show power for the test's 6,000: more draws only add to it.
    counts, _ = _sample(_draft_tree_decoder(target, draft, ResampleFromTargetRule()), 2000)
    assert chi_square_p(target, counts) < SHOWN_POWER


def test_drafting_a_tree_must_add_more_than_it_costs():
    """The decision to grow a draft tree: against a plain step, or a hybrid's free lookup tree."""
    draft_cost = curve({1: 5.0, 2: 5.2, 16: 6.0})
    flat = TreeSizer(CostModel(FLAT, draft_cost), depth=4, width=8, free_drafts=False)
    assert flat.wants_draft(256, 4) is None, "nothing known yet: draft and find out"
    flat.evidence.tree_draft_gain[:] = [0.9, 8.0, 2.0]  # the draft added 0.9 tokens over 2 passes
    assert flat.wants_draft(256, 4) is None
    steep = TreeSizer(CostModel(STEEP, draft_cost), depth=4, width=8, free_drafts=False)
    steep.evidence.tree_draft_gain[:] = [0.9, 8.0, 2.0]
    choice = steep.wants_draft(256, 4)
    assert choice is not None and choice.k == 0, "9 target tokens cost 9 steps: never worth 0.9 tokens"
    # Over a lookup tree that already brings 3 tokens in 4 nodes, a weak draft adds too little.
    flat.evidence.tree_draft_gain[:] = [0.1, 8.0, 4.0]
    assert flat.wants_draft(256, 4, base=(3.0, 4)) is not None
    assert flat.expand_threshold(256) == pytest.approx(
        draft_cost.forward_ms(8, 256) / FLAT.forward_ms(1, 256)
    )


def test_a_draft_tree_probes_each_generation_and_keeps_drafting_while_probes_pay():
    """Recent rounds say a draft tree does not pay; a new generation probes at once all the same
    (the probe costs less than a plain step here), goes on while probes bring their cost back, and
    backs off after one that does not."""
    sizer = TreeSizer(HEAD_LIKE, depth=4, width=4, free_drafts=False)
    sizer.evidence.tree_draft_gain[:] = [0.0, 4.0, 3.0]  # recent draft trees added nothing
    chain = Proposal(tokens=[5, 6, 7, 8], parents=[-1, 0, 1, 2], sources=["draft"] * 4)

    def probe_round(accepted: list[int]) -> None:
        fitted, _ = sizer.fit(chain, 256, drafted_ms=6.0, draft_passes=3)
        sizer.observe_tree(fitted, accepted)

    sizer.start()
    assert sizer.wants_draft(256, 4) is None, "a new generation probes at once"
    probe_round([0, 1, 2])
    assert sizer.wants_draft(256, 4) is None, "3 tokens for a fraction of a step: probe again"
    probe_round([])
    choice = sizer.wants_draft(256, 4)
    assert choice is not None and choice.k == 0, "a probe that brought nothing: back off"
    assert all(sizer.wants_draft(256, 4) is not None for _ in range(6))
    sizer.start()
    assert sizer.wants_draft(256, 4) is None, "the next generation finds out for itself"


def test_suffix_copies_of_one_method_share_their_earlier_outputs():
    """A routed method holds one proposer per dtype; every copy learns from every output."""
    first, second = SuffixProposer(max_depth=4, min_score=0.0), SuffixProposer(max_depth=4, min_score=0.0)
    second.share(first)
    first.start([1, 2], [1, 2])
    first.finish([1, 2], [10, 11, 12, 13])
    second.start([3, 10, 11], [3, 10, 11])
    assert second.propose([3, 10, 11], 4, GREEDY, None).tokens[:2] == [12, 13]
