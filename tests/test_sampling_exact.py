"""Speculative sampling is exact: its samples follow the target's distribution.

On a 6-token vocabulary the target's joint distribution over the first two new tokens is
enumerated exactly; 10k SPS samples are compared with it by a chi-square test. The same
test, run on a deliberately wrong acceptance rule, must reject: that shows it has power.
The law, the cells and the sampling are the library's (draftlab.audit.law), which
`draftlab audit` runs on a user's own pair.
"""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
import torch
from tiny import wide_llama
from tokenizers import Tokenizer, models, pre_tokenizers
from tolerance import FALSE_FAILURE, SHOWN_POWER, probs_tol, sum_tol
from transformers import PreTrainedTokenizerFast

from draftlab.audit.law import ResampleFromTargetRule, reuse_prefix, sample_pairs, two_token_law
from draftlab.decode.loop import SpeculativeDecoder
from draftlab.drafters.draft_model.proposer import DraftModelProposer
from draftlab.models.cached import CachedModel
from draftlab.models.loading import ModelSpec, load_model
from draftlab.proposers import NoProposer
from draftlab.sampling import KeyedSampler, SamplingParams, warp_probs
from draftlab.verify.rules import SpeculativeRule

VOCAB = ["a", "b", "c", "d", "e", "f"]
PROMPT = [0, 3, 1]
SAMPLES = 10_000
PARAMS = SamplingParams(temperature=0.8)


def _tiny_vocab_model(directory, seed):
    model = wide_llama(len(VOCAB), seed)
    model.save_pretrained(directory)
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="a"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(directory)
    return load_model(ModelSpec(str(directory), dtype="float32"))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("vocab6")
    return _tiny_vocab_model(root / "target", 11), _tiny_vocab_model(root / "draft", 12)


def exact_joint(target) -> np.ndarray:
    """P(first two tokens) under the target alone, by enumeration."""
    model = target.model
    with torch.no_grad():
        p1 = warp_probs(model(torch.tensor([PROMPT])).logits[0, -1], PARAMS)
        joint = np.zeros((len(VOCAB), len(VOCAB)))
        for a in range(len(VOCAB)):
            p2 = warp_probs(model(torch.tensor([PROMPT + [a]])).logits[0, -1], PARAMS)
            joint[a] = (p1[a].double() * p2.double()).numpy()
    return joint


def sample_counts(decoder, samples: int = SAMPLES) -> tuple[Counter, float | None]:
    run = sample_pairs(decoder, PROMPT, PARAMS, range(samples))
    return run.counts, run.acceptance


def chi_square_p(target, counts: Counter) -> float:
    """The library's test: the target's exact law, cells with small expectations pooled."""
    return two_token_law(target, PROMPT, PARAMS, sum(counts.values())).p_value(counts)


def _decoder(target, draft, rule):
    return SpeculativeDecoder(
        CachedModel(target), DraftModelProposer(CachedModel(draft), target.vocab_size), rule, gamma=2
    )


@pytest.mark.statistical
def test_sps_samples_follow_the_target_distribution(pair):
    target, draft = pair
    counts, acceptance = sample_counts(_decoder(target, draft, SpeculativeRule()))
    assert 0.2 < acceptance < 0.95, "the draft must disagree sometimes, or the test checks nothing"
    assert chi_square_p(target, counts) > FALSE_FAILURE


@pytest.mark.statistical
def test_the_chi_square_test_rejects_a_wrong_rule(pair):
    target, draft = pair
    # 2,000 draws show power for the 10,000 of the test above (p ~ 1e-134 here; more draws only add).
    counts, _ = sample_counts(_decoder(target, draft, ResampleFromTargetRule()), samples=2000)
    assert chi_square_p(target, counts) < SHOWN_POWER


def test_pld_sampling_is_exact_too(pair):
    """A deterministic proposer (q one-hot) goes through the same rule."""
    from draftlab.drafters.lookup.ngram import PromptLookupProposer

    target, _ = pair
    decoder = SpeculativeDecoder(CachedModel(target), PromptLookupProposer(), SpeculativeRule(), gamma=2)
    counts, _ = sample_counts(decoder, samples=3000)
    assert chi_square_p(target, counts) > FALSE_FAILURE


def test_enumeration_is_a_distribution(pair):
    joint = exact_joint(pair[0])
    # 7 float32 softmaxes over 6 cells, multiplied in float64: 7 sums' bounds.
    assert joint.sum() == pytest.approx(1.0, abs=7 * sum_tol(len(VOCAB)))
    assert all(joint[a, b] > 0 for a, b in itertools.product(range(6), range(6)))


def test_the_library_law_is_the_enumeration(pair):
    """The audit's law (prefix cache, batched continuations, cells) equals plain full passes."""
    target = pair[0]
    joint = exact_joint(target)
    law = two_token_law(target, PROMPT, PARAMS, SAMPLES)
    with torch.no_grad():
        logits = torch.cat([target.model(torch.tensor([PROMPT + [a]])).logits[0] for a in range(len(VOCAB))])
    # Cached float64 cells against full-pass float32 probabilities, a cell summing up to 6 of them.
    tol = len(VOCAB) * probs_tol(target.model, logits, PARAMS.temperature)
    firsts = {a for a, _ in law.cells if a >= 0}
    for (a, b), p in zip(law.cells, law.probs, strict=True):
        if a < 0:  # every first token left out
            expected = sum(joint[c].sum() for c in range(len(VOCAB)) if c not in firsts)
        elif b < 0:  # the rest of row a
            expected = joint[a].sum() - sum(joint[a, d] for c, d in law.cells if c == a and d >= 0)
        else:
            expected = joint[a, b]
        assert p == pytest.approx(expected, abs=tol), (a, b)
    assert sum(b >= 0 for _, b in law.cells) >= 20  # 10k samples: most of the 36 pairs are cells of their own


def test_reusing_the_prefix_cache_changes_nothing(pair):
    """Sampling reuses the prompt's KV cache; the samples are those of full generations, seed for seed."""
    target, draft = pair
    plain = _decoder(target, draft, SpeculativeRule())
    reused = _decoder(reuse_prefix(target, PROMPT), reuse_prefix(draft, PROMPT), SpeculativeRule())
    for seed in range(50):
        params = SamplingParams(temperature=PARAMS.temperature, seed=seed)
        assert reused.generate(PROMPT, 3, params).tokens == plain.generate(PROMPT, 3, params).tokens


class _CountingProposer(DraftModelProposer):
    """Records how many tokens each proposal asked for and got."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.asked_and_got: list[tuple[int, int]] = []

    def propose(self, sequence, k, params, sampler):
        proposal = super().propose(sequence, k, params, sampler)
        self.asked_and_got.append((k, len(proposal.tokens)))
        return proposal


@pytest.mark.statistical
def test_sps_with_an_early_stop_is_still_exact(pair):
    """Stopping the draft on its own low confidence changes how much is drafted, not the output law."""
    target, draft = pair
    proposer = _CountingProposer(CachedModel(draft), target.vocab_size, confidence=0.4)
    decoder = SpeculativeDecoder(CachedModel(target), proposer, SpeculativeRule(), gamma=2)
    counts: Counter = Counter()
    for seed in range(4000):
        out = decoder.generate(PROMPT, 2, SamplingParams(temperature=PARAMS.temperature, seed=seed))
        counts[(out.tokens[0], out.tokens[1])] += 1
    short = sum(got < asked for asked, got in proposer.asked_and_got)
    assert short > 0.1 * len(proposer.asked_and_got), "the early stop must happen, or this checks nothing"
    assert chi_square_p(target, counts) > FALSE_FAILURE


@pytest.mark.statistical
def test_cost_aware_sizing_is_still_exact(pair):
    """k chosen per round from costs and past acceptance (k = 0 included) leaves the output law intact."""
    from draftlab.decode.cost import CostModel
    from draftlab.decode.round_sizer import RoundSizer
    from draftlab.models.cost_curve import CostCurve

    target, draft = pair
    # Verifying one draft costs 1.5 plain steps here: break-even near α = 0.5, this pair's α, so
    # the choice of k moves between rounds as the estimate moves. Timings must not steer it.
    cost = CostModel(
        CostCurve([1, 2, 3], [1, 64], [[1.0, 1.5, 2.0]] * 2), CostCurve([1, 2, 3], [1, 64], [[0.05] * 3] * 2)
    )
    sizer = RoundSizer(cost, k_max=2, free_drafts=False, calibrate=False)
    proposer = DraftModelProposer(CachedModel(draft), target.vocab_size, lazy_prefill=True)
    decoder = SpeculativeDecoder(CachedModel(target), proposer, SpeculativeRule(), gamma=2, sizer=sizer)
    counts: Counter = Counter()
    k_counts = [0, 0, 0]
    for seed in range(SAMPLES):
        out = decoder.generate(PROMPT, 2, SamplingParams(temperature=PARAMS.temperature, seed=seed))
        counts[(out.tokens[0], out.tokens[1])] += 1
        for k, n in enumerate(out.stats.k_counts):
            k_counts[k] += n
    rounds = sum(k_counts)
    assert k_counts[0] > 0.1 * rounds and k_counts[1] + k_counts[2] > 0.1 * rounds, k_counts
    assert chi_square_p(target, counts) > FALSE_FAILURE


# ----------------------------------------------------------------------------- keyed sampling
# Exact mode samples with a KeyedSampler: the token at position n is a Gumbel-max pick whose noise
# is keyed by (seed, n), so plain decoding and every lossless method write the same tokens for a seed.


def _keyed(decoder):
    decoder.keyed = True
    return decoder


@pytest.mark.statistical
def test_keyed_sps_samples_follow_the_target_distribution(pair):
    target, draft = pair
    # 4000 samples: a test that must not reject needs no more (its false-failure rate is fixed).
    counts, acceptance = sample_counts(_keyed(_decoder(target, draft, SpeculativeRule())), samples=4000)
    # 0.44 here, against the classic rule's 0.54: a Gumbel-max coupling agrees less often than
    # 1 - TV(p, q), the most any rule can keep.
    assert 0.2 < acceptance < 0.95, "the draft must disagree sometimes, or the test checks nothing"
    assert chi_square_p(target, counts) > FALSE_FAILURE


class _OneNoiseForAllPositions(KeyedSampler):
    """A deliberately wrong key: the same noise at every position, so each token's law is right
    but the tokens of one generation are not independent given their distributions."""

    def noise(self, position, width):
        return super().noise(0, width)


@pytest.mark.statistical
def test_the_chi_square_test_rejects_noise_not_keyed_by_position(pair, monkeypatch):
    target, draft = pair
    monkeypatch.setattr("draftlab.decode.loop.KeyedSampler", _OneNoiseForAllPositions)
    # p = 0.0 (below float64's smallest) at 3000 samples: 2000 show the power.
    counts, _ = sample_counts(_keyed(_decoder(target, draft, SpeculativeRule())), samples=2000)
    assert chi_square_p(target, counts) < SHOWN_POWER


def test_keyed_sampling_writes_plain_decodings_tokens_for_each_seed(pair):
    """In float32, where a pass of k tokens scores as k one-token passes (up to a near-tie, none
    here): keyed SPS and PLD write keyed `ar`'s tokens seed for seed; the classic rule does not."""
    from draftlab.drafters.lookup.ngram import PromptLookupProposer

    target, draft = pair
    ar = _keyed(SpeculativeDecoder(CachedModel(target), NoProposer(), SpeculativeRule()))
    sps = _keyed(_decoder(target, draft, SpeculativeRule()))
    pld = _keyed(SpeculativeDecoder(CachedModel(target), PromptLookupProposer(), SpeculativeRule(), gamma=2))
    classic = _decoder(target, draft, SpeculativeRule())
    prompt = PROMPT * 3  # repeats, so prompt lookup finds n-grams to propose
    differs = drafted = 0
    for seed in range(40):
        params = SamplingParams(temperature=PARAMS.temperature, seed=seed)
        want = ar.generate(prompt, 8, params).tokens
        for decoder in (sps, pld):
            out = decoder.generate(prompt, 8, params)
            assert out.tokens == want, seed
            drafted += out.stats.drafted
        differs += classic.generate(prompt, 8, params).tokens != want
    assert drafted > 100, "the methods must draft, or the equality says nothing"
    assert differs > 10, "the classic rule draws its own coins: seed for seed, other tokens"


def test_keyed_noise_is_a_prefix_across_vocabulary_widths():
    """A draft and a target padded to other vocabulary sizes see the same noise on shared ids."""
    sampler, other = KeyedSampler(7), KeyedSampler(7)
    wide = sampler.noise(5, 100).copy()
    assert np.array_equal(other.noise(5, 60), wide[:60])
    assert np.array_equal(other.noise(5, 100), wide)  # grown past what it held: the same values
    assert not np.array_equal(sampler.noise(6, 100), wide)
    assert not np.array_equal(KeyedSampler(8).noise(5, 100), wide)


def test_keyed_sampling_takes_any_seed_and_never_a_token_of_probability_zero():
    probs = torch.tensor([0.0, 0.3, 0.0, 0.7])
    assert KeyedSampler(-3).draw(probs, 5) in (1, 3)  # a negative seed, as torch takes one

    class ZeroNoise(KeyedSampler):  # an exponential draw of exactly 0, on every token
        def noise(self, position, width):
            return np.zeros(width)

    assert ZeroNoise(1).draw(probs, 0) in (1, 3)
