"""The tables every report has: each label's figures overall and per subtask, timing, acceptance
by draft position, and one row per generation."""

from __future__ import annotations

from collections.abc import Iterable

from draftlab.bench.formatting import (
    UNEQUAL,
    fmt,
    fmt_ci,
    fmt_greedy,
    fmt_pct,
    fmt_rate,
    fmt_speedup,
    fmt_vs_best,
    unequal,
)
from draftlab.bench.table_data import TableData

METRIC_HEADERS = (
    "n",
    "tokens/s",
    "decode tok/s",
    "speed-up",
    "95% CI",
    "vs best ar",
    "α",
    "α̂",
    "mean acc. len",
    "c",
    "predicted",
    "meas/pred",
    "greedy match",
    "same as baseline",
)


def _metric_cells(m: dict) -> list[str]:
    return [
        str(m["n"]),
        fmt_rate(m["tokens_per_s"]),
        fmt_rate(m["decode_tokens_per_s"]),
        fmt_speedup(m, ci=False),
        fmt_ci(m),
        fmt_vs_best(m),
        fmt(m["acceptance_rate"], 3),
        fmt(m["alpha_hat"], 3),
        fmt(m["mean_accepted_length"]),
        fmt(m["cost_ratio"], 3),
        fmt(m["predicted_speedup"]) + ("×" if m["predicted_speedup"] is not None else ""),
        fmt(m["measured_over_predicted"]),
        fmt_greedy(m),
        fmt_greedy(m, "baseline"),
    ]


def overall_table(summary: dict) -> TableData:
    rows = [[label, *_metric_cells(summary["overall"][label])] for label in summary["labels"]]
    return TableData("Overall", ["label", *METRIC_HEADERS], rows)


def best_label(group: dict[str, dict], labels: Iterable[str] | None = None) -> str | None:
    """The label of `group` (of `labels` only, if given) that decoded fastest: the highest speed-up over
    the fastest plain decoding ("vs best ar", on the generations both have), else the highest tokens/s."""
    names = [label for label in (group if labels is None else labels) if label in group]
    for key in ("vs_best_ar", "tokens_per_s"):
        scored = [label for label in names if group[label].get(key) is not None]
        if scored:
            return max(scored, key=lambda label: group[label][key])
    return None


def subtask_table(summary: dict) -> TableData:
    """Every label's figures in each subtask; the best label of each subtask in bold."""
    headers = ["subtask", "label", *METRIC_HEADERS]
    highlight = [headers.index(h) for h in ("label", "tokens/s", "vs best ar")]
    rows, bold = [], set()
    for subtask in summary["subtask_names"]:
        group = summary["subtasks"][subtask]
        best = best_label(group)
        for label, m in group.items():
            if label == best:
                bold |= {(len(rows), column) for column in highlight}
            rows.append([subtask, label, *_metric_cells(m)])
    return TableData("Per subtask", headers, rows, bold=bold)


def subtask_grid(summary: dict) -> TableData:
    """Labels × subtasks: each label's speed-up over the fastest plain decoding of each subtask, the
    best of each column in bold."""
    columns = [("overall", summary["overall"])]
    columns += [(s, summary["subtasks"][s]) for s in summary["subtask_names"]]
    rows = []
    for label in summary["labels"]:
        cells = [group.get(label) for _, group in columns]
        rows.append([label, *("-" if m is None else _vs_best_ar(m) for m in cells)])
    bold = set()
    for column, (_, group) in enumerate(columns, start=1):
        best = best_label(group)
        if best is not None:
            bold.add((summary["labels"].index(best), column))
    note = "speed-up over the fastest plain decoding of each column (vs best ar); bold: the fastest there"
    return TableData("Per subtask at a glance", ["label", *(name for name, _ in columns)], rows, note, bold)


def _vs_best_ar(m: dict) -> str:
    value = m.get("vs_best_ar")
    if value is None:
        return "-"
    return f"{value:.2f}×" + (UNEQUAL if unequal(m, "vs_best_ar_length_gap") else "")


def timing_table(summary: dict) -> TableData:
    headers = ["label", "new tokens", "total s", "prefill ms (mean)", "prefill ms (median)", "ms/token", "c"]
    headers += ["decode speed-up [95% CI]", "draft step ms", "draft catch-up ms", "target step ms"]
    rows = []
    for label in summary["labels"]:
        m = summary["overall"][label]
        rows.append(
            [
                label,
                str(m["new_tokens"]),
                fmt(m["total_s"], 3),
                fmt(m["prefill_ms_mean"], 1),
                fmt(m["prefill_ms_median"], 1),
                fmt(m["time_per_token_ms"], 2),
                fmt(m["cost_ratio"], 3),
                fmt_speedup(m, "decode_"),
                fmt(m["draft_step_ms"], 3),
                fmt(m.get("catch_up_ms"), 1),
                fmt(m["target_step_ms"], 3),
            ]
        )
    return TableData("Timing", headers, rows)


def acceptance_table(summary: dict) -> TableData | None:
    rows = []
    for label in summary["labels"]:
        m = summary["overall"][label]
        if not m["drafted"]:
            continue
        positions = " ".join(fmt(v, 2) for v in m["acceptance_per_position"])
        rows.append(
            [
                label,
                str(m["drafted"]),
                str(m["accepted"]),
                str(m["rollbacks"]),
                str(m["fallbacks"]),
                fmt_pct(m["draft_share"]),
                positions,
            ]
        )
    if not rows:
        return None
    headers = [
        "label",
        "drafted",
        "accepted",
        "rejections",
        "fallbacks",
        "draft share",
        "α by position 1, 2, ...",
    ]
    return TableData("Acceptance", headers, rows)


def per_example_table(rows: list[dict]) -> TableData:
    headers = [
        "Example#",
        "turn",
        "label",
        "Prompt Length (tokens)",
        "New Tokens Generated",
        "Total Time (s)",
    ]
    headers += ["Prefill Phase (ms)", "Time/Token (ms)", "Tokens/Sec"]
    body = [
        [
            r["example_id"],
            str(r["turn"]),
            r["label"],
            str(r["prompt_tokens"]),
            str(r["new_tokens"]),
            fmt(r["total_s"], 4),
            fmt(r["prefill_ms"], 1),
            fmt(r["time_per_token_ms"], 2),
            fmt(r["tokens_per_s"], 2),
        ]
        for r in rows
    ]
    return TableData("Per example", headers, body)
