"""The sweep and ablation figures a run's labels call for: draft size × γ, tree node budget, the BiLD
threshold grid, temperature, and speculation × KV cache × attention."""

from __future__ import annotations

from collections.abc import Sequence

from draftlab.bench.group_metrics import group_metrics
from draftlab.bench.labels import baseline_label, group_by
from draftlab.bench.losslessness import same_config_plain
from draftlab.bench.rates import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, speedup
from draftlab.bench.records import Record, RunInfo
from draftlab.decode.spec import is_speculative

# The BiLD thresholds as the runner may spell them in Record.params.
_FALLBACK_KEYS = ("fallback_threshold", "fallback_thres", "fallback")
_ROLLBACK_KEYS = ("rollback_threshold", "rollback_thres", "rollback")


def _param(params: dict, names: Sequence[str]) -> object | None:
    for name in names:
        if name in params:
            return params[name]
    return None


def _sort_key(value: object) -> tuple:
    if isinstance(value, (int, float)):
        return (0, float(value), "")
    return (1, 0.0, str(value))


def _row(label: str, metrics: dict, *names: str) -> dict:
    return {"label": label, **{n: metrics.get(n) for n in names}}


_ROW_FIELDS = (
    "method",
    "is_baseline",
    "n",
    "tokens_per_s",
    "decode_tokens_per_s",
    "speedup",
    "speedup_ci_low",
    "speedup_ci_high",
    "decode_speedup",
    "measured_speedup",
    "length_gap",
    "acceptance_rate",
    "alpha_hat",
    "mean_accepted_length",
    "cost_ratio",
    "predicted_speedup",
    "greedy_match_rate",
)


def sweeps(
    records: Sequence[Record],
    run: RunInfo,
    overall: dict[str, dict],
    variants: dict[str, dict],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> dict:
    """The sweep and ablation tables the run's labels call for (only those that vary)."""
    out: dict = {}
    by_label = group_by(records, lambda r: r.label)

    # Draft size × γ (seed 003): speculative labels with a fixed γ (BiLD has its own grid).
    spec = [
        label
        for label, v in variants.items()
        if is_speculative(v["method"]) and v["method"] != "bild" and v["gamma"] is not None
    ]
    settings = group_by(spec, lambda label: (variants[label]["method"], variants[label]["temperature"]))
    varying = {
        setting
        for setting, labels in settings.items()
        if len({(variants[label]["draft"], variants[label]["gamma"]) for label in labels}) > 1
    }
    if varying:
        rows = [
            {
                **_row(label, overall[label], *_ROW_FIELDS),
                "temperature": variants[label]["temperature"],
                "draft": variants[label]["draft"],
                "draft_params": variants[label]["draft_params"],
                "gamma": variants[label]["gamma"],
            }
            for setting in varying
            for label in settings[setting]
        ]
        rows.sort(
            key=lambda r: (
                r["method"],
                _sort_key(r["temperature"]),
                _sort_key(r["draft_params"]),
                str(r["draft"]),
                _sort_key(r["gamma"]),
            )
        )
        out["draft_gamma"] = rows

    # Tree node budget (draftlab sweep tree): each tree method at each fixed budget.
    budgeted = {
        label: v["params"]["tree_budget"]
        for label, v in variants.items()
        if v["params"].get("tree_budget") is not None
    }
    if len(set(budgeted.values())) > 1:
        rows = [
            {
                **_row(label, overall[label], *_ROW_FIELDS, "nodes_per_round", "branch_win_share"),
                "budget": budget,
            }
            for label, budget in budgeted.items()
        ]
        rows.sort(key=lambda r: (str(r["method"]), r["budget"]))
        out["tree_budget"] = rows

    # BiLD fallback × rollback grid, one per draft.
    bild = []
    for label, v in variants.items():
        if v["method"] != "bild":
            continue
        fb, rb = _param(v["params"], _FALLBACK_KEYS), _param(v["params"], _ROLLBACK_KEYS)
        if fb is not None or rb is not None:
            bild.append((label, v["draft"], fb, rb))
    if len({(d, fb, rb) for _, d, fb, rb in bild}) > 1:
        grids = []
        for draft in dict.fromkeys(d for _, d, _, _ in bild):
            cells = [(label, fb, rb) for label, d, fb, rb in bild if d == draft]
            grids.append(
                {
                    "draft": draft,
                    "fallback": sorted({fb for _, fb, _ in cells}, key=_sort_key),
                    "rollback": sorted({rb for _, _, rb in cells}, key=_sort_key),
                    "cells": [
                        {
                            **_row(
                                label, overall[label], *_ROW_FIELDS, "fallbacks", "rollbacks", "draft_share"
                            ),
                            "fallback": fb,
                            "rollback": rb,
                        }
                        for label, fb, rb in cells
                    ],
                }
            )
        out["bild"] = grids

    # Temperature: each label at each temperature, against the baseline at the same temperature.
    temperatures = sorted({r.temperature for r in records})
    if len(temperatures) > 1:
        rows = []
        for label, label_records in by_label.items():
            base_all = by_label.get(baseline_label(run, label), [])
            for t, group in sorted(group_by(label_records, lambda r: r.temperature).items()):
                base = [r for r in base_all if r.temperature == t] or base_all
                is_base = label == baseline_label(run, label)
                plain = same_config_plain(group, [r for r in records if r.temperature == t])
                m = group_metrics(
                    group, base, is_baseline=is_base, resamples=resamples, seed=seed, plain_records=plain
                )
                rows.append({**_row(label, m, *_ROW_FIELDS), "temperature": t})
        out["temperature"] = rows

    # Ablation: speculative on/off × KV cache × attention implementation, when cache or attention vary.
    # A label whose params do not name them ran with the defaults: KV cache on, the model's attention.
    if any("use_cache" in r.params or "attn_implementation" in r.params for r in records):

        def combo(label: str) -> tuple[bool, bool, str]:
            v = variants[label]
            attn = v["params"].get("attn_implementation") or "default"
            return (is_speculative(v["method"]), bool(v["params"].get("use_cache", True)), str(attn))

        combos = {label: combo(label) for label in variants}
        if len({(cache, attn) for _, cache, attn in combos.values()}) > 1:
            plain_candidates = [label for label, (s, _, _) in combos.items() if not s]
            plain = (
                min(plain_candidates, key=lambda lb: (combos[lb][1], combos[lb][2] != "eager"))
                if plain_candidates
                else run.baseline
            )
            plain_records = by_label.get(plain, [])
            rows = []
            for label, (spec_on, cache, attn) in combos.items():
                vs_plain = (
                    {"speedup": 1.0 if overall[label]["tokens_per_s"] else None}
                    if label == plain
                    else speedup(by_label[label], plain_records, resamples=resamples, seed=seed)
                )
                rows.append(
                    {
                        **_row(label, overall[label], *_ROW_FIELDS),
                        "speculative": spec_on,
                        "use_cache": cache,
                        "attn_implementation": attn,
                        "plain": plain,
                        "speedup_vs_plain": vs_plain.get("speedup"),
                        "speedup_vs_plain_ci_low": vs_plain.get("speedup_ci_low"),
                        "speedup_vs_plain_ci_high": vs_plain.get("speedup_ci_high"),
                    }
                )
            rows.sort(key=lambda r: (r["speculative"], r["use_cache"], r["attn_implementation"], r["label"]))
            out["ablation"] = rows
    return out
