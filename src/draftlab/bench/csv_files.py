"""summary.csv (every figure of every group) and per_example.csv (one row per generation)."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

from draftlab.bench.rates import decode_tokens, ratio
from draftlab.bench.records import Record
from draftlab.files import atomic_path

CSV_FIELDS = (
    "method",
    "baseline",
    "is_baseline",
    "gamma",
    "n",
    "examples",
    "new_tokens",
    "total_s",
    "tokens_per_s",
    "decode_tokens",
    "decode_s",
    "decode_tokens_per_s",
    "matched_keys",
    "speedup",
    "speedup_ci_low",
    "speedup_ci_high",
    "decode_speedup",
    "decode_speedup_ci_low",
    "decode_speedup_ci_high",
    "measured_speedup",
    "length_gap",
    "projected_keys",
    "drafted",
    "accepted",
    "rollbacks",
    "acceptance_rate",
    "alpha_hat",
    "target_calls",
    "mean_accepted_length",
    "acceptance_per_position",
    "draft_step_ms",
    "catch_up_ms",
    "target_step_ms",
    "cost_ratio",
    "predicted_speedup",
    "measured_over_predicted",
    "best_plain",
    "vs_best_ar",
    "vs_best_ar_ci_low",
    "vs_best_ar_ci_high",
    "vs_best_ar_length_gap",
    "k0_share",
    "mean_k",
    "probes",
    "cost_predicted_speedup",
    "nodes_per_round",
    "branch_win_share",
    "greedy_compared",
    "greedy_matches",
    "greedy_match_rate",
    "baseline_compared",
    "baseline_matches",
    "baseline_match_rate",
    "fallbacks",
    "draft_tokens_kept",
    "draft_share",
    "prefill_ms_mean",
    "prefill_ms_median",
    "time_per_token_ms",
    "round_ms",
    "round_pass_ms",
    "round_inputs_ms",
    "round_draft_ms",
    "round_accept_ms",
    "round_rest_ms",
    "round_overhead_share",
    "zero_time_records",
)

PER_EXAMPLE_FIELDS = (
    "example_id",
    "subtask",
    "turn",
    "repeat",
    "label",
    "method",
    "temperature",
    "gamma",
    "prompt_tokens",
    "new_tokens",
    "total_s",
    "prefill_ms",
    "decode_s",
    "time_per_token_ms",
    "tokens_per_s",
    "target_calls",
    "drafted",
    "accepted",
    "acceptance_rate",
    "greedy_match",
    "baseline_match",
)


def per_example_rows(records: Sequence[Record]) -> list[dict]:
    rows = []
    for r in records:
        per_token = ratio(r.decode_s, decode_tokens(r))
        rows.append(
            {
                "example_id": r.example_id,
                "subtask": r.subtask,
                "turn": r.turn,
                "repeat": r.repeat,
                "label": r.label,
                "method": r.method,
                "temperature": r.temperature,
                "gamma": r.gamma,
                "prompt_tokens": r.prompt_tokens,
                "new_tokens": r.new_tokens,
                "total_s": r.total_s,
                "prefill_ms": r.prefill_s * 1000,
                "decode_s": r.decode_s,
                "time_per_token_ms": per_token * 1000 if per_token is not None else None,
                "tokens_per_s": ratio(r.new_tokens, r.total_s),
                "target_calls": r.target_calls,
                "drafted": r.drafted,
                "accepted": r.accepted,
                "acceptance_rate": ratio(r.accepted, r.drafted),
                "greedy_match": r.plain_match,
                "baseline_match": r.greedy_match,
            }
        )
    return rows


def _csv_value(value: object) -> object:
    if value is None:
        return ""
    if isinstance(value, list):
        return ";".join("" if v is None else f"{v:.6g}" if isinstance(v, float) else str(v) for v in value)
    return value


def write_summary_csv(summary: dict, path: Path) -> None:
    with atomic_path(path) as tmp, tmp.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["subtask", "label", *CSV_FIELDS])
        groups = [("overall", summary["overall"])] + [
            (s, summary["subtasks"][s]) for s in summary["subtask_names"]
        ]
        for subtask, group in groups:
            for label, m in group.items():
                writer.writerow([subtask, label, *(_csv_value(m.get(name)) for name in CSV_FIELDS)])


def write_per_example_csv(rows: list[dict], path: Path) -> None:
    with atomic_path(path) as tmp, tmp.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=PER_EXAMPLE_FIELDS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _csv_value(v) for k, v in row.items()})
