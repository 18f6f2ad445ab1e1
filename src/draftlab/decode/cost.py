"""What a round costs here and what it is expected to yield: the cost model (ms per pass, from the
machine's profiles of the target and the draft), the draft length k that maximises

    E[tokens | k] / (draft cost(k) + verify cost(k + 1)),   E[tokens | k] = 1 + Σ_{i<k} Π_{j<=i} α_j,

and the break-even acceptance above which drafting k tokens a round beats plain decoding.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from draftlab.models.cost_curve import CostCurve


@dataclass
class CostModel:
    """ms per pass, from the profiles of the target and (for a draft-model method) the draft.

    `clock` (seconds) times what the sizers learn from: rounds (their calibration) and a free
    proposer's own work (its draft cost, and whether lookups are paced). Runs measure with the
    wall clock; tests of those decisions pass a `decode.timing.TickClock`, so that a loaded machine
    cannot flip them.
    """

    target: CostCurve
    draft: CostCurve | None = None
    clock: Callable[[], float] = time.perf_counter
    # A block drafter (DFlash) fills this many rows in one pass whatever k it proposes (0: a chain
    # drafter, a draft model or an EAGLE head, drafting k tokens in k sequential passes).
    block: int = 0
    # Exact mode pads every pass to this many rows (models/exact.py): a shorter one costs as much.
    min_rows: int = 1

    def verify_ms(self, n: int, context: int) -> float:
        return self.target.forward_ms(max(n, self.min_rows), context)

    def draft_ms(self, k: int, context: int, pending: int = 2) -> float:
        """Drafting k tokens: k passes, the first catching up `pending` tokens the draft has not seen
        yet; a block drafter's one pass over its block."""
        if k <= 0 or self.draft is None:
            return 0.0
        if self.block:
            return self._pass_ms(self.block, context)
        return self._pass_ms(max(pending, 1), context) + (k - 1) * self.draft.forward_ms(1, context)

    def _pass_ms(self, n: int, context: int) -> float:
        # A long lag (the prompt, with a lazy prefill) costs what a prefill of that length costs.
        return self.draft.prefill(n) if n > max(self.draft.sizes) else self.draft.forward_ms(n, context)


def expected_tokens(alphas: list[float], k: int) -> float:
    """1 (the target's own token) + Σ over draft positions of P(accepted up to there)."""
    total, survive = 1.0, 1.0
    for j in range(k):
        survive *= alphas[j]
        total += survive
    return total


def choose_k(
    verify_ms, draft_ms, alphas: list[float], k_max: int, context: int, gain: float = 1.0
) -> tuple[int, float, float]:
    """The k in 0..k_max maximising expected tokens per ms; returns (k, E[tokens], cost ms).

    `verify_ms(n, context)` and `draft_ms(k, context)` give costs; `alphas` has k_max entries;
    `gain` scales the expected tokens beyond the target's own one (a correction learnt from
    rounds already run). Ties go to the smaller k: speculation must earn its place.
    """
    best = (0, 1.0, verify_ms(1, context))
    best_rate = best[1] / best[2]
    for k in range(1, k_max + 1):
        tokens = 1.0 + gain * (expected_tokens(alphas, k) - 1.0)
        cost = draft_ms(k, context) + verify_ms(k + 1, context)
        if tokens / cost > best_rate * (1 + 1e-9):
            best, best_rate = (k, tokens, cost), tokens / cost
    return best


def break_even_alpha(cost: CostModel, k: int, context: int) -> float | None:
    """The i.i.d. acceptance α above which drafting k tokens a round beats plain decoding (None: never).

    Solves (1 − α^(k+1)) / (1 − α) = (draft cost(k) + verify cost(k + 1)) / verify cost(1) by
    bisection; the left side grows with α, from 1 at α = 0 to k + 1 at α = 1.
    """
    need = (cost.draft_ms(k, context) + cost.verify_ms(k + 1, context)) / cost.verify_ms(1, context)
    if need <= 1.0:
        return 0.0
    if need >= k + 1:
        return None
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        if expected_tokens([mid] * k, k) < need:
            low = mid
        else:
            high = mid
    return high


# Exact mode pads plain decoding's steps too: a width whose pass costs more than this times plain
# decoding's step is tried only after every width within it.
EXACT_PRICE = 1.15


def exact_width_order(cost: CostModel, widths: tuple[int, ...], context: int) -> tuple[int, ...]:
    """Exact mode's pass widths (models/exact.py), in the order to try them: those whose pass costs
    at most EXACT_PRICE times plain decoding's step (a one-token pass, or one padded to two where
    that is faster) widest first, since a wider pass leaves room for longer drafts at that price;
    then the rest, cheapest first. On a flat curve that is the widest; on a steep one (a 4-bit
    target on AVX2 kernels, 8 rows at 2.8 one-row passes) the narrowest."""
    step = min(cost.target.forward_ms(1, context), cost.target.forward_ms(2, context))
    price = {w: cost.target.forward_ms(w, context) / step for w in widths}
    within = sorted((w for w in widths if price[w] <= EXACT_PRICE), reverse=True)
    beyond = sorted((w for w in widths if price[w] > EXACT_PRICE), key=lambda w: (price[w], w))
    return (*within, *beyond)
