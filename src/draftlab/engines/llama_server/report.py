"""llama-server's section of a run's summary and report (bench/sections.py): why each drafter wins or loses: its cost per round split into verification and
drafting, in plain steps, beside the tokens a round writes; and the settings chosen for it per subtask.

The server reports totals only (time, drafted and accepted tokens), so the split comes from the cost
curve of the same file (llama.cpp's passes, measured for our loop): a round that verifies d drafted
tokens costs one pass of 1 + d tokens, priced by the curve relative to its 1-token pass and scaled by
the server's own measured plain step. What remains of the measured round time is drafting (the
draft model's or the head's steps, the n-gram lookups) and the server's bookkeeping.

Speed-up over the plain server ≈ tokens per round ÷ round cost in plain steps."""

from __future__ import annotations

from collections.abc import Sequence

from draftlab.bench.formatting import fmt
from draftlab.bench.labels import baseline_label
from draftlab.bench.records import Record, RunInfo
from draftlab.bench.sections import EngineSection, register_section
from draftlab.bench.table_data import TableData
from draftlab.engines.llama_server.methods import NAME
from draftlab.models.cost_curve import CostCurve

KEY = "llama_server"  # its section in summary.json, and its record in run.json's extra


def _decode_rounds(records: Sequence[Record]) -> int:
    # The prompt's pass writes each generation's first token(s); every later round is a decode round.
    return sum(max(r.rounds - r.first_tokens, 0) for r in records)


def server_section(records: Sequence[Record], run: RunInfo) -> dict | None:
    extra = run.extra.get(KEY) or {}
    mine = [r for r in records if r.params.get("engine") == NAME]
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


def server_rounds_table(summary: dict) -> TableData | None:
    section = summary.get(KEY) or {}
    rounds = section.get("rounds")
    if not rounds:
        return None
    headers = ["method", "rounds", "tokens/round", "drafted/round", "plain step ms", "round ms"]
    headers += ["verify ms", "draft ms"]
    headers += ["round (plain steps)", "verify (steps)", "draft (steps)"]
    rows = [
        [
            label,
            str(m["rounds"]),
            fmt(m["tokens_per_round"]),
            fmt(m["drafted_per_round"]),
            fmt(m["plain_step_ms"]),
            fmt(m["round_ms"]),
            fmt(m["verify_ms"]),
            fmt(m["draft_ms"]),
            fmt(m["round_steps"]),
            fmt(m["verify_steps"]),
            fmt(m["draft_steps"]),
        ]
        for label, m in rounds.items()
    ]
    note = (
        "decode rounds only; plain step: its ar's decode time per token; "
        "verify: the cost curve's pass of 1 + drafted tokens over its 1-token pass, times the plain step; "
        "draft: the rest of the round (drafting and the server's bookkeeping); "
        "speed-up ≈ tokens/round ÷ round (plain steps)"
    )
    return TableData("llama-server: cost per round", headers, rows, note)


def server_settings_table(summary: dict) -> TableData | None:
    """Per drafter and subtask: the setting chosen (with its calibration gain over the plain server),
    or off where no setting paid."""
    settings = (summary.get(KEY) or {}).get("settings")
    if not settings:
        return None
    subtasks = list(dict.fromkeys(s for data in settings.values() for s in data["chosen"]))
    rows = []
    for method, data in settings.items():
        cells = [
            _cell(
                data["plain_tok_s"].get(s),
                [r.get(s, 0.0) for r in data["tok_s_by_setting"].values()],
                data["chosen"].get(s),
            )
            for s in subtasks
        ]
        pooled = data["pooled"]
        cells.append(
            _cell(pooled["plain_tok_s"], list(pooled["tok_s_by_setting"].values()), pooled["chosen"])
        )
        rows.append([method, *cells])
    headers = ["method", *subtasks, "other subtasks (pooled)"]
    note = (
        "each drafter's length setting chosen per subtask on calibration prompts the run does not "
        "measure (run.json names them); in brackets the best candidate's speed over the plain server "
        "there; off: no candidate beat it by 3%, so that subtask decodes plainly"
    )
    return TableData("llama-server: settings chosen by cost", headers, rows, note)


def _cell(plain: float | None, rates: list[float], setting: str | None) -> str:
    gain = f"{max(rates, default=0.0) / plain:.2f}×" if plain else "-"
    return f"{setting} ({gain})" if setting is not None else f"off (best {gain})"


register_section(
    EngineSection(
        KEY, server_section, lambda summary: [server_settings_table(summary), server_rounds_table(summary)]
    )
)
