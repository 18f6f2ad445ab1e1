"""The sweep and ablation tables, one per sweep the summary holds (bench/sweeps.py)."""

from __future__ import annotations

from draftlab.bench.formatting import fmt, fmt_params, fmt_pct, fmt_rate, fmt_speedup
from draftlab.bench.table_data import TableData


def sweep_tables(summary: dict) -> list[TableData]:
    sweeps = summary["sweeps"]
    tables = []
    if "draft_gamma" in sweeps:
        several_t = len({r["temperature"] for r in sweeps["draft_gamma"]}) > 1
        rows = [
            [
                (r["method"] or "-")
                + (f" T={r['temperature']:g}" if several_t and r["temperature"] is not None else ""),
                r["draft"] or "-",
                fmt_params(r["draft_params"]),
                str(r["gamma"]),
                fmt(r["acceptance_rate"], 3),
                fmt(r["alpha_hat"], 3),
                fmt(r["cost_ratio"], 3),
                fmt_speedup(r),
                fmt(r["predicted_speedup"]),
                fmt_rate(r["tokens_per_s"]),
                r["label"],
            ]
            for r in sweeps["draft_gamma"]
        ]
        headers = ["method", "draft", "# of draft params", "γ (n_lookahead)", "mean acceptance rate", "α̂"]
        headers += ["inference speed rate (c)", "speed-up [95% CI]", "predicted", "tokens/s", "label"]
        tables.append(TableData("Sweep: draft size × γ", headers, rows))
    if "tree_budget" in sweeps:
        names = summary["subtask_names"]
        rows, speedups = [], []
        for r in sweeps["tree_budget"]:
            groups = [summary["subtasks"][s].get(r["label"], {}) for s in names]
            per_subtask = [m.get("speedup") for m in groups]
            speedups.append(per_subtask)
            rows.append(
                [
                    r["method"] or "-",
                    str(r["budget"]),
                    fmt(r["nodes_per_round"]),
                    fmt(r["mean_accepted_length"]),
                    fmt_pct(r["branch_win_share"]),
                    fmt_speedup(r),
                    *(fmt_speedup(m, ci=False) for m in groups),
                ]
            )
        headers = ["method", "budget", "nodes / round", "mean acc. len", "non-first branch won", "speed-up"]
        bold = set()
        for j in range(len(names)):  # the fastest budget of each subtask
            column = [(row[j], i) for i, row in enumerate(speedups) if row[j] is not None]
            if column:
                bold.add((max(column, key=lambda pair: pair[0])[1], len(headers) + j))
        note = "bold: the fastest budget of each subtask"
        tables.append(TableData("Sweep: tree node budget", headers + list(names), rows, note, bold))
    for grid in sweeps.get("bild", []):
        cells = {(c["fallback"], c["rollback"]): c for c in grid["cells"]}
        rows = []
        for fb in grid["fallback"]:
            row = [str(fb)]
            for rb in grid["rollback"]:
                c = cells.get((fb, rb))
                row.append("-" if c is None else f"{fmt(c['speedup'])}× (α {fmt(c['acceptance_rate'], 2)})")
            rows.append(row)
        headers = ["fallback \\ rollback", *(str(rb) for rb in grid["rollback"])]
        title = "BiLD: speed-up (α) by fallback × rollback threshold" + (
            f" · draft {grid['draft']}" if grid["draft"] else ""
        )
        tables.append(TableData(title, headers, rows))
    if "temperature" in sweeps:
        rows = [
            [
                r["label"],
                fmt(r["temperature"], 2),
                str(r["n"]),
                fmt_rate(r["tokens_per_s"]),
                fmt_speedup(r),
                fmt(r["acceptance_rate"], 3),
                fmt(r["alpha_hat"], 3),
                fmt(r["mean_accepted_length"]),
                fmt_pct(r["greedy_match_rate"]),
            ]
            for r in sweeps["temperature"]
        ]
        headers = [
            "label",
            "temperature",
            "n",
            "tokens/s",
            "speed-up [95% CI]",
            "α",
            "α̂",
            "mean acc. len",
            "greedy match",
        ]
        note = (
            "speed-ups against the baseline's records at the same temperature (all of them where it has none)"
        )
        tables.append(TableData("Temperature", headers, rows, note))
    if "ablation" in sweeps:
        rows = [
            [
                "✓" if r["speculative"] else "✗",
                "✓" if r["use_cache"] else "✗",
                r["attn_implementation"],
                r["label"],
                fmt_rate(r["tokens_per_s"]),
                _vs_plain(r) if r["label"] != r["plain"] else "1.00× (plain)",
                fmt_speedup(r),
            ]
            for r in sweeps["ablation"]
        ]
        headers = ["speculative", "KV cache", "attention", "label", "tokens/s", "speed-up vs plain [95% CI]"]
        headers.append("speed-up vs baseline")
        plain = sweeps["ablation"][0]["plain"]
        tables.append(TableData("Ablation", headers, rows, f"plain baseline: {plain}"))
    return tables


def _vs_plain(r: dict) -> str:
    value = r.get("speedup_vs_plain")
    if value is None:
        return "-"
    low, high = r.get("speedup_vs_plain_ci_low"), r.get("speedup_vs_plain_ci_high")
    return f"{value:.2f}×" + (f" [{low:.2f}, {high:.2f}]" if low is not None and high is not None else "")
