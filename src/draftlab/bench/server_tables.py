"""llama-server's tables: each drafter's round cost split into verification and drafting, and the
settings chosen for it per subtask (bench/server_summary.py holds the figures)."""

from __future__ import annotations

from draftlab.bench.formatting import fmt
from draftlab.bench.table_data import TableData


def server_rounds_table(summary: dict) -> TableData | None:
    section = summary.get("llama_server") or {}
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
    settings = (summary.get("llama_server") or {}).get("settings")
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
