"""Where a decode round's time goes, in our loop: the target's pass itself, making its inputs,
drafting, acceptance with the caches' bookkeeping, and the rest (sizing, statistics, Python). Speculation pays on a CPU only when a
round costs about one pass, so what is not the pass is what to cut (decode/loop.py records it)."""

from __future__ import annotations

from collections.abc import Sequence

from draftlab.bench.formatting import fmt, fmt_pct
from draftlab.bench.rates import ratio
from draftlab.bench.records import Record
from draftlab.bench.table_data import TableData

PARTS = ("pass", "inputs", "draft", "accept", "rest")


def round_split(records: Sequence[Record]) -> dict:
    """Mean ms per decode round for each part, and the overhead's share of a round (the pass's
    inputs, acceptance, bookkeeping and the rest: all but the pass and drafting). None where no round was split (other
    engines, or records from before the split was recorded)."""
    split = [r for r in records if r.pass_s > 0 and r.rounds > 1]
    rounds = sum(r.rounds - 1 for r in split)
    decode_s = sum(r.decode_s for r in split)
    parts = {
        "pass": sum(r.pass_s for r in split),
        "inputs": sum(r.inputs_s for r in split),
        "draft": sum(r.draft_s for r in split),
        "accept": sum(r.accept_s for r in split),
    }
    parts["rest"] = max(decode_s - sum(parts.values()), 0.0)
    out = {f"round_{name}_ms": _ms(ratio(parts[name], rounds)) for name in PARTS}
    out["round_ms"] = _ms(ratio(decode_s, rounds))
    out["round_overhead_share"] = ratio(parts["inputs"] + parts["accept"] + parts["rest"], decode_s)
    return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def round_split_table(summary: dict) -> TableData | None:
    rows = []
    for label in summary["labels"]:
        m = summary["overall"][label]
        if m.get("round_ms") is None:
            continue
        cells = [fmt(m[f"round_{name}_ms"], 2) for name in PARTS]
        rows.append([label, fmt(m["round_ms"], 2), *cells, fmt_pct(m["round_overhead_share"])])
    if not rows:
        return None
    headers = ["label", "ms/round", "target pass", "pass inputs", "drafting", "acceptance + caches", "rest"]
    headers.append("overhead")
    note = (
        "decode rounds of our loop (after the first), mean ms each; target pass: the model's own forward (a "
        "compiled package's runner; another engine's whole call), the device synchronized; pass inputs: "
        "making its tensors, masks and padding, reading its rows; acceptance + caches: the rule, keeping the "
        "accepted path, crop and rollback; rest: sizing, statistics and Python; overhead: all but the pass "
        "and drafting, as a share of a round"
    )
    return TableData("Where a decode round's time goes", headers, rows, note)
