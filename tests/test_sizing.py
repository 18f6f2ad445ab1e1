"""Cost-aware round sizing: the cost model's choices, the profile cache, and losslessness with it on."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
from tiny import FAMILIES
from tolerance import assert_greedy_equal, sum_tol

from draftlab.decode.build import build_decoder
from draftlab.decode.cost import CostModel, break_even_alpha, choose_k, expected_tokens
from draftlab.decode.round_sizer import CATCH_UP_SHARE, Choice, RoundSizer, parent_kind
from draftlab.decode.shadows import Shadow, Shadows
from draftlab.decode.spec import DecoderConfig
from draftlab.decode.timing import TickClock
from draftlab.decode.tree_sizer import TreeSizer
from draftlab.models.cost_curve import CostCurve
from draftlab.models.loading import ModelSpec, load_model
from draftlab.models.profile import load_cached, load_or_measure, measure, profile_path
from draftlab.models.prompting import encode_prompt
from draftlab.proposal import Proposal
from draftlab.sampling import SamplingParams

GREEDY = SamplingParams()


def curve(ms_by_n: dict[int, float], contexts=(64, 1024)) -> CostCurve:
    sizes = sorted(ms_by_n)
    return CostCurve(sizes, list(contexts), [[ms_by_n[n] for n in sizes] for _ in contexts])


# The shapes measured on real CPUs (issue 10): emulated bf16 costs k passes for k tokens; native
# bf16 / float32 with AMX or AVX-512 is nearly flat.
STEEP = curve({1: 47.0, 2: 94.0, 4: 188.0, 8: 376.0, 16: 752.0})
FLAT = curve({1: 40.0, 2: 41.0, 4: 42.0, 8: 44.0, 16: 50.0})
MODERATE = curve({1: 33.0, 2: 35.0, 4: 50.0, 8: 60.0, 16: 69.0})


def best_k(cost: CostModel, alpha: float, k_max: int = 10, context: int = 256) -> int:
    return choose_k(cost.verify_ms, cost.draft_ms, [alpha] * k_max, k_max, context)[0]


def test_no_acceptance_means_plain_steps():
    for shape in (STEEP, FLAT, MODERATE):
        assert best_k(CostModel(shape), 0.0) == 0
        assert best_k(CostModel(shape, curve({1: 3.0, 2: 3.2, 16: 5.0})), 0.0) == 0


def test_k_grows_with_acceptance():
    cost = CostModel(MODERATE)
    ks = [best_k(cost, a) for a in (0.0, 0.2, 0.4, 0.6, 0.8, 0.95)]
    assert ks == sorted(ks), ks
    assert ks[0] == 0 and ks[-1] >= 8


def test_a_steep_curve_never_pays_and_a_flat_one_pays_early():
    assert best_k(CostModel(STEEP), 0.9) == 0
    assert break_even_alpha(CostModel(STEEP), 4, 256) is None
    assert best_k(CostModel(FLAT), 0.3) > 0
    alpha = break_even_alpha(CostModel(MODERATE), 4, 256)
    assert alpha is not None and 0 < alpha < 1
    # At the break-even α, drafting 4 tokens and a plain step produce tokens equally fast.
    rate = expected_tokens([alpha] * 4, 4) / MODERATE.forward_ms(5, 256)
    # 60 bisection steps pin α to 2^-60 of [0, 1]; the rates then agree to float64 rounding.
    assert rate == pytest.approx(1 / MODERATE.forward_ms(1, 256), rel=sum_tol(8, torch.float64))


def test_draft_cost_counts_against_drafting():
    cheap = CostModel(FLAT, curve({1: 1.0, 2: 1.1, 16: 2.0}))
    dear = CostModel(FLAT, curve({1: 30.0, 2: 31.0, 16: 40.0}))
    assert best_k(cheap, 0.5) > best_k(dear, 0.5)


def test_the_sizer_learns_and_a_draft_model_keeps_probing():
    sizer = RoundSizer(CostModel(MODERATE, curve({1: 2.0, 2: 2.2, 16: 4.0})), k_max=6, free_drafts=False)
    sizer.start()
    for _ in range(30):
        choice = sizer.choose(256, 6)
        sizer.observe(choice.k, 0, probe=choice.probe)
    choices = [sizer.choose(256, 6) for _ in range(200)]
    assert sum(c.k == 0 for c in choices) > 150, "nothing is ever accepted: mostly plain steps"
    probes = [c for c in choices if c.probe]
    assert probes and all(c.k == 1 for c in probes), "but it keeps probing"
    for _ in range(30):
        choice = sizer.choose(256, 6)
        sizer.observe(max(choice.k, 1), max(choice.k, 1))
    assert sizer.choose(256, 6).k == 6, "everything accepted: the longest draft"


# llama.cpp's curve for the default target's Q4_1 file on a 2-core AMD Zen5 (ms per pass of N tokens).
LLAMACPP_Q41 = curve({1: 6.4, 2: 12.8, 4: 17.6, 8: 26.8, 16: 43.7})


def test_drafted_rounds_that_bring_less_than_expected_scale_down_what_the_sizer_expects():
    """The sizer drafts when its estimate is high, so its drafted rounds are where the estimate
    was too high: their realised gain corrects later choices. A class whose expected gain was
    marginal stops drafting, a clearly paying one goes on, and the correction only ever lowers."""

    def primed(calibrate: bool = True) -> RoundSizer:
        sizer = RoundSizer(CostModel(LLAMACPP_Q41), k_max=8, free_drafts=True, calibrate=calibrate)
        sizer.start()
        # "weak": 3.4 tokens expected for 3.1 steps' cost; "copy": 7.3 tokens for 4.5 steps.
        for kind, pattern in (("weak", [4, 4, 4, 1, 0]), ("copy", [8, 8, 8, 2])):
            for _ in range(10):
                for accepted in pattern:
                    sizer.observe(8, accepted, kind)
        return sizer

    sizer = primed()
    first = sizer.choose(256, 8, "weak")
    assert first.k > 0 and first.gain == 1.0 and first.kind == "weak"
    for _ in range(10):  # drafted rounds that each bring 1 draft where about 2.4 were expected
        sizer.observe_gain(first, 1)
    assert 0.4 < sizer.gain_factor("weak") < 0.7
    assert sizer.choose(256, 8, "weak").k == 0
    assert sizer.gain_factor("copy") == 1.0 and sizer.choose(256, 8, "copy").k == 8  # its own record
    # Rounds that bring more than expected never raise the expectation above the evidence's.
    lucky = primed()
    choice = lucky.choose(256, 8, "weak")
    for _ in range(10):
        lucky.observe_gain(choice, 8)
    assert lucky.gain_factor("weak") == 1.0
    assert lucky.choose(256, 8, "weak").expected_tokens == choice.expected_tokens
    # Plain rounds and probes teach nothing about drafted gains; a sizer told not to calibrate neither.
    fixed = primed(calibrate=False)
    for c in (
        first,
        Choice(0, 1.0, 6.4, 6.4, kind="weak"),
        Choice(1, 1.5, 12.8, 6.4, probe=True, kind="weak"),
    ):
        fixed.observe_gain(c, 0)
    assert fixed.evidence.gains == {}


# A CPU where verifying 2 tokens costs 1.2 steps and a head pass a tenth of one: a draft token
# pays only above α of about 0.3.
HEAD_LIKE = CostModel(curve({1: 30.0, 2: 36.0, 4: 42.0, 8: 60.0, 16: 90.0}), curve({1: 3.0, 2: 3.3, 16: 6.0}))


def _simulate(sizer: RoundSizer, alpha: float, rounds: int, rng) -> tuple[int, int]:
    """One generation of `rounds` rounds whose draft tokens are each accepted with chance `alpha`;
    returns (rounds that drafted, probes)."""
    sizer.start()
    drafted = probes = 0
    for _ in range(rounds):
        choice = sizer.choose(256, 6)
        accepted = 0
        while accepted < choice.k and rng.random() < alpha:
            accepted += 1
        sizer.observe(choice.k, accepted, probe=choice.probe)
        drafted += choice.k > 0
        probes += choice.probe
    return drafted, probes


def test_each_generation_finds_out_for_itself_whether_drafting_pays():
    """A head's α differs by task far more than the run's average shows: generations where
    nothing is accepted must not stop a later one, where nearly everything is, from drafting. The
    earlier rule (probes backing off across generations) drafted in none of the good one's rounds."""
    import random

    rng = random.Random(0)
    sizer = RoundSizer(HEAD_LIKE, k_max=6, free_drafts=False)
    bad = [_simulate(sizer, 0.05, 40, rng) for _ in range(3)]
    assert all(drafted <= 4 and probes <= 3 for drafted, probes in bad), bad
    drafted, _ = _simulate(sizer, 0.85, 40, rng)
    assert drafted >= 30, drafted
    # And back on a task where nothing is accepted, drafting stops within a few rounds.
    drafted, _ = _simulate(sizer, 0.02, 40, rng)
    assert drafted <= 12, drafted


def test_a_probe_at_once_is_only_taken_where_it_is_cheap():
    """At the start of a generation a draft model probes at once only if the probe costs at most a
    plain step more; on a steep curve it waits for the usual, budgeted gap."""
    steep = RoundSizer(CostModel(STEEP, curve({1: 2.0, 2: 2.2, 16: 4.0})), k_max=6, free_drafts=False)
    cheap = RoundSizer(HEAD_LIKE, k_max=6, free_drafts=False)
    for sizer in (steep, cheap):
        sizer.start()
        sizer.observe(1, 0)  # the run so far: nothing accepted, so k = 0 is chosen
    first_steep, first_cheap = steep.choose(256, 6), cheap.choose(256, 6)
    assert first_cheap.probe and first_cheap.k == 1
    assert not first_steep.probe and first_steep.k == 0
    # A rejected probe: the next one waits again.
    cheap.observe(1, 0, probe=True)
    assert not cheap.choose(256, 6).probe
    # An accepted one is followed at once by another round that drafts (a probe or more).
    cheap.start()
    assert cheap.choose(256, 6).probe
    cheap.observe(1, 1, probe=True)
    assert cheap.choose(256, 6).k >= 1


def test_a_draft_catches_up_on_the_prompt_only_where_the_answer_left_repays_it():
    """A lazily prefilled draft lags by the prompt until its first pass. That catch-up (70 ms for 585
    tokens here, against a 30 ms plain step) is paid once: a probe is priced with it, and a probe or
    a first draft where the run knows nothing yet pays it only where it is at most CATCH_UP_SHARE
    of the plain time left."""
    lagging = CostCurve([1, 2, 16], [64, 1024], [[3.0, 3.3, 6.0]] * 2, [16, 1024], [6.0, 120.0])
    cost = CostModel(HEAD_LIKE.target, lagging)
    catch_up = lagging.prefill(585) - lagging.forward_ms(2, 256)
    assert catch_up > 2 * 30.0

    def chain_probes(pending: int, remaining: int | None, known: bool) -> bool:
        sizer = RoundSizer(cost, k_max=6, free_drafts=False)
        sizer.start()
        if known:
            sizer.observe(1, 0)  # the run so far: nothing accepted, so k = 0 is chosen
        choice = sizer.choose(256, 6, pending=pending, remaining=remaining)
        assert choice.k == int(choice.probe), choice
        return choice.probe

    def tree_drafts(pending: int, remaining: int | None) -> bool:
        trees = TreeSizer(cost, depth=6, width=2, free_drafts=False)
        trees.start()
        return trees.wants_draft(256, 6, pending, remaining=remaining) is None  # nothing known yet

    for pending, remaining, known, probes in [
        (2, 18, True, True),  # cheap enough to probe at once
        (585, 18, True, False),
        (585, 18, False, False),  # the answer left cannot repay the catch-up, even to find out
        (585, 256, False, True),  # the run knows nothing yet: find out
        (585, 256, True, False),  # it does: a 76 ms probe waits for its budgeted gap
    ]:
        assert chain_probes(pending, remaining, known) is probes, (pending, remaining, known)
        if not known:
            assert tree_drafts(pending, remaining) is probes, (pending, remaining)
    # Knowing nothing excuses the catch-up, not a probe that is dear in itself (a steep curve).
    steep = RoundSizer(CostModel(STEEP, lagging), k_max=6, free_drafts=False)
    steep.start()
    assert not steep.choose(256, 6, pending=2, remaining=10_000).probe
    # The share is the line: just under and just over it.
    line = catch_up / (CATCH_UP_SHARE * 30.0)
    assert chain_probes(585, math.ceil(line), known=False) and not chain_probes(585, math.floor(line), False)

    # With evidence, the catch-up counts toward the probing budget: it spaces probes out.
    def rounds_to_first_probe(pending: int) -> int:
        sizer = RoundSizer(cost, k_max=6, free_drafts=False)
        sizer.start()
        sizer.observe(1, 0)
        return next(
            n for n in range(1, 10_000) if sizer.choose(256, 6, pending=pending, remaining=10_000).probe
        )

    assert rounds_to_first_probe(2) == 1 and rounds_to_first_probe(585) > 50


def test_the_shadow_scores_a_proposal_against_what_the_target_wrote():
    shadow = Shadow()
    shadow.begin([5, 6, 7], "3-gram")
    assert shadow.advance([5]) is None
    assert shadow.advance([6]) is None
    assert shadow.advance([9]) == (3, 2, "3-gram")  # tried 3 positions, the first 2 accepted
    assert not shadow.active
    shadow.begin([1, 2], None)
    assert shadow.advance([1, 2]) == (2, 2, None)


def test_shadows_score_a_rare_kind_while_a_frequent_one_is_watched():
    shadows = Shadows()
    shadows.begin([5, 9, 9], "1-gram weak")
    assert shadows.advance([5]) == [] and shadows.active
    shadows.begin([6, 7], "3-gram/agrees on 16+")  # one shadow per kind: this one is watched too
    shadows.begin([1, 1], "1-gram weak")  # that kind already has its shadow
    assert shadows.advance([6]) == [(2, 1, "1-gram weak")]
    assert shadows.advance([7]) == [(2, 2, "3-gram/agrees on 16+")] and not shadows.active
    shadows.begin([3, 4], None)
    assert shadows.end() == [] and not shadows.active  # a speculative round ends it: nothing tried
    shadows.begin([3, 4], None)
    assert shadows.advance([3]) == [] and shadows.end() == [(1, 1, None)]


def test_a_fine_kind_starts_from_its_parent_and_then_follows_its_own_record():
    assert parent_kind("3-gram/agrees on 16+") == "3-gram" and parent_kind("3-gram") is None
    assert parent_kind(None) is None
    # llama.cpp-like: verifying 4 drafts costs 2.7 plain steps
    sizer = RoundSizer(CostModel(curve({1: 10.0, 2: 15.0, 4: 23.0, 8: 38.0})), k_max=4, free_drafts=True)
    for _ in range(30):  # copies in progress, all accepted: the 3-gram record rises with them
        sizer.observe(4, 4, "3-gram/agrees on 16+")
    for _ in range(8):
        sizer.observe(4, 0, "3-gram/agrees on 3")
    sizer.start()  # a new generation: only the run's record remains
    coarse = sizer.alphas("3-gram", 4)[0]
    unseen = sizer.alphas("3-gram/agrees on 8-15", 4)[0]
    assert unseen == pytest.approx(coarse) and coarse > 0.7  # the parent pools 38 rounds, 30 accepted
    assert sizer.alphas("3-gram/agrees on 16+", 4)[0] > coarse > sizer.alphas("3-gram/agrees on 3", 4)[0]
    assert sizer.alphas("3-gram/agrees on 3", 4)[0] < 0.3
    assert sizer.alphas("2-gram", 4)[0] == 0.5  # another kind knows nothing of these
    assert sizer.choose(256, 4, "3-gram/agrees on 16+").k > 0
    assert sizer.choose(256, 4, "3-gram/agrees on 3").k == 0


def test_profile_is_cached_and_a_foreign_one_is_remeasured(tiny_pair, monkeypatch, tmp_path):
    monkeypatch.setenv("DRAFTLAB_PROFILE_DIR", str(tmp_path))
    lm = load_model(ModelSpec(str(tiny_pair["llama"][0]), dtype="float32"))
    first, measured = load_or_measure(lm, repeats=1)
    assert measured and first.curve.forward_ms(4, 100) > 0
    assert load_or_measure(lm, repeats=1)[1] is False
    # Another machine's (or thread count's) profile in the same file is not used.
    path = profile_path(lm)
    data = json.loads(path.read_text())
    # Each foreign value is built from this machine's own, so it differs on every CPU (a hard-coded
    # "other CPU" is some machine's own identity: this test once failed on every Zen3).
    hardware = data["fingerprint"]["hardware"]
    for field, other in (
        ("name", hardware["name"] + " (another)"),
        ("cpu_id", hardware["cpu_id"] + " stepping 99"),
        ("cpu_flags", sorted(hardware["cpu_flags"])[1:] + ["a_flag_no_cpu_has"]),
    ):
        assert other != hardware[field]
        changed = json.loads(json.dumps(data))
        changed["fingerprint"]["hardware"][field] = other
        path.write_text(json.dumps(changed))
        assert load_cached(lm) is None, field
    assert data["fingerprint"]["hardware"]["cpu_id"]  # the identity is recorded, not left empty
    assert load_or_measure(lm, repeats=1)[1] is True
    # A kernel-selecting environment variable changes the key: the old profile does not apply.
    # (Another value than the one this run has: the suite also runs under AVX2 kernel ceilings.)
    ceiling = os.environ.get("ONEDNN_MAX_CPU_ISA")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2" if ceiling != "AVX2" else "SSE41")
    assert load_cached(lm) is None
    # So does one that makes the OpenMP threads sleep between a pass's parallel regions.
    if ceiling is None:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    else:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", ceiling)
    assert load_cached(lm) is not None
    monkeypatch.setenv(
        "OMP_WAIT_POLICY", "PASSIVE" if os.environ.get("OMP_WAIT_POLICY") != "PASSIVE" else "ACTIVE"
    )
    assert load_cached(lm) is None


def test_measure_reports_every_point(tiny_pair):
    lm = load_model(ModelSpec(str(tiny_pair["gpt2"][0]), dtype="float32"))
    c = measure(lm, sizes=(1, 2, 4), contexts=[8, 16], prefill_lengths=[4, 8], repeats=1)
    assert len(c.ms) == 2 and all(len(row) == 3 and min(row) > 0 for row in c.ms)
    assert len(c.prefill_ms) == 2


def _sized(method, target, draft, shape, draft_shape=None, gamma=4, clock=None):
    """A cost-sized decoder on synthetic curves, timed by a TickClock (10 µs a reading) unless told
    otherwise: its choices depend on the curves and the tokens, not on how busy the machine is."""
    config = DecoderConfig.of(method=method, gamma=gamma, draft_confidence=0.0)
    cost = CostModel(shape, draft_shape if method == "sps" else None, clock=clock or TickClock(0.01))
    return build_decoder(config, target, draft, cost)


@pytest.mark.parametrize("family", FAMILIES)
def test_cost_aware_sps_and_pld_match_ar(family, tiny_pair):
    target_dir, draft_dir = tiny_pair[family]
    target = load_model(ModelSpec(str(target_dir), dtype="float32"))
    draft = load_model(ModelSpec(str(draft_dir), dtype="float32"))
    prompt = "the cat sat on the mat and then the dog ran on the mat and then the cat"
    ids = encode_prompt(target, prompt, chat=False)
    ar = build_decoder(DecoderConfig(method="ar"), target).generate(ids, 60, GREEDY)
    draft_cost = curve({1: 1.0, 2: 1.1, 16: 2.0})
    for shape in (FLAT, MODERATE, STEEP):
        for method in ("sps", "pld"):
            out = _sized(method, target, draft, shape, draft_cost).generate(ids, 60, GREEDY)
            assert_greedy_equal(target, ids, out.tokens, ar.tokens, f"{family} {method}")
            # Every round is sized, or runs plainly while lookups go unverified (decode/pacing.py).
            paced = out.stats.paced_rounds
            assert sum(out.stats.k_counts) + paced == out.stats.rounds
            if method == "sps":
                assert paced == 0, "a draft model's rounds are never paced"
            # Every sized round after the first is timed against what the profile alone predicted.
            assert out.stats.timed_rounds == out.stats.rounds - 1 - paced
            assert out.stats.profiled_ms > 0 and out.stats.measured_ms > 0


def test_cost_aware_decoding_matches_ar_over_1000_tokens_with_stories(stories, tmp_path):
    # stories260K was trained on 512 positions; RoPE runs past them, and equality must hold anyway.
    model = load_model(ModelSpec(str(stories), dtype="float32"))
    model.model.config.max_position_embeddings = 1200
    model.eos_token_ids = set()  # no early stop: 1,000 tokens each
    ids = encode_prompt(model, "Once upon a time, there was a little dog named Max.", chat=False)
    ar = build_decoder(DecoderConfig(method="ar"), model).generate(ids, 1000, GREEDY)
    assert len(ar.tokens) == 1000
    draft_cost = curve({1: 4.0, 2: 4.2, 16: 6.0})
    for shape in (FLAT, MODERATE):
        sps = _sized("sps", model, model, shape, draft_cost).generate(ids, 1000, GREEDY)
        pld = _sized("pld", model, None, shape).generate(ids, 1000, GREEDY)
        assert_greedy_equal(model, ids, sps.tokens, ar.tokens, "sps")
        assert_greedy_equal(model, ids, pld.tokens, ar.tokens, "pld")
        assert sps.stats.accepted > 500, "a draft equal to the target is accepted: long rounds"
        assert len(sps.stats.k_counts) > 2


def test_cost_aware_decoding_matches_ar_over_1000_tokens_random_init(tiny_pair):
    target_dir, draft_dir = tiny_pair["llama"]
    target = load_model(ModelSpec(str(target_dir), dtype="float32"))
    draft = load_model(ModelSpec(str(draft_dir), dtype="float32"))
    target.eos_token_ids = set()
    target.model.config.max_position_embeddings = 1200
    ids = encode_prompt(target, "the cat sat on the mat and then the dog ran", chat=False)
    ar = build_decoder(DecoderConfig(method="ar"), target).generate(ids, 1000, GREEDY)
    for method in ("sps", "pld"):
        out = _sized(method, target, draft, FLAT, curve({1: 1.0, 2: 1.1, 16: 2.0})).generate(
            ids, 1000, GREEDY
        )
        assert_greedy_equal(target, ids, out.tokens, ar.tokens, method)


def test_the_router_runs_each_generation_in_the_dtype_predicted_fastest(tiny_pair):
    from draftlab.decode.router import DtypeRouter

    target_dir, draft_dir = tiny_pair["llama"]
    fp32 = load_model(ModelSpec(str(target_dir), dtype="float32"))
    bf16 = load_model(ModelSpec(str(target_dir), dtype="bfloat16"))
    ids = encode_prompt(fp32, "the cat sat on the mat and then the dog ran on the mat", chat=False)
    ar32 = build_decoder(DecoderConfig(method="ar"), fp32).generate(ids, 30, GREEDY)
    ar16 = build_decoder(DecoderConfig(method="ar"), bf16).generate(ids, 30, GREEDY)
    slow = curve({1: 400.0, 2: 410.0, 16: 500.0})
    for fast_dtype, costs in (("float32", (FLAT, slow)), ("bfloat16", (slow, FLAT))):
        router = build_decoder(
            DecoderConfig(method="pld"), fp32, None, CostModel(costs[0]), [(bf16, CostModel(costs[1]))]
        )
        assert isinstance(router, DtypeRouter)
        out = router.generate(ids, 30, GREEDY)
        assert out.stats.dtype == fast_dtype
        assert out.tokens == (ar32 if fast_dtype == "float32" else ar16).tokens
    # The copies learn acceptance together: what one saw, the other's sizer knows.
    sizers = [d.sizer for d in router.decoders.values()]
    assert sizers[0].evidence is sizers[1].evidence and sizers[0].evidence.rounds > 0
    # A long prompt favours the dtype with the cheaper prefill, a short one the cheaper step.
    long_prefill = CostCurve([1, 2, 16], [64, 1024], [[30.0, 31.0, 40.0]] * 2, [16, 1024], [40.0, 1200.0])
    cheap_prefill = CostCurve([1, 2, 16], [64, 1024], [[36.0, 37.0, 40.0]] * 2, [16, 1024], [40.0, 300.0])
    router = build_decoder(
        DecoderConfig(method="pld"), fp32, None, CostModel(long_prefill), [(bf16, CostModel(cheap_prefill))]
    )
    assert router.choose(900, 64) == "bfloat16"
    assert router.choose(20, 64) == "float32"


@pytest.mark.parametrize(
    ("env", "left"),
    [
        ({}, ["avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"]),
        ({"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}, ["avx2"]),
        ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}, ["avx2", "avx512f", "avx512_bf16"]),
        ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}, ["avx2", "avx512f"]),
        ({"ATEN_CPU_CAPABILITY": "default"}, []),
    ],
)
def test_kernel_ceilings_hide_the_newer_isa_from_the_record(monkeypatch, env, left):
    from draftlab.hardware import effective_isa

    for key in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert effective_isa(["avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"]) == left


class LoadClock:
    """A clock that only the target's passes move, by what a pass of n tokens `costs` now: a machine
    whose load changes mid-run, replayed exactly (a test must not depend on the real machine's load)."""

    def __init__(self, costs):
        self.costs, self.now = costs, 0.0

    def __call__(self) -> float:
        return self.now

    def passed(self, n: int) -> None:
        self.now += self.costs(n) / 1000


def test_sizing_follows_the_load_drafting_stops_when_passes_get_dear_and_resumes_after(tiny_pair):
    """The profile says verifying is nearly free (FLAT). Mid-run the machine gets busy and a pass of
    n tokens costs n plain steps; later it is quiet again. Measured round times must steer: drafting
    stops while passes are dear and comes back once they are not."""
    target = load_model(ModelSpec(str(tiny_pair["llama"][0]), dtype="float32"))
    ids = encode_prompt(target, "the cat sat on the mat and then the dog ran on the mat and the", chat=False)
    ar = build_decoder(DecoderConfig(method="ar"), target).generate(ids, 60, GREEDY)
    state = {"phase": "quiet", "prompt": True}
    clock = LoadClock(lambda n: 10.0 * n if state["phase"] == "busy" else FLAT.forward_ms(n, 64))
    verified: dict[str, list[int]] = {}  # phase -> passes of several tokens after the prompt, per generation

    def count(module, args, kwargs):
        n = kwargs["input_ids"].shape[1]
        clock.passed(n)
        if not state["prompt"]:
            verified[state["phase"]][-1] += int(n > 1)
        state["prompt"] = False

    decoder = _sized("pld", target, None, FLAT, clock=clock)
    handle = target.model.register_forward_pre_hook(count, with_kwargs=True)
    try:
        for phase in ("quiet", "busy", "quiet again"):
            state["phase"] = phase
            verified[phase] = []
            for _ in range(6):
                verified[phase].append(0)
                state["prompt"] = True
                out = decoder.generate(ids, 60, GREEDY)
                assert out.tokens == ar.tokens, phase
    finally:
        handle.remove()
    quiet, busy, again = verified["quiet"], verified["busy"], verified["quiet again"]
    assert sum(quiet) >= 6, verified  # verifying is cheap: lookups are verified
    # Dear passes: plain steps, but for a rare retry (is it still busy?), one every other generation.
    assert sum(busy) <= len(busy) and 5 * sum(busy) <= sum(quiet), verified
    # Quiet again: verification is tried, found cheap, and back where it was (without the relaxing
    # toward plain steps' factor it stayed at 70%: the dear factor was never unlearnt).
    assert sum(again[2:]) >= 0.9 * sum(quiet[2:]), verified


def test_a_block_drafter_pays_one_draft_pass_for_k_tokens():
    """A block drafter (DFlash) drafts k tokens in one pass over its whole block: its draft cost is
    that pass's whatever k is, not k-fold, so it breaks even at a lower acceptance and sizes longer
    drafts than a chain drafter on the same curves."""
    target = CostCurve([1, 2, 4, 8, 16], [64], [[10.0, 10.5, 11.0, 12.0, 14.0]])
    draft = CostCurve([1, 2, 4, 8, 16], [64], [[3.0, 3.1, 3.2, 3.4, 3.8]])
    chain, block = CostModel(target, draft), CostModel(target, draft, block=8)
    assert chain.draft_ms(6, 64) == pytest.approx(draft.forward_ms(2, 64) + 5 * 3.0)
    assert block.draft_ms(6, 64) == block.draft_ms(2, 64) == pytest.approx(draft.forward_ms(8, 64))
    assert block.draft_ms(0, 64) == 0.0
    assert break_even_alpha(block, 6, 64) < break_even_alpha(chain, 6, 64)
    alphas = [0.6] * 8
    k_chain = choose_k(chain.verify_ms, chain.draft_ms, alphas, 8, 64)[0]
    k_block = choose_k(block.verify_ms, block.draft_ms, alphas, 8, 64)[0]
    assert k_block > k_chain >= 1


def test_a_hybrid_fits_the_lookup_tree_it_previewed_without_pricing_it_twice(monkeypatch):
    """A hybrid round that does not draft previews its lookup tree, then fits that same tree: the
    budget is worked out once, and the choice is the one a fresh pricing gives."""
    tree = Proposal([5, 6, 7, 8], parents=[-1, 0, 1, -1], scores=[0.9, 0.8, 0.3, 0.2], kind="pld")

    def fitted(preview: bool) -> tuple:
        sizer = TreeSizer(CostModel(MODERATE, FLAT), depth=4, width=2, free_drafts=False)
        sizer.start()
        priced: list[int] = []
        budget = sizer._budget
        monkeypatch.setattr(sizer, "_budget", lambda p, c: priced.append(1) or budget(p, c))
        if preview:
            assert sizer.preview(tree, 256)[1] > 0
        chosen, choice = sizer.fit(tree, 256)
        return chosen.tokens, chosen.parent_list(), choice, len(priced)

    *previewed, priced = fitted(preview=True)
    *fresh, _ = fitted(preview=False)
    assert priced == 1 and previewed == fresh
    # Another tree (a merged one, after drafting) is priced afresh.
    sizer = TreeSizer(CostModel(MODERATE, FLAT), depth=4, width=2, free_drafts=False)
    sizer.start()
    sizer.preview(tree, 256)
    other = Proposal([5, 9], parents=[-1, 0], scores=[0.9, 0.9], kind="pld")
    assert sizer.fit(other, 256)[0].tokens == [5, 9]
