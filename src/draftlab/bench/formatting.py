"""How a figure is written: numbers, rates, percentages, durations, parameter counts, speed-ups with
their confidence intervals, and the method names the seed reports used."""

from __future__ import annotations

import math

from draftlab.decode.spec import REGISTRY

# The names the seed reports used ("AS: ... tokens/sec, SPS: ...") for labels that are a bare method.
SEED_NAMES = {name: spec.seed_name for name, spec in REGISTRY.items()}


def fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def fmt_rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if abs(value) >= 100 else f"{value:.2f}"


# Above this share of differing tokens (Σ|Δ tokens| / Σ baseline tokens), a speed-up is marked as
# over projected, equal work.
LENGTH_GAP = 0.2
# After a whole-generation speed-up whose lengths differ from its baseline's by more than
# LENGTH_GAP: the figure is over projected, equal work (bench/rates.py); EQUAL_WORK_NOTE says so.
UNEQUAL = "†"
EQUAL_WORK_NOTE = (
    f"{UNEQUAL}: these generations' lengths differ from the baseline's on the same prompts by more than "
    f"{LENGTH_GAP:.0%} (Σ|Δ tokens| / Σ tokens); the speed-up is over equal work: each one's time projected to the "
    "baseline's token count from its own prefill and decode ms/token (measured_speedup in summary.json "
    "keeps the plain ratio of rates)"
)


def unequal(m: dict, key: str = "length_gap") -> bool:
    gap = m.get(key)
    return gap is not None and gap > LENGTH_GAP


def fmt_speedup(m: dict, prefix: str = "", ci: bool = True) -> str:
    """ "1.44× [1.14, 1.68]"; "baseline" for the baseline itself; "-" when it cannot be computed;
    a whole-generation figure over unequal lengths is marked (UNEQUAL)."""
    value = m.get(f"{prefix}speedup")
    if value is None:
        return "-"
    if m.get("is_baseline"):
        return "baseline"
    text = f"{value:.2f}×" + (UNEQUAL if not prefix and unequal(m) else "")
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
    text = f"{value:.2f}×" + (UNEQUAL if unequal(m, "vs_best_ar_length_gap") else "")
    low, high = m.get("vs_best_ar_ci_low"), m.get("vs_best_ar_ci_high")
    return text + (f" [{low:.2f}, {high:.2f}]" if low is not None and high is not None else "")


def fmt_ci(m: dict, prefix: str = "") -> str:
    low, high = m.get(f"{prefix}speedup_ci_low"), m.get(f"{prefix}speedup_ci_high")
    if low is None or high is None:
        return "-"
    return f"[{low:.2f}, {high:.2f}]"


def fmt_pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"


def fmt_greedy(m: dict, kind: str = "greedy") -> str:
    """`kind` "greedy": matches with plain decoding in the same dtype; "baseline": with the baseline."""
    if not m.get(f"{kind}_compared"):
        return "-"
    return f"{m[f'{kind}_match_rate'] * 100:.0f}% ({m[f'{kind}_matches']}/{m[f'{kind}_compared']})"


def fmt_duration(seconds: float) -> str:
    """ "12 min 05 s", "40 s" (as the bench prints its plan)."""
    minutes, s = divmod(round(seconds), 60)
    return f"{minutes} min {s:02d} s" if minutes else f"{s} s"


def fmt_params(count: float | None) -> str:
    """A parameter count as people write it: 135M, 1.1B."""
    if count is None or not math.isfinite(count):
        return "-"
    for size, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if count >= size:
            return f"{count / size:.3g}{suffix}"
    return str(int(count))


def seed_name(label: str) -> str:
    return SEED_NAMES.get(label, label)
