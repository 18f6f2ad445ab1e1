"""A run's labels: their order, the baseline each is compared with, and what distinguishes each."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from draftlab.bench.records import Record, RunInfo

# The engine of a record that names none, and of a label without "@engine": draftlab's own loop.
OWN_LOOP = "hf"


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
        "draft": unique_value(r.draft for r in records),
        "draft_params": unique_value(r.draft_params for r in records),
        "gamma": unique_value(r.gamma for r in records),
        "temperature": temperatures[0] if len(temperatures) == 1 else None,
        "temperatures": temperatures,
        "params": params,
    }


def unique_value(values: Iterable) -> object | None:
    """The one value all of `values` share, or None when they differ (or there are none)."""
    distinct = set(values)
    return distinct.pop() if len(distinct) == 1 else None


def group_by(records: Iterable, key: Callable[..., object]) -> dict:
    """key -> the items with that key, in their order."""
    out: dict = {}
    for r in records:
        out.setdefault(key(r), []).append(r)
    return out
