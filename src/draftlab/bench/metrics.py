"""Every figure the benchmark reports, computed from saved `Record`s alone (no model is loaded).

Rules that keep the figures honest:

* Rates are ratios of sums over a group: tokens/s = Σ new tokens / Σ seconds, never the mean of
  per-example rates (which over-weights short, fast generations).
* Records with 0 new tokens count: their time stays in the denominator.
* A ratio whose denominator is 0 is `None` (printed "-"), never inf or NaN.
* A speed-up compares the same inputs: records are matched by `Record.key`
  (example_id, turn, repeat) with the baseline's records of the same group, and only keys
  present in both enter the ratio. Its 95% confidence interval is a percentile bootstrap over
  the matched keys with a fixed seed, so a report is reproducible.

Definitions of the speculative-decoding figures (per group):

* acceptance_rate = Σ accepted / Σ drafted: the share of drafted tokens that were kept.
* alpha_hat (α̂) = Σ accepted / (Σ accepted + Σ rollbacks): the per-token acceptance probability
  in Leviathan et al. (2023). Each round is a run of i.i.d. Bernoulli(α) trials that stops at the
  first rejection (a rollback) or after γ successes; successes / (successes + failures) is the
  maximum-likelihood estimate of α. accepted/drafted is biased low as an estimate of α, because
  the draft tokens after a rejection were never tried but still count as drafted.
* mean_accepted_length = Σ new tokens / Σ verification rounds: tokens per round, the target's own
  token included (1.0 for AR), as vLLM and Spec-Bench count it.
* cost_ratio c = draft step time / target step time. Draft step = Σ propose_s / Σ propose_calls
  over the group's records; target step = Σ decode_s / Σ (target_calls − 1) over the baseline's
  records of the same group (AR runs one target forward per decode token). `None` when there is
  no draft forward pass (prompt lookup has no draft model: c = 0 would be wrong) or no baseline.
* predicted_speedup = (1 − α̂^(γ+1)) / ((1 − α̂)(γc + 1)) (Leviathan et al. 2023, walltime
  improvement; (γ+1)/(γc+1) when α̂ = 1). The model assumes γ drafts per round, so it is not
  computed for BiLD, whose blocks end dynamically. It models decode steps only, so
  measured_over_predicted divides the decode-only speed-up by it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict

import numpy as np

from draftlab.bench.records import Record, RunInfo
from draftlab.decode.methods import is_speculative

SCHEMA_VERSION = 1
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
CI_LEVEL = 0.95
OVERALL = "overall"

# The BiLD thresholds as the runner may spell them in Record.params.
_FALLBACK_KEYS = ("fallback_threshold", "fallback_thres", "fallback")
_ROLLBACK_KEYS = ("rollback_threshold", "rollback_thres", "rollback")


def ratio(numerator: float, denominator: float) -> float | None:
    """numerator / denominator, or None when the denominator is not positive."""
    return numerator / denominator if denominator > 0 else None


def decode_tokens(record: Record) -> int:
    """Tokens produced after the prefill phase, whose first round may already yield several."""
    return max(record.new_tokens - record.first_tokens, 0)


# ---------------------------------------------------------------- throughput


def throughput(records: Sequence[Record]) -> dict:
    new_tokens = sum(r.new_tokens for r in records)
    total_s = sum(r.total_s for r in records)
    dec_tokens = sum(decode_tokens(r) for r in records)
    decode_s = sum(r.decode_s for r in records)
    return {
        "n": len(records),
        "examples": len({r.example_id for r in records}),
        "new_tokens": new_tokens,
        "total_s": total_s,
        "tokens_per_s": ratio(new_tokens, total_s),
        "decode_tokens": dec_tokens,
        "decode_s": decode_s,
        "decode_tokens_per_s": ratio(dec_tokens, decode_s),
        # Generations that produced tokens in no measured time: a timing bug, never a real rate.
        "zero_time_records": sum(1 for r in records if r.new_tokens > 0 and r.total_s <= 0),
    }


# ---------------------------------------------------------------- speed-up


def _per_key(records: Iterable[Record]) -> dict[tuple[str, int, int], np.ndarray]:
    """Per key: [new tokens, total s, decode tokens, decode s] (summed if a key repeats)."""
    out: dict[tuple[str, int, int], np.ndarray] = {}
    for r in records:
        row = np.array([r.new_tokens, r.total_s, decode_tokens(r), r.decode_s], dtype=float)
        out[r.key] = out[r.key] + row if r.key in out else row
    return out


def _rate_ratio(m: np.ndarray, b: np.ndarray, tok: int, sec: int) -> float | None:
    """(Σ tokens_m / Σ s_m) / (Σ tokens_b / Σ s_b) over the rows given."""
    rate_m = ratio(m[:, tok].sum(), m[:, sec].sum())
    rate_b = ratio(b[:, tok].sum(), b[:, sec].sum())
    if rate_m is None or rate_b is None or rate_b == 0:
        return None
    return float(rate_m / rate_b)


def _bootstrap(
    m: np.ndarray, b: np.ndarray, tok: int, sec: int, index: np.ndarray
) -> tuple[float, float] | None:
    """Percentile interval of the speed-up over resampled keys (rows of `index`)."""
    tm, sm = m[:, tok][index].sum(axis=1), m[:, sec][index].sum(axis=1)
    tb, sb = b[:, tok][index].sum(axis=1), b[:, sec][index].sum(axis=1)
    ok = (sm > 0) & (sb > 0) & (tb > 0)
    if not ok.any():
        return None
    values = (tm[ok] / sm[ok]) / (tb[ok] / sb[ok])
    tail = (1 - CI_LEVEL) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)


def speedup(
    records: Sequence[Record],
    baseline_records: Sequence[Record],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> dict:
    """Speed-up of `records` over `baseline_records` on the keys both hold, with bootstrap CIs.

    Whole generation: (Σ new_m / Σ total_m) / (Σ new_b / Σ total_b); decode only: the same with
    decode tokens and decode seconds. The CI resamples the matched keys with replacement
    (`resamples` times, numpy default_rng(seed)) and takes the 2.5th/97.5th percentiles; it is
    None with fewer than two matched keys.
    """
    mine, base = _per_key(records), _per_key(baseline_records)
    keys = sorted(set(mine) & set(base))
    out = {
        "matched_keys": len(keys),
        "speedup": None,
        "speedup_ci_low": None,
        "speedup_ci_high": None,
        "decode_speedup": None,
        "decode_speedup_ci_low": None,
        "decode_speedup_ci_high": None,
    }
    if not keys:
        return out
    m = np.stack([mine[k] for k in keys])
    b = np.stack([base[k] for k in keys])
    out["speedup"] = _rate_ratio(m, b, 0, 1)
    out["decode_speedup"] = _rate_ratio(m, b, 2, 3)
    if len(keys) >= 2 and resamples > 0:
        index = np.random.default_rng(seed).integers(0, len(keys), size=(resamples, len(keys)))
        for name, tok, sec in (("speedup", 0, 1), ("decode_speedup", 2, 3)):
            if out[name] is None:
                continue
            ci = _bootstrap(m, b, tok, sec, index)
            if ci is not None:
                out[f"{name}_ci_low"], out[f"{name}_ci_high"] = ci
    return out


# ---------------------------------------------------------------- acceptance


def _elementwise_sum(lists: Iterable[list[int]]) -> list[int]:
    total: list[int] = []
    for values in lists:
        if len(values) > len(total):
            total.extend([0] * (len(values) - len(total)))
        for i, v in enumerate(values):
            total[i] += v
    return total


def acceptance(records: Sequence[Record]) -> dict:
    """acceptance_rate, α̂ (Leviathan MLE), mean accepted length and per-position acceptance."""
    drafted = sum(r.drafted for r in records)
    accepted = sum(r.accepted for r in records)
    rollbacks = sum(r.rollbacks for r in records)
    target_calls = sum(r.target_calls for r in records)
    rounds = sum(r.rounds for r in records)
    new_tokens = sum(r.new_tokens for r in records)
    d_pos = _elementwise_sum(r.drafted_per_position for r in records)
    a_pos = _elementwise_sum(r.accepted_per_position for r in records)
    a_pos = (a_pos + [0] * (len(d_pos) - len(a_pos)))[: len(d_pos)]
    return {
        "drafted": drafted,
        "accepted": accepted,
        "rollbacks": rollbacks,
        "acceptance_rate": ratio(accepted, drafted),
        "alpha_hat": ratio(accepted, accepted + rollbacks) if drafted else None,
        "target_calls": target_calls,
        "rounds": rounds,
        # Tokens per verification round, the target's own token included (vLLM, Spec-Bench): AR is 1.
        "mean_accepted_length": ratio(new_tokens, rounds),
        "drafted_per_position": d_pos,
        "accepted_per_position": a_pos,
        "acceptance_per_position": [ratio(a, d) for a, d in zip(a_pos, d_pos, strict=True)],
    }


def sizing(records: Sequence[Record]) -> dict:
    """Cost-aware sizing: the distribution of k per round, the share of plain rounds (k = 0), probes,
    and the cost curve's predicted speed-up over plain decoding for the rounds that were run
    (Σ ms plain decoding would spend on the expected tokens / Σ predicted ms)."""
    counts = _elementwise_sum(r.k_counts for r in records)
    rounds = sum(counts)
    predicted_ms = sum(r.predicted_ms for r in records)
    dtypes: dict[str, int] = {}
    for r in records:
        if r.dtype:
            dtypes[r.dtype] = dtypes.get(r.dtype, 0) + 1
    timed = sum(r.timed_rounds for r in records)
    return {
        "dtypes": dtypes,  # generations per target dtype (a routed method may use several)
        # Σ measured round ms / Σ ms the cached profile predicted for those rounds
        "profile_fit": ratio(sum(r.measured_ms for r in records), sum(r.profiled_ms for r in records))
        if timed
        else None,
        "timed_rounds": timed,
        "k_counts": counts,
        "k0_share": ratio(counts[0], rounds) if counts else None,
        "mean_k": ratio(sum(k * n for k, n in enumerate(counts)), rounds) if counts else None,
        "probes": sum(r.probes for r in records),
        "cost_predicted_speedup": ratio(sum(r.predicted_plain_ms for r in records), predicted_ms)
        if counts
        else None,
    }


def trees(records: Sequence[Record]) -> dict:
    """Token trees: nodes verified per tree round, the share of tree rounds whose accepted path
    left the proposer's first choice, why a method fell back to chains, and the earlier outputs
    a SuffixDecoding proposer drew on (output label -> generations that used it)."""
    rounds = sum(r.tree_rounds for r in records)
    used: dict[str, int] = {}
    for r in records:
        for name in (r.proposer_info or {}).get("earlier_outputs_used", {}):
            used[name] = used.get(name, 0) + 1
    fallbacks = {r.tree_fallback for r in records if r.tree_fallback}
    return {
        "tree_rounds": rounds,
        "nodes_per_round": ratio(sum(r.tree_nodes for r in records), rounds) if rounds else None,
        "branch_win_share": ratio(sum(r.branch_wins for r in records), rounds) if rounds else None,
        "tree_fallback": "; ".join(sorted(fallbacks)) or None,
        "earlier_outputs_used": used,
    }


def draft_step_s(records: Sequence[Record]) -> float | None:
    """Seconds per draft forward pass while proposing: Σ propose_s / Σ propose_calls."""
    return ratio(sum(r.propose_s for r in records), sum(r.propose_calls for r in records))


def target_step_s(baseline_records: Sequence[Record]) -> float | None:
    """Seconds per target forward pass in decoding, from AR records: Σ decode_s / Σ(target_calls − 1)."""
    calls = sum(max(r.target_calls - 1, 0) for r in baseline_records)
    return ratio(sum(r.decode_s for r in baseline_records), calls)


def cost_ratio(records: Sequence[Record], baseline_records: Sequence[Record]) -> float | None:
    """c = draft step time / target step time; None without draft forward passes or a baseline."""
    draft, target = draft_step_s(records), target_step_s(baseline_records)
    if draft is None or target is None:
        return None
    return draft / target


def predicted_speedup(alpha: float | None, gamma: int | None, c: float | None) -> float | None:
    """Leviathan et al. (2023): (1 − α^(γ+1)) / ((1 − α)(γc + 1)); the limit (γ+1)/(γc+1) at α = 1."""
    if alpha is None or gamma is None or c is None or gamma < 1:
        return None
    denominator = gamma * c + 1
    if alpha >= 1.0:
        return (gamma + 1) / denominator
    return (1 - alpha ** (gamma + 1)) / ((1 - alpha) * denominator)


def greedy_match(records: Sequence[Record]) -> dict:
    compared = [r.greedy_match for r in records if r.greedy_match is not None]
    matches = sum(1 for m in compared if m)
    return {
        "greedy_compared": len(compared),
        "greedy_matches": matches,
        "greedy_match_rate": ratio(matches, len(compared)),
    }


def bild_stats(records: Sequence[Record]) -> dict:
    kept = sum(r.draft_tokens_kept for r in records)
    return {
        "fallbacks": sum(r.fallbacks for r in records),
        "draft_tokens_kept": kept,
        "draft_share": ratio(kept, sum(r.new_tokens for r in records)),
    }


def prefill_stats(records: Sequence[Record]) -> dict:
    prefill = [r.prefill_s for r in records]
    dec = sum(decode_tokens(r) for r in records)
    per_token = ratio(sum(r.decode_s for r in records), dec)
    return {
        "prefill_ms_mean": sum(prefill) / len(prefill) * 1000 if prefill else None,
        "prefill_ms_median": statistics.median(prefill) * 1000 if prefill else None,
        "time_per_token_ms": per_token * 1000 if per_token is not None else None,
    }


def _unique(values: Iterable) -> object | None:
    distinct = set(values)
    return distinct.pop() if len(distinct) == 1 else None


def group_metrics(
    records: Sequence[Record],
    baseline_records: Sequence[Record],
    *,
    is_baseline: bool = False,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> dict:
    """All figures of one group (a label, overall or within a subtask) against its baseline's records."""
    out: dict = {"method": _unique(r.method for r in records), "gamma": _unique(r.gamma for r in records)}
    out.update(throughput(records))
    if is_baseline:
        out.update(
            matched_keys=len({r.key for r in records}),
            speedup=1.0 if out["tokens_per_s"] is not None else None,
            speedup_ci_low=None,
            speedup_ci_high=None,
            decode_speedup=1.0 if out["decode_tokens_per_s"] is not None else None,
            decode_speedup_ci_low=None,
            decode_speedup_ci_high=None,
        )
    else:
        out.update(speedup(records, baseline_records, resamples=resamples, seed=seed))
    out["is_baseline"] = is_baseline
    out.update(acceptance(records))
    draft, target = draft_step_s(records), target_step_s(baseline_records)
    c = draft / target if draft is not None and target is not None else None
    out["draft_step_ms"] = draft * 1000 if draft is not None else None
    out["target_step_ms"] = target * 1000 if target is not None else None
    out["cost_ratio"] = c
    predicted = None
    if out["method"] != "bild" and not is_baseline:
        predicted = predicted_speedup(out["alpha_hat"], out["gamma"], c)
    out["predicted_speedup"] = predicted
    decode = out["decode_speedup"]
    out["measured_over_predicted"] = decode / predicted if decode is not None and predicted else None
    out.update(sizing(records))
    out.update(trees(records))
    out.update(greedy_match(records))
    out.update(bild_stats(records))
    out.update(prefill_stats(records))
    return out


# ---------------------------------------------------------------- grouping


def label_order(records: Sequence[Record], run: RunInfo) -> list[str]:
    """The baseline first, then RunInfo.labels, then any other label in order of appearance."""
    present = list(dict.fromkeys(r.label for r in records))
    ordered = [run.baseline] if run.baseline in present else []
    ordered += [label for label in run.labels if label in present and label not in ordered]
    ordered += [label for label in present if label not in ordered]
    return ordered


def subtask_order(records: Sequence[Record]) -> list[str]:
    return list(dict.fromkeys(r.subtask for r in records))


def baseline_label(run: RunInfo, label: str) -> str:
    """The label `label` is compared with: RunInfo.extra["baselines"][label] if set, else RunInfo.baseline."""
    return (run.extra.get("baselines") or {}).get(label, run.baseline)


def variant_info(records: Sequence[Record]) -> dict:
    """What distinguishes a label: method, draft, γ, temperature(s) and settings."""
    first = records[0]
    temperatures = sorted({r.temperature for r in records})
    params: dict = {}
    for r in records:
        for k, v in r.params.items():
            params.setdefault(k, v)
    return {
        "method": first.method,
        "target": first.target,
        "draft": _unique(r.draft for r in records),
        "draft_params": _unique(r.draft_params for r in records),
        "gamma": _unique(r.gamma for r in records),
        "temperature": temperatures[0] if len(temperatures) == 1 else None,
        "temperatures": temperatures,
        "params": params,
    }


def _by(records: Iterable, key: Callable[..., object]) -> dict:
    out: dict = {}
    for r in records:
        out.setdefault(key(r), []).append(r)
    return out


# ---------------------------------------------------------------- sweeps


def _param(params: dict, names: Sequence[str]) -> object | None:
    for name in names:
        if name in params:
            return params[name]
    return None


def _sort_key(value: object) -> tuple:
    if isinstance(value, (int, float)):
        return (0, float(value), "")
    return (1, 0.0, str(value))


def _row(label: str, metrics: dict, *names: str) -> dict:
    return {"label": label, **{n: metrics.get(n) for n in names}}


_ROW_FIELDS = (
    "method",
    "is_baseline",
    "n",
    "tokens_per_s",
    "decode_tokens_per_s",
    "speedup",
    "speedup_ci_low",
    "speedup_ci_high",
    "decode_speedup",
    "acceptance_rate",
    "alpha_hat",
    "mean_accepted_length",
    "cost_ratio",
    "predicted_speedup",
    "greedy_match_rate",
)


def sweeps(
    records: Sequence[Record],
    run: RunInfo,
    overall: dict[str, dict],
    variants: dict[str, dict],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> dict:
    """The sweep and ablation tables the run's labels call for (only those that vary)."""
    out: dict = {}
    by_label = _by(records, lambda r: r.label)

    # Draft size × γ (seed 003): speculative labels with a fixed γ (BiLD has its own grid).
    spec = [
        label
        for label, v in variants.items()
        if is_speculative(v["method"]) and v["method"] != "bild" and v["gamma"] is not None
    ]
    settings = _by(spec, lambda label: (variants[label]["method"], variants[label]["temperature"]))
    varying = {
        setting
        for setting, labels in settings.items()
        if len({(variants[label]["draft"], variants[label]["gamma"]) for label in labels}) > 1
    }
    if varying:
        rows = [
            {
                **_row(label, overall[label], *_ROW_FIELDS),
                "temperature": variants[label]["temperature"],
                "draft": variants[label]["draft"],
                "draft_params": variants[label]["draft_params"],
                "gamma": variants[label]["gamma"],
            }
            for setting in varying
            for label in settings[setting]
        ]
        rows.sort(
            key=lambda r: (
                r["method"],
                _sort_key(r["temperature"]),
                _sort_key(r["draft_params"]),
                str(r["draft"]),
                _sort_key(r["gamma"]),
            )
        )
        out["draft_gamma"] = rows

    # Tree node budget (draftlab sweep tree): each tree method at each fixed budget.
    budgeted = {
        label: v["params"]["tree_budget"]
        for label, v in variants.items()
        if v["params"].get("tree_budget") is not None
    }
    if len(set(budgeted.values())) > 1:
        rows = [
            {
                **_row(label, overall[label], *_ROW_FIELDS, "nodes_per_round", "branch_win_share"),
                "budget": budget,
            }
            for label, budget in budgeted.items()
        ]
        rows.sort(key=lambda r: (str(r["method"]), r["budget"]))
        out["tree_budget"] = rows

    # BiLD fallback × rollback grid, one per draft.
    bild = []
    for label, v in variants.items():
        if v["method"] != "bild":
            continue
        fb, rb = _param(v["params"], _FALLBACK_KEYS), _param(v["params"], _ROLLBACK_KEYS)
        if fb is not None or rb is not None:
            bild.append((label, v["draft"], fb, rb))
    if len({(d, fb, rb) for _, d, fb, rb in bild}) > 1:
        grids = []
        for draft in dict.fromkeys(d for _, d, _, _ in bild):
            cells = [(label, fb, rb) for label, d, fb, rb in bild if d == draft]
            grids.append(
                {
                    "draft": draft,
                    "fallback": sorted({fb for _, fb, _ in cells}, key=_sort_key),
                    "rollback": sorted({rb for _, _, rb in cells}, key=_sort_key),
                    "cells": [
                        {
                            **_row(
                                label, overall[label], *_ROW_FIELDS, "fallbacks", "rollbacks", "draft_share"
                            ),
                            "fallback": fb,
                            "rollback": rb,
                        }
                        for label, fb, rb in cells
                    ],
                }
            )
        out["bild"] = grids

    # Temperature: each label at each temperature, against the baseline at the same temperature.
    temperatures = sorted({r.temperature for r in records})
    if len(temperatures) > 1:
        rows = []
        for label, label_records in by_label.items():
            base_all = by_label.get(baseline_label(run, label), [])
            for t, group in sorted(_by(label_records, lambda r: r.temperature).items()):
                base = [r for r in base_all if r.temperature == t] or base_all
                is_base = label == baseline_label(run, label)
                m = group_metrics(group, base, is_baseline=is_base, resamples=resamples, seed=seed)
                rows.append({**_row(label, m, *_ROW_FIELDS), "temperature": t})
        out["temperature"] = rows

    # Ablation: speculative on/off × KV cache × attention implementation, when cache or attention vary.
    # A label whose params do not name them ran with the defaults: KV cache on, the model's attention.
    if any("use_cache" in r.params or "attn_implementation" in r.params for r in records):

        def combo(label: str) -> tuple[bool, bool, str]:
            v = variants[label]
            attn = v["params"].get("attn_implementation") or "default"
            return (is_speculative(v["method"]), bool(v["params"].get("use_cache", True)), str(attn))

        combos = {label: combo(label) for label in variants}
        if len({(cache, attn) for _, cache, attn in combos.values()}) > 1:
            plain_candidates = [label for label, (s, _, _) in combos.items() if not s]
            plain = (
                min(plain_candidates, key=lambda lb: (combos[lb][1], combos[lb][2] != "eager"))
                if plain_candidates
                else run.baseline
            )
            plain_records = by_label.get(plain, [])
            rows = []
            for label, (spec_on, cache, attn) in combos.items():
                vs_plain = (
                    {"speedup": 1.0 if overall[label]["tokens_per_s"] else None}
                    if label == plain
                    else speedup(by_label[label], plain_records, resamples=resamples, seed=seed)
                )
                rows.append(
                    {
                        **_row(label, overall[label], *_ROW_FIELDS),
                        "speculative": spec_on,
                        "use_cache": cache,
                        "attn_implementation": attn,
                        "plain": plain,
                        "speedup_vs_plain": vs_plain.get("speedup"),
                        "speedup_vs_plain_ci_low": vs_plain.get("speedup_ci_low"),
                        "speedup_vs_plain_ci_high": vs_plain.get("speedup_ci_high"),
                    }
                )
            rows.sort(key=lambda r: (r["speculative"], r["use_cache"], r["attn_implementation"], r["label"]))
            out["ablation"] = rows
    return out


# ---------------------------------------------------------------- summary


def json_safe(value: object) -> object:
    """Replace non-finite floats (JSON has none): inf → "inf", NaN → None."""
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def add_vs_best_plain(
    group: dict[str, dict],
    by_label: dict[str, list[Record]],
    subtask: str | None,
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> None:
    """ "vs best ar": every label's speed-up over the fastest plain decoding in the group (any dtype).

    The baseline of a speed-up is one `ar`; a method that beats a slow `ar` (say bfloat16 on a CPU
    that emulates it) but loses to a fast one (float32 there) must show it.
    """
    plain = [
        label
        for label, m in group.items()
        if not is_speculative(m.get("method")) and m.get("tokens_per_s") is not None
    ]
    for m in group.values():
        m.update(best_plain=None, vs_best_ar=None, vs_best_ar_ci_low=None, vs_best_ar_ci_high=None)
    if not plain:
        return
    best = max(plain, key=lambda label: group[label]["tokens_per_s"])

    def rows(label: str) -> list[Record]:
        return [r for r in by_label[label] if subtask is None or r.subtask == subtask]

    base = rows(best)
    for label, m in group.items():
        s = speedup(rows(label), base, resamples=0 if label == best else resamples, seed=seed)
        m.update(
            best_plain=best,
            vs_best_ar=s["speedup"],
            vs_best_ar_ci_low=s["speedup_ci_low"],
            vs_best_ar_ci_high=s["speedup_ci_high"],
        )


def engine_of(variant: dict) -> str:
    return str((variant.get("params") or {}).get("engine", "hf"))


def engine_summary(
    records: Sequence[Record], variants: dict[str, dict], baseline_of: Callable
) -> dict | None:
    """Which label ran which method on which engine, and how often the engines' plain decodings agree.

    None when one engine made every record. "ar_match" compares each engine's greedy `ar` tokens
    with the hf engine's on the same keys: information only (kernels differ between engines, and so
    may near-ties), unlike greedy_match, which compares each method with its own engine's `ar`.
    """
    engines = list(dict.fromkeys(engine_of(v) for v in variants.values()))
    if len(engines) < 2 and engines != ["vllm"]:
        return None
    table: dict[str, dict[str, str]] = {}
    for label, v in variants.items():
        if baseline_of(label) is None:
            continue
        # The first label of a method on an engine is its main one ("ar", not "ar float16").
        table.setdefault(v["method"], {}).setdefault(engine_of(v), label)
    ar_match = {}
    plain = table.get("ar", {})
    reference = {r.key: r.tokens for r in records if r.label == plain.get("hf") and r.temperature == 0}
    for engine, label in plain.items():
        if engine == "hf" or not reference:
            continue
        pairs = [(r.tokens, reference[r.key]) for r in records if r.label == label and r.key in reference]
        ar_match[engine] = {"matched": sum(a == b for a, b in pairs), "compared": len(pairs)}
    return {"engines": engines, "methods": table, "ar_match": ar_match}


# ---------------------------------------------------------------- concurrency (bench/concurrency.py)

LEVEL_SEPARATOR = " c="  # a concurrency sweep labels its variants "sps@vllm c=16"


def level_label(label: str, level: int) -> str:
    return f"{label}{LEVEL_SEPARATOR}{level}"


def level_summary(records: Sequence[Record], baseline: str) -> dict:
    """Per method and level: output tok/s, median and p90 time per output token, α, speed-up over
    the baseline at the same level, and per method the highest level at which it still beats it."""
    groups: dict[str, dict[int, list[Record]]] = {}
    for r in records:
        if LEVEL_SEPARATOR not in r.label:
            continue
        label, level = r.label.rsplit(LEVEL_SEPARATOR, 1)
        groups.setdefault(label, {}).setdefault(int(level), []).append(r)
    rows: dict[str, dict[int, dict]] = {}
    for label, levels in groups.items():
        for level, rs in sorted(levels.items()):
            tokens = sum(r.new_tokens for r in rs)
            seconds = sum(r.total_s for r in rs)
            tpots = sorted(r.params["tpot_s"] for r in rs if r.params.get("tpot_s") is not None)
            drafted = sum(r.drafted for r in rs)
            rows.setdefault(label, {})[level] = {
                "n": len(rs),
                "tokens_per_s": tokens / seconds if seconds > 0 else None,
                "tpot_ms_median": statistics.median(tpots) * 1000 if tpots else None,
                "tpot_ms_p90": _quantile(tpots, 0.9) * 1000 if tpots else None,
                "acceptance_rate": sum(r.accepted for r in rs) / drafted if drafted else None,
                "mean_accepted_length": sum(r.new_tokens for r in rs) / max(sum(r.rounds for r in rs), 1),
                "verified_per_step": 1 + drafted / max(sum(r.rounds for r in rs), 1),
                "greedy_match": [
                    sum(bool(r.greedy_match) for r in rs),
                    sum(r.greedy_match is not None for r in rs),
                ],
            }
    base = rows.get(baseline, {})
    for levels in rows.values():
        for level, m in levels.items():
            b = base.get(level, {}).get("tokens_per_s")
            m["speedup"] = m["tokens_per_s"] / b if b and m["tokens_per_s"] is not None else None
    pays = {}
    for label, levels in rows.items():
        if label == baseline:
            continue
        measured = [(c, m["speedup"]) for c, m in sorted(levels.items()) if m["speedup"] is not None]
        # The highest level up to which every level beats the baseline, and the first that does not.
        up_to, stops = None, None
        for c, speedup in measured:
            if speedup > 1:
                up_to = c
            else:
                stops = c
                break
        pays[label] = {"beats_up_to": up_to, "stops_at": stops}
    return {"baseline": baseline, "levels": rows, "pays": pays}


def predicted_concurrency_speedup(
    summary: dict, target: dict, draft: dict | None, context: int, methods: dict[str, bool]
) -> None:
    """Beside each measured level: what the hf engine's cost curves predict for it.

    A batch of c requests is taken as one pass of c tokens (c · (1 + drafted per step) with
    speculation), the curves being batch-1 passes of n tokens; with the acceptance vLLM measured at
    that level, speed-up = tokens per step · cost(c) / (cost(c · verified per step) + draft passes).
    `methods` says which labels draft with the draft model (one draft pass of c tokens per draft token).
    """
    from draftlab.models.profile import CostCurve  # noqa: PLC0415 - reports need no torch otherwise

    t_curve = CostCurve(**target)
    d_curve = CostCurve(**draft) if draft else None
    rows = summary["levels"]
    for label, levels in rows.items():
        if label == summary["baseline"]:
            continue
        for level, m in levels.items():
            c = int(level)
            per_step = m.get("mean_accepted_length")
            verified = m.get("verified_per_step")
            if not per_step or not verified:
                continue
            plain = t_curve.forward_ms(c, context)
            cost = t_curve.forward_ms(round(c * verified), context)
            if methods.get(label) and d_curve is not None:
                cost += (verified - 1) * d_curve.forward_ms(c, context)
            m["predicted_speedup"] = per_step * plain / cost


def _quantile(values: list[float], q: float) -> float:
    """The q-quantile, linear between order statistics (numpy's default, as the bootstrap uses)."""
    return float(np.quantile(values, q))


def _concurrency(records: Sequence[Record], run: RunInfo) -> dict | None:
    if not run.extra.get("concurrency_baseline"):
        return None
    out = level_summary(records, run.extra["concurrency_baseline"])
    curves = run.extra.get("cost_curves")
    if curves:
        drafts = {label: bool(curves.get("draft_labels", {}).get(label)) for label in out["levels"]}
        predicted_concurrency_speedup(out, curves["target"], curves.get("draft"), curves["context"], drafts)
    return out


def summarize(
    records: Sequence[Record],
    run: RunInfo,
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> dict:
    """The JSON-able summary every report is rendered from.

    {"schema", "run", "baseline", "labels", "subtask_names", "variants",
     "overall": {label: metrics}, "subtasks": {subtask: {label: metrics}},
     "sweeps": {...}, "unmatched": {label: keys without a baseline record}, "bootstrap": {...}}
    """
    labels = label_order(records, run)
    subtasks = subtask_order(records)
    by_label = _by(records, lambda r: r.label)
    variants = {label: variant_info(by_label[label]) for label in labels}

    def metrics_for(label: str, subtask: str | None) -> dict:
        base_name = baseline_label(run, label)
        mine = by_label[label]
        base = by_label.get(base_name, [])
        if subtask is not None:
            mine = [r for r in mine if r.subtask == subtask]
            base = [r for r in base if r.subtask == subtask]
        m = group_metrics(mine, base, is_baseline=label == base_name, resamples=resamples, seed=seed)
        return {"label": label, "baseline": base_name, **m}

    overall = {label: metrics_for(label, None) for label in labels}
    per_subtask = {
        subtask: {
            label: metrics_for(label, subtask)
            for label in labels
            if any(r.subtask == subtask for r in by_label[label])
        }
        for subtask in subtasks
    }
    add_vs_best_plain(overall, by_label, None, resamples=resamples, seed=seed)
    for subtask, group in per_subtask.items():
        add_vs_best_plain(group, by_label, subtask, resamples=resamples, seed=seed)
    unmatched = {}
    for label in labels:
        base_name = baseline_label(run, label)
        if label == base_name:
            continue
        base_keys = {r.key for r in by_label.get(base_name, [])}
        missing = sorted({r.key for r in by_label[label]} - base_keys)
        if missing:
            unmatched[label] = [list(k) for k in missing]
    summary = {
        "schema": SCHEMA_VERSION,
        "run": asdict(run),
        "baseline": run.baseline,
        "labels": labels,
        "subtask_names": subtasks,
        "variants": variants,
        "overall": overall,
        "subtasks": per_subtask,
        "sweeps": sweeps(records, run, overall, variants, resamples=resamples, seed=seed),
        "engines": (
            None
            if run.extra.get("concurrency_baseline")
            else engine_summary(records, variants, lambda label: baseline_label(run, label))
        ),
        "concurrency": _concurrency(records, run),
        "unmatched": unmatched,
        "bootstrap": {"resamples": resamples, "seed": seed, "level": CI_LEVEL},
    }
    return json_safe(summary)
