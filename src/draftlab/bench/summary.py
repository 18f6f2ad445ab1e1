"""The JSON-able summary every report is rendered from: each label's figures overall and per subtask,
each against the fastest plain decoding too, with the sweeps, engines and concurrency sections."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict

from draftlab.bench.concurrency_summary import concurrency_section
from draftlab.bench.engine_summary import engine_summary
from draftlab.bench.group_metrics import group_metrics
from draftlab.bench.labels import baseline_label, group_by, label_order, subtask_order, variant_info
from draftlab.bench.losslessness import same_config_plain, with_plain_matches
from draftlab.bench.rates import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, CI_LEVEL, speedup
from draftlab.bench.records import Record, RunInfo
from draftlab.bench.sections import section_summaries
from draftlab.bench.sweeps import sweeps
from draftlab.decode.spec import is_speculative

SCHEMA_VERSION = 1


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
    """ "vs best ar": every label's speed-up over the fastest plain decoding in the group (any dtype,
    any engine), fastest over equal work.

    The baseline of a speed-up is one `ar`; a method that beats a slow `ar` (say bfloat16 on a CPU
    that emulates it) but loses to a fast one (float32 there) must show it.
    """
    plain = [
        label
        for label, m in group.items()
        if not is_speculative(m.get("method")) and m.get("tokens_per_s") is not None
    ]
    for m in group.values():
        m.update(
            best_plain=None,
            vs_best_ar=None,
            vs_best_ar_ci_low=None,
            vs_best_ar_ci_high=None,
            vs_best_ar_length_gap=None,
        )
    if not plain:
        return

    def rows(label: str) -> list[Record]:
        return [r for r in by_label[label] if subtask is None or r.subtask == subtask]

    # The fastest over the same work: engines and dtypes write answers of other lengths, and a longer
    # one spreads its prefill over more tokens, so raw tokens/s would favour whichever talked longest.
    # Each candidate against one of them, projected to that one's token counts (bench/rates.py).
    reference = rows(max(plain, key=lambda label: group[label]["tokens_per_s"]))

    def over_equal_work(label: str) -> tuple[bool, float, float]:
        ratio = speedup(rows(label), reference, resamples=0)["speedup"]
        return ratio is not None, ratio or 0.0, group[label]["tokens_per_s"]

    best = max(plain, key=over_equal_work)
    base = rows(best)
    for label, m in group.items():
        s = speedup(rows(label), base, resamples=0 if label == best else resamples, seed=seed)
        m.update(
            best_plain=best,
            vs_best_ar=s["speedup"],
            vs_best_ar_ci_low=s["speedup_ci_low"],
            vs_best_ar_ci_high=s["speedup_ci_high"],
            vs_best_ar_length_gap=0.0 if label == best else s["length_gap"],
        )


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
    records = with_plain_matches(records)
    labels = label_order(records, run)
    subtasks = subtask_order(records)
    by_label = group_by(records, lambda r: r.label)
    variants = {label: variant_info(by_label[label]) for label in labels}

    def metrics_for(label: str, subtask: str | None) -> dict:
        base_name = baseline_label(run, label)
        mine = by_label[label]
        base = by_label.get(base_name, [])
        if subtask is not None:
            mine = [r for r in mine if r.subtask == subtask]
            base = [r for r in base if r.subtask == subtask]
        m = group_metrics(
            mine,
            base,
            is_baseline=label == base_name,
            resamples=resamples,
            seed=seed,
            plain_records=same_config_plain(mine, records),
        )
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
        "concurrency": concurrency_section(records, run),
        **section_summaries(records, run),  # each engine's own (bench/sections.py)
        "unmatched": unmatched,
        "bootstrap": {"resamples": resamples, "seed": seed, "level": CI_LEVEL},
    }
    return json_safe(summary)
