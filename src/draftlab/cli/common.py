"""Arguments shared by the commands that load a target and a draft."""

from __future__ import annotations

import argparse
import math

from rich.console import Console

from draftlab.decode.cost import CostModel
from draftlab.decode.spec import DEFAULTS, REGISTRY, DecoderConfig
from draftlab.drafters.eagle3.io import load_head_lm
from draftlab.errors import DraftlabError
from draftlab.models.compiled import compiled_steps
from draftlab.models.cost_curve import TIE_BAND, Profile, compiled_wins, pick_dtype, verify_slope
from draftlab.models.loading import (
    ATTN_IMPLEMENTATIONS,
    DTYPES,
    STORAGES,
    LoadedModel,
    ModelSpec,
    candidate_dtypes,
    check_compatible,
    compute_dtype,
    load_model,
)
from draftlab.models.profile import (
    FULL_SIZES,
    hand_written,
    load_cached,
    load_or_measure,
    off_band,
    profile_dir,
    profile_path,
    spot_checks_on,
    spot_ratio,
)
from draftlab.sampling import SamplingParams

DEFAULT_TARGET = "smollm2-135m-instruct"
DEFAULT_DRAFT = "smollm2-135m-draft"
DEFAULT_HEAD = "smollm2-135m-eagle3"


def threshold(text: str) -> float:
    if text.lower() in ("inf", "none", "off"):
        return math.inf
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid threshold value: '{text}'") from None


def add_model_args(parser: argparse.ArgumentParser, default_dtype: str = "auto") -> None:
    g = parser.add_argument_group("models")
    g.add_argument(
        "--target",
        "--target_model_name",
        dest="target",
        default=None,
        help=f"hub id, local folder or registry name (default: {DEFAULT_TARGET})",
    )
    g.add_argument(
        "--draft",
        "--approx_model_name",
        dest="draft",
        default=None,
        help=f"draft model (default: {DEFAULT_DRAFT} with the default target)",
    )
    g.add_argument(
        "--head",
        default=None,
        help=f"EAGLE-3 head for eagle and eagle-tree: a speculators-format folder or registry name "
        f"(default: {DEFAULT_HEAD} with the default target)",
    )
    g.add_argument(
        "--dtype",
        choices=[*DTYPES, "auto"],
        default=default_dtype,
        help="dtype of both models; q4_1: the target's linear layers from 4-bit Q4_1 blocks (its GGUF's "
        "own, else quantized here), computing in bfloat16 on the CPU, the draft in bfloat16; auto "
        "(default): the dtype whose plain decoding is fastest on this machine, from its measured cost "
        "profile (q4_1 only where the target's own weights are Q4_1)",
    )
    g.add_argument("--target-dtype", choices=list(DTYPES), default=None)
    g.add_argument("--draft-dtype", choices=list(DTYPES), default=None)
    g.add_argument(
        "--device", default="cpu", help="cpu, cuda, cuda:N or auto (accelerate device_map) for both"
    )
    g.add_argument("--target-device", default=None)
    g.add_argument("--draft-device", default=None, help="e.g. cpu while the target is on cuda")
    g.add_argument("--attn-implementation", choices=list(ATTN_IMPLEMENTATIONS), default=None)


def add_method_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("decoding")
    g.add_argument(
        "--gamma",
        type=int,
        default=DEFAULTS.gamma,
        help="sps: draft tokens per round (γ); with cost-aware sizing the most per round",
    )
    g.add_argument(
        "--fixed-k",
        action="store_true",
        help="sps and pld: draft γ (pld: --pld-tokens) every round instead of sizing each round from "
        "the machine's cost profile and the acceptance so far",
    )
    g.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--max-new-tokens", "--max_tokens", dest="max_new_tokens", type=int, default=64)
    for flag, kind, default, text in (
        ("--fallback-threshold", float, DEFAULTS.fallback_threshold, "BiLD fallback threshold in [0, 1]"),
        (
            "--rollback-threshold",
            threshold,
            DEFAULTS.rollback_threshold,
            "BiLD rollback threshold (> 0, or inf)",
        ),
        ("--max-small-steps", int, DEFAULTS.max_small_steps, "BiLD: most small-model tokens per block"),
        ("--max-ngram", int, DEFAULTS.max_ngram, "PLD: longest n-gram matched"),
        (
            "--pld-tokens",
            int,
            DEFAULTS.pld_tokens,
            "PLD (and suffix, pld-tree): most tokens proposed per path",
        ),
        (
            "--tree-budget",
            int,
            DEFAULTS.tree_budget,
            "tree methods (pld-tree, sps-tree, hybrid, suffix): verify this many tree nodes every round "
            "(default: chosen each round from the machine's cost profile; without a profile, a chain)",
        ),
        (
            "--tree-width",
            int,
            DEFAULTS.tree_width,
            "sps-tree and hybrid: draft candidates per expanded node, and nodes expanded per level",
        ),
    ):
        g.add_argument(flag, type=kind, default=default, help=text)
    g.add_argument(
        "--no-kv-cache", action="store_true", help="recompute the whole sequence every step (ablation)"
    )
    g.add_argument(
        "--exact",
        action="store_true",
        help="our own loop's methods score every position bit for bit as plain decoding does, in every "
        "dtype: each target pass over a static cache, padded to one width measured on this CPU (greedy "
        "output then equals plain decoding's token for token; costs what the padding costs)",
    )
    g.add_argument(
        "--draft-confidence",
        "--assistant-confidence",
        dest="draft_confidence",
        type=float,
        default=DEFAULTS.draft_confidence,
        help="sps and hf-assisted: stop drafting after a token the draft gives less than this probability "
        "(HF's assistant_confidence_threshold, whose default is also 0.4; 0: always draft γ)",
    )


def add_compile_arg(parser: argparse.ArgumentParser, text: str, auto: bool = False) -> None:
    """--compile; with `auto`, --compile / --no-compile and a default (None) that the profiles decide."""
    if auto:
        parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None, help=text)
    else:
        parser.add_argument("--compile", action="store_true", help=text)


def compile_seconds(target: LoadedModel) -> dict[str, dict]:
    """Per static-cache length, the seconds its compiled package took to get ready and whether it
    was built now or loaded, built by an earlier run (models/compiled.py)."""

    steps = compiled_steps(target)
    return {
        str(length): {"seconds": round(t, 1), "package": "loaded" if steps.loaded.get(length) else "built"}
        for length, t in steps.compile_seconds.items()
    }


def sampling_from(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)


def decoder_config(args: argparse.Namespace, method: str, gamma: int | None = None) -> DecoderConfig:
    if args.max_new_tokens < 1:
        raise DraftlabError(f"max_new_tokens must be >= 1, got {args.max_new_tokens}")
    return DecoderConfig(
        method=method,
        gamma=args.gamma if gamma is None else gamma,
        fallback_threshold=args.fallback_threshold,
        rollback_threshold=args.rollback_threshold,
        max_small_steps=args.max_small_steps,
        max_ngram=args.max_ngram,
        pld_tokens=args.pld_tokens,
        use_cache=not args.no_kv_cache,
        draft_confidence=args.draft_confidence,
        fixed_k=args.fixed_k,
        tree_width=args.tree_width,
        tree_budget=args.tree_budget,
        # Exact mode is our own loop's: other engines' methods run as they are.
        exact=args.exact and REGISTRY[method].compilable if method in REGISTRY else args.exact,
    )


def model_names(args: argparse.Namespace, need_draft: bool) -> tuple[str, str | None]:
    target = args.target or DEFAULT_TARGET
    draft = args.draft
    if draft is None and need_draft and args.target is None:
        draft = DEFAULT_DRAFT
    return target, draft


_LOADED: dict[ModelSpec, LoadedModel] = {}  # one load per spec per process (auto profiles several)


def load_spec(spec: ModelSpec) -> LoadedModel:
    if spec not in _LOADED:
        _LOADED[spec] = load_model(spec)
    return _LOADED[spec]


def _status(message: str) -> None:
    Console(stderr=True).print(f"[dim]{message}[/]")


# Profiles spot-checked in this process (models/profile.py, SPOT_BAND).
_SPOT_CHECKED: set = set()


def machine_profile(lm: LoadedModel, compiled: bool = False) -> Profile:
    """The model's cost profile on this machine, measured once and then read from the cache.

    `compiled`: its compiled passes' profile (compiling them, untimed, if this process has not)."""
    cached = load_cached(lm, compiled)
    kind = ", compiled passes" if compiled else ""
    if cached is not None:
        path = profile_path(lm)
        if compiled or hand_written(cached) or not spot_checks_on() or path in _SPOT_CHECKED:
            return cached
        # Once per process, a short plain decode checks that the machine still runs as profiled;
        # a second one confirms a miss before minutes go into measuring again (a head's 2 ms passes
        # once read 0.75x on a quiet first run, minutes after its profile was measured).
        ratio = spot_ratio(lm, cached.curve)
        _SPOT_CHECKED.add(path)
        if off_band(ratio):
            again = spot_ratio(lm, cached.curve)
            ratio = again if abs(math.log(again)) < abs(math.log(ratio)) else ratio
        if not off_band(ratio):
            return cached
        _status(
            f"{lm.spec.name} ({lm.spec.dtype}) now decodes at {ratio:.2f}× the time its cached profile "
            f"predicts (measured {cached.measured_at}, under another load?): profiling it again"
        )
        return load_or_measure(lm, quick=max(cached.curve.sizes) < max(FULL_SIZES), refresh=True)[0]
    _status(
        f"profiling {lm.spec.name} ({lm.spec.dtype}{kind}) on this machine, once: cached in {profile_dir()}"
    )
    return load_or_measure(lm, compiled=compiled)[0]


def resolve_dtype(args: argparse.Namespace, name: str, device: str, attn: str | None) -> str:
    """`--dtype auto`: the dtype whose plain decoding (prefill + decode) is fastest here, by profile."""
    choices = getattr(args, "dtype_choices", None)
    if choices is None:
        choices = args.dtype_choices = {}
    if name in choices:
        return choices[name]["dtype"]
    prompt_tokens = 256
    curves, ways = {}, {}
    # Where bench decides compilation from the profiles (neither --compile nor --no-compile), each
    # dtype is priced the way it would run: compiled where its cached compiled profile wins by the
    # margin bench_compile applies. (On a Zen3, eager bfloat16 beat eager float32, 6.15 s against
    # 7.80, while compiled float32 was predicted 3.51 s and never considered.)
    joint = getattr(args, "compile", False) is None and device == "cpu"
    for dtype in candidate_dtypes(name, device):
        lm = load_spec(ModelSpec(name, dtype, device, attn))
        curves[dtype], ways[dtype] = machine_profile(lm).curve, "eager"
        compiled = load_cached(lm, compiled=True) if joint and lm.engine == "hf" else None
        if compiled is not None and compiled_wins(
            curves[dtype], compiled.curve, prompt_tokens, args.max_new_tokens
        ):
            curves[dtype], ways[dtype] = compiled.curve, "compiled"
    dtype, predicted = pick_dtype(curves, prompt_tokens, args.max_new_tokens)
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
    choices[name] = {
        "dtype": dtype,
        "reason": reason,
        "predicted_s": {d: v / 1000 for d, v in predicted.items()},
        "ways": ways,
    }
    return dtype


def role_spec(args: argparse.Namespace, name: str, role: str, attn: str | None = None) -> ModelSpec:
    device = getattr(args, f"{role}_device") or args.device
    attn = attn or args.attn_implementation
    dtype = getattr(args, f"{role}_dtype") or args.dtype
    if dtype == "auto":
        dtype = resolve_dtype(args, name, device, attn)
    return ModelSpec(name, dtype, device, attn)


def load_role(args: argparse.Namespace, name: str, role: str, attn: str | None = None) -> LoadedModel:
    """Load `name` as the target or a draft, with that role's dtype and device from the CLI."""
    return load_spec(role_spec(args, name, role, attn))


def cost_model(
    args: argparse.Namespace, target: LoadedModel, draft: LoadedModel | None, compiled: bool = False
) -> CostModel | None:
    """The machine's cost model for this pair, or None when rounds are not sized from it.

    `compiled`: the target runs its compiled passes (--compile), which cost otherwise than eager
    ones; the draft stays eager."""
    if getattr(args, "fixed_k", False):
        return None
    return CostModel(machine_profile(target, compiled).curve, machine_profile(draft).curve if draft else None)


def load_draft(
    args: argparse.Namespace, name: str, target: LoadedModel, attn: str | None = None
) -> LoadedModel:
    # With --dtype auto (or a 4-bit --dtype) the draft follows the target's dtype, the one its 4-bit
    # storage computes in, unless --draft-dtype says otherwise: a draft quantized here would be
    # another draft.
    if args.draft_dtype is None and (args.dtype == "auto" or args.dtype in STORAGES):
        dtype = compute_dtype(target.spec.dtype)
        device = args.draft_device or args.device
        draft = load_spec(ModelSpec(name, dtype, device, attn or args.attn_implementation))
    else:
        draft = load_role(args, name, "draft", attn)
    check_compatible(target, draft)
    return draft


def head_name(args: argparse.Namespace) -> str | None:
    head = getattr(args, "head", None)
    return head if head is not None or args.target is not None else DEFAULT_HEAD


def load_head(args: argparse.Namespace, target: LoadedModel, method: str = "eagle"):
    """The EAGLE-3 head beside its loaded target (in the target's dtype), checked to fit it."""

    name = head_name(args)
    if name is None:
        raise DraftlabError(
            f"method '{method}' needs an EAGLE-3 head: pass --head (a speculators-format folder)"
        )
    key = ("head", name, target.spec)
    if key not in _HEADS:
        _HEADS[key] = load_head_lm(name, target)
    return _HEADS[key]


_HEADS: dict = {}


def load_pair(args: argparse.Namespace, need_draft: bool) -> tuple[LoadedModel, LoadedModel | None]:
    target_name, draft_name = model_names(args, need_draft)
    if need_draft and draft_name is None:
        raise DraftlabError("this method needs a draft model: pass --draft")
    target = load_role(args, target_name, "target")
    draft = load_draft(args, draft_name, target) if draft_name is not None else None
    return target, draft
