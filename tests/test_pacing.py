"""Free drafts stop being looked for every round while the sizer verifies none of them."""

from __future__ import annotations

from test_sizing import FLAT, _sized, curve
from tolerance import assert_greedy_equal

from draftlab.decode.build import build_decoder
from draftlab.decode.pacing import IDLE_ROUNDS, MAX_SKIP, MIN_LOOK_SHARE, ProposalPacer
from draftlab.decode.spec import DecoderConfig
from draftlab.models.loading import ModelSpec, load_model
from draftlab.models.prompting import encode_prompt
from draftlab.sampling import SamplingParams

# A steep curve whose steps are so cheap (20 µs) that a lookup costs more than a step: no lookup is
# ever worth verifying, and looking is dear.
CHEAP_STEEP = curve({1: 0.02, 2: 0.04, 4: 0.08, 8: 0.16, 16: 0.32})


def pattern(pacer: ProposalPacer, rounds: int, verified: bool = False, share: float = 0.05) -> str:
    """P: a round that proposed (and was left unverified unless `verified`), .: a skipped round;
    looking costs `share` of a step."""
    out = []
    for _ in range(rounds):
        if pacer.wants_proposal():
            pacer.proposed(verified, share)
            out.append("P")
        else:
            out.append(".")
    return "".join(out)


def test_unverified_proposals_back_off_to_every_ninth_round_and_a_verified_one_resets():
    pacer = ProposalPacer()
    assert IDLE_ROUNDS == 4 and MAX_SKIP == 8
    assert pattern(pacer, 32) == "PPPP" + ".P" + "..P" + "....P" + "........P" + "........P"
    assert pattern(pacer, 9) == "........P"  # stays at the longest skip
    # The next proposal is verified: every round again, and a fresh run of idle ones after it.
    assert pattern(pacer, 9, verified=True) == "........P"
    assert pattern(pacer, 6) == "PPPP.P"
    assert pattern(ProposalPacer(), 12, verified=True) == "P" * 12
    # Looking that costs little next to a step is worth doing every round.
    assert pattern(ProposalPacer(), 12, share=MIN_LOOK_SHARE / 2) == "P" * 12
    assert pattern(ProposalPacer(), 6, share=MIN_LOOK_SHARE) == "PPPP.P"


def test_paced_lookups_stay_lossless_and_fixed_k_is_never_paced(tiny_pair):
    target = load_model(ModelSpec(str(tiny_pair["llama"][0]), dtype="float32"))
    ids = encode_prompt(target, "the cat sat on the mat and then the dog ran on the mat and the", chat=False)
    greedy = SamplingParams()
    ar = build_decoder(DecoderConfig(method="ar"), target).generate(ids, 80, greedy)
    for method in ("pld", "pld-tree", "suffix"):
        steep = _sized(method, target, None, CHEAP_STEEP).generate(ids, 80, greedy)
        assert_greedy_equal(target, ids, steep.tokens, ar.tokens, f"paced {method}")
        assert steep.stats.paced_rounds > steep.stats.rounds / 2, method
        assert sum(steep.stats.k_counts) + steep.stats.paced_rounds == steep.stats.rounds
        # 40 ms steps: a lookup of well under 0.2 ms is below MIN_LOOK_SHARE, so every round looks.
        # `_sized` times each lookup as 0.01 ms (a TickClock), whatever else runs on the machine.
        flat = _sized(method, target, None, FLAT).generate(ids, 80, greedy)
        assert_greedy_equal(target, ids, flat.tokens, ar.tokens, f"{method} on a flat curve")
        assert flat.stats.paced_rounds == 0, method
        fixed = build_decoder(DecoderConfig(method=method, fixed_k=True), target).generate(ids, 80, greedy)
        assert fixed.stats.paced_rounds == 0 and fixed.tokens == steep.tokens
