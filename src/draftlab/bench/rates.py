"""Token rates of a group of records, and speed-ups over a baseline's records with bootstrap CIs.

Every figure the benchmark reports is computed from saved `Record`s alone (no model is loaded).
Rules that keep the figures honest:

* Rates are ratios of sums over a group: tokens/s = Σ new tokens / Σ seconds, never the mean of
  per-example rates (which over-weights short, fast generations).
* Records with 0 new tokens count: their time stays in the denominator.
* A ratio whose denominator is 0 is `None` (printed "-"), never inf or NaN.
* A speed-up compares the same inputs: records are matched by `Record.key`
  (example_id, turn, repeat) with the baseline's records of the same group, and only keys
  present in both enter the ratio. Its 95% confidence interval is a percentile bootstrap over
  the matched keys with a fixed seed, so a report is reproducible.
* A speed-up compares the same work. Engines, dtypes and sampled methods may stop at other
  lengths: a 2-token answer to a 720-token prompt is almost all prefill, and its tokens/s set
  against a 64-token answer's reads 0.02x whatever either decodes at. So where a generation's
  length differs from the baseline's, its time is projected to the baseline's token count from
  its own prefill (time to first token) and decode time per token (as serving benchmarks keep
  TTFT and TPOT apart); equal lengths keep their measured time. The speed-up is then
  Σ baseline seconds / Σ (projected) seconds. `length_gap` (Σ|Δ tokens| / Σ baseline tokens)
  says how much was projected, and `measured_speedup` keeps the plain ratio of rates.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from draftlab.bench.records import Record

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
CI_LEVEL = 0.95


def ratio(numerator: float, denominator: float) -> float | None:
    """numerator / denominator, or None when the denominator is not positive."""
    return numerator / denominator if denominator > 0 else None


def decode_tokens(record: Record) -> int:
    """Tokens produced after the prefill phase, whose first round may already yield several."""
    return max(record.new_tokens - record.first_tokens, 0)


def throughput(records: Sequence[Record]) -> dict:
    new_tokens = sum(r.new_tokens for r in records)
    total_s = sum(r.total_s for r in records)
    dec_tokens = sum(decode_tokens(r) for r in records)
    decode_s = sum(r.decode_s for r in records)
    return {
        "n": len(records),
        "examples": len({r.example_id for r in records}),
        "new_tokens": new_tokens,
        "total_s": total_s,
        "tokens_per_s": ratio(new_tokens, total_s),
        "decode_tokens": dec_tokens,
        "decode_s": decode_s,
        "decode_tokens_per_s": ratio(dec_tokens, decode_s),
        # Generations that produced tokens in no measured time: a timing bug, never a real rate.
        "zero_time_records": sum(1 for r in records if r.new_tokens > 0 and r.total_s <= 0),
    }


def _per_key(records: Iterable[Record]) -> dict[tuple[str, int, int], np.ndarray]:
    """Per key: [new tokens, total s, decode tokens, decode s, prefill s, first tokens, records]
    (summed if a key repeats)."""
    out: dict[tuple[str, int, int], np.ndarray] = {}
    for r in records:
        row = np.array(
            [r.new_tokens, r.total_s, decode_tokens(r), r.decode_s, r.prefill_s, r.first_tokens, 1],
            dtype=float,
        )
        out[r.key] = out[r.key] + row if r.key in out else row
    return out


def equal_work_seconds(m: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per matched key, the seconds `m`'s generation would take to write the baseline's token count:
    its measured time where the counts agree, else its prefill plus its decode time per token for
    each token past its first ones (its pooled time per token where this generation decoded none)."""
    pooled = ratio(m[:, 3].sum(), m[:, 2].sum())
    per_token = np.where(
        m[:, 2] > 0, m[:, 3] / np.maximum(m[:, 2], 1), pooled if pooled is not None else np.nan
    )
    # A key may hold several generations (a sweep's baseline at every temperature): as many
    # prefills as the baseline's.
    generations = b[:, 6] / m[:, 6]
    past_first = np.maximum(b[:, 0] - m[:, 5] * generations, 0)
    decoding = np.where(past_first > 0, past_first * per_token, 0.0)
    projected = m[:, 4] * generations + decoding
    # No decode time anywhere to project with: scale the whole time by the token counts.
    scaled = m[:, 1] * np.maximum(b[:, 0], 1) / np.maximum(m[:, 0], 1)
    projected = np.where(np.isnan(projected), scaled, projected)
    return np.where((m[:, 0] == b[:, 0]) & (m[:, 6] == b[:, 6]), m[:, 1], projected)


def _rate_ratio(m: np.ndarray, b: np.ndarray, tok: int, sec: int) -> float | None:
    """(Σ tokens_m / Σ s_m) / (Σ tokens_b / Σ s_b) over the rows given."""
    rate_m = ratio(m[:, tok].sum(), m[:, sec].sum())
    rate_b = ratio(b[:, tok].sum(), b[:, sec].sum())
    if rate_m is None or rate_b is None or rate_b == 0:
        return None
    return float(rate_m / rate_b)


def _bootstrap(
    m: np.ndarray, b: np.ndarray, tok: int, sec: int, index: np.ndarray
) -> tuple[float, float] | None:
    """Percentile interval of the speed-up over resampled keys (rows of `index`)."""
    tm, sm = m[:, tok][index].sum(axis=1), m[:, sec][index].sum(axis=1)
    tb, sb = b[:, tok][index].sum(axis=1), b[:, sec][index].sum(axis=1)
    ok = (sm > 0) & (sb > 0) & (tb > 0)
    if not ok.any():
        return None
    values = (tm[ok] / sm[ok]) / (tb[ok] / sb[ok])
    tail = (1 - CI_LEVEL) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)


def speedup(
    records: Sequence[Record],
    baseline_records: Sequence[Record],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> dict:
    """Speed-up of `records` over `baseline_records` on the keys both hold, with bootstrap CIs.

    Whole generation, over equal work: Σ total_b / Σ total_m, each of `records`' times projected to
    the baseline's token count where the lengths differ (`equal_work_seconds`; with equal lengths
    this is (Σ new_m / Σ total_m) / (Σ new_b / Σ total_b)); decode only: the ratio of decode rates. The CI resamples the matched keys with replacement
    (`resamples` times, numpy default_rng(seed)) and takes the 2.5th/97.5th percentiles; it is
    None with fewer than two matched keys.
    """
    mine, base = _per_key(records), _per_key(baseline_records)
    keys = sorted(set(mine) & set(base))
    out = {
        "matched_keys": len(keys),
        "speedup": None,
        "speedup_ci_low": None,
        "speedup_ci_high": None,
        "decode_speedup": None,
        "decode_speedup_ci_low": None,
        "decode_speedup_ci_high": None,
        "measured_speedup": None,
        "length_gap": None,
        "projected_keys": 0,
    }
    if not keys:
        return out
    m = np.stack([mine[k] for k in keys])
    b = np.stack([base[k] for k in keys])
    # Column 7: the seconds of the same work as the baseline's (equal lengths: the measured ones);
    # the baseline's own tokens and seconds make the rate ratio a ratio of seconds.
    m = np.column_stack([m, equal_work_seconds(m, b)])
    work = np.column_stack([b[:, 0], b[:, 1]])
    out["measured_speedup"] = _rate_ratio(m, b, 0, 1)
    out["speedup"] = _rate_ratio(np.column_stack([b[:, 0], m[:, 7]]), work, 0, 1)
    out["decode_speedup"] = _rate_ratio(m, b, 2, 3)
    out["length_gap"] = ratio(float(np.abs(m[:, 0] - b[:, 0]).sum()), float(b[:, 0].sum()))
    out["projected_keys"] = int(((m[:, 0] != b[:, 0]) | (m[:, 6] != b[:, 6])).sum())
    if len(keys) >= 2 and resamples > 0:
        index = np.random.default_rng(seed).integers(0, len(keys), size=(resamples, len(keys)))
        for name, mine_rows, base_rows, tok, sec in (
            ("speedup", np.column_stack([b[:, 0], m[:, 7]]), work, 0, 1),
            ("decode_speedup", m, b, 2, 3),
        ):
            if out[name] is None:
                continue
            ci = _bootstrap(mine_rows, base_rows, tok, sec, index)
            if ci is not None:
                out[f"{name}_ci_low"], out[f"{name}_ci_high"] = ci
    return out
