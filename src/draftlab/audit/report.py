"""What `draftlab audit` prints: the settings, one row per method, the power check and the time."""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table

from draftlab.audit.checks import RECHECKS, RERUN_ROUNDING, WRONG_RULE


def _p(value: float) -> str:
    return f"{value:.2g}" if value < 0.01 else f"{value:.2f}"


def print_report(console: Console, result: dict, audits, power, prefixes) -> None:
    s = result["settings"]
    dtype = result["dtype"]["target"] + (
        f"/{result['dtype']['draft']}"
        if result["draft"] and result["dtype"]["draft"] != result["dtype"]["target"]
        else ""
    )
    hw = result["hardware"]
    console.print(
        f"[bold]draftlab audit[/]: target {result['target']} · draft {result['draft'] or '-'} · {dtype} on "
        f"{hw.get('name') or hw['kind']} ({result['device']['target']})",
        highlight=False,
    )
    lines = [
        f"greedy: {len(s['prompts'])} prompts × {s['max_new_tokens']} new tokens, each method against ar",
    ]
    if prefixes:
        sp = s["sampling"]
        lines.append(
            f"sampling: {len(prefixes)} prefix{'es' if len(prefixes) > 1 else ''} × {s['samples']} samples of the first 2 tokens at temperature "
            f"{sp['temperature']:g}"
            + (f", top-k {sp['top_k']}" if sp["top_k"] else "")
            + (f", top-p {sp['top_p']:g}" if sp["top_p"] < 1 else "")
            + " (every round drafts its full k, so that the acceptance rule is exercised)"
            + f"; chi-square against the target's exact law, α = {s['alpha']:g} "
            f"({_p(s['alpha_per_test'])} per test, Bonferroni)"
        )
    for text in lines:
        console.print(text, highlight=False)
    table = Table(show_lines=False)
    for col in (
        "method",
        "greedy identical",
        "first divergence",
        "exact mode",
        f"{dict(RECHECKS).get(result['recheck'], 'float32')} recheck",
        "sampling p",
        "α",
        "result",
    ):
        table.add_column(col, justify="left" if col in ("method", "first divergence", "result") else "right")
    for a in audits:
        first = a.divergences[0] if a.divergences else None
        where = (
            f"prompt {first['prompt']}, token {first['position']}: {first['ar_text']!r} (ar) vs "
            f"{first['method_text']!r}"
            + (f", gap {first['logit_gap']:.3g}" if first["logit_gap"] is not None else "")
            if first
            else "-"
        )
        rechecks = [d[key] for d in a.divergences for key, _ in RECHECKS if d.get(key)]
        kept = sum(r in RERUN_ROUNDING for r in rechecks)
        recheck = f"{kept}/{len(rechecks)} match" if rechecks else "-"
        ps = ", ".join(
            _p(x["p_value"])
            + "".join(
                f" ({name} {_p(x[f'{key}_p_value'])})" for key, name in RECHECKS if f"{key}_p_value" in x
            )
            for x in a.sampling
        )
        drafted = sum(x["drafted"] for x in a.sampling)
        accepted = sum(x["accepted"] for x in a.sampling)
        style = (
            "red" if a.status == "NOT lossless" else "green" if a.status.startswith("lossless") else "yellow"
        )
        table.add_row(
            a.method,
            f"{a.greedy_identical}/{a.greedy_prompts}",
            where,
            f"{a.exact_identical}/{a.exact_prompts}" if a.exact_prompts else "-",
            recheck,
            ps or "-",
            f"{accepted / drafted:.2f}" if drafted else "-",
            f"[{style}]{a.status}[/]",
        )
    if power is not None:
        drafted = sum(x["drafted"] for x in power["prefixes"])
        accepted = sum(x["accepted"] for x in power["prefixes"])
        table.add_row(
            f"wrong rule ({power['proposer_of']}'s drafts)",
            "",
            f"power check: {WRONG_RULE}",
            "",
            "",
            ", ".join(_p(x["p_value"]) for x in power["prefixes"]),
            f"{accepted / drafted:.2f}" if drafted else "-",
            "[green]rejected: the check has power[/]" if power["shown"] else "[red]NOT rejected: no power[/]",
        )
    console.print(table)
    for a in audits:
        for reason in a.reasons if a.status != "lossless" else []:
            console.print(f"  {a.method}: {reason}", markup=False, highlight=False)
    e = result["elapsed_s"]
    console.print(
        f"took {_duration(e['total'])} (greedy {_duration(e['greedy'])}, sampling {_duration(e['sampling'])})",
        highlight=False,
    )


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes = math.floor(seconds / 60)
    return f"{minutes} min {seconds - 60 * minutes:.0f} s"
