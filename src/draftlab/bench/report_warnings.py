"""What a reader of the report must be warned of: missing baselines, zero-time generations, a stale
cost profile, generations left out of the speed-up."""

from __future__ import annotations

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
