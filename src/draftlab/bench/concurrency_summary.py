"""Figures of a concurrency sweep (bench/concurrency.py): per method and level, rates, time per
output token, acceptance and speed-up over the baseline at that level, with what the cost curves predict."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import numpy as np

from draftlab.bench.records import Record, RunInfo
from draftlab.models.cost_curve import CostCurve

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


def concurrency_section(records: Sequence[Record], run: RunInfo) -> dict | None:
    """The summary's concurrency section: None unless the run is a concurrency sweep."""
    if not run.extra.get("concurrency_baseline"):
        return None
    out = level_summary(records, run.extra["concurrency_baseline"])
    curves = run.extra.get("cost_curves")
    if curves:
        drafts = {label: bool(curves.get("draft_labels", {}).get(label)) for label in out["levels"]}
        predicted_concurrency_speedup(out, curves["target"], curves.get("draft"), curves["context"], drafts)
    return out
