"""The exactness audit's pieces, checked directly: the law's cells against enumeration, the chi-square
p-value against scipy, the prefix reuse against plain passes, the sampling bookkeeping."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from tiny import wide_llama, wide_llama_config
from tolerance import logits_tol, probs_tol, sum_tol
from transformers import T5Config, T5ForConditionalGeneration

from draftlab.audit.law import (
    END,
    OTHER,
    ResampleFromTargetRule,
    SampleRun,
    TwoTokenLaw,
    _remainder,
    _start_token,
    next_token_logits,
    reuse_prefix,
    sample_pairs,
    two_token_law,
)
from draftlab.models.loading import LoadedModel, ModelSpec
from draftlab.proposal import Proposal
from draftlab.sampling import SamplingParams, warp_probs

V = 6
PROMPT = [0, 3, 1]
PARAMS = SamplingParams(temperature=0.8)


def _llama(seed=11, vocab=V):
    return LoadedModel(wide_llama(vocab, seed), None, ModelSpec("tiny"), "tiny")


@pytest.fixture(scope="module")
def lm():
    return _llama()


def _close(got: torch.Tensor, want: torch.Tensor, config=None) -> bool:
    """Logits of the same tokens from passes of other shapes, within the float32 reduction bound."""
    model = SimpleNamespace(config=config or wide_llama_config(V))
    return torch.allclose(got, want, rtol=0.0, atol=logits_tol(model, want))


def _law_tol(lm) -> float:
    """Cells of the law (float64, from float32 logits of cached passes) against the enumeration
    (float32 probabilities of full passes): the logits' bound carried through the softmax."""
    with torch.no_grad():
        logits = torch.cat([lm.model(torch.tensor([PROMPT + [a]])).logits[0] for a in range(V)])
    return probs_tol(lm.model, logits, PARAMS.temperature)


def joint(lm, prompt=PROMPT, params=PARAMS) -> np.ndarray:
    """P(a, b) by full passes without a cache."""
    with torch.no_grad():
        p1 = warp_probs(lm.model(torch.tensor([prompt])).logits[0, -1], params).double()
        out = np.zeros((V, V))
        for a in range(V):
            p2 = warp_probs(lm.model(torch.tensor([prompt + [a]])).logits[0, -1], params).double()
            out[a] = (p1[a] * p2).numpy()
    return out


# --- the rule with the classic bug --------------------------------------------------------------


def test_resample_from_target_rule_resamples_p_itself():
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([[0.1, 0.8, 0.1]])
    assert torch.equal(ResampleFromTargetRule.residual(p, Proposal([1], q), 0, 1), p)


# --- next_token_logits ---------------------------------------------------------------------------


def test_next_token_logits_match_plain_passes(lm):
    first, rows = next_token_logits(lm, PROMPT, [2, 0, 5])
    with torch.no_grad():
        assert _close(first, lm.model(torch.tensor([PROMPT])).logits[0, -1])
        for row, a in zip(rows, [2, 0, 5], strict=True):
            assert _close(row, lm.model(torch.tensor([PROMPT + [a]])).logits[0, -1])
    assert rows.shape == (3, V)
    _, none = next_token_logits(lm, PROMPT, [])
    assert none.numel() == 0


def test_next_token_logits_batches_long_lists(lm):
    # A long prompt makes the batch small (4096 // len): several chunks, the same rows.
    prompt = [1, 2, 3, 4, 5] * 12  # 60 tokens: batches of 64 would be one chunk
    firsts = list(range(V)) * 12
    prompt = prompt[:60]
    _, rows = next_token_logits(lm, prompt[:50], firsts)
    assert rows.shape == (len(firsts), V)
    with torch.no_grad():
        for i in (0, 5, 40, 71):
            a = firsts[i]
            ref = lm.model(torch.tensor([prompt[:50] + [a]])).logits[0, -1]
            assert _close(rows[i], ref)


def test_next_token_logits_for_an_encoder_decoder():
    torch.manual_seed(0)
    config = T5Config(
        vocab_size=V,
        d_model=16,
        d_kv=4,
        d_ff=32,
        num_layers=1,
        num_heads=4,
        decoder_start_token_id=2,
        pad_token_id=0,
        eos_token_id=1,
    )
    model = T5ForConditionalGeneration(config).eval()
    lm = LoadedModel(model, None, ModelSpec("t5"), "t5")
    assert _start_token(lm) == 2
    first, rows = next_token_logits(lm, PROMPT, [3, 4])
    enc = torch.tensor([PROMPT])
    with torch.no_grad():
        ref = model(input_ids=enc, decoder_input_ids=torch.tensor([[2]])).logits[0, -1]
        assert _close(first, ref, config)
        for row, a in zip(rows, [3, 4], strict=True):
            ref = model(input_ids=enc, decoder_input_ids=torch.tensor([[2, a]])).logits[0, -1]
            assert _close(row, ref, config)
    # Without a decoder start token, the pad token starts the decoder.
    model.config.decoder_start_token_id = None
    assert _start_token(lm) == 0
    assert reuse_prefix(lm, PROMPT) is lm  # encoder-decoders run in full


# --- two_token_law ---------------------------------------------------------------------------------


def test_the_law_with_every_cell_listed_is_the_joint(lm):
    exact = joint(lm)
    law = two_token_law(lm, PROMPT, PARAMS, samples=10**9, min_expected=1e-6)
    assert law.samples == 10**9
    # Only cells of (rounding-)zero probability are too small to stand alone: the pooled rows' rests.
    assert law.pooled == [i for i, p in enumerate(law.probs) if p * 10**9 < 1e-6]
    assert all(law.cells[i][1] == OTHER for i in law.pooled)
    cells = dict(zip(law.cells, law.probs, strict=True))
    # Every first token is listed: what is left is rounding noise, which the law takes as zero
    # (a float32 law left 2.2e-9 here on AMD EPYC CPUs, where the test compared with 1e-9).
    assert cells[(OTHER, OTHER)] == 0.0
    tol = _law_tol(lm)
    for a in range(V):
        for b in range(V):
            assert cells[(a, b)] == pytest.approx(exact[a, b], rel=tol)
        assert cells[(a, OTHER)] == 0.0
    assert law.probs.sum() == pytest.approx(1.0, abs=sum_tol(len(law.cells), torch.float64))
    # First tokens in decreasing probability, and within a row the second tokens likewise.
    firsts = list(dict.fromkeys(a for a, _ in law.cells[:-1]))
    p1 = exact.sum(axis=1)
    assert firsts == sorted(range(V), key=lambda a: -p1[a])
    row = [b for a, b in law.cells if a == firsts[0] and b != OTHER]
    assert row == sorted(range(V), key=lambda b: -exact[firsts[0], b])


def test_rounding_noise_is_no_cell_on_any_cpu():
    """Regression (issue 20): the (OTHER, OTHER) cell was 1 − Σ p over a float32 softmax, 2.2e-9 on
    AMD EPYC CPUs and 0 on an AMX Xeon. In float32 that noise reaches V·eps; the law is float64 now,
    and a remainder within its rounding bound is the zero it is."""
    gen = torch.Generator().manual_seed(0)
    for vocab in (6, 1000, 49152):
        logits = torch.randn(vocab, generator=gen) * 3
        p32 = warp_probs(logits, PARAMS).double()
        assert abs(1 - float(p32.sum())) > 1e-9  # what a float32 law would have left
        assert abs(1 - float(p32.sum())) <= sum_tol(vocab) / 2  # within float32's bound: n·eps
        assert _remainder(warp_probs(logits, PARAMS, torch.float64), vocab) == 0.0
    # A real remainder stays: one token of probability 1e-6 left out of the listed cells.
    probs = torch.tensor([0.5, 0.5 - 1e-6, 1e-6], dtype=torch.float64)
    assert _remainder(probs[:2], 3) == pytest.approx(1e-6, rel=sum_tol(3, torch.float64) / 1e-6)


def test_small_cells_are_pooled_per_row_and_left_out_firsts_together(lm):
    exact = joint(lm)
    samples, min_expected = 200, 5.0
    law = two_token_law(lm, PROMPT, PARAMS, samples=samples, min_expected=min_expected)
    threshold = min_expected / samples
    p1 = exact.sum(axis=1)
    tol = _law_tol(lm)
    cells = dict(zip(law.cells, law.probs, strict=True))
    listed_firsts = {a for a in range(V) if p1[a] >= threshold}
    for a in range(V):
        if a not in listed_firsts:
            assert (a, OTHER) not in cells
            continue
        listed = [b for b in range(V) if exact[a, b] >= threshold]
        for b in range(V):
            assert ((a, b) in cells) == (b in listed)
            if b in listed:
                assert cells[(a, b)] == pytest.approx(exact[a, b], rel=tol)
        assert cells[(a, OTHER)] == pytest.approx(p1[a] - exact[a, listed].sum(), abs=tol)
    assert cells[(OTHER, OTHER)] == pytest.approx(
        sum(p1[a] for a in range(V) if a not in listed_firsts), abs=tol
    )
    # Cells still expected fewer than min_expected times are pooled (when there are two or more).
    small = [i for i, p in enumerate(law.probs) if p * samples < min_expected]
    assert law.pooled == (small if len(small) > 1 else [])


def test_max_first_limits_the_first_tokens(lm):
    law = two_token_law(lm, PROMPT, PARAMS, samples=10**9, min_expected=1e-6, max_first=2)
    firsts = list(dict.fromkeys(a for a, _ in law.cells[:-1]))
    assert len(firsts) == 2
    p1 = joint(lm).sum(axis=1)
    assert law.probs[law.cells.index((OTHER, OTHER))] == pytest.approx(1 - p1[firsts].sum(), abs=_law_tol(lm))


def test_an_end_token_first_is_a_cell_of_its_own(lm):
    eos = int(joint(lm).sum(axis=1).argmax())  # the likeliest first token: listed before the others
    lm.eos_token_ids = {eos}
    try:
        law = two_token_law(lm, PROMPT, PARAMS, samples=10**9, min_expected=1e-6)
    finally:
        lm.eos_token_ids = set()
    p1 = joint(lm).sum(axis=1)
    assert (eos, END) in law.cells
    assert law.probs[law.cells.index((eos, END))] == pytest.approx(p1[eos], rel=_law_tol(lm))
    assert not any(a == eos and b != END for a, b in law.cells)
    assert law.probs.sum() == pytest.approx(1.0, abs=sum_tol(len(law.cells), torch.float64))
    # The first tokens after the end token are listed too.
    assert {a for a, _ in law.cells} == set(range(V)) | {OTHER}
    for a in range(V):
        if a != eos:
            assert law.probs[law.cells.index((a, OTHER))] == 0.0


def _uniform(vocab):
    """A model whose every distribution is exactly uniform (all weights zero): exact thresholds."""
    lm = _llama(vocab=vocab)
    with torch.no_grad():
        for p in lm.model.parameters():
            p.zero_()
    return lm


T1 = SamplingParams(temperature=1.0)


def test_thresholds_are_inclusive():
    lm = _uniform(8)
    # First tokens expected exactly min_expected times are listed.
    law = two_token_law(lm, PROMPT, T1, samples=1, min_expected=1 / 8)
    assert {a for a, _ in law.cells} == set(range(8)) | {OTHER}
    # So are pairs expected exactly min_expected times; and cells expected exactly min_expected
    # times are not pooled.
    law = two_token_law(lm, PROMPT, T1, samples=64, min_expected=1.0)
    assert sum(1 for _, b in law.cells if b >= 0) == 64
    assert all(law.cells[i][1] == OTHER for i in law.pooled) and len(law.pooled) == 9
    assert law.probs[law.cells.index((3, 5))] == pytest.approx(1 / 64)


def test_a_single_small_cell_is_not_pooled():
    lm = _uniform(8)
    # Rows with no listed pair: 8 cells (a, any) of 1/8 (expected 5 each, not small), and the empty
    # (any, any) cell: the one small cell stays as it is.
    law = two_token_law(lm, PROMPT, T1, samples=40, min_expected=5.0)
    assert law.cells == [(a, OTHER) for a in range(8)] + [(OTHER, OTHER)]
    assert law.probs == pytest.approx([1 / 8] * 8 + [0.0])
    assert law.pooled == []
    assert law.degrees_of_freedom == 8


def test_the_defaults_list_cells_expected_five_times_and_256_first_tokens():
    lm = _uniform(300)
    # p1 = 1/300: at 1500 samples each first token is expected 5 times, listed with the default
    # min_expected of 5; no pair is. Only the 256 likeliest first tokens are listed.
    law = two_token_law(lm, PROMPT, T1, samples=1500)
    assert len(law.cells) == 257
    assert all(b == OTHER for _, b in law.cells)
    assert law.probs[:-1] == pytest.approx([1 / 300] * 256)
    assert law.probs[-1] == pytest.approx(44 / 300)
    assert law.pooled == []
    assert len(two_token_law(lm, PROMPT, T1, samples=1499).cells) == 1


# --- TwoTokenLaw -----------------------------------------------------------------------------------


def law_of(cells, probs, pooled=(), samples=0):
    return TwoTokenLaw(list(cells), np.array(probs, dtype=float), list(pooled), samples)


def test_cell_lookup_prefers_the_pair_then_its_row_then_the_rest():
    law = law_of([(1, 2), (1, OTHER), (3, END), (OTHER, OTHER)], [0.4, 0.2, 0.1, 0.3])
    assert law.cell((1, 2)) == 0
    assert law.cell((1, 5)) == 1
    assert law.cell((3, END)) == 2
    assert law.cell((4, 4)) == 3
    assert law.cell((3, 2)) == 3
    small = law_of([(1, 2)], [1.0])
    with pytest.raises(KeyError) as error:
        small.cell((1, 3))
    assert error.value.args == ((1, 3),)


def test_p_value_is_scipys_chi_square():
    law = law_of([(0, 0), (0, OTHER), (OTHER, OTHER)], [0.5, 0.3, 0.2])
    counts = Counter({(0, 0): 40, (0, 4): 20, (0, OTHER): 15, (2, 2): 25})
    expected = np.array([0.5, 0.3, 0.2]) * 100
    assert law.p_value(counts) == pytest.approx(chisquare([40, 35, 25], expected).pvalue)
    assert law.degrees_of_freedom == 2


def test_pooled_cells_are_tested_as_one():
    law = law_of([(0, 0), (0, 1), (0, 2), (0, OTHER)], [0.7, 0.1, 0.1, 0.1], pooled=[1, 3])
    counts = Counter({(0, 0): 60, (0, 1): 10, (0, 2): 20, (0, 5): 10})
    ref = chisquare([60, 20, 20], np.array([0.7, 0.1, 0.2]) * 100).pvalue
    assert law.p_value(counts) == pytest.approx(ref)
    # 4 cells, 2 merged into 1: 3 groups, 2 degrees of freedom.
    assert law.degrees_of_freedom == 2
    assert law_of([(0, 0), (0, 1), (0, OTHER)], [0.5, 0.25, 0.25]).degrees_of_freedom == 2


def test_p_value_edges():
    law = law_of([(0, 0), (0, 1), (OTHER, OTHER)], [0.6, 0.4, 0.0])
    # An outcome the target never writes: certainly wrong.
    assert law.p_value(Counter({(0, 0): 10, (3, 3): 1})) == 0.0
    # Impossible cells with no observations are dropped from the test.
    ref = chisquare([55, 45], [60, 40]).pvalue
    assert law.p_value(Counter({(0, 0): 55, (0, 1): 45})) == pytest.approx(ref)
    # A single possible outcome: nothing can differ.
    one = law_of([(0, 0), (OTHER, OTHER)], [1.0, 0.0])
    assert one.p_value(Counter({(0, 0): 7})) == 1.0
    # A perfect fit.
    assert law.p_value(Counter({(0, 0): 60, (0, 1): 40})) == pytest.approx(1.0)
    # A clear misfit.
    assert law.p_value(Counter({(0, 0): 10, (0, 1): 90})) < 1e-6


def test_small_but_possible_cells_count():
    # Expected 0.5 of 100 observations, observed once: a real (if small) cell, not an impossible one.
    law = law_of([(0, 0), (0, 1)], [0.995, 0.005])
    counts = Counter({(0, 0): 99, (0, 1): 1})
    assert law.p_value(counts) == pytest.approx(chisquare([99, 1], [99.5, 0.5]).pvalue)
    assert law.p_value(Counter({(0, 0): 100})) == pytest.approx(chisquare([100, 0], [99.5, 0.5]).pvalue)


def test_expected_counts_follow_the_observed_total():
    # A possible cell never observed still counts (expected 16 of 80 observations).
    law = law_of([(0, 0), (0, 1), (0, 2)], [0.5, 0.3, 0.2])
    counts = Counter({(0, 0): 50, (0, 1): 30})
    ref = chisquare([50, 30, 0], [40, 24, 16]).pvalue
    assert law.p_value(counts) == pytest.approx(ref)


# --- sampling ----------------------------------------------------------------------------------------


class ScriptedDecoder:
    def __init__(self, outputs):
        self.outputs = outputs
        self.calls = []

    def generate(self, prompt_ids, max_new_tokens, params):
        self.calls.append((list(prompt_ids), max_new_tokens, params))
        tokens, drafted, accepted = self.outputs[params.seed]
        stats = SimpleNamespace(drafted=drafted, accepted=accepted)
        return SimpleNamespace(tokens=tokens, stats=stats)


def test_sample_pairs_counts_the_first_two_tokens_of_each_seed():
    decoder = ScriptedDecoder({0: ([4, 5], 2, 1), 1: ([4], 0, 0), 2: ([4, 5], 3, 3), 3: ([2, 1], 1, 0)})
    ticks = []
    run = sample_pairs(decoder, PROMPT, PARAMS, range(4), on_sample=lambda: ticks.append(1))
    assert run.counts == Counter({(4, 5): 2, (4, END): 1, (2, 1): 1})
    assert run.samples == 4 and len(ticks) == 4
    assert run.drafted == 6 and run.accepted == 4
    assert run.speculative_samples == 3
    assert run.acceptance == 4 / 6
    assert [c[2].seed for c in decoder.calls] == [0, 1, 2, 3]
    assert all(c[1] == 2 and c[0] == PROMPT and c[2].temperature == 0.8 for c in decoder.calls)
    assert run.to_dict() == {
        "samples": 4,
        "drafted": 6,
        "accepted": 4,
        "acceptance": 4 / 6,
        "speculative_samples": 3,
    }
    assert sample_pairs(decoder, PROMPT, PARAMS, [1]).samples == 1


def test_an_empty_run_has_no_acceptance():
    assert SampleRun().acceptance is None
    assert SampleRun(drafted=4, accepted=0).acceptance == 0.0
    assert SampleRun().to_dict()["acceptance"] is None


# --- reuse_prefix ----------------------------------------------------------------------------------


def test_reuse_prefix_gives_the_same_logits_as_a_plain_pass(lm):
    from transformers import DynamicCache

    reused = reuse_prefix(lm, PROMPT)
    assert reused is not lm and reused.model is not lm.model
    assert reused.model.config is lm.model.config  # attributes go through to the model
    with torch.no_grad():
        ids = torch.tensor([PROMPT + [4, 2]])
        ref = lm.model(input_ids=ids).logits[0]
        cache = DynamicCache(config=lm.model.config)
        out = reused.model(input_ids=ids, past_key_values=cache)
        # The prefix (all but the prompt's last token) is reused: logits only for the rest.
        assert out.logits.shape[1] == 3
        assert _close(out.logits[0], ref[-3:])
        assert cache.get_seq_length() == len(PROMPT) + 2
        # The prefix alone: its last row only, and the cache filled.
        long_prompt = [0, 3, 1, 2, 5]
        long = reuse_prefix(lm, long_prompt)
        cache = DynamicCache(config=lm.model.config)
        out = long.model(input_ids=torch.tensor([long_prompt[:-1]]), past_key_values=cache)
        assert out.logits.shape == (1, 1, V)
        ref_prefix = lm.model(input_ids=torch.tensor([long_prompt[:-1]])).logits[0, -1]
        assert _close(out.logits[0, -1], ref_prefix)
        assert out.past_key_values is cache and cache.get_seq_length() == 4
        # Keyword arguments reach the model.
        one = reused.model(
            input_ids=ids, past_key_values=DynamicCache(config=lm.model.config), logits_to_keep=1
        )
        assert one.logits.shape == (1, 1, V)
        assert _close(one.logits[0, 0], ref[-1])
        # Asking for logits of prefix positions is refused.
        with pytest.raises(ValueError, match="^reuse_prefix: logits of prefix positions"):
            reused.model(
                input_ids=ids, past_key_values=DynamicCache(config=lm.model.config), logits_to_keep=4
            )
        keep = reused.model(
            input_ids=ids, past_key_values=DynamicCache(config=lm.model.config), logits_to_keep=3
        )
        assert _close(keep.logits[0], ref[-3:])


def test_reuse_prefix_passes_other_calls_through(lm):
    from transformers import DynamicCache

    reused = reuse_prefix(lm, PROMPT)
    with torch.no_grad():
        other = torch.tensor([[2, 2, 2, 2]])
        ref = lm.model(input_ids=other).logits
        # Another prefix, no cache, a non-empty cache, a batch: all run in full.
        assert _close(reused.model(input_ids=other).logits, ref)
        cache = DynamicCache(config=lm.model.config)
        out = reused.model(input_ids=other, past_key_values=cache)
        assert out.logits.shape[1] == 4 and cache.get_seq_length() == 4
        # Positional arguments and keyword arguments go through.
        assert _close(reused.model(other).logits, ref)
        kept = reused.model(
            input_ids=other, past_key_values=DynamicCache(config=lm.model.config), logits_to_keep=1
        )
        assert kept.logits.shape[1] == 1
        ids = torch.tensor([PROMPT + [4]])
        full = lm.model(input_ids=ids).logits
        assert reused.model(input_ids=ids).logits.shape[1] == 4
        cache = DynamicCache(config=lm.model.config)
        lm.model(input_ids=torch.tensor([[5]]), past_key_values=cache)
        out = reused.model(input_ids=ids, past_key_values=cache)
        assert out.logits.shape[1] == 4
        batch = reused.model(
            input_ids=ids.expand(2, -1), past_key_values=DynamicCache(config=lm.model.config)
        )
        assert batch.logits.shape == (2, 4, V)
        assert _close(batch.logits[0], full[0])
        # Shorter than the prefix.
        short = reused.model(
            input_ids=torch.tensor([PROMPT[:1]]), past_key_values=DynamicCache(config=lm.model.config)
        )
        assert short.logits.shape[1] == 1
        # A legacy (non-Dynamic) cache argument is not reused.
        assert not reused.model._reusable(ids, object())
        assert not reused.model._reusable(None, DynamicCache(config=lm.model.config))
    assert reuse_prefix(lm, [3]) is lm  # nothing to reuse
    assert reuse_prefix(lm, [3, 4]) is not lm  # one token to reuse
