"""Why each llama-server drafter wins or loses: its cost per round split into verification and
drafting, in plain steps, beside the tokens a round writes; and the settings chosen for it per subtask.

The server reports totals only (time, drafted and accepted tokens), so the split comes from the cost
curve of the same file (llama.cpp's passes, measured for our loop): a round that verifies d drafted
tokens costs one pass of 1 + d tokens, priced by the curve relative to its 1-token pass and scaled by
the server's own measured plain step. What remains of the measured round time is drafting (the
draft model's or the head's steps, the n-gram lookups) and the server's bookkeeping.

Speed-up over the plain server ≈ tokens per round ÷ round cost in plain steps."""

from __future__ import annotations

from collections.abc import Sequence

from draftlab.bench.labels import baseline_label
from draftlab.bench.records import Record, RunInfo
from draftlab.models.cost_curve import CostCurve

ENGINE = "llama-server"


def _decode_rounds(records: Sequence[Record]) -> int:
    # The prompt's pass writes each generation's first token(s); every later round is a decode round.
    return sum(max(r.rounds - r.first_tokens, 0) for r in records)


def server_section(records: Sequence[Record], run: RunInfo) -> dict | None:
    extra = run.extra.get("llama_server") or {}
    mine = [r for r in records if r.params.get("engine") == ENGINE]
    if not mine:
        return None
    by_label: dict[str, list[Record]] = {}
    for r in mine:
        by_label.setdefault(r.label, []).append(r)
    section: dict = {"settings": extra.get("settings") or {}, "rounds": {}}
    curve_data = extra.get("cost_curve")
    if not curve_data:
        return section
    curve = CostCurve(**curve_data)
    for label, rs in by_label.items():
        plain = by_label.get(baseline_label(run, label))  # at the same concurrency, in a sweep
        rounds = _decode_rounds(rs)
        steps = sum(r.new_tokens - r.first_tokens for r in plain or [])
        if not plain or rounds == 0 or steps == 0:
            continue
        plain_step_ms = 1000 * sum(r.decode_s for r in plain) / steps
        context = round(sum(r.prompt_tokens + r.new_tokens / 2 for r in rs) / len(rs))
        drafted = sum(r.drafted for r in rs) / rounds
        round_ms = 1000 * sum(r.decode_s for r in rs) / rounds
        verify_ms = plain_step_ms * curve.forward_ms(1 + drafted, context) / curve.forward_ms(1, context)
        section["rounds"][label] = {
            "rounds": rounds,
            "tokens_per_round": sum(r.new_tokens - r.first_tokens for r in rs) / rounds,
            "drafted_per_round": drafted,
            "plain_step_ms": plain_step_ms,
            "round_ms": round_ms,
            "verify_ms": verify_ms,
            "draft_ms": round_ms - verify_ms,
            "round_steps": round_ms / plain_step_ms,
            "verify_steps": verify_ms / plain_step_ms,
            "draft_steps": (round_ms - verify_ms) / plain_step_ms,
        }
    return section
