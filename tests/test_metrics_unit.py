"""The figure modules (bench/rates.py, group_metrics.py, labels.py, sweeps.py, engine_summary.py,
concurrency_summary.py, summary.py) function by function, on hand-made records whose figures are
easy to compute by hand."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from draftlab.bench.concurrency_summary import _quantile, level_label, level_summary
from draftlab.bench.engine_summary import engine_of, engine_summary
from draftlab.bench.formatting import fmt_speedup, fmt_vs_best
from draftlab.bench.group_metrics import (
    _elementwise_sum,
    acceptance,
    bild_stats,
    cost_ratio,
    draft_step_s,
    greedy_match,
    group_metrics,
    predicted_speedup,
    prefill_stats,
    sizing,
    target_step_s,
    trees,
)
from draftlab.bench.labels import (
    baseline_label,
    group_by,
    label_order,
    subtask_order,
    unique_value,
    variant_info,
)
from draftlab.bench.rates import _bootstrap, _per_key, _rate_ratio, decode_tokens, ratio, speedup, throughput
from draftlab.bench.records import Record, RunInfo
from draftlab.bench.summary import SCHEMA_VERSION, add_vs_best_plain, json_safe, summarize
from draftlab.bench.sweeps import _FALLBACK_KEYS, _ROW_FIELDS, _param, _row, _sort_key


def rec(label="sps", example_id="e1", turn=0, repeat=0, **kw) -> Record:
    base = dict(
        label=label,
        method=kw.pop("method", label.split()[0]),
        example_id=example_id,
        subtask="qa",
        turn=turn,
        repeat=repeat,
        temperature=0.0,
        gamma=4,
        target="t",
        draft="d",
        prompt_tokens=5,
        new_tokens=10,
        prefill_s=0.1,
        decode_s=0.9,
        total_s=1.0,
        target_calls=10,
        draft_calls=0,
        drafted=0,
        accepted=0,
        drafted_per_position=[],
        accepted_per_position=[],
        rounds=10,
        fallbacks=0,
        rollbacks=0,
        draft_tokens_kept=0,
        propose_s=0.0,
        propose_calls=0,
        tokens=[],
    )
    base.update(kw)
    return Record(**base)


def run_info(**kw) -> RunInfo:
    return RunInfo(
        target="t", draft="d", dtype="float32", device="cpu", temperature=0.0, max_new_tokens=10, **kw
    )


# --- small figures ------------------------------------------------------------------------------------


def test_ratio_and_decode_tokens():
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(3.0, 0.0) is None
    assert ratio(3.0, -1.0) is None
    assert ratio(0.0, 2.0) == 0.0
    assert decode_tokens(rec(new_tokens=10, first_tokens=3)) == 7
    assert decode_tokens(rec(new_tokens=10)) == 9  # first_tokens defaults to 1
    assert decode_tokens(rec(new_tokens=0, first_tokens=1)) == 0


def test_throughput_sums_before_dividing():
    records = [
        rec(example_id="a", new_tokens=10, total_s=1.0, decode_s=0.8, first_tokens=2),
        rec(example_id="b", new_tokens=2, total_s=3.0, decode_s=2.0, first_tokens=1),
        rec(example_id="a", turn=1, new_tokens=0, total_s=0.5, decode_s=0.0, first_tokens=0),
    ]
    t = throughput(records)
    assert t["n"] == 3 and t["examples"] == 2
    assert t["new_tokens"] == 12 and t["total_s"] == 4.5
    assert t["tokens_per_s"] == pytest.approx(12 / 4.5)
    assert t["decode_tokens"] == 8 + 1 + 0
    assert t["decode_s"] == pytest.approx(2.8)
    assert t["decode_tokens_per_s"] == pytest.approx(9 / 2.8)
    assert t["zero_time_records"] == 0
    bad = throughput([rec(new_tokens=3, total_s=0.0), rec(new_tokens=0, total_s=0.0), rec(total_s=-1.0)])
    assert bad["zero_time_records"] == 2
    empty = throughput([])
    assert empty["tokens_per_s"] is None and empty["n"] == 0 and empty["examples"] == 0


# --- speed-up -----------------------------------------------------------------------------------------


def test_per_key_sums_repeated_keys():
    out = _per_key(
        [
            rec(new_tokens=4, total_s=1.0, decode_s=0.5),
            rec(new_tokens=6, total_s=2.0, decode_s=1.5),
            rec(example_id="x"),
        ]
    )
    assert set(out) == {("e1", 0, 0), ("x", 0, 0)}
    # new tokens, total s, decode tokens, decode s, prefill s, first tokens, records
    assert out[("e1", 0, 0)].tolist() == [10.0, 3.0, 3 + 5, 2.0, 0.2, 2.0, 2.0]


def test_speedup_matches_keys_and_divides_rates():
    mine = [
        rec(example_id="a", new_tokens=10, total_s=0.5, decode_s=0.4),
        rec(example_id="b", new_tokens=10, total_s=1.0, decode_s=0.9),
        rec(example_id="only-mine", new_tokens=100, total_s=0.001),
    ]
    base = [
        rec("ar", example_id="a", new_tokens=10, total_s=1.0, decode_s=0.9),
        rec("ar", example_id="b", new_tokens=10, total_s=2.0, decode_s=1.8),
        rec("ar", example_id="only-base"),
    ]
    s = speedup(mine, base, resamples=300, seed=1)
    assert s["matched_keys"] == 2
    assert s["speedup"] == pytest.approx((20 / 1.5) / (20 / 3.0))
    assert s["decode_speedup"] == pytest.approx((18 / 1.3) / (18 / 2.7))
    assert s["speedup_ci_low"] <= s["speedup"] <= s["speedup_ci_high"]
    # Per-key speed-ups are 2.0 and 2.0: every resample gives 2.
    assert s["speedup_ci_low"] == pytest.approx(2.0) and s["speedup_ci_high"] == pytest.approx(2.0)
    # Decode only: per-key 9/0.4 over 9/0.9 = 2.25 and 9/0.9 over 9/1.8 = 2.
    assert (
        2.0 - 1e-9
        <= s["decode_speedup_ci_low"]
        <= s["decode_speedup"]
        <= s["decode_speedup_ci_high"]
        <= 2.25 + 1e-9
    )
    assert s["decode_speedup_ci_low"] < s["decode_speedup_ci_high"]
    # The interval spans the per-key values when they differ.
    mine[1] = rec(example_id="b", new_tokens=10, total_s=4.0, decode_s=3.6)
    s = speedup(mine, base, resamples=2000, seed=0)
    assert s["speedup"] == pytest.approx((20 / 4.5) / (20 / 3.0))
    # Resamples [a, a] give 2, [b, b] 0.5, mixed ones 2/3: a quarter each way, so the 2.5th and
    # 97.5th percentiles are the extremes.
    assert s["speedup_ci_low"] == pytest.approx(0.5) and s["speedup_ci_high"] == pytest.approx(2.0)
    # No resamples: no interval.
    s = speedup(mine, base, resamples=0)
    assert s["speedup"] is not None and s["speedup_ci_low"] is None and s["speedup_ci_high"] is None
    # No key in common.
    s = speedup(mine[2:], base)
    assert s == {
        "matched_keys": 0,
        "speedup": None,
        "speedup_ci_low": None,
        "speedup_ci_high": None,
        "decode_speedup": None,
        "decode_speedup_ci_low": None,
        "decode_speedup_ci_high": None,
        "measured_speedup": None,
        "length_gap": None,
        "projected_keys": 0,
    }


def test_a_speedup_compares_equal_work_where_lengths_differ():
    """Issue 49's case: a 720-token prompt answered in 2 tokens by one engine and in 64 by the
    fastest plain decoding. Both decode at 20 ms a token; the short answer's rate is almost all
    prefill. Projected to 64 tokens, the two take the same time: 1.0x, not 0.05x."""
    short = rec("ar", example_id="law", new_tokens=2, prefill_s=0.5, decode_s=0.02, total_s=0.52)
    long = rec("ar llamacpp", example_id="law", new_tokens=64, prefill_s=0.5, decode_s=63 * 0.02)
    long.total_s = long.prefill_s + long.decode_s
    s = speedup([short], [long], resamples=0)
    assert s["measured_speedup"] == pytest.approx((2 / 0.52) / (64 / long.total_s))
    assert s["measured_speedup"] < 0.11
    assert s["speedup"] == pytest.approx(1.0)
    assert s["length_gap"] == pytest.approx(62 / 64) and s["projected_keys"] == 1
    # The other way round too: the long answer cut to the short one's work.
    assert speedup([long], [short], resamples=0)["speedup"] == pytest.approx(1.0)
    # Twice as fast a decoder, stopped early: its projected time is prefill + 63 x 10 ms.
    fast = rec("pld", example_id="law", new_tokens=3, prefill_s=0.5, decode_s=0.02, total_s=0.52)
    assert speedup([fast], [long], resamples=0)["speedup"] == pytest.approx(long.total_s / (0.5 + 63 * 0.01))
    # Equal lengths: the plain ratio of rates, nothing projected.
    same = rec("sps", example_id="law", new_tokens=64, prefill_s=0.4, decode_s=0.7, total_s=1.1)
    s = speedup([same], [long], resamples=0)
    assert s["speedup"] == pytest.approx(s["measured_speedup"]) == pytest.approx(long.total_s / 1.1)
    assert s["length_gap"] == 0 and s["projected_keys"] == 0
    # A generation with no decode tokens takes its label's pooled time per token.
    only_prefill = rec("sps", example_id="x", new_tokens=1, prefill_s=0.3, decode_s=0.0, total_s=0.3)
    base_x = rec("ar", example_id="x", new_tokens=11, prefill_s=0.3, decode_s=1.0, total_s=1.3)
    s = speedup([same, only_prefill], [long, base_x], resamples=0)
    per_token = 0.7 / 63
    assert s["speedup"] == pytest.approx((long.total_s + 1.3) / (1.1 + 0.3 + 10 * per_token))


def test_reports_mark_a_speedup_over_unequal_lengths():
    marked = {"label": "sps", "best_plain": "ar", "speedup": 1.0, "length_gap": 0.5}
    marked |= {"vs_best_ar": 0.9, "vs_best_ar_length_gap": 0.5}
    assert fmt_speedup(marked, ci=False) == "1.00×†" and fmt_vs_best(marked).startswith("0.90×†")
    close = {**marked, "length_gap": 0.1, "vs_best_ar_length_gap": 0.1}
    assert fmt_speedup(close, ci=False) == "1.00×" and fmt_vs_best(close) == "0.90×"


def test_rate_ratio_edges():
    m = np.array([[10.0, 1.0, 9.0, 0.9]])
    b = np.array([[10.0, 2.0, 9.0, 1.8]])
    assert _rate_ratio(m, b, 0, 1) == pytest.approx(2.0)
    assert _rate_ratio(m, b, 2, 3) == pytest.approx(2.0)
    zero_time = np.array([[10.0, 0.0, 9.0, 0.0]])
    assert _rate_ratio(zero_time, b, 0, 1) is None
    assert _rate_ratio(m, zero_time, 0, 1) is None
    no_tokens = np.array([[0.0, 2.0, 0.0, 1.8]])
    assert _rate_ratio(m, no_tokens, 0, 1) is None
    assert _rate_ratio(no_tokens, b, 0, 1) == 0.0


def test_bootstrap_skips_degenerate_resamples():
    m = np.array([[10.0, 1.0], [10.0, 0.0]])
    b = np.array([[10.0, 2.0], [10.0, 2.0]])
    # Resamples: [0, 0] (speed-up 2), [1, 1] (no time: skipped), [0, 1] (20/1 over 20/4 = 4).
    index = np.array([[0, 0], [1, 1], [0, 1]])
    low, high = _bootstrap(m, b, 0, 1, index)
    assert (low, high) == pytest.approx(tuple(np.percentile([2.0, 4.0], [2.5, 97.5])))
    assert _bootstrap(m, b, 0, 1, np.array([[1, 1]])) is None
    # A baseline without tokens or time is skipped too.
    b0 = np.array([[0.0, 2.0], [10.0, 0.0]])
    assert _bootstrap(m, b0, 0, 1, np.array([[0, 0], [1, 1]])) is None


# --- acceptance ---------------------------------------------------------------------------------------


def test_elementwise_sum():
    assert _elementwise_sum([[1, 2], [3], [0, 0, 5]]) == [4, 2, 5]
    assert _elementwise_sum([]) == []
    assert _elementwise_sum([[], [1]]) == [1]


def test_acceptance_figures():
    records = [
        rec(
            drafted=8,
            accepted=5,
            rollbacks=2,
            target_calls=4,
            rounds=3,
            new_tokens=9,
            drafted_per_position=[3, 3, 2],
            accepted_per_position=[2, 2, 1],
        ),
        rec(
            drafted=4,
            accepted=3,
            rollbacks=1,
            target_calls=2,
            rounds=2,
            new_tokens=5,
            drafted_per_position=[2, 2],
            accepted_per_position=[2],
        ),
    ]
    a = acceptance(records)
    assert (a["drafted"], a["accepted"], a["rollbacks"]) == (12, 8, 3)
    assert a["acceptance_rate"] == pytest.approx(8 / 12)
    assert a["alpha_hat"] == pytest.approx(8 / 11)
    assert a["target_calls"] == 6 and a["rounds"] == 5
    assert a["mean_accepted_length"] == pytest.approx(14 / 5)
    assert a["drafted_per_position"] == [5, 5, 2]
    assert a["accepted_per_position"] == [4, 2, 1]
    assert a["acceptance_per_position"] == pytest.approx([0.8, 0.4, 0.5])
    none = acceptance([rec(rounds=0, new_tokens=0)])
    assert (
        none["acceptance_rate"] is None and none["alpha_hat"] is None and none["mean_accepted_length"] is None
    )
    assert none["acceptance_per_position"] == []
    # Accepted positions beyond the drafted ones are cut; no rollback at all gives α̂ = 1.
    odd = acceptance([rec(drafted=2, accepted=2, drafted_per_position=[2], accepted_per_position=[1, 1])])
    assert odd["accepted_per_position"] == [1] and odd["alpha_hat"] == 1.0


def test_sizing_figures():
    records = [
        rec(k_counts=[2, 1, 3], probes=1, predicted_ms=10.0, predicted_plain_ms=15.0, dtype="float32"),
        rec(k_counts=[0, 1], probes=2, predicted_ms=6.0, predicted_plain_ms=9.0, dtype="bfloat16"),
        rec(dtype="float32"),
        rec(dtype=None),
    ]
    s = sizing(records)
    assert s["dtypes"] == {"float32": 2, "bfloat16": 1}
    assert s["k_counts"] == [2, 2, 3]
    assert s["k0_share"] == pytest.approx(2 / 7)
    assert s["mean_k"] == pytest.approx((0 * 2 + 1 * 2 + 2 * 3) / 7)
    assert s["probes"] == 3
    assert s["cost_predicted_speedup"] == pytest.approx(24 / 16)
    plain = sizing([rec()])
    assert plain["k_counts"] == [] and plain["k0_share"] is None and plain["mean_k"] is None
    assert plain["cost_predicted_speedup"] is None and plain["dtypes"] == {}


def test_tree_figures():
    records = [
        rec(
            tree_rounds=4,
            tree_nodes=20,
            branch_wins=1,
            proposer_info={"earlier_outputs_used": {"x": 2, "y": 1}},
        ),
        rec(
            tree_rounds=1,
            tree_nodes=5,
            branch_wins=1,
            tree_fallback="no mask",
            proposer_info={"earlier_outputs_used": {"x": 1}},
        ),
        rec(tree_fallback="another", proposer_info=None),
    ]
    t = trees(records)
    assert t["tree_rounds"] == 5
    assert t["nodes_per_round"] == 5.0
    assert t["branch_win_share"] == pytest.approx(0.4)
    assert t["tree_fallback"] == "another; no mask"
    assert t["earlier_outputs_used"] == {"x": 2, "y": 1}
    empty = trees([rec()])
    assert empty == {
        "tree_rounds": 0,
        "nodes_per_round": None,
        "branch_win_share": None,
        "tree_fallback": None,
        "earlier_outputs_used": {},
    }


# --- costs and the predicted speed-up -------------------------------------------------------------------


def test_step_times_and_cost_ratio():
    records = [rec(propose_s=0.2, propose_calls=10), rec(propose_s=0.1, propose_calls=5)]
    base = [
        rec("ar", decode_s=0.9, target_calls=10),
        rec("ar", decode_s=0.3, target_calls=4),
        rec("ar", decode_s=0.0, target_calls=0),
    ]
    assert draft_step_s(records) == pytest.approx(0.02)
    assert target_step_s(base) == pytest.approx(1.2 / 12)
    assert cost_ratio(records, base) == pytest.approx(0.2)
    assert cost_ratio([rec()], base) is None
    assert cost_ratio(records, []) is None
    assert target_step_s([rec("ar", target_calls=1)]) is None


def test_predicted_speedup():
    assert predicted_speedup(0.5, 4, 0.1) == pytest.approx((1 - 0.5**5) / (0.5 * 1.4))
    assert predicted_speedup(1.0, 4, 0.1) == pytest.approx(5 / 1.4)
    assert predicted_speedup(1.2, 2, 0.0) == pytest.approx(3.0)
    assert predicted_speedup(0.0, 3, 0.0) == pytest.approx(1.0)
    assert predicted_speedup(0.5, 1, 0.5) == pytest.approx((1 - 0.25) / (0.5 * 1.5))
    for args in ((None, 4, 0.1), (0.5, None, 0.1), (0.5, 4, None), (0.5, 0, 0.1)):
        assert predicted_speedup(*args) is None


def test_greedy_bild_and_prefill_figures():
    records = [
        rec(
            greedy_match=True,
            fallbacks=2,
            draft_tokens_kept=4,
            new_tokens=10,
            prefill_s=0.1,
            decode_s=0.9,
            first_tokens=1,
        ),
        rec(
            greedy_match=False,
            fallbacks=1,
            draft_tokens_kept=1,
            new_tokens=10,
            prefill_s=0.3,
            decode_s=0.9,
            first_tokens=1,
        ),
        rec(greedy_match=True, new_tokens=0, prefill_s=0.5, decode_s=0.0, first_tokens=0),
        rec(greedy_match=None, new_tokens=0, prefill_s=0.2, decode_s=0.0, first_tokens=0),
    ]
    g = greedy_match(records)
    assert g == {
        "greedy_compared": 0,  # no plain_match set: no plain decoding of the same dtype was compared
        "greedy_matches": 0,
        "greedy_match_rate": None,
        "baseline_compared": 3,
        "baseline_matches": 2,
        "baseline_match_rate": pytest.approx(2 / 3),
    }
    same_dtype = [dataclasses.replace(r, plain_match=r.greedy_match) for r in records]
    assert greedy_match(same_dtype)["greedy_match_rate"] == pytest.approx(2 / 3)
    assert greedy_match([rec()])["greedy_match_rate"] is None
    b = bild_stats(records)
    assert b == {"fallbacks": 3, "draft_tokens_kept": 5, "draft_share": 0.25}
    p = prefill_stats(records)
    assert p["prefill_ms_mean"] == pytest.approx(275.0)
    assert p["prefill_ms_median"] == pytest.approx(250.0)
    assert p["time_per_token_ms"] == pytest.approx(1800 / 18)
    empty = prefill_stats([])
    assert empty == {"prefill_ms_mean": None, "prefill_ms_median": None, "time_per_token_ms": None}


def test_unique():
    assert unique_value([1, 1, 1]) == 1
    assert unique_value([1, 2]) is None
    assert unique_value([]) is None


# --- group_metrics ------------------------------------------------------------------------------------


def test_group_metrics_of_a_speculative_method():
    base = [rec("ar", example_id=e, new_tokens=10, total_s=1.0, decode_s=0.9, target_calls=10) for e in "ab"]
    mine = [
        rec(
            example_id=e,
            new_tokens=10,
            total_s=0.5,
            decode_s=0.45,
            drafted=8,
            accepted=6,
            rollbacks=2,
            propose_s=0.04,
            propose_calls=8,
            gamma=4,
        )
        for e in "ab"
    ]
    m = group_metrics(mine, base, resamples=100)
    assert m["method"] == "sps" and m["gamma"] == 4 and m["is_baseline"] is False
    assert m["speedup"] == pytest.approx(2.0) and m["decode_speedup"] == pytest.approx(2.0)
    assert m["draft_step_ms"] == pytest.approx(5.0)
    assert m["target_step_ms"] == pytest.approx(100.0)
    assert m["cost_ratio"] == pytest.approx(0.05)
    alpha = 0.75
    predicted = (1 - alpha**5) / ((1 - alpha) * (4 * 0.05 + 1))
    assert m["alpha_hat"] == pytest.approx(alpha)
    assert m["predicted_speedup"] == pytest.approx(predicted)
    assert m["measured_over_predicted"] == pytest.approx(2.0 / predicted)
    for name in (
        "k_counts",
        "tree_rounds",
        "greedy_match_rate",
        "draft_share",
        "prefill_ms_mean",
        "acceptance_rate",
    ):
        assert name in m
    # BiLD's blocks end dynamically: no prediction.
    bild = group_metrics(
        [
            rec("bild", example_id=e, drafted=8, accepted=6, rollbacks=2, propose_s=0.04, propose_calls=8)
            for e in "ab"
        ],
        base,
        resamples=0,
    )
    assert bild["predicted_speedup"] is None and bild["measured_over_predicted"] is None
    assert bild["cost_ratio"] is not None
    # Without draft passes there is no cost ratio and no prediction.
    pld = group_metrics(
        [rec("pld", example_id=e, drafted=8, accepted=6, rollbacks=2) for e in "ab"], base, resamples=0
    )
    assert pld["cost_ratio"] is None and pld["draft_step_ms"] is None and pld["predicted_speedup"] is None
    assert pld["target_step_ms"] == pytest.approx(100.0)
    mixed = group_metrics([rec(gamma=2), rec(gamma=4, example_id="b")], base, resamples=0)
    assert mixed["gamma"] is None


def test_group_metrics_of_the_baseline():
    base = [rec("ar", example_id=e) for e in "abc"] + [rec("ar", example_id="a")]
    m = group_metrics(base, base, is_baseline=True)
    assert m["is_baseline"] is True
    assert m["matched_keys"] == 3
    assert m["speedup"] == 1.0 and m["decode_speedup"] == 1.0
    assert m["speedup_ci_low"] is None and m["speedup_ci_high"] is None
    assert m["decode_speedup_ci_low"] is None and m["decode_speedup_ci_high"] is None
    assert m["predicted_speedup"] is None
    zero = [rec("ar", new_tokens=0, total_s=0.0, decode_s=0.0)]
    m = group_metrics(zero, zero, is_baseline=True)
    assert m["speedup"] is None and m["decode_speedup"] is None


# --- grouping -------------------------------------------------------------------------------------------


def test_label_and_subtask_order():
    records = [rec("pld"), rec("sps"), rec("ar"), rec("x"), rec("sps")]
    records[0] = rec("pld")
    run = run_info(labels=["sps", "missing", "ar"])
    assert label_order(records, run) == ["ar", "sps", "pld", "x"]
    assert label_order(records, run_info(baseline="nope", labels=["x"])) == ["x", "pld", "sps", "ar"]
    subtasks = [rec(subtask="b"), rec(subtask="a"), rec(subtask="b")]
    assert subtask_order(subtasks) == ["b", "a"]


def test_baseline_label():
    run = run_info(extra={"baselines": {"sps bf16": "ar bf16"}})
    assert baseline_label(run, "sps bf16") == "ar bf16"
    assert baseline_label(run, "sps") == "ar"
    assert baseline_label(run_info(extra={"baselines": None}), "sps") == "ar"


def test_variant_info():
    records = [
        rec(temperature=0.0, params={"a": 1}, draft_params=100),
        rec(temperature=0.0, params={"a": 2, "b": 3}, draft_params=100),
    ]
    v = variant_info(records)
    assert v == {
        "method": "sps",
        "target": "t",
        "draft": "d",
        "draft_params": 100,
        "gamma": 4,
        "temperature": 0.0,
        "temperatures": [0.0],
        "params": {"a": 1, "b": 3},
    }
    two = variant_info([rec(temperature=1.0), rec(temperature=0.5, draft="e", gamma=2)])
    assert two["temperature"] is None and two["temperatures"] == [0.5, 1.0]
    assert two["draft"] is None and two["gamma"] is None


def test_helpers():
    assert group_by([1, 2, 3, 4], lambda x: x % 2) == {1: [1, 3], 0: [2, 4]}
    assert _param({"fallback": 1, "fallback_thres": 2}, _FALLBACK_KEYS) == 2
    assert _param({"x": 1}, _FALLBACK_KEYS) is None
    assert _sort_key(2) == (0, 2.0, "")
    assert _sort_key(None) == (1, 0.0, "None")
    assert sorted([None, 3, 1.5], key=_sort_key) == [1.5, 3, None]
    assert _row("x", {"a": 1, "b": 2}, "a", "c") == {"label": "x", "a": 1, "c": None}


def test_json_safe():
    value = {1: [float("nan"), float("inf"), -math.inf, 1.5, (2, "s")], "n": None}
    assert json_safe(value) == {"1": [None, "inf", "-inf", 1.5, [2, "s"]], "n": None}


# --- vs best plain ---------------------------------------------------------------------------------


def test_the_fastest_plain_decoding_is_chosen_over_equal_work():
    """One engine's ar talks longer and so spreads its prefill over more tokens: higher raw tokens/s
    (20 against 14.3), yet slower on the same work (its 40 tokens take the other 1.37 s, not 2.0)."""

    def plain(label, new, prefill, decode):
        return [
            rec(
                label,
                method="ar",
                example_id=e,
                new_tokens=new,
                prefill_s=prefill,
                decode_s=decode,
                total_s=prefill + decode,
            )
            for e in "ab"
        ]

    by_label = {"ar long": plain("ar long", 40, 1.0, 1.0), "ar short": plain("ar short", 10, 0.5, 0.2)}
    group = {
        label: {"method": "ar", "tokens_per_s": rs[0].new_tokens / rs[0].total_s}
        for label, rs in by_label.items()
    }
    assert group["ar long"]["tokens_per_s"] > group["ar short"]["tokens_per_s"]
    add_vs_best_plain(group, by_label, None, resamples=0)
    assert group["ar long"]["best_plain"] == "ar short"
    # Its time projected to the best one's 10 tokens: prefill plus 9 tokens at its own 1/39 s each.
    assert group["ar long"]["vs_best_ar"] == pytest.approx(0.7 / (1.0 + 9 / 39))


def test_vs_best_plain_compares_with_the_fastest_ar():
    by_label = {
        "ar": [rec("ar", example_id=e, total_s=2.0, subtask="qa") for e in "ab"],
        "ar fast": [rec("ar", example_id=e, total_s=1.0, subtask="qa") for e in "ab"],
        "sps": [rec("sps", example_id=e, total_s=0.5, subtask="qa") for e in "ab"],
    }
    group = {
        label: {"method": rs[0].method, "tokens_per_s": 10 / rs[0].total_s} for label, rs in by_label.items()
    }
    add_vs_best_plain(group, by_label, None, resamples=50)
    assert all(m["best_plain"] == "ar fast" for m in group.values())
    assert group["sps"]["vs_best_ar"] == pytest.approx(2.0)
    assert group["ar"]["vs_best_ar"] == pytest.approx(0.5)
    assert group["ar fast"]["vs_best_ar"] == pytest.approx(1.0)
    assert group["ar fast"]["vs_best_ar_ci_low"] is None  # itself: no interval
    assert group["sps"]["vs_best_ar_ci_low"] == pytest.approx(2.0)
    assert group["sps"]["vs_best_ar_ci_high"] == pytest.approx(2.0)
    # A subtask with no records of a label: nothing to compare.
    add_vs_best_plain(group, by_label, "other", resamples=0)
    assert group["sps"]["vs_best_ar"] is None and group["sps"]["best_plain"] == "ar fast"
    # No plain decoding with a rate: all None.
    only = {"sps": {"method": "sps", "tokens_per_s": 3.0}, "ar": {"method": "ar", "tokens_per_s": None}}
    add_vs_best_plain(only, by_label, None)
    assert only["sps"] == {
        "method": "sps",
        "tokens_per_s": 3.0,
        "best_plain": None,
        "vs_best_ar": None,
        "vs_best_ar_ci_low": None,
        "vs_best_ar_ci_high": None,
        "vs_best_ar_length_gap": None,
    }


# --- summarize ----------------------------------------------------------------------------------------


def test_summarize_structure():
    records = [
        rec("ar", example_id="a", subtask="qa"),
        rec("ar", example_id="b", subtask="code"),
        rec("sps", example_id="a", subtask="qa", total_s=0.5),
        rec("sps", example_id="c", subtask="code", total_s=0.5),
        rec("pld", example_id="a", subtask="qa", total_s=0.8),
    ]
    s = summarize(records, run_info(labels=["pld", "sps"]), resamples=10, seed=3)
    assert s["schema"] == SCHEMA_VERSION
    assert s["labels"] == ["ar", "pld", "sps"]
    assert s["subtask_names"] == ["qa", "code"]
    assert s["baseline"] == "ar"
    assert s["bootstrap"] == {"resamples": 10, "seed": 3, "level": 0.95}
    assert s["unmatched"] == {"sps": [["c", 0, 0]]}
    assert set(s["subtasks"]["code"]) == {"ar", "sps"}
    assert set(s["subtasks"]["qa"]) == {"ar", "sps", "pld"}
    assert s["overall"]["sps"]["label"] == "sps" and s["overall"]["sps"]["baseline"] == "ar"
    assert s["overall"]["sps"]["speedup"] == pytest.approx(2.0)
    assert s["overall"]["ar"]["is_baseline"] is True and s["overall"]["sps"]["is_baseline"] is False
    assert s["subtasks"]["qa"]["pld"]["speedup"] == pytest.approx(1.25)
    assert s["subtasks"]["code"]["sps"]["matched_keys"] == 0
    assert s["overall"]["pld"]["vs_best_ar"] == pytest.approx(1.25)
    assert s["subtasks"]["code"]["sps"]["best_plain"] == "ar"
    assert s["run"]["labels"] == ["pld", "sps"]
    assert s["variants"]["sps"]["method"] == "sps"
    assert s["sweeps"] == {}


def test_summarize_with_a_per_label_baseline():
    records = [
        rec("ar", example_id="a"),
        rec("ar bf16", method="ar", example_id="a", total_s=2.0),
        rec("sps bf16", method="sps", example_id="a", total_s=1.0),
    ]
    run = run_info(extra={"baselines": {"sps bf16": "ar bf16", "ar bf16": "ar bf16"}})
    s = summarize(records, run, resamples=0)
    assert s["overall"]["sps bf16"]["baseline"] == "ar bf16"
    assert s["overall"]["sps bf16"]["speedup"] == pytest.approx(2.0)
    assert s["overall"]["ar bf16"]["is_baseline"] is True
    assert s["unmatched"] == {}


# --- sweeps -------------------------------------------------------------------------------------------


def sweep_of(records, **run_kw):
    return summarize(records, run_info(**run_kw), resamples=0)["sweeps"]


def test_draft_gamma_sweep_rows_are_sorted_and_only_varying_settings_count():
    records = [
        rec("ar", gamma=None, draft=None),
        rec("sps g2", method="sps", gamma=2, draft_params=100, total_s=0.5),
        rec("sps g4", method="sps", gamma=4, draft_params=100),
        rec("sps big", method="sps", gamma=4, draft="D", draft_params=500),
        rec("sps small", method="sps", gamma=4, draft="c", draft_params=None),
        rec("pld", gamma=3),  # one setting only: no sweep of its own
        rec("bild", gamma=4),
        rec("bild g2", method="bild", gamma=2),  # BiLD has its own grid
        rec("sps T1", method="sps", temperature=1.0, gamma=4),  # alone at its temperature
    ]
    rows = sweep_of(records)["draft_gamma"]
    assert [r["label"] for r in rows] == ["sps g2", "sps g4", "sps big", "sps small"]
    g2 = rows[0]
    assert (g2["temperature"], g2["draft"], g2["draft_params"], g2["gamma"]) == (0.0, "d", 100, 2)
    assert g2["method"] == "sps" and g2["speedup"] == pytest.approx(2.0) and g2["n"] == 1
    assert set(_ROW_FIELDS) <= set(g2)
    # One value each: no sweep.
    assert "draft_gamma" not in sweep_of([rec("ar"), rec("sps")])


def test_draft_gamma_rows_sort_by_method_then_temperature():
    records = [
        rec("ar"),
        rec("sps a", method="sps", gamma=4, temperature=0.5),
        rec("sps b", method="sps", gamma=2, temperature=0.5),
        rec("pld a", method="pld", gamma=4),
        rec("pld b", method="pld", gamma=2),
        rec("sps c", method="sps", gamma=4, temperature=0.0, draft="z"),
        rec("sps d", method="sps", gamma=4, temperature=0.0, draft="a"),
    ]
    rows = sweep_of(records)["draft_gamma"]
    assert [r["label"] for r in rows] == ["pld b", "pld a", "sps d", "sps c", "sps b", "sps a"]


def test_tree_budget_sweep():
    records = [
        rec("ar"),
        rec(
            "tree 8",
            method="pld-tree",
            params={"tree_budget": 8},
            tree_rounds=2,
            tree_nodes=16,
            branch_wins=1,
        ),
        rec("tree 4", method="pld-tree", params={"tree_budget": 4}, tree_rounds=2, tree_nodes=8),
        rec("dtree 2", method="draft-tree", params={"tree_budget": 2}),
        rec("free", method="pld-tree", params={"tree_budget": None}),
    ]
    rows = sweep_of(records)["tree_budget"]
    assert [(r["label"], r["budget"]) for r in rows] == [("dtree 2", 2), ("tree 4", 4), ("tree 8", 8)]
    assert rows[2]["nodes_per_round"] == 8.0 and rows[2]["branch_win_share"] == 0.5
    assert "tree_budget" not in sweep_of([rec("ar"), rec("t", method="pld-tree", params={"tree_budget": 4})])


def test_bild_grid_per_draft():
    records = [
        rec("ar"),
        rec("b1", method="bild", params={"fallback_threshold": 0.5, "rollback": 2}, fallbacks=3),
        rec("b2", method="bild", params={"fallback": 0.9, "rollback_thres": 2}),
        rec("b3", method="bild", params={"fallback_threshold": 0.5, "rollback_threshold": "inf"}),
        rec("b4", method="bild", draft="e", params={"fallback_threshold": 0.5}),
        rec("b5", method="bild", params={}),  # no thresholds: not in the grid
        rec("sps", params={"fallback_threshold": 0.1}),  # not BiLD
    ]
    grids = sweep_of(records)["bild"]
    assert [g["draft"] for g in grids] == ["d", "e"]
    d = grids[0]
    assert d["fallback"] == [0.5, 0.9]
    assert d["rollback"] == [2, "inf"]
    assert [(c["label"], c["fallback"], c["rollback"]) for c in d["cells"]] == [
        ("b1", 0.5, 2),
        ("b2", 0.9, 2),
        ("b3", 0.5, "inf"),
    ]
    assert d["cells"][0]["fallbacks"] == 3 and "draft_share" in d["cells"][0] and "rollbacks" in d["cells"][0]
    assert grids[1]["rollback"] == [None] and grids[1]["cells"][0]["fallback"] == 0.5
    single = [rec("ar"), rec("b1", method="bild", params={"fallback_threshold": 0.5})]
    assert "bild" not in sweep_of(single)
    # Only the rollback given is enough to place a label.
    only_rb = [
        rec("ar"),
        rec("b1", method="bild", params={"rollback": 1}),
        rec("b2", method="bild", params={"rollback": 2}),
    ]
    assert sweep_of(only_rb)["bild"][0]["fallback"] == [None]


def test_temperature_sweep_compares_with_the_baseline_at_the_same_temperature():
    records = [
        rec("ar", example_id="a", temperature=0.0, total_s=1.0),
        rec("ar", example_id="a", temperature=1.0, total_s=2.0),
        rec("sps", example_id="a", temperature=0.0, total_s=0.5),
        rec("sps", example_id="a", temperature=1.0, total_s=0.5),
        rec("sps", example_id="a", temperature=0.5, total_s=0.5, decode_s=0.4),  # no baseline at 0.5: all
    ]
    rows = sweep_of(records)["temperature"]
    got = {(r["label"], r["temperature"]): r for r in rows}
    assert [(r["label"], r["temperature"]) for r in rows] == [
        ("ar", 0.0),
        ("ar", 1.0),
        ("sps", 0.0),
        ("sps", 0.5),
        ("sps", 1.0),
    ]
    assert got[("ar", 1.0)]["speedup"] == 1.0 and got[("ar", 1.0)]["is_baseline"] is True
    assert got[("sps", 0.0)]["speedup"] == pytest.approx(2.0)
    assert got[("sps", 1.0)]["speedup"] == pytest.approx(4.0)
    # Against both baseline records (the same key twice: summed), 20 tokens in 3 s; its one
    # generation projected to that work: two prefills of 0.1 s and 18 tokens at 0.4 / 9 s each.
    assert got[("sps", 0.5)]["measured_speedup"] == pytest.approx((10 / 0.5) / (20 / 3.0))
    assert got[("sps", 0.5)]["speedup"] == pytest.approx(3.0 / (2 * 0.1 + 18 * 0.4 / 9))
    assert got[("sps", 0.0)]["is_baseline"] is False
    assert "temperature" not in sweep_of([rec("ar"), rec("sps")])


def test_ablation_of_cache_and_attention():
    records = [
        rec("ar", example_id="a", total_s=1.0),
        rec("ar eager", method="ar", example_id="a", total_s=2.0, params={"attn_implementation": "eager"}),
        rec("ar nocache", method="ar", example_id="a", total_s=4.0, params={"use_cache": False}),
        rec("sps", example_id="a", total_s=0.5),
        rec(
            "sps nocache",
            method="sps",
            example_id="a",
            total_s=1.0,
            params={"use_cache": False, "attn_implementation": "sdpa"},
        ),
    ]
    rows = sweep_of(records)["ablation"]
    # Plain decoding: the one without cache first, eager attention preferred.
    assert {r["plain"] for r in rows} == {"ar nocache"}
    assert [(r["label"], r["speculative"], r["use_cache"], r["attn_implementation"]) for r in rows] == [
        ("ar nocache", False, False, "default"),
        ("ar", False, True, "default"),
        ("ar eager", False, True, "eager"),
        ("sps nocache", True, False, "sdpa"),
        ("sps", True, True, "default"),
    ]
    by = {r["label"]: r for r in rows}
    assert by["ar nocache"]["speedup_vs_plain"] == 1.0
    assert by["ar nocache"]["speedup_vs_plain_ci_low"] is None
    assert by["sps"]["speedup_vs_plain"] == pytest.approx(8.0)
    assert by["ar eager"]["speedup_vs_plain"] == pytest.approx(2.0)
    assert by["sps nocache"]["speedup_vs_plain"] == pytest.approx(4.0)
    assert set(_ROW_FIELDS) <= set(by["sps"])


def test_ablation_prefers_eager_among_uncached_plain_runs_and_needs_variation():
    records = [
        rec("ar", example_id="a", params={"use_cache": False}),
        rec(
            "ar eager",
            method="ar",
            example_id="a",
            params={"use_cache": False, "attn_implementation": "eager"},
        ),
        rec("ar cached", method="ar", example_id="a"),
    ]
    assert {r["plain"] for r in sweep_of(records)["ablation"]} == {"ar eager"}
    # Named but all the same: no ablation.
    same = [rec("ar", params={"use_cache": True}), rec("sps", params={"use_cache": True})]
    assert "ablation" not in sweep_of(same)
    # No plain label: the run's baseline is the reference.
    spec_only = [
        rec("sps", example_id="a", total_s=0.5, params={"use_cache": False}),
        rec("pld", example_id="a", total_s=0.25),
    ]
    rows = sweep_of(spec_only, baseline="sps")["ablation"]
    assert {r["plain"] for r in rows} == {"sps"}
    assert {r["label"]: r["speedup_vs_plain"] for r in rows} == {"sps": 1.0, "pld": pytest.approx(2.0)}
    # A plain label without throughput has no speed-up against itself.
    idle = [
        rec("ar", example_id="a", new_tokens=0, params={"use_cache": False}),
        rec("sps", example_id="a"),
    ]
    rows = {r["label"]: r for r in sweep_of(idle)["ablation"]}
    assert rows["ar"]["speedup_vs_plain"] is None


# --- what the summary hands down: seed, resamples, baselines ------------------------------------------


SPEEDS = [0.3, 0.5, 0.7, 0.4, 0.9, 0.35]


def spread(label="sps", method=None, subtask_of=lambda i: "qa", **kw):
    """One record per key a..f, with different per-key times so that intervals depend on the draws."""
    return [
        rec(
            label,
            method=method or label.split()[0],
            example_id=e,
            subtask=subtask_of(i),
            total_s=t,
            decode_s=t * 0.9,
            **kw,
        )
        for i, (e, t) in enumerate(zip("abcdef", SPEEDS, strict=True))
    ]


def ar_rows(label="ar", total_s=1.0, **kw):
    return [
        rec(label, method="ar", example_id=e, total_s=total_s, decode_s=total_s * 0.9, **kw) for e in "abcdef"
    ]


def test_summary_intervals_use_the_given_seed_and_resamples():
    sps, ar = spread(), ar_rows()
    ref = speedup(sps, ar, resamples=40, seed=7)
    # The draws matter for this data: another seed or count gives another interval.
    assert ref["speedup_ci_low"] != speedup(sps, ar, resamples=40, seed=0)["speedup_ci_low"]
    assert ref["speedup_ci_low"] != speedup(sps, ar, resamples=2000, seed=7)["speedup_ci_low"]
    s = summarize(sps + ar, run_info(), resamples=40, seed=7)
    for name in ("speedup_ci_low", "speedup_ci_high", "decode_speedup_ci_low", "decode_speedup_ci_high"):
        assert s["overall"]["sps"][name] == pytest.approx(ref[name]), name
        assert s["subtasks"]["qa"]["sps"][name] == pytest.approx(ref[name]), name
    # "vs best ar" as well, overall and per subtask.
    assert s["overall"]["sps"]["vs_best_ar_ci_low"] == pytest.approx(ref["speedup_ci_low"])
    assert s["subtasks"]["qa"]["sps"]["vs_best_ar_ci_high"] == pytest.approx(ref["speedup_ci_high"])


def test_vs_best_ar_per_subtask_uses_that_subtasks_records():
    two = spread(subtask_of=lambda i: "qa" if i < 3 else "code")
    ar = [rec("ar", example_id=e, subtask="qa" if i < 3 else "code") for i, e in enumerate("abcdef")]
    s = summarize(two + ar, run_info(), resamples=0)
    for subtask, keys in (("qa", slice(0, 3)), ("code", slice(3, 6))):
        expected = (30 / sum(SPEEDS[keys])) / (30 / 3.0)
        assert s["subtasks"][subtask]["sps"]["vs_best_ar"] == pytest.approx(expected)


def test_temperature_sweep_intervals_use_the_given_seed_and_per_label_baselines():
    records = (
        spread(temperature=0.0)
        + spread(temperature=1.0)
        + ar_rows(temperature=0.0)
        + ar_rows(temperature=1.0)
    )
    records += spread("sps bf16", method="sps", temperature=1.0) + ar_rows(
        "ar bf16", total_s=2.0, temperature=1.0
    )
    run = run_info(extra={"baselines": {"sps bf16": "ar bf16", "ar bf16": "ar bf16"}})
    rows = summarize(records, run, resamples=40, seed=7)["sweeps"]["temperature"]
    got = {(r["label"], r["temperature"]): r for r in rows}
    ref = speedup(spread(temperature=1.0), ar_rows(temperature=1.0), resamples=40, seed=7)
    assert got[("sps", 1.0)]["speedup_ci_low"] == pytest.approx(ref["speedup_ci_low"])
    assert got[("sps", 1.0)]["speedup_ci_high"] == pytest.approx(ref["speedup_ci_high"])
    # sps bf16 against ar bf16 (twice as slow as ar), which is its own baseline.
    assert got[("sps bf16", 1.0)]["speedup"] == pytest.approx(2 * ref["speedup"])
    assert got[("ar bf16", 1.0)]["is_baseline"] is True and got[("ar bf16", 1.0)]["speedup"] == 1.0


def test_ablation_intervals_use_the_given_seed():
    records = spread() + ar_rows() + ar_rows("ar nocache", total_s=2.0, params={"use_cache": False})
    rows = {r["label"]: r for r in summarize(records, run_info(), resamples=40, seed=7)["sweeps"]["ablation"]}
    ref = speedup(spread(), ar_rows("ar nocache", total_s=2.0), resamples=40, seed=7)
    assert rows["sps"]["plain"] == "ar nocache"
    assert rows["sps"]["speedup_vs_plain"] == pytest.approx(ref["speedup"])
    assert rows["sps"]["speedup_vs_plain_ci_low"] == pytest.approx(ref["speedup_ci_low"])
    assert rows["sps"]["speedup_vs_plain_ci_high"] == pytest.approx(ref["speedup_ci_high"])
    # The plain label itself: 1, and no interval even with resamples.
    assert rows["ar nocache"]["speedup_vs_plain"] == 1.0
    assert rows["ar nocache"]["speedup_vs_plain_ci_low"] is None
    assert rows["ar nocache"]["speedup_vs_plain_ci_high"] is None


def test_an_attention_only_ablation():
    records = ar_rows() + ar_rows("ar eager", params={"attn_implementation": "eager"})
    rows = summarize(records, run_info(), resamples=0)["sweeps"]["ablation"]
    assert [(r["label"], r["attn_implementation"]) for r in rows] == [
        ("ar", "default"),
        ("ar eager", "eager"),
    ]


def test_a_missing_baseline_gives_no_speedup_but_a_summary():
    records = spread(temperature=0.0) + spread(temperature=1.0)
    s = summarize(records, run_info(), resamples=0)
    assert s["overall"]["sps"]["speedup"] is None and s["overall"]["sps"]["matched_keys"] == 0
    assert {r["speedup"] for r in s["sweeps"]["temperature"]} == {None}
    # An ablation with no plain label and no baseline records: nothing to compare with.
    ablation = spread() + spread("sps nocache", method="sps", params={"use_cache": False})
    rows = summarize(ablation, run_info(), resamples=0)["sweeps"]["ablation"]
    assert {r["plain"] for r in rows} == {"ar"} and {r["speedup_vs_plain"] for r in rows} == {None}


def test_plain_labels_never_enter_the_draft_gamma_table():
    records = [rec("ar", gamma=4), rec("ar g2", method="ar", gamma=2), rec("sps")]
    assert "draft_gamma" not in sweep_of(records)


def test_two_tree_budgets_are_a_sweep_sorted_by_method_first():
    records = [
        rec("ar"),
        rec("z 2", method="z-tree", params={"tree_budget": 2}),
        rec("p 8", method="pld-tree", params={"tree_budget": 8}),
    ]
    rows = sweep_of(records)["tree_budget"]
    assert [r["label"] for r in rows] == ["p 8", "z 2"]


def test_bild_grid_axes_mix_numbers_and_missing_values():
    records = [
        rec("ar"),
        rec("b1", method="bild", params={"fallback_threshold": 0.5, "rollback": 2}),
        rec("b2", method="bild", params={"rollback": 3}),
    ]
    grid = sweep_of(records)["bild"][0]
    assert grid["fallback"] == [0.5, None] and grid["rollback"] == [2, 3]
    assert set(_ROW_FIELDS) <= set(grid["cells"][0])


def test_best_plain_is_the_fastest_not_the_last_named():
    by_label = {
        "ar": [rec("ar", total_s=1.0)],
        "ar slow": [rec("ar", total_s=4.0)],
        "sps": [rec("sps", total_s=0.5)],
    }
    group = {
        label: {"method": rs[0].method, "tokens_per_s": 10 / rs[0].total_s} for label, rs in by_label.items()
    }
    add_vs_best_plain(group, by_label, None, resamples=0)
    assert group["sps"]["best_plain"] == "ar" and group["sps"]["vs_best_ar"] == pytest.approx(2.0)


def test_bootstrap_thresholds_are_strictly_positive():
    index = np.array([[0]])
    # Small but positive sums count.
    assert _bootstrap(np.array([[2.0, 0.5]]), np.array([[1.0, 0.25]]), 0, 1, index) == pytest.approx(
        (1.0, 1.0)
    )
    # A baseline without time is skipped (it would give an infinite rate).
    assert _bootstrap(np.array([[2.0, 0.5]]), np.array([[1.0, 0.0]]), 0, 1, index) is None


def test_sort_key_of_strings():
    assert _sort_key("inf") == (1, 0.0, "inf")
    assert sorted(["b", 2, "a"], key=_sort_key) == [2, "a", "b"]


def test_more_edges():
    # A single token in no time is already a timing bug.
    assert throughput([rec(new_tokens=1, total_s=0.0)])["zero_time_records"] == 1
    # One resample is an interval (of one value).
    s = speedup(spread(), ar_rows(), resamples=1, seed=0)
    assert s["speedup_ci_low"] is not None and s["speedup_ci_low"] == s["speedup_ci_high"]
    # No whole-generation time but decode time: the decode speed-up still gets its interval.
    mine = [rec(example_id=e, total_s=0.0, decode_s=t) for e, t in zip("ab", (0.3, 0.6), strict=True)]
    s = speedup(mine, ar_rows()[:2], resamples=50, seed=0)
    assert s["speedup"] is None and s["speedup_ci_low"] is None
    assert s["decode_speedup"] is not None and s["decode_speedup_ci_low"] is not None
    # Accepted positions missing at the end count as 0.
    a = acceptance([rec(drafted=4, accepted=1, drafted_per_position=[2, 2], accepted_per_position=[1])])
    assert a["accepted_per_position"] == [1, 0] and a["acceptance_per_position"] == [0.5, 0.0]
    # Nothing drafted: no α̂, whatever else was counted.
    assert acceptance([rec(drafted=0, accepted=0, rollbacks=1)])["alpha_hat"] is None
    # The share of plain rounds is that of k = 0.
    assert sizing([rec(k_counts=[1, 3])])["k0_share"] == 0.25


def test_unmatched_keys_are_checked_against_each_labels_own_baseline():
    records = [
        rec("ar", example_id="a"),
        rec("ar", example_id="b"),
        rec("ar bf16", method="ar", example_id="a"),
        rec("sps bf16", method="sps", example_id="a"),
        rec("sps bf16", method="sps", example_id="b"),
    ]
    run = run_info(extra={"baselines": {"sps bf16": "ar bf16", "ar bf16": "ar bf16"}})
    assert summarize(records, run, resamples=0)["unmatched"] == {"sps bf16": [["b", 0, 0]]}


# --- engines and concurrency ------------------------------------------------------------------------


def test_engine_of_reads_the_variants_engine_setting():
    assert engine_of({"params": {"engine": "vllm"}}) == "vllm"
    assert engine_of({"params": {}}) == "hf"
    assert engine_of({}) == "hf"


def _two_engines() -> tuple[list[Record], RunInfo]:
    vllm = {"engine": "vllm"}
    rows = [
        rec("ar", "e1", method="ar", tokens=[1, 2]),
        rec("ar", "e2", method="ar", tokens=[3, 4]),
        rec("ar", "e3", method="ar", tokens=[5], temperature=1.0),  # sampled: never a reference
        rec("sps", "e1", tokens=[1, 2]),
        rec("ar float16", "e1", method="ar", tokens=[9]),
        rec("ar@vllm", "e1", method="ar", tokens=[1, 2], params=vllm),  # same tokens as hf's ar
        rec("ar@vllm", "e2", method="ar", tokens=[3, 5], params=vllm),  # differs
        rec("ar@vllm", "e3", method="ar", tokens=[5], params=vllm),  # no greedy hf reference
        rec("sps@vllm", "e1", method="sps", tokens=[1, 2], params=vllm),
    ]
    baselines = {"ar": "ar", "sps": "ar", "ar float16": "ar", "ar@vllm": "ar@vllm", "sps@vllm": "ar@vllm"}
    run = run_info(labels=list(baselines), extra={"baselines": baselines})
    return rows, run


def test_engine_summary_names_each_engines_main_label_and_compares_their_ar():
    rows, run = _two_engines()
    summary = summarize(rows, run, resamples=0)
    assert summary["engines"] == {
        "engines": ["hf", "vllm"],
        "methods": {"ar": {"hf": "ar", "vllm": "ar@vllm"}, "sps": {"hf": "sps", "vllm": "sps@vllm"}},
        "ar_match": {"vllm": {"matched": 1, "compared": 2}},
    }
    assert summary["concurrency"] is None
    from draftlab.bench.run_header import header_rows

    rows_of_header = dict(header_rows(summary))  # without extra["engines"], the engines the records name
    assert rows_of_header["engines"] == "hf, vllm"
    assert rows_of_header["decoding"].endswith("speed-ups over ar, ar@vllm")
    hf_only = [r for r in rows if "@" not in r.label]
    run_hf = run_info(labels=["ar", "sps", "ar float16"], extra={"baselines": {}})
    assert summarize(hf_only, run_hf, resamples=0)["engines"] is None
    vllm_only = [r for r in rows if "@" in r.label]
    out = engine_summary(vllm_only, {"ar@vllm": {"method": "ar", "params": {"engine": "vllm"}}}, str)
    assert out == {"engines": ["vllm"], "methods": {"ar": {"vllm": "ar@vllm"}}, "ar_match": {}}
    # A label that has no baseline is left out of the table.
    variants = {"x": {"method": "ar", "params": {"engine": "vllm"}}, "y": {"method": "pld", "params": {}}}
    assert engine_summary([], variants, lambda label: None if label == "y" else "x")["methods"] == {
        "ar": {"vllm": "x"}
    }


def _level(label, level, share, accepted=0, drafted=0, tpots=None):
    rows = []
    for i in range(level):
        r = rec(level_label(label, level), f"e{i}", method=label.split("@")[0])
        r.new_tokens, r.total_s, r.accepted, r.drafted, r.rounds = 10, share, accepted, drafted, 10 - accepted
        r.params = {"tpot_s": (tpots or [0.02] * level)[i]}
        rows.append(r)
    return rows


def test_a_concurrency_run_is_summarised_level_by_level_with_its_prediction():
    rows = _level("ar@vllm", 1, 1.0) + _level("ar@vllm", 2, 1.0) + _level("sps@vllm", 1, 0.5, 5, 10)
    rows += _level("sps@vllm", 2, 2.0, 5, 10, [0.01, 0.03])
    curve = {"sizes": [1, 2, 4, 8], "contexts": [0, 100], "ms": [[10, 10, 20, 40], [10, 10, 20, 40]]}
    draft = {"sizes": [1, 2, 4], "contexts": [0, 100], "ms": [[1, 2, 4], [1, 2, 4]]}
    extra = {
        "concurrency_baseline": "ar@vllm",
        "cost_curves": {"target": curve, "draft": draft, "context": 50, "draft_labels": {"sps@vllm": True}},
    }
    run = run_info(labels=sorted({r.label for r in rows}), extra=extra)
    summary = summarize(rows, run, resamples=0)
    assert summary["engines"] is None
    data = summary["concurrency"]
    assert data["baseline"] == "ar@vllm"
    one, two = data["levels"]["sps@vllm"]["1"], data["levels"]["sps@vllm"]["2"]  # JSON keys
    assert one["tokens_per_s"] == pytest.approx(20.0) and one["speedup"] == pytest.approx(2.0)
    assert two["tokens_per_s"] == pytest.approx(5.0) and two["speedup"] == pytest.approx(0.5)
    assert two["tpot_ms_median"] == pytest.approx(20.0) and two["tpot_ms_p90"] == pytest.approx(28.0)
    assert one["acceptance_rate"] == pytest.approx(0.5) and one["verified_per_step"] == pytest.approx(3.0)
    assert data["pays"] == {"sps@vllm": {"beats_up_to": 1, "stops_at": 2}}
    # c = 1: 2 tokens a step; a pass of 3 tokens (15 ms) plus 2 draft passes of 1 token (1 ms each).
    assert one["predicted_speedup"] == pytest.approx(2 * 10 / (15 + 2 * 1))
    # c = 2: a pass of 6 tokens (30 ms) plus 2 draft passes of 2 tokens (2 ms each), against 10 ms.
    assert two["predicted_speedup"] == pytest.approx(2 * 10 / (30 + 2 * 2))
    assert "predicted_speedup" not in data["levels"]["ar@vllm"]["1"]
    # Without cost curves there is no prediction; without a draft curve the draft costs nothing.
    plain = summarize(
        rows, run_info(labels=run.labels, extra={"concurrency_baseline": "ar@vllm"}), resamples=0
    )
    assert "predicted_speedup" not in plain["concurrency"]["levels"]["sps@vllm"]["1"]
    extra["cost_curves"] = {**extra["cost_curves"], "draft": None}
    no_draft = summarize(rows, run_info(labels=run.labels, extra=extra), resamples=0)
    assert no_draft["concurrency"]["levels"]["sps@vllm"]["1"]["predicted_speedup"] == pytest.approx(
        2 * 10 / 15
    )


def test_level_summary_edges():
    rows = _level("ar@vllm", 1, 1.0) + _level("pld@vllm", 1, 2.0) + _level("pld@vllm", 3, 1.0)
    data = level_summary(rows + [rec("not a level")], "ar@vllm")
    assert set(data["levels"]) == {"ar@vllm", "pld@vllm"}
    assert data["levels"]["pld@vllm"][1]["speedup"] == pytest.approx(0.5)
    assert data["levels"]["pld@vllm"][3]["speedup"] is None  # no ar at that level
    assert data["levels"]["pld@vllm"][1]["acceptance_rate"] is None
    assert data["levels"]["pld@vllm"][3]["tpot_ms_p90"] == pytest.approx(20.0)
    assert data["pays"] == {"pld@vllm": {"beats_up_to": None, "stops_at": 1}}
    winner = _level("ar@vllm", 1, 1.0) + _level("pld@vllm", 1, 0.5)
    assert level_summary(winner, "ar@vllm")["pays"]["pld@vllm"] == {
        "beats_up_to": 1,
        "stops_at": None,
    }
    assert _quantile([1.0], 0.9) == 1.0
    assert _quantile([0.0, 10.0], 0.9) == pytest.approx(9.0)
    assert _quantile([0.0, 10.0, 20.0], 0.5) == pytest.approx(10.0)


# --- profile fit -------------------------------------------------------------------------------------


def _fit_summary(timed: int, profiled: float, measured: float) -> dict:
    records = [
        rec("ar", method="ar"),
        rec(
            "pld",
            method="pld",
            k_counts=[5, 5],
            timed_rounds=timed,
            profiled_ms=profiled,
            measured_ms=measured,
        ),
    ]
    return summarize(records, run_info(baseline="ar", labels=["ar", "pld"]))


def test_a_profile_off_by_over_a_quarter_over_many_rounds_is_named_stale():
    from draftlab.bench.report_warnings import warnings

    summary = _fit_summary(200, 1000.0, 1300.0)
    assert summary["overall"]["pld"]["profile_fit"] == pytest.approx(1.3)
    assert summary["overall"]["pld"]["timed_rounds"] == 200
    notes = [n for n in warnings(summary) if "profile --refresh" in n]
    assert len(notes) == 1 and "pld 1.30×" in notes[0]
    # Faster than the profile says counts the same.
    assert any("pld 0.70×" in n for n in warnings(_fit_summary(200, 1000.0, 700.0)))
    # Within 25%, or over too few rounds to tell: no warning.
    assert not [n for n in warnings(_fit_summary(200, 1000.0, 1240.0)) if "refresh" in n]
    assert not [n for n in warnings(_fit_summary(99, 1000.0, 2000.0)) if "refresh" in n]
    assert _fit_summary(0, 0.0, 0.0)["overall"]["pld"]["profile_fit"] is None


def test_no_alpha_hat_from_an_engine_that_reports_totals_only():
    """llama-server and llama.cpp's own lookup give drafted and accepted totals, not rejections per
    round: α is known, α̂ is not (it would read 1.0)."""
    base = [rec("ar", example_id=e, new_tokens=10, total_s=1.0, decode_s=0.9, target_calls=10) for e in "ab"]
    totals = [
        rec(example_id=e, new_tokens=10, total_s=0.8, decode_s=0.7, drafted=8, accepted=3) for e in "ab"
    ]
    m = group_metrics(totals, base, resamples=100)
    assert m["acceptance_rate"] == pytest.approx(3 / 8) and m["alpha_hat"] is None


# --- where a decode round's time goes --------------------------------------------------------------


def test_round_split_is_sums_over_decode_rounds_and_the_rest_is_what_is_left():
    from draftlab.bench.round_split import round_split

    # 2 generations, 10 + 30 decode rounds (round 1 is the prefill), 0.4 s of decode in all.
    records = [
        rec("pld", rounds=11, decode_s=0.1, pass_s=0.05, inputs_s=0.01, draft_s=0.01, accept_s=0.01),
        rec(
            "pld",
            example_id="e2",
            rounds=31,
            decode_s=0.3,
            pass_s=0.22,
            inputs_s=0.02,
            draft_s=0.02,
            accept_s=0.02,
        ),
    ]
    split = round_split(records)
    assert split["round_ms"] == pytest.approx(10.0)  # 400 ms / 40 rounds
    assert split["round_pass_ms"] == pytest.approx(6.75)
    assert split["round_inputs_ms"] == pytest.approx(0.75)
    assert split["round_draft_ms"] == pytest.approx(0.75)
    assert split["round_accept_ms"] == pytest.approx(0.75)
    assert split["round_rest_ms"] == pytest.approx(1.0)
    assert split["round_overhead_share"] == pytest.approx(0.25)  # (30 + 30 + 40 ms) / 400 ms
    # Records of another engine (nothing split) are left out, not counted as all overhead.
    assert round_split([*records, rec("ar@llamacpp", method="ar", rounds=50, decode_s=5.0)]) == split
    assert round_split([rec("ar@llamacpp", method="ar")])["round_ms"] is None


def test_the_loop_splits_every_decode_round(tiny_pair):
    """Our loop records each part; the parts add up to no more than the decode time."""
    from draftlab.decode.build import build_decoder
    from draftlab.decode.spec import DecoderConfig
    from draftlab.models.loading import ModelSpec, load_model
    from draftlab.sampling import SamplingParams

    target, draft = (load_model(ModelSpec(str(p), dtype="float32")) for p in tiny_pair["llama"])
    decoder = build_decoder(DecoderConfig(method="sps", gamma=3), target, draft, None)
    s = decoder.generate([1, 5, 9, 3], 24, SamplingParams()).stats
    assert s.pass_s > 0 and s.inputs_s > 0 and s.draft_s > 0 and s.accept_s > 0
    assert s.pass_s + s.inputs_s + s.draft_s + s.accept_s <= s.decode_s
