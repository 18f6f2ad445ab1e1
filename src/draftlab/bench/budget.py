"""How long a benchmark will take, predicted from the cost profile, and what to leave out to fit a budget.

The default `draftlab bench` must finish in minutes on any CPU, and CPUs differ by 2.5× in plain
decoding speed alone. So before the first generation the run is priced from the machine's cost
profile: each generation as plain decoding of its prompt plus its new tokens (an upper bound for
the cost-aware methods, which fall back to plain steps where drafting cannot pay). Over the budget,
what the profile says adds nothing goes first (a draft that cannot pay here, a peer that drafts a
fixed γ at a loss, plain decoding in a dtype that cannot be the fastest), then prompts, down to one
per subtask. The caller prints and records what was left out; `--full` runs everything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from draftlab.bench.runner import WARMUP_TOKENS
from draftlab.decode.cost import CostModel, break_even_alpha, choose_k, expected_tokens
from draftlab.models.cost_curve import TIE_BAND, CostCurve

# The generations' share of the default's 5 minutes: loading, warm-up and the report take the rest.
DEFAULT_BUDGET_S = 240.0
# The acceptance a draft is assumed to reach before any is seen: the round sizer's own prior.
PRIOR_ALPHA = 0.5
CONTEXT = 256  # where drafting is priced: a typical prompt plus part of its answer


@dataclass
class PlannedVariant:
    label: str
    curve: CostCurve  # the target's cost profile in the dtype the variant runs in
    adds_nothing: str | None = None  # why the profile predicts no gain here (None: worth running)


@dataclass
class Fit:
    labels: list[str]  # the variants kept, in order
    limit: int | None  # prompts per subtask (None: as asked)
    predicted_s: float
    full_s: float  # the prediction for everything asked for
    left_out: list[str] = field(default_factory=list)  # what was cut, and why, one line each


def predict_s(
    variants: Sequence[PlannedVariant], prompts: Sequence[int], new_tokens: int, warmup: int = 1
) -> float:
    """Seconds for every variant over every generation (`prompts`: their prompt lengths), warm-up included."""
    total = 0.0
    for v in variants:
        total += sum(v.curve.plain_decoding_ms(p, new_tokens) for p in prompts)
        if prompts:  # the runner's untimed warm-up: up to WARMUP_TOKENS on the first prompt
            total += warmup * v.curve.plain_decoding_ms(prompts[0], min(new_tokens, WARMUP_TOKENS))
    return total / 1000


def draft_adds_nothing(cost: CostModel, gamma: int) -> str | None:
    """Why a cost-aware draft-model method would decode plainly here (None: it may pay).

    At the sizer's prior acceptance it would choose k = 0 in every round, and it only leaves k = 0
    on acceptance it has seen, which a draft that cannot pay at α = 0.5 rarely shows on a CPU.
    """
    k, _, _ = choose_k(cost.verify_ms, cost.draft_ms, [PRIOR_ALPHA] * gamma, gamma, CONTEXT)
    if k > 0:
        return None
    alpha = break_even_alpha(cost, 1, CONTEXT)
    need = f"α above {alpha:.2f}" if alpha is not None else "more than a perfect draft"
    return f"its draft would need {need} for one draft token to pay on this machine"


def fixed_draft_loses(cost: CostModel, gamma: int) -> str | None:
    """Why a peer that drafts γ tokens every round would run below plain speed (None: it may not)."""
    tokens = expected_tokens([PRIOR_ALPHA] * gamma, gamma)
    rate = tokens / (cost.draft_ms(gamma, CONTEXT) + cost.verify_ms(gamma + 1, CONTEXT))
    plain = 1 / cost.verify_ms(1, CONTEXT)
    if rate >= plain:
        return None
    return (
        f"drafting γ = {gamma} every round at α = {PRIOR_ALPHA} is predicted at {rate / plain:.2f}× "
        "plain decoding here"
    )


def slower_dtype(predicted_s: dict[str, float], dtype: str) -> str | None:
    """Why plain decoding in `dtype` cannot be the fastest here (None: it may be)."""
    fastest = min(predicted_s.values())
    if predicted_s[dtype] <= fastest * (1 + TIE_BAND):
        return None
    return f"predicted {predicted_s[dtype] / fastest:.2f}× the fastest dtype's time, past the {TIE_BAND:.0%} tie band"


def fit(
    variants: Sequence[PlannedVariant],
    prompts_at: dict[int, list[int]],
    limit: int,
    new_tokens: int,
    budget_s: float,
    warmup: int = 1,
    drop_variants: bool = True,
    cut_prompts: bool = True,
) -> Fit:
    """Keep the run within `budget_s`: first drop what adds nothing, then prompts down to 1 per subtask.

    `prompts_at[n]` holds the prompt lengths of every generation with n prompts per subtask.
    """
    full = predict_s(variants, prompts_at[limit], new_tokens, warmup)
    kept, left_out = list(variants), []
    predicted = full
    if predicted > budget_s and drop_variants:
        for v in variants:
            if v.adds_nothing:
                kept.remove(v)
                left_out.append(f"{v.label}: {v.adds_nothing}")
        predicted = predict_s(kept, prompts_at[limit], new_tokens, warmup)
    chosen = limit
    while predicted > budget_s and cut_prompts and chosen > 1:
        chosen -= 1
        predicted = predict_s(kept, prompts_at[chosen], new_tokens, warmup)
    if chosen != limit:
        left_out.append(f"prompts: {chosen} per subtask instead of {limit}")
    return Fit([v.label for v in kept], chosen, predicted, full, left_out)
