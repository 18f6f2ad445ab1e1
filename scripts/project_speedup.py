"""Project a run's measured acceptance onto another cost curve: what speculation would gain on a
machine whose passes cost otherwise (issue 22: a CPU where verifying 4 tokens costs at most 1.5x
a plain step, which no CPU we have is like).

    python scripts/project_speedup.py runs/X/results.jsonl --curve PROFILE.json --context 256
    python scripts/project_speedup.py runs/X/results.jsonl --ratios 1,1.17,1.33,1.5 --context 256

Reads each generation's drafted and accepted counts per draft position (a fixed-k run: every
round drafts what its proposer finds, up to γ) and prices its rounds on the curve: a round that
drafted d tokens costs one pass over d + 1 tokens. Capping drafts at g keeps a round's first g
drafts and its accepted ones among them. Rounds are treated as independent (a capped round would
shift later rounds' positions; Leviathan et al. make the same assumption), and the prefill round
is priced as a plain step on both sides, so the figures are decode-only speed-ups over plain
decoding on that curve.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict


def curve_from_profile(path: str, context: int) -> dict[int, float]:
    data = json.loads(open(path).read())["curve"]
    rows = data["ms"]
    contexts = data["contexts"]
    row = min(zip(contexts, rows, strict=True), key=lambda cr: abs(cr[0] - context))[1]
    return dict(zip(data["sizes"], row, strict=True))


def curve_from_ratios(ratios: list[float]) -> dict[int, float]:
    """Costs of passes of 1, 2, ... tokens; beyond the last, the last step's slope continues."""
    return {n + 1: r for n, r in enumerate(ratios)}


def cost(curve: dict[int, float], n: int) -> float:
    sizes = sorted(curve)
    if n in curve:
        return curve[n]
    if n > sizes[-1]:
        a, b = sizes[-2], sizes[-1]
        return curve[b] + (curve[b] - curve[a]) / (b - a) * (n - b)
    lo = max(s for s in sizes if s < n)
    hi = min(s for s in sizes if s > n)
    return curve[lo] + (curve[hi] - curve[lo]) * (n - lo) / (hi - lo)


def rounds_by_count(at_least: list[int], n_rounds: int, cap: int | None = None) -> dict[int, int]:
    """Rounds with exactly d drafted (or accepted) tokens, from the per-position counts of rounds
    with more than j; counts past `cap` are folded into `cap`."""
    by_count: dict[int, int] = defaultdict(int)
    by_count[0] = n_rounds - (at_least[0] if at_least else 0)
    for j, count in enumerate(at_least):
        after = at_least[j + 1] if j + 1 < len(at_least) else 0
        by_count[j + 1 if cap is None else min(j + 1, cap)] += count - after
    return by_count


def project(records: list[dict], curve: dict[int, float], cap: int) -> tuple[float, float]:
    """(decode-only speed-up over plain decoding, mean accepted length) with drafts capped at `cap`."""
    plain_ms = spec_ms = 0.0
    tokens = rounds = 0
    for r in records:
        accepted, n_rounds = r["accepted_per_position"], r["rounds"]
        by_d = rounds_by_count(r["drafted_per_position"], n_rounds)
        new = n_rounds + sum(accepted[:cap])
        spec_ms += sum(n * cost(curve, min(d, cap) + 1) for d, n in by_d.items())
        plain_ms += new * cost(curve, 1)
        tokens += new
        rounds += n_rounds
    return plain_ms / spec_ms, tokens / rounds


def project_oracle(records: list[dict], curve: dict[int, float], cap: int) -> float:
    """The bound of any sizing policy: each round drafts exactly the tokens the target will accept
    (up to `cap`), and a round that would accept none is a plain step."""
    plain_ms = spec_ms = 0.0
    for r in records:
        accepted, n_rounds = r["accepted_per_position"], r["rounds"]
        by_a = rounds_by_count(accepted, n_rounds, cap)
        new = n_rounds + sum(accepted[:cap])
        spec_ms += sum(n * cost(curve, a + 1) for a, n in by_a.items())
        plain_ms += new * cost(curve, 1)
    return plain_ms / spec_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results")
    parser.add_argument("--curve", help="a cached profile JSON (draftlab profile)")
    parser.add_argument("--ratios", help="costs of passes of 1, 2, 3, ... tokens, comma-separated")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--caps", default="1,2,3,4,6,8,10")
    args = parser.parse_args()
    if bool(args.curve) == bool(args.ratios):
        parser.error("give exactly one of --curve and --ratios")
    curve = (
        curve_from_profile(args.curve, args.context)
        if args.curve
        else curve_from_ratios([float(x) for x in args.ratios.split(",")])
    )
    by_label: dict[str, list[dict]] = defaultdict(list)
    for line in open(args.results):
        r = json.loads(line)
        if r.get("drafted_per_position"):
            by_label[r["label"]].append(r)
    caps = [int(c) for c in args.caps.split(",")]
    print("| method | " + " | ".join(f"γ ≤ {c}" for c in caps) + " |")
    print("|---|" + "---|" * len(caps))
    for label, records in sorted(by_label.items()):
        cells = []
        for cap in caps:
            speedup, length = project(records, curve, cap)
            cells.append(f"{speedup:.2f}× ({length:.2f})")
        print(f"| {label} | " + " | ".join(cells) + " |")
        bound = [f"{project_oracle(records, curve, cap):.2f}×" for cap in caps]
        print(f"| {label}, sizing bound | " + " | ".join(bound) + " |")


if __name__ == "__main__":
    main()
