"""The seed-format result lines: "Overall Result: AS: 8.28 tokens/sec, SPS: 12.93 tokens/sec -> 1.44 X Speedup"."""

from __future__ import annotations

from draftlab.bench.formatting import fmt, seed_name, unequal


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
    if unequal(m):
        text += f" (over equal work: lengths differ by {m['length_gap']:.0%})"
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
