"""How cost-aware methods sized their rounds (k per round) and their token trees (nodes per round),
against what the cost curve predicted."""

from __future__ import annotations

from draftlab.bench.formatting import fmt, fmt_pct, fmt_speedup, fmt_vs_best
from draftlab.bench.table_data import TableData


def sizing_table(summary: dict) -> TableData | None:
    """How cost-aware methods sized their rounds, and whether the cost curve predicted the outcome."""
    rows = []
    for label in summary["labels"]:
        m = summary["overall"][label]
        if not m.get("k_counts"):
            continue
        total = sum(m["k_counts"])
        spread = " ".join(f"{k}:{n / total * 100:.0f}%" for k, n in enumerate(m["k_counts"]) if n)
        rows.append(
            [
                label,
                str(total),
                fmt_pct(m["k0_share"]),
                fmt(m["mean_k"]),
                spread,
                str(m["probes"]),
                fmt_pct(m.get("paced_share")),
                fmt(m["cost_predicted_speedup"]) + ("×" if m["cost_predicted_speedup"] is not None else ""),
                fmt_speedup(m, "decode_", ci=False),
                fmt_vs_best(m),
                " ".join(f"{d}:{n}" for d, n in (m.get("dtypes") or {}).items()),
            ]
        )
    if not rows:
        return None
    headers = ["label", "rounds", "k = 0", "mean k", "share of rounds by k", "probes", "paced"]
    headers += ["predicted (cost curve)", "decode speed-up", "vs best ar", "generations by dtype"]
    note = (
        "rounds: those sized; k = 0 is a plain target step; paced: share of all rounds that did not look"
        " for a free draft, since recent ones went unverified; predicted = Σ ms plain decoding would take"
        " for the expected tokens / Σ predicted ms"
    )
    return TableData("Round sizing (cost-aware)", headers, rows, note)


def tree_table(summary: dict) -> TableData | None:
    """Tree methods: how big their trees were, how often a branch other than the first won, and
    what the cost curve predicted against what was measured."""
    rows = []
    for label in summary["labels"]:
        m = summary["overall"][label]
        if not m.get("tree_rounds") and not m.get("tree_fallback"):
            continue
        used = m.get("earlier_outputs_used") or {}
        rows.append(
            [
                label,
                str(m["tree_rounds"]),
                fmt(m["nodes_per_round"]),
                fmt(m["mean_accepted_length"]),
                fmt_pct(m["branch_win_share"]),
                fmt(m["cost_predicted_speedup"]) + ("×" if m["cost_predicted_speedup"] is not None else ""),
                fmt_speedup(m, "decode_", ci=False),
                fmt_vs_best(m),
                (", ".join(sorted(used)) if used else "-") if m["method"] == "suffix" else "-",
                m.get("tree_fallback") or "-",
            ]
        )
    if not rows:
        return None
    headers = ["label", "tree rounds", "nodes / round", "mean acc. len", "non-first branch won"]
    headers += ["predicted (cost curve)", "decode speed-up", "vs best ar", "earlier outputs used", "fallback"]
    note = (
        "mean acc. len counts the target's own token; non-first branch won = share of tree rounds whose "
        "accepted path left the proposer's first choice"
    )
    return TableData("Token trees", headers, rows, note)
