"""Which dtypes plain decoding runs in: `--dtype auto`'s choice, and the others worth measuring beside it."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

from rich.console import Console

from draftlab.errors import DraftlabError
from draftlab.models.cost_curve import (
    TIE_BAND,
    CostCurve,
    compiled_wins,
    pick_checked,
    verify_slope,
)
from draftlab.models.loading import DTYPES, LoadedModel, ModelSpec, candidate_dtypes
from draftlab.models.profile import load_cached
from draftlab.plan.configs import parse_list
from draftlab.plan.profiles import load_spec, machine_profile


@dataclass(frozen=True)
class DtypeChoice:
    """`--dtype auto`'s decision for one model, and the predictions it was made from."""

    dtype: str
    reason: str
    predicted_s: dict[str, float]  # plain decoding of the reference request, per dtype
    ways: dict[str, str]  # eager or compiled, per dtype, as it was priced

    def record(self) -> dict:
        return dataclasses.asdict(self)


def choose_dtype(args: argparse.Namespace, name: str, device: str, attn: str | None) -> DtypeChoice:
    """`--dtype auto`: the dtype whose plain decoding (prefill + decode) is fastest here, by profile."""
    prompt_tokens = 256
    ways: dict[str, str] = {}
    # Where bench decides compilation from the profiles (neither --compile nor --no-compile), each
    # dtype is priced the way it would run: compiled where its cached compiled profile wins by the
    # margin plan/compile.py applies. (On a Zen3, eager bfloat16 beat eager float32, 6.15 s against
    # 7.80, while compiled float32 was predicted 3.51 s and never considered.)
    joint = getattr(args, "compile", False) is None and device == "cpu"

    def price(dtype: str, check: bool) -> CostCurve:
        lm = load_spec(ModelSpec(name, dtype, device, attn))
        compiled = load_cached(lm, compiled=True) if joint else None

        def runs_compiled(eager: CostCurve) -> bool:
            return compiled is not None and compiled_wins(
                eager, compiled.curve, prompt_tokens, args.max_new_tokens
            )

        eager = machine_profile(lm, check=False).curve
        if check and not runs_compiled(eager):  # compiled profiles are never spot-checked
            eager = machine_profile(lm, check=True).curve
        ways[dtype] = "compiled" if runs_compiled(eager) else "eager"
        return compiled.curve if ways[dtype] == "compiled" else eager

    dtype, predicted, curves = pick_checked(
        candidate_dtypes(name, device), price, prompt_tokens, args.max_new_tokens
    )
    others = ", ".join(f"{d} {ways[d]} {ms / 1000:.2f} s" for d, ms in predicted.items() if d != dtype)
    reason = (
        f"plain decoding of a {prompt_tokens}-token prompt + {args.max_new_tokens} tokens is predicted "
        f"to take {predicted[dtype] / 1000:.2f} s in {dtype} {ways[dtype]}"
        + (f" (vs {others})" if others else "")
    )
    if predicted[dtype] > min(predicted.values()):
        reason += (
            f"; within {TIE_BAND:.0%} of the fastest, and verifying 4 drafts costs least in it "
            f"({verify_slope(curves[dtype]):.2f}× a plain step)"
        )
    return DtypeChoice(dtype, reason, {d: v / 1000 for d, v in predicted.items()}, ways)


def dtype_choices(args: argparse.Namespace, target: str) -> dict[str, DtypeChoice]:
    """The choices `--dtype auto` makes for a run's target (none where its dtype is named)."""
    if (args.target_dtype or args.dtype) != "auto":
        return {}
    device = args.target_device or args.device
    return {target: choose_dtype(args, target, device, args.attn_implementation)}


def other_dtypes(
    args: argparse.Namespace, target: LoadedModel, choice: DtypeChoice | None
) -> tuple[list[str], list[str]]:
    """Every other dtype the device supports (or --ar-dtypes), for "vs best ar" and for routing;
    and why each dtype left out is left out."""
    if args.ar_dtypes == "none":
        return [], []
    dtypes = (
        candidate_dtypes(target.spec.name, target.spec.device)
        if args.ar_dtypes == "supported"
        else parse_list(args.ar_dtypes, str, "dtype")
    )
    out: list[str] = []
    skipped: list[str] = []
    predicted = choice.predicted_s if choice is not None else {}
    for dtype in dtypes:
        if dtype == target.spec.dtype:
            continue
        if dtype not in DTYPES:
            raise DraftlabError(f"unknown dtype '{dtype}' in --ar-dtypes (choose from {', '.join(DTYPES)})")
        hopeless = predicted and predicted[dtype] > 1.25 * min(predicted.values())
        if args.ar_dtypes == "supported" and hopeless and not getattr(args, "full", False):
            # Its profile says it cannot be the fastest plain decoding here: measuring it costs time only.
            why = (
                f"ar in {dtype}: predicted {predicted[dtype]:.2f} s per generation, "
                f"over 1.25× the fastest dtype's {min(predicted.values()):.2f} s"
            )
            Console(stderr=True).print(f"[dim]{why}: skipped[/]")
            skipped.append(why)
            continue
        out.append(dtype)
    return out, skipped
