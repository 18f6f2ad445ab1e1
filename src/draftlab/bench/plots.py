"""PNG plots of a benchmark summary (matplotlib, Agg; no pyplot state, safe to call from any thread).

All three plots are always written; where the run has nothing to sweep they show the single
configuration measured, with a note saying so.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from draftlab.bench.formatting import fmt_params
from draftlab.decode.spec import is_speculative
from draftlab.files import atomic_path

SPEEDUP_PNG = "speedup_by_subtask.png"
ACCEPTANCE_PNG = "acceptance_vs_gamma.png"
DRAFT_SIZE_PNG = "tokens_per_s_vs_draft_size.png"
TREE_BUDGET_PNG = "speedup_vs_tree_budget.png"
CONCURRENCY_PNG = "speedup_vs_concurrency.png"
PLOT_FILES = (SPEEDUP_PNG, ACCEPTANCE_PNG, DRAFT_SIZE_PNG)


def _figure(width: float = 8.0, height: float = 4.8) -> Figure:
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _note(ax, text: str) -> None:
    ax.text(
        0.5,
        0.97,
        text,
        transform=ax.transAxes,
        ha="center",
        va="top",
        fontsize=9,
        color="0.35",
        bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": "0.8"},
    )


_SWEPT = ("gamma", "draft", "draft_params", "n_lookahead")


def _series(summary: dict, labels: list[str], shown: str) -> dict[str, list[str]]:
    """Group labels into lines: same method, `shown` setting, temperature and other settings.

    A line is named by its label when it holds one, else by method, `shown` and temperature
    (falling back to its labels if two lines would share that name).
    """
    several_t = len({t for v in summary["variants"].values() for t in v["temperatures"]}) > 1
    groups: dict[tuple, list[str]] = {}
    names: dict[tuple, str] = {}
    for label in labels:
        v = summary["variants"][label]
        rest = tuple(sorted((k, str(x)) for k, x in v["params"].items() if k not in _SWEPT))
        key = (v["method"], str(v.get(shown)), v["temperature"], rest)
        groups.setdefault(key, []).append(label)
        parts = [v["method"]]
        if v.get(shown) is not None:
            parts.append(f"γ={v[shown]}" if shown == "gamma" else str(v[shown]))
        if several_t and v["temperature"] is not None:
            parts.append(f"T={v['temperature']:g}")
        names[key] = " · ".join(parts)
    out: dict[str, list[str]] = {}
    taken = [names[key] for key, members in groups.items() if len(members) > 1]
    for key, members in groups.items():
        if len(members) == 1:
            name = members[0]
        elif taken.count(names[key]) > 1:
            name = ", ".join(members)
        else:
            name = names[key]
        out[name] = members
    return out


def _plot_series(ax, points: list[tuple[float, float]], **kwargs):
    """A line through the points, or bare markers where one x holds several labels."""
    xs = [p[0] for p in points]
    style = {"linestyle": "none"} if len(set(xs)) < len(xs) else {}
    return ax.plot(xs, [p[1] for p in points], **{**kwargs, **style})[0]


def _legend(ax, entries: int) -> None:
    if entries > 4:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    elif entries:
        ax.legend(fontsize=8)


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    return path


def plot_speedup_by_subtask(summary: dict, path: Path) -> Path:
    """Grouped bars: speed-up over the baseline per subtask (and overall) and label, with 95% CI bars."""
    fig = _figure(max(8.0, 1.1 * (len(summary["subtask_names"]) + 1) + 2))
    ax = fig.add_subplot()
    groups = ["overall", *summary["subtask_names"]]
    tables = [summary["overall"], *(summary["subtasks"][s] for s in summary["subtask_names"])]
    series = [label for label in summary["labels"] if not summary["overall"][label]["is_baseline"]]
    width = 0.8 / max(len(series), 1)
    for i, label in enumerate(series):
        xs, ys, low, high = [], [], [], []
        for x, table in enumerate(tables):
            m = table.get(label)
            if m is None or m["speedup"] is None:
                continue
            xs.append(x - 0.4 + width * (i + 0.5))
            ys.append(m["speedup"])
            has_ci = m["speedup_ci_low"] is not None and m["speedup_ci_high"] is not None
            low.append(max(m["speedup"] - m["speedup_ci_low"], 0.0) if has_ci else 0.0)
            high.append(max(m["speedup_ci_high"] - m["speedup"], 0.0) if has_ci else 0.0)
        ax.bar(xs, ys, width, yerr=[low, high], capsize=3, label=label)
    ax.axhline(1.0, color="0.3", linestyle="--", linewidth=1, label=f"baseline ({summary['baseline']})")
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, rotation=30, ha="right")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.15)
    ax.set_ylabel("speed-up (× baseline tokens/s)")
    ax.set_title("Speed-up by subtask (95% bootstrap CI)")
    _legend(ax, len(series) + 1)
    if not series:
        _note(ax, "single configuration: no method besides the baseline")
    return _save(fig, path)


def _points(summary: dict, group_by: str, x: str, ys: tuple[str, ...], keep=lambda variant: True) -> dict:
    """Per series (see _series): (variant's x, overall ys...) of every label with x and ys[0] known."""
    variants, overall = summary["variants"], summary["overall"]
    labels = [
        label
        for label in summary["labels"]
        if variants[label][x] is not None and overall[label][ys[0]] is not None and keep(variants[label])
    ]
    return {
        name: [(variants[label][x], *(overall[label][y] for y in ys)) for label in members]
        for name, members in _series(summary, labels, group_by).items()
    }


def plot_acceptance_vs_gamma(summary: dict, path: Path) -> Path:
    """Acceptance rate (solid) and α̂ (dashed) against γ, one line per method and draft."""
    fig = _figure()
    ax = fig.add_subplot()
    series = _points(summary, "draft", "gamma", ("acceptance_rate", "alpha_hat"))
    for name, points in series.items():
        points.sort(key=lambda p: p[0])
        line = _plot_series(ax, [(g, a) for g, a, _ in points], marker="o", label=f"{name}: α")
        alpha_hat = [(g, a) for g, _, a in points if a is not None]
        if alpha_hat:
            _plot_series(
                ax,
                alpha_hat,
                marker="s",
                linestyle="--",
                fillstyle="none",
                color=line.get_color(),
                label=f"{name}: α̂",
            )
    ax.set_xlabel("γ (draft tokens per round)")
    ax.set_ylabel("acceptance")
    ax.set_ylim(0, 1.15)
    ax.set_title("Acceptance rate vs γ")
    if series:
        _legend(ax, 2 * len(series))
        gammas = sorted({p[0] for points in series.values() for p in points})
        ax.set_xticks(gammas)
        if len(gammas) == 1:
            _note(ax, f"single configuration: γ = {gammas[0]} only")
    else:
        _note(ax, "single configuration: no drafted tokens in this run")
    return _save(fig, path)


def plot_tokens_per_s_vs_draft_size(summary: dict, path: Path) -> Path:
    """Tokens/s against draft parameter count, one line per method and γ, the baseline as a line."""
    fig = _figure()
    ax = fig.add_subplot()
    series = _points(
        summary, "gamma", "draft_params", ("tokens_per_s",), keep=lambda v: is_speculative(v["method"])
    )
    for name, points in series.items():
        points.sort()
        _plot_series(ax, points, marker="o", label=name)
    base = summary["overall"].get(summary["baseline"])
    if base is not None and base["tokens_per_s"] is not None:
        ax.axhline(
            base["tokens_per_s"], color="0.3", linestyle="--", label=f"{summary['baseline']} (no draft)"
        )
    sizes = sorted({p[0] for points in series.values() for p in points})
    if sizes:
        ax.set_xscale("log")
        ax.set_xlim(sizes[0] / 2, sizes[-1] * 2)
        ax.set_xticks(sizes)
        ax.set_xticklabels([fmt_params(size) for size in sizes])
        ax.minorticks_off()
    ax.set_xlabel("draft parameters")
    ax.set_ylabel("tokens/s (Σ tokens / Σ s)")
    ax.set_title("Throughput vs draft size")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.15)
    _legend(ax, len(ax.get_legend_handles_labels()[0]))
    if not sizes:
        _note(ax, "single configuration: no draft model with a known size in this run")
    elif len(sizes) == 1:
        _note(ax, f"single configuration: one draft size ({fmt_params(sizes[0])})")
    return _save(fig, path)


def plot_speedup_vs_tree_budget(summary: dict, path: Path) -> Path:
    """One panel per tree method: speed-up against the node budget, overall and per subtask."""
    rows = summary["sweeps"]["tree_budget"]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig = _figure(5.0 * len(methods), 4.4)
    names = summary["subtask_names"]
    for i, method in enumerate(methods, 1):
        ax = fig.add_subplot(1, len(methods), i)
        mine = [r for r in rows if r["method"] == method]
        _plot_series(
            ax, [(r["budget"], r["speedup"]) for r in mine if r["speedup"]], label="overall", linewidth=2.5
        )
        for name in names:
            points = [
                (r["budget"], summary["subtasks"][name].get(r["label"], {}).get("speedup")) for r in mine
            ]
            _plot_series(ax, [(b, s) for b, s in points if s], label=name, linewidth=1, alpha=0.8)
        ax.axhline(1.0, color="0.3", linestyle="--", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tree node budget")
        ax.set_ylabel(f"speed-up over {summary['baseline']}")
        ax.set_title(method)
        _legend(ax, len(names) + 1)
    return _save(fig, path)


def plot_speedup_vs_concurrency(summary: dict, path: Path) -> Path:
    """Speed-up over the baseline at the same concurrency, per method (and the cost-curve prediction)."""
    data = summary["concurrency"]
    fig = _figure(7.0, 4.6)
    ax = fig.add_subplot(1, 1, 1)
    for label, levels in data["levels"].items():
        if label == data["baseline"]:
            continue
        points = [(int(c), m["speedup"]) for c, m in levels.items() if m["speedup"]]
        line = _plot_series(ax, sorted(points), label=label, linewidth=2)
        predicted = [
            (int(c), m["predicted_speedup"]) for c, m in levels.items() if m.get("predicted_speedup")
        ]
        if predicted:
            color = line.get_color() if line is not None else None
            _plot_series(ax, sorted(predicted), label=f"{label} (hf cost curve)", linestyle=":", color=color)
    ax.axhline(1.0, color="0.3", linestyle="--", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel(f"output tok/s over {data['baseline']}")
    ax.set_title("speculation under load")
    _legend(ax, len(data["levels"]))
    return _save(fig, path)


def write_plots(summary: dict, directory: Path) -> list[Path]:
    """Write the PNGs into `directory` (three always, more for the sweeps that need them)."""
    directory = Path(directory)
    paths = [
        plot_speedup_by_subtask(summary, directory / SPEEDUP_PNG),
        plot_acceptance_vs_gamma(summary, directory / ACCEPTANCE_PNG),
        plot_tokens_per_s_vs_draft_size(summary, directory / DRAFT_SIZE_PNG),
    ]
    if "tree_budget" in summary["sweeps"]:
        paths.append(plot_speedup_vs_tree_budget(summary, directory / TREE_BUDGET_PNG))
    if summary.get("concurrency"):
        paths.append(plot_speedup_vs_concurrency(summary, directory / CONCURRENCY_PNG))
    return paths
