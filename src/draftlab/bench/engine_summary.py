"""The summary's engines section, for a run whose variants ran on more than the hf engine."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from draftlab.bench.labels import OWN_LOOP
from draftlab.bench.records import Record


def engine_of(variant: dict) -> str:
    return str((variant.get("params") or {}).get("engine", OWN_LOOP))


def engine_summary(
    records: Sequence[Record], variants: dict[str, dict], baseline_of: Callable
) -> dict | None:
    """Which label ran which method on which engine, and how often the engines' plain decodings agree.

    None when our own loop made every record. "ar_match" compares each engine's greedy `ar` tokens
    with our own loop's on the same keys: information only (kernels differ between engines, and so
    may near-ties), unlike greedy_match, which compares each method with its own engine's `ar`.
    """
    engines = list(dict.fromkeys(engine_of(v) for v in variants.values()))
    if set(engines) <= {OWN_LOOP}:
        return None
    table: dict[str, dict[str, str]] = {}
    for label, v in variants.items():
        if baseline_of(label) is None:
            continue
        # The first label of a method on an engine is its main one ("ar", not "ar float16").
        table.setdefault(v["method"], {}).setdefault(engine_of(v), label)
    ar_match = {}
    plain = table.get("ar", {})
    reference = {r.key: r.tokens for r in records if r.label == plain.get(OWN_LOOP) and r.temperature == 0}
    for engine, label in plain.items():
        if engine == OWN_LOOP or not reference:
            continue
        pairs = [(r.tokens, reference[r.key]) for r in records if r.label == label and r.key in reference]
        ar_match[engine] = {"matched": sum(a == b for a, b in pairs), "compared": len(pairs)}
    return {"engines": engines, "methods": table, "ar_match": ar_match}
