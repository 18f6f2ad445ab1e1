"""`draftlab profile`: what a forward pass costs here, and the acceptance speculation needs to pay."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from draftlab import engines as registry
from draftlab.bench.runner import plan_need
from draftlab.bench.suites import load_suite
from draftlab.cli.common import add_compile_arg, add_model_args
from draftlab.cli.engine_option import add_engine_arg
from draftlab.decode.cost import CostModel, break_even_alpha
from draftlab.drafters.eagle3.io import load_head_lm
from draftlab.errors import DraftlabError
from draftlab.files import atomic_path, write_text
from draftlab.hardware import compile_skip_reason, fingerprint_key, hardware
from draftlab.models.bandwidth import HEADROOM, cached_bandwidth, least_decoding_ms, limit_ms, weight_bytes
from draftlab.models.cached import compiles
from draftlab.models.cost_curve import Profile, compiled_wins, out_of_reach, pick_dtype, verify_slope
from draftlab.models.loading import ModelSpec, candidate_dtypes, draft_dtype
from draftlab.models.profile import load_or_measure, profile_dir
from draftlab.outputs import check_folder, claim_folder
from draftlab.plan.profiles import load_spec
from draftlab.plan.roles import DEFAULT_DRAFT, DEFAULT_TARGET, head_name

BREAK_EVEN_KS = (1, 2, 3, 4, 6, 8, 10)
# The prompt `--dtype auto` prices plain decoding with (plan/dtypes.py), here too.
REFERENCE_PROMPT = 256


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "profile", help="measure ms per forward pass here, and the acceptance at which speculation pays"
    )
    add_model_args(p)
    add_engine_arg(p)
    p.add_argument("--full", action="store_true", help="N up to 128 and contexts up to the model's limit")
    p.add_argument("--refresh", action="store_true", help="measure again even if a cached profile fits")
    add_compile_arg(
        p,
        "the target's compiled passes (an AOTInductor package over a static cache, as `bench "
        "--compile` runs them): passes of 1, 2, 4 and 8 tokens in the static-cache bucket that the "
        "default bench's longest generation needs (one package per model serves every shorter "
        "context), built first where no earlier run built it, cached as a profile of its own; "
        "after every eager profile, and not in a half-precision dtype this CPU only emulates",
    )
    p.add_argument("--repeats", type=int, default=3, help="passes per point (the median is kept)")
    p.add_argument("--context", type=int, default=256, help="context length of the break-even table")
    p.add_argument("--max-new-tokens", type=int, default=64, help="decode length for the dtype choice")
    p.add_argument(
        "--out", default=None, help="folder for profile.json and the plot (default runs/profile-*)"
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="write into an --out folder that holds files draftlab did not write",
    )
    p.set_defaults(func=run)


def _table(title: str, profile: Profile) -> Table:
    curve = profile.curve
    table = Table(title=title)
    table.add_column("context")
    for n in curve.sizes:
        table.add_column(f"N={n}", justify="right")
    for context, row in zip(curve.contexts, curve.ms, strict=True):
        table.add_row(str(context), *(f"{v:.1f}" for v in row))
    prefill = ", ".join(f"{p}: {v:.0f}" for p, v in zip(curve.prefill_lengths, curve.prefill_ms, strict=True))
    table.caption = f"ms per forward pass of N new tokens (median of {profile.repeats}); prefill ms {prefill}"
    return table


def _break_even_table(
    context: int, target: Profile, draft: Profile | None, head: Profile | None = None
) -> Table:
    table = Table(
        title=f"Break-even acceptance α at context {context}: above it, speculation beats plain decoding"
    )
    table.add_column("k", justify="right")
    table.add_column("verify(k+1) / verify(1)", justify="right")
    table.add_column("pld (free drafts)", justify="right")
    seconds = [
        (label, CostModel(target.curve, p.curve))
        for label, p in (("sps (draft passes)", draft), ("eagle (head passes)", head))
        if p is not None
    ]
    for label, _ in seconds:
        table.add_column(label, justify="right")
    free = CostModel(target.curve)
    for k in BREAK_EVEN_KS:
        ratio = free.verify_ms(k + 1, context) / free.verify_ms(1, context)
        cells = [str(k), f"{ratio:.2f}", _alpha(break_even_alpha(free, k, context))]
        cells += [_alpha(break_even_alpha(cost, k, context)) for _, cost in seconds]
        table.add_row(*cells)
    table.caption = "i.i.d. acceptance per token (Leviathan et al.); '-': never pays at this k"
    return table


def _alpha(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def run(args: argparse.Namespace) -> int:
    if args.repeats < 1:
        raise DraftlabError(f"--repeats must be >= 1, got {args.repeats}")
    if args.context < 1:
        raise DraftlabError(f"--context must be >= 1, got {args.context}")
    if args.compile and not registry.get(args.engine).compiles:
        raise DraftlabError(
            "--compile is for the hf engine (compiled transformers passes); llama.cpp runs its own kernels"
        )
    console = Console()
    target_name = args.target or DEFAULT_TARGET
    draft_name = args.draft or (DEFAULT_DRAFT if args.target is None else None)
    device = args.target_device or args.device
    dtypes = candidate_dtypes(target_name, device) if args.dtype == "auto" else [args.dtype]
    hw = hardware(device)
    console.print(f"[bold]{hw['name']}[/] · " + ", ".join(f"{k}: {v}" for k, v in hw.items() if k != "name"))
    out_dir = Path(args.out) if args.out else Path("runs") / f"profile-{time.strftime('%Y%m%d-%H%M%S')}"
    check_folder(out_dir, "--out", args.force, legacy=lambda folder: (folder / "profile.json").is_file())
    results: dict = {"hardware": hw, "profiles": {}, "bandwidth_limit": {}}
    bandwidth = cached_bandwidth(profile_dir(), fingerprint_key(hw)) if device == "cpu" else None
    if bandwidth is not None:
        results["bandwidth"] = dataclasses.asdict(bandwidth)
        console.print(
            f"memory read bandwidth {bandwidth.gb_per_s:.1f} GB/s (torch sum over {bandwidth.buffer_bytes >> 20} MiB, "
            f"{bandwidth.threads} threads)"
        )
    curves = {}
    # Every eager profile first, then the packages: a process that has built or run a package
    # times eager passes differently, and bench's spot check would then measure them again.
    for dtype, models in _settings(args, target_name, draft_name, dtypes, device):
        profiles: dict[str, Profile] = {}
        for role, lm in models:
            profiles[role] = _profile(console, args, results, role, lm, bandwidth, compiled=False)
        curves[dtype] = profiles["target"].curve
        console.print(
            _break_even_table(args.context, profiles["target"], profiles.get("draft"), profiles.get("head"))
        )
    ways = dict.fromkeys(curves, "eager")
    if args.compile:
        isa = hw.get("isa_flags", [])
        for dtype in compile_order(dtypes, results["bandwidth_limit"]):
            skip = compile_skip_reason(dtype, isa) or out_of_reach_reason(
                dtype, results["bandwidth_limit"], curves, ways, bandwidth, args.max_new_tokens
            )
            if skip is not None:
                console.print(f"[dim]no compiled {dtype} package: {skip}[/]")
                results.setdefault("compile_skipped", {})[dtype] = skip
                continue
            target = load_spec(ModelSpec(target_name, dtype, device, args.attn_implementation))
            # The package the default bench will run (one per model serves every context), so that
            # bench builds none: the built-in suite's longest generation at this answer length.
            need = plan_need(target, load_suite("builtin"), args.max_new_tokens, chat=True)
            try:
                compiled = _profile(
                    console, args, results, "target", target, bandwidth, compiled=True, bucket_need=need
                )
                if compiled_wins(curves[dtype], compiled.curve, REFERENCE_PROMPT, args.max_new_tokens):
                    ways[dtype], curves[dtype] = "compiled", compiled.curve  # as bench would run it
            except DraftlabError as error:
                # No package here (no C++ compiler, a model that does not export): the eager
                # profiles still serve, and `draftlab bench` then runs our loop eagerly.
                console.print(f"[yellow]no compiled profile of {target_name} ({dtype}): {error}[/]")
                results.setdefault("compile_failed", {})[dtype] = str(error)
            del target
    if not registry.get(args.engine).reads_weights:
        results["engine"] = args.engine
    else:
        chosen, predicted = pick_dtype(curves, REFERENCE_PROMPT, args.max_new_tokens)
        if ways[chosen] == "compiled" and draft_name is not None:
            _compiled_draft(console, args, results, draft_name, chosen, bandwidth)
        if ways[chosen] == "compiled" and head_name(args) is not None:
            _compiled_head(console, args, results, head_name(args), chosen, bandwidth)
        results["dtype_choice"] = {
            "dtype": chosen,
            "predicted_plain_s": {d: v / 1000 for d, v in predicted.items()},
            "ways": ways,
        }
        console.print(
            f"--dtype auto picks [bold]{chosen} {ways[chosen]}[/]: predicted plain decoding of a {REFERENCE_PROMPT}-token "
            f"prompt + {args.max_new_tokens} tokens: "
            + ", ".join(
                f"{d} {ways[d]} {v / 1000:.2f} s (4 drafts verified at {verify_slope(curves[d]):.2f}× a step)"
                for d, v in predicted.items()
            )
        )
    claim_folder(out_dir, "profile")
    write_text(out_dir / "profile.json", json.dumps(results, indent=1))
    _plot(results, out_dir / "profile.png")
    console.print(f"wrote profile.json and profile.png in {out_dir}")
    return 0


def compile_order(dtypes: list[str], limits: dict) -> list[str]:
    """The dtypes whose packages are built, fewest bytes a step first: the lightest one's measured
    passes can put the heavier ones out of reach before minutes go into building them."""
    return sorted(dtypes, key=lambda d: limits.get(f"target/{d}", {}).get("weight_bytes", float("inf")))


def out_of_reach_reason(
    dtype: str, limits: dict, curves: dict, ways: dict, bandwidth, new_tokens: int
) -> str | None:
    """Why `dtype` needs no package here, or None: reading its weights once a token, at this
    machine's memory bandwidth, would take longer than plain decoding in another dtype is already
    predicted to by more than the tie band (on the Zen5, float32's package took 141 s of a cold
    first run's 14 min 25 s to build, for plain decoding predicted at 1.28 s against the 4-bit
    package's 0.35 s)."""
    weights = limits.get(f"target/{dtype}", {}).get("weight_bytes")
    if bandwidth is None or weights is None:
        return None
    _, predicted = pick_dtype(curves, REFERENCE_PROMPT, new_tokens)
    best = min((d for d in predicted if d != dtype), key=predicted.__getitem__, default=None)
    if best is None:
        return None
    least = least_decoding_ms(weights, bandwidth, new_tokens)
    if not out_of_reach(least, predicted[best]):
        return None
    return (
        f"even at this machine's memory bandwidth ({bandwidth.gb_per_s:.1f} GB/s, with {HEADROOM}x headroom) "
        f"its plain decoding of {new_tokens} tokens would take at least {least / 1000:.2f} s, over "
        f"{best} {ways[best]}'s predicted {predicted[best] / 1000:.2f} s for a {REFERENCE_PROMPT}-token "
        "prompt and as many tokens"
    )


def _compiled_draft(console: Console, args, results: dict, name: str, dtype: str, bandwidth) -> None:
    """The draft's compiled passes, as bench drafts beside the target compiled in `dtype`, in the
    same bucket: so that bench builds no draft package either."""
    device = args.draft_device or args.device
    draft = load_spec(ModelSpec(name, draft_dtype(dtype, device), device, args.attn_implementation))
    if compiles(draft):
        _compiled_beside(console, args, results, "draft", draft, _target(args, dtype), bandwidth)


def _compiled_head(console: Console, args, results: dict, name: str, dtype: str, bandwidth) -> None:
    """The head's compiled passes, as bench drafts with them beside the target compiled in `dtype`
    (bench would otherwise price them by its eager passes: 5.6 ms a pass in float32 on a Zen3)."""
    target = _target(args, dtype)
    head = load_head_lm(name, target)
    if compiles(head):
        _compiled_beside(console, args, results, "head", head, target, bandwidth)


def _target(args, dtype: str):
    device = args.target_device or args.device
    return load_spec(ModelSpec(args.target or DEFAULT_TARGET, dtype, device, args.attn_implementation))


def _compiled_beside(console: Console, args, results: dict, role: str, lm, target, bandwidth) -> None:
    """`lm`'s compiled passes in the bucket bench runs beside `target` in; where no package can be
    built, bench drafts eagerly, priced by the eager profile."""
    need = plan_need(target, load_suite("builtin"), args.max_new_tokens, chat=True)
    try:
        _profile(console, args, results, role, lm, bandwidth, compiled=True, bucket_need=need)
    except DraftlabError as error:
        console.print(f"[yellow]no compiled profile of {lm.spec.name} ({lm.spec.dtype}): {error}[/]")
        results.setdefault("compile_failed", {})[f"{role}/{lm.spec.dtype}"] = str(error)


def _profile(
    console: Console, args, results: dict, role: str, lm, bandwidth, compiled: bool, bucket_need: int = 0
) -> Profile:
    """One model's profile, cached or measured now, printed and recorded in `results`."""
    name = lm.spec.name
    kind = ", compiling its passes first" if compiled else ""
    with console.status(f"profiling {name} ({lm.spec.dtype}{kind})"):
        profile, measured = load_or_measure(
            lm,
            quick=not args.full,
            refresh=args.refresh,
            repeats=args.repeats,
            compiled=compiled,
            bucket_need=bucket_need,
        )
    source = f"measured in {profile.seconds:.0f} s" if measured else f"cached, {profile.measured_at}"
    own_passes = getattr(lm, "cached_model", None) is not None  # another engine's model (llama.cpp's)
    engine = " · compiled" if compiled else (f" · {lm.engine}" if own_passes else "")
    console.print(_table(f"{role} {name} · {lm.spec.dtype}{engine} · {source}", profile))
    key = f"{role}/{lm.spec.dtype}" + ("/compiled" if compiled else "")
    results["profiles"][key] = json.loads(profile.to_json())
    if (args.target_device or args.device) == "cpu":
        results["bandwidth_limit"][key] = _limit(console, lm, profile, bandwidth)
    return profile


def _limit(console: Console, lm, profile: Profile, bandwidth) -> dict:
    """A plain step reads every weight once: the least it can take here, against the measured one."""
    weights = weight_bytes(lm)
    least = limit_ms(weights, bandwidth)
    step = profile.curve.ms[0][0]  # N = 1 at the shortest context
    console.print(
        f"{lm.spec.name} ({lm.spec.dtype}) reads {weights / 1e6:.0f} MB a step: at least {least:.2f} ms; a 1-token "
        f"pass at context {profile.curve.contexts[0]} takes {step:.2f} ms = {step / least:.1f}× that limit"
    )
    return {"weight_bytes": weights, "limit_ms": least, "step_ms": step, "ratio": step / least}


def _settings(args: argparse.Namespace, target_name: str, draft_name: str | None, dtypes, device):
    """(dtype, [(role, model)]) per profiled setting, loaded one at a time: on hf one per dtype; on
    llama.cpp one, in the GGUF's own quantization (a transformers draft beside it in float32)."""
    engine = registry.get(args.engine)
    if not engine.reads_weights:  # the engine's own model, in its own storage
        args.target, args.draft = target_name, draft_name
        target, draft = engine.load_here(args, draft_name is not None)
        yield target.spec.dtype, [("target", target)] + ([("draft", draft)] if draft is not None else [])
        return
    for dtype in dtypes:
        names = [("target", target_name)] + ([("draft", draft_name)] if draft_name else [])
        # A 4-bit target's draft computes in the storage's dtype (or float32 where the CPU emulates
        # it), as bench runs it (plan/roles.load_draft).
        models = [
            (
                role,
                load_spec(
                    ModelSpec(
                        n,
                        dtype if role == "target" else draft_dtype(dtype, device),
                        device,
                        args.attn_implementation,
                    )
                ),
            )
            for role, n in names
        ]
        head = head_name(args)  # the default target's shipped head too: bench would measure it
        if head is not None:  # an EAGLE-3 head beside its target, in the target's dtype
            models.append(("head", load_head_lm(head, models[0][1])))
        yield dtype, models


def _plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(results["profiles"])
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 4), squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        curve = results["profiles"][key]["curve"]
        for context, row in zip(curve["contexts"], curve["ms"], strict=True):
            ax.plot(curve["sizes"], row, marker="o", label=f"context {context}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("new tokens per pass (N)")
        ax.set_ylabel("ms per pass")
        ax.set_title(key)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
