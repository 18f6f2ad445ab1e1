"""A cost curve: milliseconds of one forward pass by pass size and context, read off a profile
measured on this machine, and the choices it prices (the fastest dtype, a verification's slope).
No torch: reports and the budget read curves."""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field


def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear through the points, extended linearly past both ends (never below 0)."""
    if len(xs) == 1:
        return ys[0]
    i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    if x < x0 and i == 1:
        # Below the first point: hold the value rather than extrapolate a pass to zero cost.
        return y0
    if x > x1 and y1 <= y0:
        # Past the last point a cost never falls: noise between the last two points must not
        # extrapolate toward zero.
        return y1
    return max(y0 + (y1 - y0) * (x - x0) / (x1 - x0), 0.0)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def _ascending(xs) -> bool:
    return (
        isinstance(xs, list)
        and all(isinstance(x, int) and not isinstance(x, bool) for x in xs)
        and all(a < b for a, b in zip(xs, xs[1:], strict=False))
    )


def _curve_problem(curve: CostCurve) -> str | None:
    """What makes a curve unusable (a hand-edited or damaged profile), or None."""
    if not curve.sizes or not _ascending(curve.sizes) or curve.sizes[0] < 1:
        return f"pass sizes {curve.sizes!r} are not ascending whole numbers"
    if not curve.contexts or not _ascending(curve.contexts):
        return f"contexts {curve.contexts!r} are not ascending whole numbers"
    rows = curve.ms
    if not isinstance(rows, list) or len(rows) != len(curve.contexts):
        return (
            f"{len(curve.contexts)} contexts but {len(rows) if isinstance(rows, list) else rows!r} rows of ms"
        )
    for row in rows:
        if not isinstance(row, list) or len(row) != len(curve.sizes) or not all(map(_is_number, row)):
            return f"a row of ms {row!r} is not {len(curve.sizes)} non-negative numbers"
    if not (_ascending(curve.prefill_lengths) and isinstance(curve.prefill_ms, list)):
        return "prefill lengths or times are not lists"
    if len(curve.prefill_ms) != len(curve.prefill_lengths) or not all(map(_is_number, curve.prefill_ms)):
        return f"prefill times {curve.prefill_ms!r} do not match lengths {curve.prefill_lengths!r}"
    if not _is_number(curve.step_factor) or curve.step_factor <= 0:
        return f"step factor {curve.step_factor!r} is not a positive number"
    return None


@dataclass
class CostCurve:
    """ms per forward pass of `sizes[j]` new tokens on a cache of `contexts[i]` tokens, plus prefill."""

    sizes: list[int]
    contexts: list[int]
    ms: list[list[float]]  # [context][size], medians
    prefill_lengths: list[int] = field(default_factory=list)
    prefill_ms: list[float] = field(default_factory=list)
    # Measured plain decoding step / the curve's 1-token pass at the same context: what a real
    # decode step adds (sampling the token, growing the cache) on this machine and dtype.
    step_factor: float = 1.0

    def __post_init__(self) -> None:
        problem = _curve_problem(self)
        if problem:
            raise ValueError(f"not a cost curve: {problem}")
        # Sizers ask for several pass sizes at every round's context; interpolating each anew cost
        # about 40 µs a round, 1% of a llama.cpp step. Not a field: profiles are saved without it.
        self._memo: dict[tuple[int, int], float] = {}
        # Per pass size, its ms at each measured context: the part of a lookup that does not move
        # with the context, which changes every round.
        self._by_size: dict[int, list[float]] = {}

    def forward_ms(self, n: int, context: int) -> float:
        """One pass scoring `n` new tokens after `context` cached ones, interpolated."""
        key = (n, context)
        ms = self._memo.get(key)
        if ms is None:
            if len(self._memo) > 65536:
                self._memo.clear()
            per_context = self._by_size.get(n)
            if per_context is None:
                per_context = self._by_size[n] = [_interp(self.sizes, row, n) for row in self.ms]
            ms = self._memo[key] = _interp(self.contexts, per_context, context)
        return ms

    def prefill(self, length: int) -> float:
        if not self.prefill_lengths:
            return self.forward_ms(length, 0)
        return _interp(self.prefill_lengths, self.prefill_ms, length)

    def plain_decoding_ms(self, prompt: int, new_tokens: int) -> float:
        """Predicted time of plain decoding: the prefill, then one pass per token."""
        middle = prompt + new_tokens // 2
        return self.prefill(prompt) + (new_tokens - 1) * self.forward_ms(1, middle) * self.step_factor


@dataclass
class Profile:
    fingerprint: dict
    curve: CostCurve
    repeats: int
    seconds: float  # how long measuring took
    measured_at: str

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_dict(cls, data: dict) -> Profile:
        """A saved profile; ValueError or TypeError for one whose values cannot be a profile (it is
        then measured again, as a truncated one is)."""
        profile = cls(**{**data, "curve": CostCurve(**data["curve"])})
        if not isinstance(profile.fingerprint, dict) or not isinstance(profile.measured_at, str):
            raise ValueError("not a profile: its fingerprint or its date has the wrong type")
        return profile


# Plain decoding predicted within this share of the fastest counts as a tie. On a 2-core Xeon with
# AMX the profile predicted float16 7% faster than bfloat16 (2.18 vs 2.34 s), while whole plain
# generations measured in one interleaved bench differed by 1% (26.6 vs 26.5 tok/s).
TIE_BAND = 0.10
# Compiled passes must be predicted at least this much faster than eager ones to be chosen: under
# AVX2 kernels on the Zen5 they were predicted 2.25 s against 2.27 s eager, and then ran at 0.95x
# eager `ar`, its lookups at 1.06-1.10x where the eager ones gain more (flatter verification).
COMPILE_MARGIN = 0.9


def compiled_wins(eager: CostCurve, compiled: CostCurve, prompt_tokens: int, new_tokens: int) -> bool:
    """Whether compiled plain decoding is predicted faster than eager by COMPILE_MARGIN: the one
    rule for bench's compile choice, `--dtype auto` and `profile`'s line."""
    ms = compiled.plain_decoding_ms(prompt_tokens, new_tokens)
    return ms < COMPILE_MARGIN * eager.plain_decoding_ms(prompt_tokens, new_tokens)


def verify_slope(curve: CostCurve, k: int = 4, context: int = 256) -> float:
    """What verifying k drafts costs relative to a plain step: 1 is free speculation."""
    return curve.forward_ms(k + 1, context) / curve.forward_ms(1, context)


def pick_dtype(curves: dict[str, CostCurve], prompt_tokens: int, new_tokens: int) -> tuple[str, dict]:
    """The dtype of the fastest predicted plain decoding, and every candidate's prediction in ms.

    Among dtypes tied with the fastest (within TIE_BAND), the one where verifying drafts costs
    least wins: plain decoding's predicted time × its verify_slope, the time if every step checked
    4 drafts. Plain decoding costs about the same in each, and speculation runs on verification
    passes. (The slope alone once chose compiled bfloat16, 1.75 s at a slope of 1.09, over the
    4-bit target's 1.63 s at 1.15; measured, the 4-bit target's plain decoding was 1.5x faster.)
    """
    predicted = {dtype: curve.plain_decoding_ms(prompt_tokens, new_tokens) for dtype, curve in curves.items()}
    fastest = min(predicted.values())
    tied = [d for d, ms in predicted.items() if ms <= fastest * (1 + TIE_BAND)]
    return min(tied, key=lambda d: (predicted[d] * verify_slope(curves[d]), predicted[d])), predicted


def out_of_reach(least_ms: float, best_ms: float) -> bool:
    """Whether a way of running whose plain decoding cannot take less than `least_ms` can be
    passed over unmeasured, `best_ms` being the fastest predicted already: even at its bound it
    would lie outside the band `pick_dtype` treats as tied with the fastest."""
    return least_ms > best_ms * (1 + TIE_BAND)


def pick_checked(
    candidates: Sequence[str],
    price: Callable[[str, bool], CostCurve],
    prompt_tokens: int,
    new_tokens: int,
) -> tuple[str, dict, dict[str, CostCurve]]:
    """`pick_dtype` over `candidates`, each priced by `price(candidate, check)`: from its cached
    profile as it is (check False), then only the winner spot-checked (check True), and the choice
    made again where that measured it anew. Returns the pick, the predictions and the curves.

    Spot-checking every candidate once re-profiled eager float32 for minutes on a noisy host
    before a run of the 4-bit package; checking none left runs that set up no cost model of their
    own (plain `ar`, fixed γ) on a stale profile."""
    curves = {c: price(c, False) for c in candidates}
    pick, predicted = pick_dtype(curves, prompt_tokens, new_tokens)
    checked = price(pick, True)
    if checked != curves[pick]:
        curves[pick] = checked
        pick, predicted = pick_dtype(curves, prompt_tokens, new_tokens)
    return pick, predicted, curves
