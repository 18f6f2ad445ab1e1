"""The target, the draft and a head (EAGLE-3, DFlash), loaded by role with the dtype and device asked for."""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from draftlab.decode.spec import method_spec
from draftlab.errors import DraftlabError
from draftlab.models.loading import (
    STORAGES,
    LoadedModel,
    ModelSpec,
    check_compatible,
    draft_dtype,
    load_model,
)
from draftlab.plan.dtypes import DtypeChoice, choose_dtype
from draftlab.plan.profiles import load_spec

Choices = Mapping[str, DtypeChoice] | None

DEFAULT_TARGET = "smollm2-135m-instruct"
DEFAULT_DRAFT = "smollm2-135m-draft"
DEFAULT_HEAD = "smollm2-135m-eagle3"


def model_names(args: argparse.Namespace, need_draft: bool) -> tuple[str, str | None]:
    target = args.target or DEFAULT_TARGET
    draft = args.draft
    if draft is None and need_draft and args.target is None:
        draft = DEFAULT_DRAFT
    return target, draft


def role_spec(
    args: argparse.Namespace, name: str, role: str, attn: str | None = None, chosen: Choices = None
) -> ModelSpec:
    """`chosen`: the run plan's `--dtype auto` choices by model name (else chosen here)."""
    device = getattr(args, f"{role}_device") or args.device
    attn = attn or args.attn_implementation
    dtype = getattr(args, f"{role}_dtype") or args.dtype
    if dtype == "auto":
        choice = (chosen or {}).get(name) or choose_dtype(args, name, device, attn)
        dtype = choice.dtype
    return ModelSpec(name, dtype, device, attn)


def load_role(
    args: argparse.Namespace, name: str, role: str, attn: str | None = None, chosen: Choices = None
) -> LoadedModel:
    """Load `name` as the target or a draft, with that role's dtype and device from the CLI."""
    return load_spec(role_spec(args, name, role, attn, chosen))


def load_draft(
    args: argparse.Namespace, name: str, target: LoadedModel, attn: str | None = None
) -> LoadedModel:
    # With --dtype auto (or a 4-bit --dtype) the draft follows the target's dtype, the one its 4-bit
    # storage computes in (float32 where the CPU only emulates that), unless --draft-dtype says
    # otherwise: a draft quantized here would be another draft.
    if args.draft_dtype is None and (args.dtype == "auto" or args.dtype in STORAGES):
        device = args.draft_device or args.device
        dtype = draft_dtype(target.spec.dtype, device)
        draft = load_spec(ModelSpec(name, dtype, device, attn or args.attn_implementation))
    else:
        draft = load_role(args, name, "draft", attn)
    check_compatible(target, draft)
    return draft


def head_name(
    args: argparse.Namespace, option: str = "head", default: str | None = DEFAULT_HEAD
) -> str | None:
    """The head `option` names, else `default` (the head shipped for the default target) when the
    target is the default one."""
    head = getattr(args, option, None)
    return head if head is not None or args.target is not None else default


def load_head(args: argparse.Namespace, target: LoadedModel, method: str = "eagle"):
    """The head `method` drafts with (its drafter names the option and the loader), beside its
    loaded target in the target's dtype, checked to fit it."""
    spec = method_spec(method)
    name = head_name(args, spec.head_option, spec.head_default)
    if name is None:
        flag = "--" + spec.head_option.replace("_", "-")
        raise DraftlabError(f"method '{method}' needs {spec.head_kind}: pass {flag}")
    key = (spec.head_loader, name, target.spec)
    if key not in _HEADS:
        _HEADS[key] = spec.load_head(name, target)
    return _HEADS[key]


_HEADS: dict = {}


def load_pair(
    args: argparse.Namespace, need_draft: bool, chosen: Choices = None
) -> tuple[LoadedModel, LoadedModel | None]:
    target_name, draft_name = model_names(args, need_draft)
    if need_draft and draft_name is None:
        raise DraftlabError("this method needs a draft model: pass --draft")
    target = load_role(args, target_name, "target", chosen=chosen)
    draft = load_draft(args, draft_name, target) if draft_name is not None else None
    return target, draft


def load_shells(args: argparse.Namespace, need_draft: bool) -> tuple[LoadedModel, LoadedModel | None]:
    """Target and draft without their weights (tokenizer, config, end tokens): vLLM holds the weights."""
    target_name, draft_name = model_names(args, need_draft)
    if need_draft and draft_name is None:
        raise DraftlabError("this method needs a draft model: pass --draft")
    dtype = args.target_dtype or (args.dtype if args.dtype != "auto" else "float32")
    target = load_model(ModelSpec(target_name, dtype), weights=False)
    draft = None
    if draft_name is not None:
        draft = load_model(ModelSpec(draft_name, args.draft_dtype or dtype), weights=False)
        check_compatible(target, draft)
    return target, draft
