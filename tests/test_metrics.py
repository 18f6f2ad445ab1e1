"""The summary (bench/summary.py and the figure modules it draws on) against figures computed by
hand from tests/fixtures/run_small.

The fixture (13 records, subtasks qa and multi-turn, labels ar / sps / pld):

    label ex    turn  new  prefill  decode  total  calls  drafted acc  rollb  propose_s/calls  greedy
    ar    qa-1  0     10   0.10     0.90    1.00   10
    ar    qa-2  0      0   0.20     0.00    0.20    1
    ar    mt-1  0      8   0.15     0.70    0.85    8
    ar    mt-1  1      6   0.25     0.60    0.85    6
    sps   qa-1  0     10   0.12     0.48    0.60    4    12      6    2     0.12/12          True
    sps   qa-2  0      0   0.22     0.00    0.22    1     0      0    0     0/0              True
    sps   qa-3  0      6   0.10     0.20    0.30    2     4      4    0     0.04/4           None (no ar record)
    sps   mt-1  0      8   0.16     0.34    0.50    3     7      5    2     0.07/7           True
    sps   mt-1  1      6   0.26     0.44    0.70    3     8      4    1     0.08/8           False
    pld   qa-1  0     10   0.10     0.70    0.80    7     5      3    1     0.006/0          True
    pld   qa-2  0      0   0.20     0.00    0.20    1     0      0    0     0/0              True
    pld   mt-1  0      8   0.15     0.55    0.70    4     4      4    0     0.003/0          True
    pld   mt-1  1      6   0.25     0.55    0.80    6     0      0    0     0.002/0          True
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from draftlab.bench.group_metrics import bild_stats, group_metrics, predicted_speedup
from draftlab.bench.rates import ratio, speedup
from draftlab.bench.records import RunInfo, read_records
from draftlab.bench.summary import summarize

FIXTURE = Path(__file__).parent / "fixtures" / "run_small"


@pytest.fixture(scope="module")
def records():
    return read_records(FIXTURE / "results.jsonl")


@pytest.fixture(scope="module")
def run():
    return RunInfo.load(FIXTURE)


@pytest.fixture(scope="module")
def summary(records, run):
    return summarize(records, run)


def test_fixture_shape(records):
    assert len(records) == 13
    assert {r.subtask for r in records} == {"qa", "multi-turn"}
    assert {r.label for r in records} == {"ar", "sps", "pld"}
    assert any(r.new_tokens == 0 for r in records)
    assert {r.turn for r in records if r.example_id == "mt-1"} == {0, 1}


def test_tokens_per_s_is_a_ratio_of_sums(summary):
    ar, sps, pld = (summary["overall"][label] for label in ("ar", "sps", "pld"))
    assert ar["new_tokens"] == 10 + 0 + 8 + 6
    assert ar["total_s"] == pytest.approx(1.00 + 0.20 + 0.85 + 0.85)
    assert ar["tokens_per_s"] == pytest.approx(24 / 2.90)
    assert sps["tokens_per_s"] == pytest.approx((10 + 0 + 6 + 8 + 6) / (0.60 + 0.22 + 0.30 + 0.50 + 0.70))
    assert pld["tokens_per_s"] == pytest.approx(24 / (0.80 + 0.20 + 0.70 + 0.80))
    # Not the mean of per-example rates (that would be (10 + 0 + 8/0.85 + 6/0.85) / 4 for ar).
    assert ar["tokens_per_s"] != pytest.approx((10 / 1.0 + 0 / 0.2 + 8 / 0.85 + 6 / 0.85) / 4)
    # Decode: first token comes out of the prefill; 0-token records add 0 tokens.
    assert ar["decode_tokens"] == 9 + 0 + 7 + 5
    assert ar["decode_tokens_per_s"] == pytest.approx(21 / (0.90 + 0.0 + 0.70 + 0.60))
    assert sps["decode_tokens_per_s"] == pytest.approx(
        (9 + 0 + 5 + 7 + 5) / (0.48 + 0.0 + 0.20 + 0.34 + 0.44)
    )
    assert ar["n"] == 4 and ar["examples"] == 3  # mt-1 has two turns
    assert sps["n"] == 5 and sps["examples"] == 4


def test_per_subtask_figures(summary):
    qa, mt = summary["subtasks"]["qa"], summary["subtasks"]["multi-turn"]
    assert set(qa) == {"ar", "sps", "pld"} and set(mt) == {"ar", "sps", "pld"}
    assert qa["ar"]["tokens_per_s"] == pytest.approx(10 / (1.00 + 0.20))
    assert qa["sps"]["tokens_per_s"] == pytest.approx((10 + 0 + 6) / (0.60 + 0.22 + 0.30))
    assert mt["ar"]["tokens_per_s"] == pytest.approx((8 + 6) / (0.85 + 0.85))
    assert mt["sps"]["tokens_per_s"] == pytest.approx((8 + 6) / (0.50 + 0.70))
    assert summary["subtask_names"] == ["qa", "multi-turn"]


def test_zero_token_example_counts(summary):
    qa_ar = summary["subtasks"]["qa"]["ar"]
    assert qa_ar["n"] == 2
    assert qa_ar["total_s"] == pytest.approx(1.20)  # qa-2's 0.20 s stay in the denominator
    assert qa_ar["tokens_per_s"] == pytest.approx(10 / 1.20)
    assert qa_ar["tokens_per_s"] != pytest.approx(10 / 1.00)


def test_speedup_on_matched_keys(summary):
    sps = summary["overall"]["sps"]
    # qa-3 has no ar record: only qa-1, qa-2, mt-1/0, mt-1/1 enter.
    assert sps["matched_keys"] == 4
    assert sps["speedup"] == pytest.approx((24 / (0.60 + 0.22 + 0.50 + 0.70)) / (24 / 2.90))
    assert sps["decode_speedup"] == pytest.approx((21 / (0.48 + 0.34 + 0.44)) / (21 / 2.20))
    pld = summary["overall"]["pld"]
    assert pld["speedup"] == pytest.approx((24 / 2.50) / (24 / 2.90))
    assert summary["subtasks"]["qa"]["sps"]["speedup"] == pytest.approx((10 / 0.82) / (10 / 1.20))
    assert summary["subtasks"]["multi-turn"]["sps"]["speedup"] == pytest.approx((14 / 1.20) / (14 / 1.70))
    ar = summary["overall"]["ar"]
    assert ar["is_baseline"] and ar["speedup"] == 1.0 and ar["speedup_ci_low"] is None
    assert summary["unmatched"] == {"sps": [["qa-3", 0, 0]]}


def test_acceptance_alpha_hat_and_accepted_length(summary):
    sps = summary["overall"]["sps"]
    assert sps["drafted"] == 12 + 0 + 4 + 7 + 8
    assert sps["accepted"] == 6 + 0 + 4 + 5 + 4
    assert sps["acceptance_rate"] == pytest.approx(19 / 31)
    assert sps["rollbacks"] == 2 + 0 + 0 + 2 + 1
    assert sps["alpha_hat"] == pytest.approx(19 / (19 + 5))
    assert sps["mean_accepted_length"] == pytest.approx(30 / (4 + 0 + 2 + 3 + 3))  # Σ tokens / Σ rounds
    assert sps["drafted_per_position"] == [3 + 1 + 2 + 2, 3 + 1 + 2 + 2, 3 + 1 + 2 + 2, 3 + 1 + 1 + 2]
    assert sps["accepted_per_position"] == [3 + 1 + 2 + 1, 1 + 1 + 2 + 1, 1 + 1 + 1 + 1, 1 + 1 + 0 + 1]
    assert sps["acceptance_per_position"] == pytest.approx([7 / 8, 5 / 8, 4 / 8, 3 / 7])
    pld = summary["overall"]["pld"]
    assert pld["acceptance_rate"] == pytest.approx(7 / 9)
    assert pld["alpha_hat"] == pytest.approx(7 / 8)
    assert pld["mean_accepted_length"] == pytest.approx(24 / (7 + 0 + 4 + 6))
    ar = summary["overall"]["ar"]
    assert ar["acceptance_rate"] is None and ar["alpha_hat"] is None
    assert ar["mean_accepted_length"] == pytest.approx(24 / 24)


def test_cost_ratio(summary):
    draft_step = (0.12 + 0.0 + 0.04 + 0.07 + 0.08) / (12 + 0 + 4 + 7 + 8)
    target_step = (0.90 + 0.0 + 0.70 + 0.60) / (9 + 0 + 7 + 5)  # ar: target_calls - 1 per record
    sps = summary["overall"]["sps"]
    assert sps["draft_step_ms"] == pytest.approx(draft_step * 1000)
    assert sps["target_step_ms"] == pytest.approx(target_step * 1000)
    assert sps["cost_ratio"] == pytest.approx(draft_step / target_step)
    qa_c = ((0.12 + 0.04) / (12 + 4)) / (0.90 / 9)
    assert summary["subtasks"]["qa"]["sps"]["cost_ratio"] == pytest.approx(qa_c)
    # Prompt lookup has no draft model: c is unknown, not 0.
    assert summary["overall"]["pld"]["cost_ratio"] is None
    assert summary["overall"]["ar"]["cost_ratio"] is None


def test_predicted_speedup(summary):
    alpha = 19 / 24
    c = ((0.31) / 31) / (2.20 / 21)
    gamma = 4
    expected = (1 - alpha ** (gamma + 1)) / ((1 - alpha) * (gamma * c + 1))
    sps = summary["overall"]["sps"]
    assert sps["gamma"] == 4
    assert sps["predicted_speedup"] == pytest.approx(expected)
    decode_speedup = (21 / 1.26) / (21 / 2.20)
    assert sps["measured_over_predicted"] == pytest.approx(decode_speedup / expected)
    assert summary["overall"]["pld"]["predicted_speedup"] is None
    assert summary["overall"]["ar"]["predicted_speedup"] is None


def test_a_compiled_methods_c_and_prediction_are_set_against_compiled_plain_decoding(records, run):
    """`sps compiled` beside `ar` (eager, the seeds' baseline) and `ar compiled`, whose passes take a
    quarter of the eager ones: its c, predicted speed-up and meas/pred read compiled plain decoding,
    its speed-up column still the baseline."""
    import dataclasses

    def compiled(r):
        label = f"{r.label} compiled"
        faster = 0.25 if r.method == "ar" else 1.0
        return dataclasses.replace(
            r, label=label, params={**r.params, "compile": True}, decode_s=r.decode_s * faster
        )

    both = list(records) + [compiled(r) for r in records if r.label in ("ar", "sps")]
    overall = summarize(both, run)["overall"]
    eager, fast = overall["sps"], overall["sps compiled"]
    assert fast["baseline"] == "ar"
    assert fast["target_step_ms"] == pytest.approx(eager["target_step_ms"] / 4)
    assert fast["cost_ratio"] == pytest.approx(eager["cost_ratio"] * 4)
    alpha, gamma, c = 19 / 24, 4, fast["cost_ratio"]
    expected = (1 - alpha ** (gamma + 1)) / ((1 - alpha) * (gamma * c + 1))
    assert fast["predicted_speedup"] == pytest.approx(expected)
    over_compiled_plain = (21 / 1.26) / (21 / (2.20 / 4))
    assert fast["measured_over_predicted"] == pytest.approx(over_compiled_plain / expected)
    # The speed-up column stays over the eager baseline; the eager method's figures are unchanged.
    assert fast["decode_speedup"] == pytest.approx(eager["decode_speedup"])
    assert eager["cost_ratio"] == pytest.approx(((0.31) / 31) / (2.20 / 21))


def test_a_drafts_catch_up_is_reported_per_generation_apart_from_its_step(records, run):
    import dataclasses

    caught = [dataclasses.replace(r, catch_up_s=0.05) if r.label == "sps" else r for r in records]
    overall = summarize(caught, run)["overall"]
    assert overall["sps"]["catch_up_ms"] == pytest.approx(50.0)  # 0.05 s in each of 5 generations
    assert overall["sps"]["cost_ratio"] == pytest.approx(
        summarize(records, run)["overall"]["sps"]["cost_ratio"]
    )
    assert overall["pld"]["catch_up_ms"] is None


def test_a_sized_methods_prediction_is_taken_over_its_rounds_as_run(records, run):
    """Leviathan's γ-every-round prediction read 0.72x for a sized sps that drafted k = 1 in 9% of
    rounds: over the rounds as sized it is Σ n_k E[tokens | k] / Σ n_k (kc + 1). A tree has none."""
    import dataclasses

    from draftlab.bench.group_metrics import predicted_over_rounds

    sized = [dataclasses.replace(r, k_counts=[3, 1]) if r.label == "sps" else r for r in records]
    tree = [dataclasses.replace(r, label="sps-tree", method="sps-tree") for r in sized if r.label == "sps"]
    overall = summarize(sized + tree, run)["overall"]
    sps = overall["sps"]
    alpha, c = 19 / 24, sps["cost_ratio"]
    counts = [15, 5]  # 3 plain rounds and 1 of k = 1 in each of the 5 generations
    expected = (15 * 1 + 5 * (1 + alpha)) / (15 * 1 + 5 * (c + 1))
    assert sps["k_counts"] == counts
    assert sps["predicted_speedup"] == pytest.approx(expected)
    assert predicted_over_rounds(alpha, c, counts) == pytest.approx(expected)
    assert predicted_over_rounds(1.0, 0.0, [0, 0, 2]) == pytest.approx(3.0)
    assert predicted_over_rounds(None, c, counts) is None and predicted_over_rounds(alpha, c, []) is None
    assert sps["measured_over_predicted"] == pytest.approx(sps["decode_speedup"] / expected)
    assert overall["sps-tree"]["cost_ratio"] == pytest.approx(c)
    assert overall["sps-tree"]["predicted_speedup"] is None


def test_predicted_speedup_formula_edges():
    assert predicted_speedup(1.0, 4, 0.1) == pytest.approx(5 / 1.4)
    assert predicted_speedup(0.0, 4, 0.1) == pytest.approx(1 / 1.4)
    assert predicted_speedup(0.5, 2, 0.0) == pytest.approx((1 - 0.125) / 0.5)
    assert predicted_speedup(None, 4, 0.1) is None
    assert predicted_speedup(0.5, None, 0.1) is None
    assert predicted_speedup(0.5, 4, None) is None


def test_greedy_match_rate(summary):
    sps = summary["overall"]["sps"]
    assert (sps["greedy_matches"], sps["greedy_compared"]) == (3, 4)  # qa-3 has no ar record to compare
    assert (sps["baseline_matches"], sps["baseline_compared"]) == (3, 4)  # the records' own flags
    assert sps["greedy_match_rate"] == pytest.approx(3 / 4)
    assert summary["subtasks"]["multi-turn"]["sps"]["greedy_match_rate"] == pytest.approx(1 / 2)
    assert summary["overall"]["pld"]["greedy_match_rate"] == pytest.approx(1.0)
    assert summary["overall"]["ar"]["greedy_match_rate"] is None


def test_bild_and_prefill_figures(summary, records):
    sps = summary["overall"]["sps"]
    assert sps["draft_tokens_kept"] == 6 + 0 + 4 + 5 + 4
    assert sps["draft_share"] == pytest.approx(19 / 30)
    assert sps["fallbacks"] == 0
    ar = summary["overall"]["ar"]
    assert ar["prefill_ms_mean"] == pytest.approx((0.10 + 0.20 + 0.15 + 0.25) / 4 * 1000)
    assert ar["prefill_ms_median"] == pytest.approx((0.15 + 0.20) / 2 * 1000)
    assert ar["time_per_token_ms"] == pytest.approx(2.20 / 21 * 1000)
    assert sps["prefill_ms_median"] == pytest.approx(160.0)
    bild = [
        dataclasses.replace(r, label="bild", method="bild", fallbacks=2, rollbacks=1)
        for r in records
        if r.label == "sps"
    ]
    stats = bild_stats(bild)
    assert stats["fallbacks"] == 10
    assert group_metrics(bild, [r for r in records if r.label == "ar"])["predicted_speedup"] is None


def test_bootstrap_ci_contains_estimate_and_is_reproducible(records, run, summary):
    for label in ("sps", "pld"):
        m = summary["overall"][label]
        assert m["speedup_ci_low"] <= m["speedup"] <= m["speedup_ci_high"]
        assert m["decode_speedup_ci_low"] <= m["decode_speedup"] <= m["decode_speedup_ci_high"]
    again = summarize(records, run)
    assert json.dumps(again, sort_keys=True) == json.dumps(summary, sort_keys=True)
    sps = [r for r in records if r.label == "sps"]
    ar = [r for r in records if r.label == "ar"]
    one = speedup(sps, ar, resamples=500, seed=7)
    assert one == speedup(sps, ar, resamples=500, seed=7)
    assert one["speedup"] == pytest.approx(summary["overall"]["sps"]["speedup"])
    # A single matched key has no interval.
    single = speedup([r for r in sps if r.example_id == "qa-1"], ar)
    assert single["matched_keys"] == 1 and single["speedup_ci_low"] is None
    assert single["speedup"] == pytest.approx((10 / 0.60) / (10 / 1.00))


def test_zero_denominators_give_none(records):
    zero = [
        dataclasses.replace(
            r, new_tokens=0, prefill_s=0.0, decode_s=0.0, total_s=0.0, target_calls=0, rounds=0
        )
        for r in records
        if r.label == "sps"
    ]
    m = group_metrics(zero, [r for r in records if r.label == "ar"])
    for name in ("tokens_per_s", "decode_tokens_per_s", "speedup", "decode_speedup", "mean_accepted_length"):
        assert m[name] is None, name
    assert ratio(1.0, 0.0) is None
    assert speedup(zero, [])["speedup"] is None


def test_summary_is_strict_json(summary):
    text = json.dumps(summary, allow_nan=False)
    assert json.loads(text) == summary
    assert summary["labels"] == ["ar", "sps", "pld"]
    assert summary["baseline"] == "ar"
    assert summary["sweeps"] == {}
    assert summary["variants"]["sps"]["draft_params"] == 1_000_000


def test_sweeps_are_detected(records, run):
    extra = []
    for r in records:
        if r.label == "sps":
            extra.append(dataclasses.replace(r, label="sps γ=2", gamma=2, params={"gamma": 2}))
            extra.append(dataclasses.replace(r, label="sps T=1", temperature=1.0))
        if r.label == "ar":
            extra.append(
                dataclasses.replace(
                    r, label="ar no-cache", params={"use_cache": False, "attn_implementation": "eager"}
                )
            )
    s = summarize(records + extra, run, resamples=200)
    assert [row["gamma"] for row in s["sweeps"]["draft_gamma"]] == [2, 4]
    assert {(row["label"], row["temperature"]) for row in s["sweeps"]["temperature"]} >= {("sps T=1", 1.0)}
    ablation = {row["label"]: row for row in s["sweeps"]["ablation"]}
    assert ablation["ar"]["plain"] == "ar no-cache"
    assert ablation["ar no-cache"]["speedup_vs_plain"] == 1.0
    assert ablation["ar"]["speedup_vs_plain"] == pytest.approx(1.0)  # same times in this synthetic copy


def test_greedy_match_compares_with_plain_decoding_in_the_same_dtype_only():
    """A routed method's bfloat16 generation is lossless if it writes bfloat16 plain decoding's tokens,
    whatever float32 `ar` wrote; with no plain decoding in its dtype nothing is claimed."""
    from draftlab.bench.losslessness import with_plain_matches

    base = read_records(FIXTURE / "results.jsonl")[0]  # ar, qa-1

    def rec(label, method, dtype, tokens, example="qa-1", engine=None):
        params = {"engine": engine} if engine else {}
        return dataclasses.replace(
            base, label=label, method=method, dtype=dtype, tokens=tokens, example_id=example, params=params
        )

    records = [
        rec("ar", "ar", "float32", [1, 2, 3]),
        rec("ar bfloat16", "ar", "bfloat16", [1, 2, 4]),
        rec("pld", "pld", "bfloat16", [1, 2, 4]),  # bf16 plain decoding's tokens: lossless
        rec("pld", "pld", "float32", [1, 2, 3], example="qa-2"),  # no plain decoding of qa-2: unknown
        rec("sps", "sps", "float32", [1, 2, 4]),  # float32, yet bf16's tokens: a loss
        rec("pld@llamacpp", "pld", "bfloat16", [1, 2, 4], engine="llamacpp"),  # no llama.cpp ar: unknown
    ]
    got = [r.plain_match for r in with_plain_matches(records)]
    assert got == [None, None, True, None, False, None]
    sampled = dataclasses.replace(records[2], temperature=0.7)
    assert with_plain_matches([records[1], sampled])[1].plain_match is None
    # Exact mode samples with keyed noise: the seed's sample is plain decoding's, so it is compared.
    exact = {"exact": True}
    ar_sampled = dataclasses.replace(records[1], temperature=0.7, params=exact)
    for tokens, match in (([1, 2, 4], True), ([1, 2, 5], False)):
        pld = dataclasses.replace(sampled, params=exact, tokens=tokens)
        assert with_plain_matches([ar_sampled, pld])[1].plain_match is match
