"""Arguments shared by the commands that load a target and a draft."""

from __future__ import annotations

import argparse
import math

from draftlab.decode.methods import DecoderConfig
from draftlab.errors import DraftlabError
from draftlab.models.loading import (
    ATTN_IMPLEMENTATIONS,
    DTYPES,
    LoadedModel,
    ModelSpec,
    check_compatible,
    load_model,
)
from draftlab.sampling import SamplingParams

DEFAULT_TARGET = "smollm2-135m-instruct"
DEFAULT_DRAFT = "smollm2-135m-draft"


def threshold(text: str) -> float:
    if text.lower() in ("inf", "none", "off"):
        return math.inf
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid threshold value: '{text}'") from None


def add_model_args(parser: argparse.ArgumentParser, default_dtype: str = "bfloat16") -> None:
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
    g.add_argument("--dtype", choices=list(DTYPES), default=default_dtype, help="dtype of both models")
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
    g.add_argument("--gamma", type=int, default=4, help="draft tokens per verification (γ)")
    g.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--max-new-tokens", "--max_tokens", dest="max_new_tokens", type=int, default=64)
    g.add_argument("--fallback-threshold", type=float, default=0.6, help="BiLD fallback threshold in [0, 1]")
    g.add_argument(
        "--rollback-threshold", type=threshold, default=5.0, help="BiLD rollback threshold (> 0, or inf)"
    )
    g.add_argument("--max-small-steps", type=int, default=10, help="BiLD: most small-model tokens per block")
    g.add_argument("--max-ngram", type=int, default=3, help="PLD: longest n-gram matched")
    g.add_argument("--pld-tokens", type=int, default=10, help="PLD: most tokens proposed per round")
    g.add_argument(
        "--no-kv-cache", action="store_true", help="recompute the whole sequence every step (ablation)"
    )
    g.add_argument(
        "--draft-confidence",
        "--assistant-confidence",
        dest="draft_confidence",
        type=float,
        default=0.4,
        help="sps and hf-assisted: stop drafting after a token the draft gives less than this probability "
        "(HF's assistant_confidence_threshold, whose default is also 0.4; 0: always draft γ)",
    )


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
    )


def model_names(args: argparse.Namespace, need_draft: bool) -> tuple[str, str | None]:
    target = args.target or DEFAULT_TARGET
    draft = args.draft
    if draft is None and need_draft and args.target is None:
        draft = DEFAULT_DRAFT
    return target, draft


def load_role(args: argparse.Namespace, name: str, role: str, attn: str | None = None) -> LoadedModel:
    """Load `name` as the target or a draft, with that role's dtype and device from the CLI."""
    dtype = getattr(args, f"{role}_dtype") or args.dtype
    device = getattr(args, f"{role}_device") or args.device
    return load_model(ModelSpec(name, dtype, device, attn or args.attn_implementation))


def load_draft(
    args: argparse.Namespace, name: str, target: LoadedModel, attn: str | None = None
) -> LoadedModel:
    draft = load_role(args, name, "draft", attn)
    check_compatible(target, draft)
    return draft


def load_pair(args: argparse.Namespace, need_draft: bool) -> tuple[LoadedModel, LoadedModel | None]:
    target_name, draft_name = model_names(args, need_draft)
    if need_draft and draft_name is None:
        raise DraftlabError("this method needs a draft model: pass --draft")
    target = load_role(args, target_name, "target")
    draft = load_draft(args, draft_name, target) if draft_name is not None else None
    return target, draft
