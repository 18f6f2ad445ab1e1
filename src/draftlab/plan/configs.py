"""Decoder settings and sampling parameters from the arguments, and the parameters a variant records."""

from __future__ import annotations

import argparse

from draftlab.decode.spec import REGISTRY, DecoderConfig, declared_settings
from draftlab.errors import DraftlabError
from draftlab.sampling import SamplingParams


def sampling_from(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)


def decoder_config(args: argparse.Namespace, method: str, gamma: int | None = None) -> DecoderConfig:
    if args.max_new_tokens < 1:
        raise DraftlabError(f"max_new_tokens must be >= 1, got {args.max_new_tokens}")
    return DecoderConfig(
        method=method,
        gamma=args.gamma if gamma is None else gamma,
        use_cache=not args.no_kv_cache,
        fixed_k=args.fixed_k,
        tree_budget=args.tree_budget,
        # Exact mode is our own loop's: other engines' methods run as they are.
        exact=args.exact and REGISTRY[method].compilable if method in REGISTRY else args.exact,
        options=tuple((s.name, getattr(args, s.name)) for s in declared_settings() if hasattr(args, s.name)),
    )


def parse_list(text: str, kind, name: str) -> list:
    try:
        values = [kind(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        raise DraftlabError(f"invalid {name} list: '{text}'") from None
    if not values:
        raise DraftlabError(f"empty {name} list")
    return values


def variant_params(args: argparse.Namespace, config, **extra) -> dict:
    params = {
        **config.settings(),
        "attn_implementation": args.attn_implementation or "default",
        "top_k": args.top_k,
        "top_p": args.top_p,
    }
    params.update(extra)
    return params
