"""The default bench's time budget, decided from synthetic cost profiles of the CPUs seen so far.

Each profile has the shape measured on one CPU kind (issue 20): an AMX Xeon (flat curve, about 38 ms
a plain step), an AMD Zen4 with native bfloat16 (flat, about 40 ms) and an AVX2-only Zen3 (float32
steps of 94 ms, a steep curve where verifying k tokens costs nearly k steps).
"""

from __future__ import annotations

import pytest

from draftlab.bench import budget
from draftlab.bench.formatting import fmt_duration
from draftlab.decode.cost import CostModel
from draftlab.models.cost_curve import CostCurve

DRAFT = CostCurve([1, 2, 4, 8, 16], [64, 1024], [[4.0, 4.2, 4.5, 5.0, 6.0]] * 2, [16, 1024], [5.0, 60.0])


def curve(step_ms: float, slope: float, prefill_per_token: float) -> CostCurve:
    """`slope`: what a pass over 5 tokens costs relative to one."""
    sizes = [1, 2, 4, 8, 16]
    row = [step_ms * (1 + (slope - 1) * (n - 1) / 4) for n in sizes]
    return CostCurve(
        sizes, [64, 1024], [row, row], [16, 1024], [16 * prefill_per_token, 1024 * prefill_per_token]
    )


AMX = curve(38.0, 1.1, 0.3)
ZEN4 = curve(40.0, 1.2, 0.4)
ZEN3 = curve(94.0, 4.2, 1.0)

# The builtin suite's prompt lengths with the chat template: 8 subtasks, multi-turn's second turn
# holding the first turn and its answer.
ONE = [60, 150, 300, 40, 90, 500, 400, 70, 60 + 64 + 30]
TWO = ONE + [55, 160, 280, 45, 100, 450, 420, 80, 55 + 64 + 25]
PROMPTS = {1: ONE, 2: TWO}
METHODS = ("ar", "sps", "pld", "hf-assisted", "pld-tree", "sps-tree", "hybrid", "suffix")


def planned(target: CostCurve, extra_ar: tuple[str, ...] = ()) -> list[budget.PlannedVariant]:
    cost = CostModel(target, DRAFT)
    reasons = {
        "sps": budget.draft_adds_nothing(cost, 4),
        "sps-tree": budget.draft_adds_nothing(cost, 4),
        "hybrid": budget.draft_adds_nothing(cost, 4),
        "hf-assisted": budget.fixed_draft_loses(cost, 4),
    }
    out = [budget.PlannedVariant(m, target, reasons.get(m)) for m in METHODS]
    for label in extra_ar:
        out.append(budget.PlannedVariant(label, target, "predicted slower"))
    return out


def test_prediction_is_the_sum_of_plain_decodings_with_warm_up():
    v = budget.PlannedVariant("ar", ZEN3)
    one = ZEN3.plain_decoding_ms(100, 64) / 1000
    warm = ZEN3.plain_decoding_ms(100, 16) / 1000  # the runner warms up on 16 tokens
    assert budget.predict_s([v], [100, 100], 64, warmup=1) == pytest.approx(2 * one + warm)
    assert budget.predict_s([v, v], [100], 64, warmup=0) == pytest.approx(2 * one)
    assert ZEN3.plain_decoding_ms(100, 64) == pytest.approx(ZEN3.prefill(100) + 63 * ZEN3.forward_ms(1, 132))


def test_a_steep_curve_makes_the_draft_hopeless_and_a_flat_one_does_not():
    steep, flat = CostModel(ZEN3, DRAFT), CostModel(AMX, DRAFT)
    assert "would need α above" in budget.draft_adds_nothing(steep, 4)
    assert budget.draft_adds_nothing(flat, 4) is None
    assert "plain decoding here" in budget.fixed_draft_loses(steep, 4)
    assert budget.fixed_draft_loses(flat, 4) is None
    # A draft as slow as the target cannot pay even on a flat curve.
    assert budget.draft_adds_nothing(CostModel(AMX, AMX), 4) is not None


def test_a_dtype_outside_the_tie_band_cannot_be_the_fastest():
    times = {"float32": 10.0, "bfloat16": 10.9, "float16": 11.5}
    assert budget.slower_dtype(times, "bfloat16") is None
    assert "1.15×" in budget.slower_dtype(times, "float16")
    assert budget.slower_dtype(times, "float32") is None


@pytest.mark.parametrize("name, target", [("amx", AMX), ("zen4", ZEN4), ("zen3", ZEN3)])
def test_the_default_run_fits_the_budget_on_every_cpu_kind(name, target):
    variants = planned(target, extra_ar=("ar bfloat16",) if name == "zen3" else ())
    fitted = budget.fit(variants, PROMPTS, 2, 64, budget.DEFAULT_BUDGET_S)
    assert fitted.predicted_s <= budget.DEFAULT_BUDGET_S, (name, fitted)
    assert fitted.limit >= 1 and "ar" in fitted.labels and "pld" in fitted.labels
    assert fitted.full_s >= fitted.predicted_s
    if fitted.labels != [v.label for v in variants] or fitted.limit != 2:
        assert fitted.left_out, "whatever is cut is named"


def test_zen3_leaves_out_the_hopeless_draft_methods_and_says_why():
    fitted = budget.fit(planned(ZEN3, ("ar bfloat16",)), PROMPTS, 2, 64, budget.DEFAULT_BUDGET_S)
    assert set(fitted.labels) == {"ar", "pld", "pld-tree", "suffix"}
    dropped = {line.split(":")[0] for line in fitted.left_out}
    assert {"sps", "sps-tree", "hybrid", "hf-assisted", "ar bfloat16"} <= dropped
    assert fitted.limit == 1 and "1 per subtask instead of 2" in fitted.left_out[-1]


def test_within_budget_nothing_is_cut():
    fitted = budget.fit(planned(AMX), PROMPTS, 2, 64, budget_s=10_000)
    assert fitted.labels == list(METHODS) and fitted.limit == 2 and not fitted.left_out
    assert fitted.predicted_s == fitted.full_s


def test_prompts_are_cut_before_variants_only_when_variants_may_not_be_dropped():
    variants = planned(ZEN3)
    kept = budget.fit(variants, PROMPTS, 2, 64, budget.DEFAULT_BUDGET_S, drop_variants=False)
    assert kept.labels == list(METHODS) and kept.limit == 1
    asked = budget.fit(
        variants, PROMPTS, 2, 64, budget.DEFAULT_BUDGET_S, drop_variants=False, cut_prompts=False
    )
    assert asked.labels == list(METHODS) and asked.limit == 2 and not asked.left_out
    assert asked.predicted_s > budget.DEFAULT_BUDGET_S  # explicit choices run as asked, over budget


def test_never_fewer_than_one_prompt_per_subtask():
    fitted = budget.fit(planned(ZEN3), PROMPTS, 2, 64, budget_s=1.0)
    assert fitted.limit == 1 and fitted.predicted_s > 1.0


def test_durations_read_as_minutes_and_seconds():
    assert fmt_duration(59.4) == "59 s"
    assert fmt_duration(272) == "4 min 32 s"
