"""Reports rendered from a results folder: console tables, summary.json/.csv, report.md, per_example.csv, plots.

`render(directory, console)` is the only entry point: the live benchmark calls it when it ends and
`draftlab report DIR` calls it on saved results, so both print and write the same thing.
Every figure comes from `metrics.summarize`; this module only formats.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table

from draftlab.bench.metrics import decode_tokens, ratio, summarize
from draftlab.bench.plots import fmt_params, write_plots
from draftlab.bench.records import RESULTS_FILE, RUN_FILE, Record, RunInfo, read_records
from draftlab.decode.methods import REGISTRY
from draftlab.errors import DraftlabError
from draftlab.files import atomic_path, write_text

SUMMARY_JSON = "summary.json"
SUMMARY_CSV = "summary.csv"
REPORT_MD = "report.md"
PER_EXAMPLE_CSV = "per_example.csv"

# The names the seed reports used ("AS: ... tokens/sec, SPS: ...") for labels that are a bare method.
SEED_NAMES = {name: spec.seed_name for name, spec in REGISTRY.items()}

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
    "drafted",
    "accepted",
    "rollbacks",
    "acceptance_rate",
    "alpha_hat",
    "target_calls",
    "mean_accepted_length",
    "acceptance_per_position",
    "draft_step_ms",
    "target_step_ms",
    "cost_ratio",
    "predicted_speedup",
    "measured_over_predicted",
    "best_plain",
    "vs_best_ar",
    "vs_best_ar_ci_low",
    "vs_best_ar_ci_high",
    "k0_share",
    "mean_k",
    "probes",
    "cost_predicted_speedup",
    "nodes_per_round",
    "branch_win_share",
    "greedy_compared",
    "greedy_matches",
    "greedy_match_rate",
    "fallbacks",
    "draft_tokens_kept",
    "draft_share",
    "prefill_ms_mean",
    "prefill_ms_median",
    "time_per_token_ms",
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
)

DEFINITIONS = """\
- **tokens/s** = Σ new tokens / Σ generation seconds (prefill included) over the group; **decode tokens/s** =
  Σ (new tokens − tokens of the first round) / Σ decode seconds (the first round belongs to the prefill). Ratios of sums, never a
  mean of per-example rates; generations with 0 new tokens count (their time stays in the denominator).
- **speed-up** = (Σ tokens / Σ s of the method) / (Σ tokens / Σ s of the baseline) on the generations
  (example, turn, repeat) both have; **[95% CI]**: percentile bootstrap over those generations
  ({resamples} resamples, seed {seed}).
- **α** = Σ accepted / Σ drafted. **α̂** = Σ accepted / (Σ accepted + Σ rejections): the maximum-likelihood
  per-token acceptance probability under Leviathan et al.'s i.i.d. model (α is biased low as its estimate,
  since drafts after a rejection are never tried).
- **mean acc. len** = Σ new tokens / Σ verification rounds (one target pass each; the target's own token included; AR = 1).
- **c** = draft step time / target step time = (Σ propose s / Σ draft calls) / (baseline Σ decode s / Σ
  decode target calls); "-" without a draft model (prompt lookup).
- **predicted** = (1 − α̂^(γ+1)) / ((1 − α̂)(γc + 1)) (Leviathan et al. 2023; not for BiLD, whose blocks
  end dynamically); **meas/pred** = decode-only speed-up / predicted.
- "-" marks a figure that cannot be computed (no time measured, nothing drafted, no baseline).
"""


# ---------------------------------------------------------------- number formatting


def fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def fmt_rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if abs(value) >= 100 else f"{value:.2f}"


def fmt_speedup(m: dict, prefix: str = "", ci: bool = True) -> str:
    """ "1.44× [1.14, 1.68]"; "baseline" for the baseline itself; "-" when it cannot be computed."""
    value = m.get(f"{prefix}speedup")
    if value is None:
        return "-"
    if m.get("is_baseline"):
        return "baseline"
    text = f"{value:.2f}×"
    if ci:
        text += f" {fmt_ci(m, prefix)}" if fmt_ci(m, prefix) != "-" else ""
    return text


def fmt_vs_best(m: dict) -> str:
    """ "0.98× [0.95, 1.01]" over the fastest plain decoding of the group; "best" for that one itself."""
    value = m.get("vs_best_ar")
    if value is None:
        return "-"
    if m.get("best_plain") == m.get("label"):
        return "best"
    text = f"{value:.2f}×"
    low, high = m.get("vs_best_ar_ci_low"), m.get("vs_best_ar_ci_high")
    return text + (f" [{low:.2f}, {high:.2f}]" if low is not None and high is not None else "")


def fmt_ci(m: dict, prefix: str = "") -> str:
    low, high = m.get(f"{prefix}speedup_ci_low"), m.get(f"{prefix}speedup_ci_high")
    if low is None or high is None:
        return "-"
    return f"[{low:.2f}, {high:.2f}]"


def fmt_pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"


def fmt_greedy(m: dict) -> str:
    if not m.get("greedy_compared"):
        return "-"
    return f"{m['greedy_match_rate'] * 100:.0f}% ({m['greedy_matches']}/{m['greedy_compared']})"


def seed_name(label: str) -> str:
    return SEED_NAMES.get(label, label)


# ---------------------------------------------------------------- tables as data


class TableData:
    def __init__(self, title: str, headers: Sequence[str], rows: list[list[str]], note: str = "") -> None:
        self.title, self.headers, self.rows, self.note = title, list(headers), rows, note


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
    ]


def overall_table(summary: dict) -> TableData:
    rows = [[label, *_metric_cells(summary["overall"][label])] for label in summary["labels"]]
    return TableData("Overall", ["label", *METRIC_HEADERS], rows)


def subtask_table(summary: dict) -> TableData:
    rows = []
    for subtask in summary["subtask_names"]:
        for label, m in summary["subtasks"][subtask].items():
            rows.append([subtask, label, *_metric_cells(m)])
    return TableData("Per subtask", ["subtask", "label", *METRIC_HEADERS], rows)


def timing_table(summary: dict) -> TableData:
    headers = ["label", "new tokens", "total s", "prefill ms (mean)", "prefill ms (median)", "ms/token", "c"]
    headers += ["decode speed-up [95% CI]", "draft step ms", "target step ms"]
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
                fmt(m["target_step_ms"], 3),
            ]
        )
    return TableData("Timing", headers, rows)


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
                fmt(m["cost_predicted_speedup"]) + ("×" if m["cost_predicted_speedup"] is not None else ""),
                fmt_speedup(m, "decode_", ci=False),
                fmt_vs_best(m),
                " ".join(f"{d}:{n}" for d, n in (m.get("dtypes") or {}).items()),
            ]
        )
    if not rows:
        return None
    headers = ["label", "rounds", "k = 0", "mean k", "share of rounds by k", "probes"]
    headers += ["predicted (cost curve)", "decode speed-up", "vs best ar", "generations by dtype"]
    note = "k = 0 is a plain target step; predicted = Σ ms plain decoding would take for the expected tokens / Σ predicted ms"
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
        rows = []
        for r in sweeps["tree_budget"]:
            per_subtask = [summary["subtasks"][s].get(r["label"], {}).get("speedup") for s in names]
            rows.append(
                [
                    r["method"] or "-",
                    str(r["budget"]),
                    fmt(r["nodes_per_round"]),
                    fmt(r["mean_accepted_length"]),
                    fmt_pct(r["branch_win_share"]),
                    fmt_speedup(r),
                    *(fmt(x) + ("×" if x is not None else "") for x in per_subtask),
                ]
            )
        headers = ["method", "budget", "nodes / round", "mean acc. len", "non-first branch won", "speed-up"]
        tables.append(TableData("Sweep: tree node budget", headers + list(names), rows))
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
                "greedy_match": r.greedy_match,
            }
        )
    return rows


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


# ---------------------------------------------------------------- seed-style lines and notes


def _result_line(prefix: str, summary_group: dict, baseline: str, label: str) -> str | None:
    base, m = summary_group.get(baseline), summary_group.get(label)
    if base is None or m is None:
        return None
    text = (
        f"{prefix}{seed_name(baseline)}: {fmt(base['tokens_per_s'])} tokens/sec, "
        f"{seed_name(label)}: {fmt(m['tokens_per_s'])} tokens/sec -> "
    )
    if m["speedup"] is None:
        return text + "- X Speedup"
    text += f"{m['speedup']:.2f} X Speedup"
    if m["speedup_ci_low"] is not None:
        text += f" [95% CI {m['speedup_ci_low']:.2f}-{m['speedup_ci_high']:.2f}]"
    if m["matched_keys"] < max(m["n"], base["n"]):
        text += f" (on the {m['matched_keys']} generations both have)"
    return text


def result_lines(summary: dict, subtasks: bool = True) -> list[str]:
    lines = []
    others = [label for label in summary["labels"] if not summary["overall"][label]["is_baseline"]]
    for label in others:
        line = _result_line(
            "Overall Result: ", summary["overall"], summary["overall"][label]["baseline"], label
        )
        if line:
            lines.append(line)
    if subtasks:
        lines += ["", "Subtask Result: "]
        for subtask in summary["subtask_names"]:
            group = summary["subtasks"][subtask]
            for label in others:
                if label in group:
                    line = _result_line(f"Subtask: {subtask}, ", group, group[label]["baseline"], label)
                    if line:
                        lines.append(line)
    return lines


# A profile is called stale when rounds measured in the run take over 25% more or less than it
# predicts, over at least this many rounds (fewer are noise: one round is tens of ms).
PROFILE_FIT_BAND, PROFILE_FIT_ROUNDS = 0.25, 100


def warnings(summary: dict) -> list[str]:
    notes = []
    baselines = {m["baseline"] for m in summary["overall"].values()}
    for name in sorted(baselines):
        if name not in summary["overall"]:
            notes.append(f"baseline '{name}' has no records: no speed-ups against it")
    for label in summary["labels"]:
        m = summary["overall"][label]
        if m["zero_time_records"]:
            notes.append(
                f"{label}: {m['zero_time_records']} generation(s) report new tokens in zero measured time "
                "(a timing bug; check the results)"
            )
    stale = [
        f"{label} {m['profile_fit']:.2f}×"
        for label, m in summary["overall"].items()
        if (m.get("timed_rounds") or 0) >= PROFILE_FIT_ROUNDS
        and m.get("profile_fit")
        and abs(m["profile_fit"] - 1) > PROFILE_FIT_BAND
    ]
    if stale:
        notes.append(
            f"measured round times differ from the cached cost profile by over {PROFILE_FIT_BAND:.0%} "
            f"({', '.join(stale)} of its prediction, over {PROFILE_FIT_ROUNDS}+ rounds each): the profile "
            "may be from another load or software state; run `draftlab profile --refresh`"
        )
    by_count: dict[int, list[str]] = {}
    for label, keys in summary["unmatched"].items():
        by_count.setdefault(len(keys), []).append(label)
    for count, labels in by_count.items():
        notes.append(
            f"{', '.join(labels)}: {count} generation(s) {'each ' if len(labels) > 1 else ''}without a baseline "
            "record, left out of the speed-up"
        )
    return notes


# ---------------------------------------------------------------- writers


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(table: TableData) -> str:
    lines = [
        "| " + " | ".join(_md_cell(h) for h in table.headers) + " |",
        "|" + "|".join("---" for _ in table.headers) + "|",
    ]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in table.rows]
    return "\n".join(lines)


def rich_table(table: TableData) -> Table:
    out = Table(title=table.title, caption=table.note or None, box=box.SIMPLE_HEAD, padding=(0, 1))
    for i, header in enumerate(table.headers):
        out.add_column(
            header, justify="left" if i == 0 or header in ("label", "subtask", "method", "draft") else "right"
        )
    for row in table.rows:
        out.add_row(*row)
    return out


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


def run_lines(summary: dict) -> list[str]:
    run = summary["run"]
    lines = [
        f"target: {run['target']}",
        f"draft: {run['draft'] or '-'}",
        f"dtype: {run['dtype']} · device: {run['device']}",
        f"temperature: {run['temperature']} · max new tokens: {run['max_new_tokens']}",
        f"suite: {run['suite']} · baseline: {run['baseline']}",
        f"labels: {', '.join(summary['labels'])}",
        f"subtasks: {', '.join(summary['subtask_names'])}",
    ]
    extra = dict(run.get("extra") or {})
    hw = extra.pop("hardware", None)
    if hw:
        details = hw.get("isa_flags") if hw.get("kind") == "cpu" else [f"compute {hw.get('capability')}"]
        ident = f" ({hw['cpu_id']})" if hw.get("cpu_id") else ""
        lines.append(
            f"hardware: {hw.get('name')}{ident} · {', '.join(details or []) or 'no listed ISA flags'}"
        )
    choice = extra.pop("dtype_choice", None)
    if choice:
        lines.append(f"dtype chosen: {choice['dtype']}, because {choice['reason']}")
    for key, value in extra.items():
        lines.append(
            f"{key}: {json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else value}"
        )
    return lines


def markdown_report(summary: dict, tables: list[TableData], plots: list[Path]) -> str:
    boot = summary["bootstrap"]
    parts = ["# draftlab benchmark report", "", *(f"- {line}" for line in run_lines(summary)), ""]
    notes = warnings(summary)
    if notes:
        parts += ["## Warnings", "", *(f"- {n}" for n in notes), ""]
    parts += ["## Definitions", "", DEFINITIONS.format(resamples=boot["resamples"], seed=boot["seed"])]
    parts += ["## Summary (seed format)", "", "```", *result_lines(summary), "```", ""]
    for table in tables:
        parts += [f"## {table.title}", ""]
        if table.note:
            parts += [f"_{table.note}_", ""]
        parts += [markdown_table(table), ""]
    if plots:
        parts += ["## Plots", ""]
        parts += [f"![{p.stem}]({p.name})" for p in plots]
        parts.append("")
    return "\n".join(parts)


# ---------------------------------------------------------------- entry point


def load_results(directory: Path) -> tuple[RunInfo, list[Record]]:
    """run.json and results.jsonl of a results folder; a one-line DraftlabError if either is unusable."""
    if not directory.exists():
        raise DraftlabError(f"results folder '{directory}' does not exist")
    if not directory.is_dir():
        raise DraftlabError(f"'{directory}' is not a folder")
    try:
        run = RunInfo.load(directory)
    except (json.JSONDecodeError, TypeError) as exc:
        raise DraftlabError(f"{directory / RUN_FILE}: unreadable run info ({exc})") from None
    records = read_records(directory / RESULTS_FILE)
    if not records:
        raise DraftlabError(f"no results in '{directory}' ({RESULTS_FILE} is missing or empty)")
    return run, records


def render(directory: Path | str, console: Console | None = None, per_example: bool = False) -> dict:
    """Read results.jsonl + run.json in `directory`, write every report file there, print the tables.

    Writes summary.json, summary.csv, report.md, per_example.csv and the plots; prints the overall
    and per-subtask tables, the seed-style result lines, any sweep tables and (with `per_example`)
    one row per generation. Returns the summary dict (the content of summary.json).
    """
    directory = Path(directory)
    console = console if console is not None else Console()
    run, records = load_results(directory)
    summary = summarize(records, run)
    rows = per_example_rows(records)

    write_text(
        directory / SUMMARY_JSON, json.dumps(summary, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    )
    write_summary_csv(summary, directory / SUMMARY_CSV)
    write_per_example_csv(rows, directory / PER_EXAMPLE_CSV)
    plots = write_plots(summary, directory)

    main_tables = [overall_table(summary), subtask_table(summary)]
    extra_tables = [timing_table(summary)]
    for optional in (
        engine_table(summary),
        sizing_table(summary),
        tree_table(summary),
        acceptance_table(summary),
    ):
        if optional is not None:
            extra_tables.append(optional)
    sweeps = sweep_tables(summary)
    md_tables = [*main_tables, *extra_tables, *sweeps, per_example_table(rows)]
    write_text(directory / REPORT_MD, markdown_report(summary, md_tables, plots))

    console.print(f"[bold]draftlab report[/bold] · {directory}", highlight=False)
    for line in run_lines(summary):
        console.print(f"  {line}", markup=False, highlight=False)
    console.print(rich_table(main_tables[0]))
    for line in result_lines(summary, subtasks=False):
        console.print(line, markup=False, highlight=False)
    console.print(rich_table(main_tables[1]))
    for optional in (
        engine_table(summary),
        concurrency_table(summary),
        sizing_table(summary),
        tree_table(summary),
    ):
        if optional is not None:
            console.print(rich_table(optional))
    for line in concurrency_lines(summary):
        console.print(line, markup=False, highlight=False)
    for table in sweeps:
        console.print(rich_table(table))
    if per_example:
        console.print(rich_table(per_example_table(rows)))
    for note in warnings(summary):
        console.print(f"[yellow]warning:[/yellow] {note}", highlight=False)
    written = [SUMMARY_JSON, SUMMARY_CSV, REPORT_MD, PER_EXAMPLE_CSV, *(p.name for p in plots)]
    console.print(f"wrote {', '.join(written)} in {directory}", markup=False, highlight=False)
    return summary
