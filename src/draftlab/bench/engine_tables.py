"""Engines side by side (each method on each engine) and the concurrency sweep, with the lines that
say up to which concurrency a method beats the baseline."""

from __future__ import annotations

from draftlab.bench.formatting import fmt, fmt_greedy, fmt_rate, fmt_speedup, fmt_vs_best
from draftlab.bench.table_data import TableData


def engine_table(summary: dict) -> TableData | None:
    """Method × engine: each method's figures on each engine, speed-ups over that engine's own ar."""
    engines = summary.get("engines")
    if not engines:
        return None
    names = engines["engines"]
    headers = ["method"]
    for engine in names:
        headers += [f"{engine} tok/s", f"{engine} speed-up [95% CI]", f"{engine} α", f"{engine} acc. len"]
        headers += [f"{engine} vs best ar", f"{engine} greedy match"]
    rows = []
    for method, labels in engines["methods"].items():
        row = [method]
        for engine in names:
            m = summary["overall"].get(labels.get(engine, ""))
            if m is None:
                row += ["-"] * 6
                continue
            row += [
                fmt_rate(m["tokens_per_s"]),
                fmt_speedup(m),
                fmt(m["acceptance_rate"], 3),
                fmt(m["mean_accepted_length"]),
                fmt_vs_best(m),
                fmt_greedy(m),
            ]
        rows.append(row)
    notes = [
        "speed-up: over ar on the same engine; vs best ar: over the fastest plain decoding of any engine"
    ]
    for engine, match in engines["ar_match"].items():
        notes.append(
            f"ar on {engine} wrote the hf engine's ar tokens in {match['matched']}/{match['compared']} "
            "generations (information: kernels differ)"
        )
    return TableData("Engines", headers, rows, "; ".join(notes))


def concurrency_table(summary: dict) -> TableData | None:
    data = summary.get("concurrency")
    if not data:
        return None
    rows = []
    for label, levels in data["levels"].items():
        for level, m in levels.items():
            matched, compared = m["greedy_match"]
            rows.append(
                [
                    label,
                    str(level),
                    str(m["n"]),
                    fmt_rate(m["tokens_per_s"]),
                    fmt(m["tpot_ms_median"], 1),
                    fmt(m["tpot_ms_p90"], 1),
                    fmt(m["acceptance_rate"], 3),
                    fmt(m["mean_accepted_length"]),
                    "baseline"
                    if label == data["baseline"]
                    else fmt(m["speedup"]) + ("×" if m["speedup"] else ""),
                    fmt(m.get("predicted_speedup")) + ("×" if m.get("predicted_speedup") else ""),
                    f"{matched}/{compared}" if compared else "-",
                ]
            )
    headers = ["method", "concurrency", "requests", "output tok/s", "TPOT ms (median)", "TPOT ms (p90)"]
    headers += ["α", "mean acc. len", f"speed-up over {data['baseline']}", "predicted (hf cost curve)"]
    headers += ["greedy match"]
    return TableData("Concurrency", headers, rows, "; ".join(concurrency_lines(summary)))


def concurrency_lines(summary: dict) -> list[str]:
    """Per method: up to which concurrency it beats the baseline, and where it stops paying."""
    data = summary.get("concurrency") or {}
    base, lines = data.get("baseline"), []
    for label, pays in (data.get("pays") or {}).items():
        up_to, stops = pays["beats_up_to"], pays["stops_at"]
        if stops is None:
            lines.append(f"{label} beats {base} at every concurrency measured")
        elif up_to is None:
            lines.append(f"{label} does not beat {base} even at concurrency {stops}")
        else:
            lines.append(f"{label} beats {base} up to concurrency {up_to} and stops paying at {stops}")
    return lines
