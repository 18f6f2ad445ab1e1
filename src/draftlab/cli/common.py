"""Arguments shared by the commands that load a target and a draft."""

from __future__ import annotations

import argparse

from draftlab.decode.spec import DEFAULTS, declared_settings
from draftlab.models.loading import (
    ATTN_IMPLEMENTATIONS,
    DTYPES,
)

DEFAULT_TARGET = "smollm2-135m-instruct"
DEFAULT_DRAFT = "smollm2-135m-draft"
DEFAULT_HEAD = "smollm2-135m-eagle3"


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
        "own, else quantized here), computing in bfloat16 on the CPU, the draft (and an EAGLE head) from "
        "8-bit Q8_0 blocks quantized here where bfloat16 is native, else in float32; q8_0: every matrix "
        "from Q8_0 blocks quantized here (a quantized model, labelled so); auto "
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
    g.add_argument(
        "--tree-budget",
        type=int,
        default=DEFAULTS.tree_budget,
        help="tree methods (pld-tree, sps-tree, hybrid, suffix): verify this many tree nodes every round "
        "(default: chosen each round from the machine's cost profile; without a profile, a chain)",
    )
    for setting in declared_settings():  # each drafter's own, declared with its rows
        g.add_argument(
            setting.flag,
            *setting.aliases,
            dest=setting.name,
            type=setting.type,
            default=setting.default,
            help=setting.help.replace("%", "%%"),
        )
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


def add_compile_arg(parser: argparse.ArgumentParser, text: str, auto: bool = False) -> None:
    """--compile; with `auto`, --compile / --no-compile and a default (None) that the profiles decide."""
    if auto:
        parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None, help=text)
    else:
        parser.add_argument("--compile", action="store_true", help=text)
