"""The head of a report: what ran, on what, how it was planned, and which method won.

A few rows a person reads at a glance; every setting of every variant stays in run.json.
"""

from __future__ import annotations

from draftlab.bench.formatting import fmt_duration
from draftlab.bench.labels import OWN_LOOP
from draftlab.bench.table_data import TableData
from draftlab.bench.tables import best_label
from draftlab.decode.spec import is_speculative

FULL_SETTINGS = "full settings: run.json (every variant's settings, the software versions, the host)"


def header_rows(summary: dict) -> list[tuple[str, str]]:
    """(name, value) rows: target, draft, dtype and why, processor, engines, suite, decoding, plan, winner."""
    run = summary["run"]
    extra = run.get("extra") or {}
    rows = []
    if extra.get("engines_missing"):
        # First: a "winner" over our own plain decoding alone may be a loss to the engine left out.
        rows.append(("not measured", extra["engines_missing"]))
    rows += [
        ("target", run["target"]),
        ("draft", run["draft"] or "-"),
    ]
    if extra.get("head"):
        rows.append(("heads", extra["head"]))
    rows.append(
        (
            "dtype",
            _dtype(run, extra.get("dtype_choice"), extra.get("target_storage"), extra.get("draft_storage")),
        )
    )
    if extra.get("hardware"):
        rows.append(_hardware(extra["hardware"]))
    engines = extra.get("engines") or (summary.get("engines") or {}).get("engines") or [OWN_LOOP]
    baselines = sorted({m["baseline"] for m in summary["overall"].values()}) or [run["baseline"]]
    rows += [
        ("engines", ", ".join(engines)),
        ("suite", _suite(summary, extra)),
        (
            "decoding",
            f"temperature {run['temperature']:g}, up to {run['max_new_tokens']} new tokens; "
            f"speed-ups over {', '.join(baselines)}",
        ),
    ]
    if extra.get("plan"):
        rows.append(("plan", _plan(extra["plan"])))
    compiled_row = compiled_line(extra)
    if compiled_row:
        rows.append(("compiled passes", compiled_row))
    rows.append(("winner", winner_line(summary)))
    engine_row = best_engine_line(summary)
    if engine_row:
        rows.append(("best plain decoding", engine_row))
    limit_row = bandwidth_line(summary)
    if limit_row:
        rows.append(("bandwidth limit", limit_row))
    return rows


def header_table(summary: dict) -> TableData:
    return TableData("Run", ["", ""], [list(row) for row in header_rows(summary)], FULL_SETTINGS)


def header_lines(summary: dict) -> list[str]:
    """The same rows as "name: value" lines, for the console."""
    return [f"{name}: {value}" for name, value in header_rows(summary)] + [FULL_SETTINGS]


def winner_line(summary: dict) -> str:
    """The fastest speculative method against the fastest plain decoding ("vs best ar"), overall."""
    overall = summary["overall"]
    plain = next((m["best_plain"] for m in overall.values() if m.get("best_plain")), None)
    if plain is None:
        return "no plain decoding was measured: no method can be compared with it"
    best = best_label(overall, [label for label, m in overall.items() if is_speculative(m.get("method"))])
    if best is None or overall[best].get("vs_best_ar") is None:
        return f"no speculative method to compare; the fastest plain decoding was {plain}"
    m = overall[best]
    low, high = m.get("vs_best_ar_ci_low"), m.get("vs_best_ar_ci_high")
    ci = f", 95% CI [{low:.2f}, {high:.2f}]" if low is not None and high is not None else ""
    speed = f"{m['vs_best_ar']:.2f}× the speed of the fastest plain decoding ({plain}){ci}"
    if m["vs_best_ar"] <= 1:
        return f"no method beat the fastest plain decoding; the closest, {best}, ran at {speed}"
    if low is not None and low <= 1:
        return f"{best}: {speed}; the interval reaches 1×, so the win is not clear"
    return f"{best}: {speed}"


def engine_of(label: str) -> str:
    """ "ar@llamacpp" -> "llamacpp"; our own loop's labels carry no engine ("ar float32" -> "hf")."""
    return label.split("@", 1)[1].split(" ", 1)[0] if "@" in label else OWN_LOOP


def best_engine_line(summary: dict) -> str | None:
    """Which engine's plain decoding was fastest, and by how much over the best of each other engine;
    None when plain decoding ran on one engine only."""
    overall = summary["overall"]
    plain = {
        label: m
        for label, m in overall.items()
        if not is_speculative(m.get("method")) and m.get("tokens_per_s") is not None
    }
    fastest: dict[str, str] = {}
    for label, m in plain.items():
        engine = engine_of(label)
        if engine not in fastest or m["tokens_per_s"] > plain[fastest[engine]]["tokens_per_s"]:
            fastest[engine] = label
    if len(fastest) < 2:
        return None
    best = max(fastest.values(), key=lambda label: plain[label]["tokens_per_s"])
    others = [
        f"{plain[best]['tokens_per_s'] / plain[label]['tokens_per_s']:.2f}× {label} ({engine})"
        for engine, label in fastest.items()
        if label != best
    ]
    return f"{best} ({engine_of(best)}), {plain[best]['tokens_per_s']:.2f} tok/s: " + ", ".join(others)


def compiled_line(extra: dict) -> str | None:
    """Whether our loop ran compiled and why; each package built or loaded, in how long; the
    process's peak memory before and after the packages."""
    choice = extra.get("compile")
    if not choice:
        return None
    parts = [choice["why"]]
    packages = extra.get("compile_s") or {}
    if packages:
        parts.append(
            "packages: "
            + ", ".join(
                f"{n}-token cache {c['package']} in {c['seconds']:.1f} s" for n, c in packages.items()
            )
        )
    single = extra.get("one_token_passes")
    if single:
        ms = single["ms"]
        how = "run as two-token ones" if single["padded"] else "run as they are"
        parts.append(
            f"one-token passes {how} ({ms['one']:.1f} ms alone, {ms['padded']:.1f} ms padded to two)"
        )
    peak = extra.get("peak_rss_mb")
    if peak:
        parts.append(
            f"peak memory {peak['before_packages'] / 1000:.2f} GB before the packages, "
            f"{peak['with_packages'] / 1000:.2f} GB with them"
        )
    return "; ".join(parts)


def bandwidth_line(summary: dict) -> str | None:
    """Each plain decoding's decode ms per token against the least a step can take here: every
    weight read once at the measured memory bandwidth."""
    extra = summary["run"].get("extra") or {}
    bandwidth = extra.get("bandwidth")
    if not bandwidth:
        return None
    parts = []
    for label, weights in bandwidth["weight_bytes"].items():
        m = summary["overall"].get(label)
        if not m or not m.get("decode_tokens_per_s"):
            continue
        limit = weights / (bandwidth["gb_per_s"] * 1e9) * 1000
        ms = 1000 / m["decode_tokens_per_s"]
        parts.append(
            f"{label} {ms:.1f} ms/token = {ms / limit:.1f}× its limit {limit:.1f} ms ({weights / 1e6:.0f} MB)"
        )
    if not parts:
        return None
    return f"memory read {bandwidth['gb_per_s']:.1f} GB/s ({bandwidth['threads']} threads): " + "; ".join(
        parts
    )


def _dtype(
    run: dict, choice: dict | None, storage: str | None = None, draft_storage: str | None = None
) -> str:
    text = f"{run['dtype']} on {run['device']}"
    if storage:  # a 4-bit target: its own blocks, or quantized here (then not the plain target)
        text += f"; the target's linear layers from {storage}"
    if draft_storage:  # a draft (and a head) beside it from Q8_0 blocks: what it proposes, not the output
        text += f"; the draft's matrices and output head {draft_storage}"
    if choice:
        text += f"; dtype chosen: {choice['dtype']}, because {choice['reason']}"
    return text


def _hardware(hw: dict) -> tuple[str, str]:
    if hw.get("kind") == "cuda":
        return "GPU", f"{hw.get('name')}, compute capability {hw.get('capability')}"
    ident = f" ({hw['cpu_id']})" if hw.get("cpu_id") else ""
    flags = ", ".join(hw.get("isa_flags") or []) or "none listed"
    return "CPU", f"{hw.get('name')}{ident}; ISA flags: {flags}"


def _suite(summary: dict, extra: dict) -> str:
    text = f"{summary['run']['suite']}: {', '.join(summary['subtask_names'])}"
    if extra.get("examples"):
        counts = f"{extra['examples']} prompts"
        if extra.get("turns") and extra["turns"] != extra["examples"]:
            counts += f", {extra['turns']} turns"
        if (extra.get("repeats") or 1) > 1:
            counts += f", each {extra['repeats']} times"
        text += f" ({counts})"
    return text


def _plan(plan: dict) -> str:
    text = f"predicted {fmt_duration(plan['predicted_s'])}" if plan.get("predicted_s") is not None else ""
    text = (
        text
        + (f" of a {fmt_duration(plan['budget_s'])} budget" if plan.get("budget_s") else " (no time budget)")
    ).strip()
    left_out = plan.get("left_out") or []
    if not left_out:
        return f"{text}; nothing left out"
    everything = plan.get("everything_s")
    full = f", everything: {fmt_duration(everything)}" if everything is not None else ""
    return f"{text}; left out: {'; '.join(left_out)} (`--full` restores them{full})"
