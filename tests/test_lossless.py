"""Greedy losslessness for every family: SPS and PLD reproduce AR token for token in float32."""

from __future__ import annotations

import pytest
from tiny import FAMILIES
from tolerance import assert_greedy_equal

from draftlab.decode.build import build_decoder
from draftlab.decode.spec import DecoderConfig
from draftlab.models.loading import ModelSpec, check_compatible, load_model
from draftlab.models.prompting import encode_prompt
from draftlab.sampling import SamplingParams

GREEDY = SamplingParams()
PROMPTS = [
    "the cat sat on the mat and then the dog ran",
    "law court contract clause paid month year the big red tree",
]


@pytest.fixture(scope="module")
def loaded(tiny_pair):
    cache = {}

    def get(family):
        if family not in cache:
            target_dir, draft_dir = tiny_pair[family]
            target = load_model(ModelSpec(str(target_dir), dtype="float32"))
            draft = load_model(ModelSpec(str(draft_dir), dtype="float32"))
            check_compatible(target, draft)
            cache[family] = (target, draft)
        return cache[family]

    return get


def run(method, target, draft, prompt, max_new=40, gamma=4, **kw):
    kw.setdefault("draft_confidence", 0.0)  # plain SPS: every round drafts γ
    ids = encode_prompt(target, prompt, chat=False)
    config = DecoderConfig.of(method=method, gamma=gamma, **kw)  # a drafter's own settings too
    return build_decoder(config, target, draft).generate(ids, max_new, GREEDY)


@pytest.mark.parametrize("family", FAMILIES)
def test_sps_pld_hf_match_ar(family, loaded):
    target, draft = loaded(family)
    for prompt in PROMPTS:
        ar = run("ar", target, draft, prompt)
        assert ar.stats.new_tokens > 0
        assert ar.stats.mean_accepted_length == 1.0
        ids = encode_prompt(target, prompt, chat=False)
        for method in ("sps", "pld", "hf-greedy"):
            out = run(method, target, draft, prompt)
            assert_greedy_equal(target, ids, out.tokens, ar.tokens, f"{family} {method}")
        sps = run("sps", target, draft, prompt, gamma=3)
        assert_greedy_equal(target, ids, sps.tokens, ar.tokens, f"{family} sps γ=3")
        assert sps.stats.drafted > 0


@pytest.mark.parametrize("family", FAMILIES)
def test_draft_equal_target_accepts_everything(family, loaded):
    target, _ = loaded(family)
    out = run("sps", target, target, PROMPTS[0], max_new=30)
    assert out.stats.drafted > 0
    assert out.stats.acceptance_rate == 1.0
    # every round keeps γ drafted tokens plus the bonus token (except a budget-cut last round)
    assert out.stats.mean_accepted_length > 3.0


@pytest.mark.parametrize("family", ["llama", "t5"])
def test_hf_assisted_matches_ar(family, loaded):
    target, draft = loaded(family)
    ar = run("ar", target, draft, PROMPTS[1])
    assisted = run("hf-assisted", target, draft, PROMPTS[1])
    assert assisted.tokens == ar.tokens


def test_no_cache_variant_is_identical(loaded):
    target, draft = loaded("llama")
    ar = run("ar", target, draft, PROMPTS[0])
    for method in ("ar", "sps"):
        out = run(method, target, draft, PROMPTS[0], use_cache=False)
        assert out.tokens == ar.tokens


def test_output_never_exceeds_budget(loaded):
    target, _ = loaded("llama")
    for max_new in (1, 2, 5, 7):
        out = run("sps", target, target, PROMPTS[0], max_new=max_new, gamma=4)
        assert out.stats.new_tokens == len(out.tokens) <= max_new


def test_bild_limits(loaded):
    target, draft = loaded("llama")
    ar = run("ar", target, draft, PROMPTS[0])
    # Fallback 1.0: the small model is never confident enough, the large model writes everything.
    always_fallback = run("bild", target, draft, PROMPTS[0], fallback_threshold=1.0)
    assert always_fallback.tokens == ar.tokens
    assert always_fallback.stats.draft_tokens_kept == 0
    # Fallback 0 and no rollback: the small model writes everything.
    small_ar = build_decoder(DecoderConfig(method="ar"), draft).generate(
        encode_prompt(draft, PROMPTS[0], chat=False), 40, GREEDY
    )
    small_only = run(
        "bild", target, draft, PROMPTS[0], fallback_threshold=0.0, rollback_threshold=float("inf")
    )
    assert small_only.tokens == small_ar.tokens
    assert small_only.stats.fallbacks == 0 and small_only.stats.rollbacks == 0


def test_bild_records_fallbacks_and_rollbacks(loaded):
    target, draft = loaded("llama")
    out = run("bild", target, draft, PROMPTS[0], fallback_threshold=0.3, rollback_threshold=1.0)
    s = out.stats
    assert s.fallbacks + s.rollbacks > 0
    assert 0.0 <= s.draft_share <= 1.0


def test_stories_acceptance_is_meaningful(stories):
    target = load_model(ModelSpec(str(stories), dtype="float32"))
    ids = encode_prompt(target, "Once upon a time, there was a little dog named Max.", chat=False)
    ar = build_decoder(DecoderConfig(method="ar"), target).generate(ids, 80, GREEDY)
    sps = build_decoder(DecoderConfig(method="sps"), target, target).generate(ids, 80, GREEDY)
    pld = build_decoder(DecoderConfig(method="pld"), target).generate(ids, 80, GREEDY)
    assert sps.tokens == ar.tokens == pld.tokens
    assert sps.stats.acceptance_rate == 1.0
    assert sps.stats.rounds < ar.stats.rounds / 3


def test_draft_confidence_stops_drafting_early_and_stays_lossless(loaded):
    target, draft = loaded("llama")
    ar = run("ar", target, draft, PROMPTS[1])
    full = run("sps", target, draft, PROMPTS[1])
    early = run("sps", target, draft, PROMPTS[1], draft_confidence=0.9)
    assert early.tokens == ar.tokens
    # A random tiny draft is rarely 90% sure, so rounds stop before γ = 4 draft tokens.
    assert early.stats.drafted < 4 * (early.stats.rounds - 1)
    assert early.stats.drafted < full.stats.drafted
    assert early.stats.draft_calls < full.stats.draft_calls


def test_the_confidence_stop_is_not_checked_after_the_last_draft_token(loaded, monkeypatch):
    """Stopping after the last token changes nothing, so its check (a softmax over the vocabulary)
    is not made: k tokens, k - 1 checks."""
    from draftlab.drafters.draft_model.proposer import DraftModelProposer
    from draftlab.models.cached import CachedModel
    from draftlab.sampling import Sampler

    target, draft = loaded("llama")
    proposer = DraftModelProposer(CachedModel(draft), target.vocab_size, confidence=1e-9)
    checked = []
    monkeypatch.setattr(proposer, "_token_prob", lambda *args: checked.append(args) or 1.0)
    ids = encode_prompt(target, PROMPTS[1], chat=False)
    proposer.start(ids, ids)
    for k, checks in ((1, 0), (3, 2)):
        checked.clear()
        proposal = proposer.propose(ids, k, GREEDY, Sampler(GREEDY.seed))
        assert len(proposal.tokens) == k and len(checked) == checks
        proposer.rollback(len(ids) - 1)


def test_nothing_is_drafted_or_verified_past_an_end_token(loaded):
    target, _ = loaded("llama")
    ar = run("ar", target, target, PROMPTS[0])
    eos = ar.tokens[2]
    first = ar.tokens.index(eos)
    saved = set(target.eos_token_ids)
    target.eos_token_ids.clear()
    target.eos_token_ids.add(eos)
    try:
        # Draft = target: round 1 drafts up to the end token and stops, the target accepts it all.
        out = run("sps", target, target, PROMPTS[0])
        pld = run("pld", target, target, PROMPTS[0])
    finally:
        target.eos_token_ids.clear()
        target.eos_token_ids.update(saved)
    assert out.tokens == ar.tokens[: first + 1]
    assert out.stats.rounds == 1 and out.stats.drafted == first + 1
    assert out.stats.draft_calls == 1 + first + 1  # draft prefill, then one pass per drafted token
    assert pld.tokens == ar.tokens[: first + 1]


def test_hf_assisted_decoders_sharing_a_draft_keep_their_own_settings(loaded):
    """HF reads γ and the confidence threshold from the draft's generation config, which is shared."""
    target, draft = loaded("llama")
    eager = build_decoder(DecoderConfig.of(method="hf-assisted", draft_confidence=0.0), target, draft)
    cautious = build_decoder(DecoderConfig.of(method="hf-assisted", draft_confidence=0.9), target, draft)
    ids = encode_prompt(target, PROMPTS[1], chat=False)
    first = eager.generate(ids, 40, GREEDY)
    stopped = cautious.generate(ids, 40, GREEDY)
    again = eager.generate(ids, 40, GREEDY)
    assert stopped.stats.draft_calls < first.stats.draft_calls
    assert again.stats.draft_calls == first.stats.draft_calls
    assert first.tokens == stopped.tokens == again.tokens


def test_greedy_equality_forgives_only_a_near_tie(loaded):
    """The comparison the long equality tests use fails on a token that is not a near-tie."""
    target, draft = loaded("llama")
    ids = encode_prompt(target, PROMPTS[0], chat=False)
    ar = run("ar", target, draft, PROMPTS[0])
    assert_greedy_equal(target, ids, list(ar.tokens), ar.tokens)
    wrong = list(ar.tokens)
    wrong[5] = (wrong[5] + 1) % target.vocab_size
    with pytest.raises(AssertionError, match="no near-tie"):
        assert_greedy_equal(target, ids, wrong, ar.tokens, "llama")
    with pytest.raises(AssertionError, match="prefix"):
        assert_greedy_equal(target, ids, ar.tokens[:-1], ar.tokens, "llama")
