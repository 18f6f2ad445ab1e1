"""`draftlab bench`'s llama.cpp variants: plain decoding (and the methods asked for) on the target's own GGUF
and on its exported storages, beside our loop's."""

from __future__ import annotations

import argparse

from draftlab.bench.runner import Variant
from draftlab.cli import llamacpp_engine
from draftlab.cli.common import (
    cost_model,
)
from draftlab.cli.run_setup import (
    variant_params,
)
from draftlab.decode.build import check_fits
from draftlab.decode.spec import DecoderConfig
from draftlab.engines.llamacpp.load import load_llamacpp
from draftlab.engines.llamacpp.model import is_llamacpp_source
from draftlab.errors import DraftlabError
from draftlab.models.loading import LoadedModel
from draftlab.models.registry import ENTRIES

LLAMACPP_SUFFIX = "@llamacpp"  # llama.cpp variants are labelled "ar@llamacpp", "pld@llamacpp", ...


def gguf_file_target(args: argparse.Namespace, engines: list[str]) -> bool:
    """Whether --target names a .gguf file for a llama.cpp-only run; any other engine needs the
    target as transformers loads it (a catalogue name or a Hugging Face folder)."""

    name = args.target or ""
    if not name or name in ENTRIES or not is_llamacpp_source(name):
        return False
    if engines != ["llamacpp"]:
        raise DraftlabError(
            f"--target '{name}' is a GGUF file, which only the llamacpp engine runs; "
            f"got --engines {','.join(engines)}"
        )
    return True


def default_llamacpp(args: argparse.Namespace, engines: list[str], target: LoadedModel) -> list[str]:
    """The default run adds llama.cpp's plain decoding of the target's own GGUF when llama.cpp is
    installed: "vs best ar" must count the fastest plain decoding a CPU user has."""
    if args.engines is not None or engines != ["hf"] or args.methods is not None:
        return []
    if target.spec.device != "cpu" or not llamacpp_engine.installed():
        return []
    return ["ar"] if is_llamacpp_source(target.spec.name) else []


def gguf_target(args: argparse.Namespace, target, storage: str):
    """The target as llama.cpp runs it: itself when it is a GGUF, else its catalogue GGUF in `storage`."""
    if target.engine == "llamacpp":
        return target
    tokenizer = args.tokenizer or target.tokenizer
    return load_llamacpp(target.spec.name, tokenizer=tokenizer, n_ctx=args.n_ctx, storage=storage)


def llamacpp_variants(
    args: argparse.Namespace,
    configs: dict[str, DecoderConfig],
    target: LoadedModel,
    draft: LoadedModel | None,
    sampling,
) -> tuple[list[Variant], dict]:
    """The methods on llama.cpp: our loop over the GGUF target, with the transformers draft for sps."""

    tokenizer = args.tokenizer or target.tokenizer
    gguf = gguf_target(args, target, llamacpp_engine.resolve_storage(args, target.spec.name))
    variants = []
    costs: dict[int, object] = {}  # id(draft) -> the cost model of llama.cpp's target beside it
    for method, config in configs.items():
        check_fits(config, gguf)
        params = {**variant_params(args, config), "engine": "llamacpp", "quantization": gguf.spec.dtype}
        uses_draft = draft if config.needs_draft else None
        cost = None
        if config.adaptive:
            if id(uses_draft) not in costs:
                costs[id(uses_draft)] = cost_model(args, gguf, uses_draft)
            cost = costs[id(uses_draft)]
        variants.append(Variant(method + LLAMACPP_SUFFIX, config, gguf, uses_draft, sampling, params, cost))
    for storage in other_storages(args, gguf):
        plain = load_llamacpp(target.spec.name, tokenizer=tokenizer, n_ctx=args.n_ctx, storage=storage)
        params = {
            **variant_params(args, configs["ar"]),
            "engine": "llamacpp",
            "quantization": plain.spec.dtype,
        }
        label = f"ar{LLAMACPP_SUFFIX} {plain.spec.dtype}"
        variants.append(Variant(label, configs["ar"], plain, None, sampling, params))
    choice = (getattr(args, "storage_choices", None) or {}).get(target.spec.name)
    return variants, {
        "gguf": gguf.path,
        "quantization": gguf.spec.dtype,
        "threads": gguf.threads,
        "storage": gguf.spec.storage,
        "storage_choice": choice["reason"] if choice else None,
    }


def other_storages(args: argparse.Namespace, gguf) -> list[str]:
    """Where llama.cpp runs a catalogue target from its own GGUF or its BF16 copy, "vs best ar" counts
    plain decoding on the other too (unless --ar-dtypes none): the same weights, other kernels, and on
    our CPUs neither is fastest everywhere (BF16 prefills faster, Q4_1 decodes faster)."""

    pair = llamacpp_engine.AUTO_CANDIDATES  # the two that compete: the shipped file, the BF16 copy
    if args.ar_dtypes == "none" or gguf.spec.name not in ENTRIES or gguf.spec.storage not in pair:
        return []
    return [s for s in pair if s != gguf.spec.storage]
