"""Fitting `draftlab bench`'s default run to its time budget: what the cost profile predicts adds nothing
(a dtype that cannot be the fastest, a peer that drafts at a loss) is left out, then prompts."""

from __future__ import annotations

import argparse

from rich.console import Console

from draftlab.bench import budget
from draftlab.bench.formatting import fmt_duration
from draftlab.bench.runner import Variant
from draftlab.bench.suites import select
from draftlab.models.loading import LoadedModel
from draftlab.models.profile import load_cached
from draftlab.models.prompting import encode_prompt
from draftlab.plan.dtypes import DtypeChoice
from draftlab.plan.prompts import prompt_limit


def fit_budget(
    args: argparse.Namespace,
    variants: list[Variant],
    examples: list,
    target: LoadedModel,
    dtype: DtypeChoice | None = None,
    skipped: list[str] = (),
) -> tuple[list[Variant], list, dict | None]:
    """Price the run from the cost profile before the first generation and, for the default run,
    leave out what the profile says adds nothing, then prompts, to stay within the time budget."""
    curves = {}
    for v in variants:
        profile = v.cost.target if v.cost else getattr(load_cached(v.target), "curve", None)
        if profile is None:
            return variants, examples, None  # no profile (e.g. --fixed-k on a new machine): no prediction
        curves[v.label] = profile
    limit = prompt_limit(args)
    chat = not args.no_chat
    lengths = {}  # example id -> prompt tokens of each turn, earlier turns and answers included
    for e in examples:
        so_far, turns = 0, []
        for turn in e.turns:
            so_far += len(encode_prompt(target, turn, chat=chat))
            turns.append(so_far)
            so_far += args.max_new_tokens
        lengths[e.id] = turns
    prompts_at = {
        n: [t for e in select(examples, None, n) for t in lengths[e.id]] for n in range(1, limit + 1)
    }
    dtype_times = dtype.predicted_s if dtype is not None else {}
    planned = [
        budget.PlannedVariant(v.label, curves[v.label], adds_nothing(v, dtype_times)) for v in variants
    ]
    explicit = args.full or args.methods is not None or args.limit is not None
    fitted = budget.fit(
        planned,
        prompts_at if not args.full else {limit: [t for ts in lengths.values() for t in ts]},
        limit,
        args.max_new_tokens,
        budget.DEFAULT_BUDGET_S,
        warmup=args.warmup,
        drop_variants=not explicit,
        cut_prompts=not explicit,
    )
    # As the profiling lines: --quiet hides the progress bar only. A resumed run prints no plan: its
    # settings are checked against the earlier run's first, and the whole run's prediction would
    # overstate what is left.
    console = Console(stderr=True, quiet=bool(getattr(args, "resume", False)))
    kept = [v for v in variants if v.label in fitted.labels]
    if fitted.limit != limit:
        examples = select(examples, None, fitted.limit)
    generations = sum(len(e.turns) for e in examples)
    console.print(
        f"[dim]predicted: {fmt_duration(fitted.predicted_s)} for {len(kept)} variants × "
        f"{generations} generations (plain decoding from the cost profile, an upper bound)[/]"
    )
    if fitted.left_out:
        console.print(
            f"[dim]left out to stay within {fmt_duration(budget.DEFAULT_BUDGET_S)} "
            f"(everything: {fmt_duration(fitted.full_s)}; --full runs it):[/]"
        )
        for line in fitted.left_out:
            console.print(f"[dim]  {line}[/]")
    record = {
        "predicted_s": round(fitted.predicted_s, 1),
        "budget_s": budget.DEFAULT_BUDGET_S if not explicit else None,
        "everything_s": round(fitted.full_s, 1),
        "left_out": [*skipped, *fitted.left_out],
    }
    return kept, examples, record


def adds_nothing(v: Variant, dtype_times: dict[str, float]) -> str | None:
    """Why the profile predicts this variant adds nothing to the comparison here (None: it may)."""
    method = v.config.method
    if method == "ar":
        dtype = v.target.spec.dtype
        return budget.slower_dtype(dtype_times, dtype) if v.label != "ar" and dtype in dtype_times else None
    if v.cost is None or v.draft is None or not v.config.needs_draft:
        return None
    if method == "hf-assisted":
        return budget.fixed_draft_loses(v.cost, v.config.gamma)
    reason = budget.draft_adds_nothing(v.cost, v.config.gamma)
    if reason and method == "hybrid":
        return reason + " (its lookup half is pld-tree)"
    return reason
