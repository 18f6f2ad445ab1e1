"""`draftlab bench --engines ...,llama-server`: llama-server's plain decoding and its drafters, one
server at a time, beside our loop's variants in the same report."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from rich.console import Console

from draftlab.bench.runner import Variant
from draftlab.cli.bench_llamacpp import gguf_target
from draftlab.cli.common import head_name
from draftlab.cli.run_setup import variant_params
from draftlab.decode.spec import DecoderConfig, method_spec
from draftlab.distill.config import package_data
from draftlab.engines import counterpart
from draftlab.engines.llama_server.binary import server_binary
from draftlab.engines.llama_server.convert import head_gguf
from draftlab.engines.llama_server.decoder import LlamaServerDecoder, ServerPool
from draftlab.engines.llama_server.methods import NAME, NOT_RUN
from draftlab.engines.llama_server.tuning import N_MAX_CANDIDATES, calibrate, plain_rate
from draftlab.engines.llamacpp.export import export_gguf
from draftlab.engines.llamacpp.load import locate
from draftlab.engines.llamacpp.model import OWN_STORAGE
from draftlab.errors import DraftlabError
from draftlab.files import read_text_file
from draftlab.models.cache import home
from draftlab.models.loading import LoadedModel, ModelSpec, load_model, resolve_path
from draftlab.models.prompting import encode_prompt
from draftlab.progress import progress_bar

SUFFIX = "@" + NAME
DEFAULT_METHODS = "ar,ngram-mod,ngram-simple,ngram-map-k,ngram-cache"


def default_methods(args: argparse.Namespace) -> str:
    """llama.cpp's n-gram drafters, and our draft (draft-simple) and EAGLE-3 head (draft-eagle3) where
    they are at hand: the shipped ones for the default target, or --draft and --head."""
    extra = []
    if args.target is None or getattr(args, "draft", None):
        extra.append("sps")
    if head_name(args):
        extra += ["eagle", "eagle+ngram-mod"]
    return ",".join([DEFAULT_METHODS, *extra])


# What the server runs a catalogue target from: its BF16 copy, whose verification of several tokens is
# cheap on CPUs (docs/engines.md), unless --gguf-type names another storage.
DEFAULT_STORAGE = "bf16"
DEFAULTS_SUFFIX = " default"  # the same drafter at llama-server's own settings, beside the chosen ones
CALIBRATION_TOKENS = 64  # at most: the run's --max-new-tokens if fewer


def _calibration_prompts(lm) -> list[list[int]]:
    """One packaged distillation prompt per subtask (none is in a benchmark suite)."""
    rows = [
        json.loads(line)
        for line in read_text_file(package_data("distill_prompts.jsonl"), "calibration prompts").splitlines()
        if line
    ]
    first = {}
    for row in rows:
        first.setdefault(row["category"], row["turns"][0] if "turns" in row else row["prompt"])
    return [encode_prompt(lm, text, chat=True) for text in first.values()]


def draft_gguf(name: str, reference: Path) -> Path:
    """Our transformers draft as a BF16 GGUF for llama-server's draft-simple, written once."""
    out = home() / "gguf" / f"{Path(name).name}-bf16.gguf"
    if not out.is_file():
        Console(stderr=True).print(
            f"[dim]writing the draft {name} as a bf16 GGUF for llama-server (once): {out}[/]"
        )
        export_gguf(load_model(ModelSpec(name, dtype="float32")), out, reference, "bf16")
    return out


def _variant(
    pool, label: str, config, lm, sampling, base: dict, server_args: list[str], settings: str
) -> Variant:
    params = {**base, "server_args": server_args, "server_settings": settings}
    decoder = LlamaServerDecoder(pool, server_args, lm.tokenizer)
    return Variant(label, config, lm, None, sampling, params, _decoder=decoder)


def server_variants(
    args: argparse.Namespace,
    configs: dict[str, DecoderConfig],
    target: LoadedModel,
    draft: LoadedModel | None,
    sampling,
) -> tuple[list[Variant], dict]:
    binary = server_binary()
    storage = args.gguf_type if args.gguf_type not in (OWN_STORAGE, "auto") else DEFAULT_STORAGE
    gguf = gguf_target(args, target, storage)
    threads = torch.get_num_threads()
    pool = ServerPool(
        binary, Path(gguf.path), threads, gguf.context_length, Path(args.out) / "llama-server.log"
    )
    variants = []
    tuning: dict[str, dict] = {}
    calibration = _calibration_prompts(gguf) if args.server_settings == "auto" else []
    plain_tok_s = None
    tokens = min(args.max_new_tokens, CALIBRATION_TOKENS)
    for method, config in configs.items():
        kind = counterpart(NAME, method_spec(method))
        spec_args: list[str] = [] if not kind else ["--spec-type", kind]
        if kind == "draft-simple":
            if draft is None:
                raise DraftlabError(f"method '{method}' on llama-server needs a draft model (--draft)")
            spec_args += ["-md", str(draft_gguf(draft.spec.name, locate(target.spec.name)[0]))]
        elif kind and "draft-eagle3" in kind.split(","):
            head = head_name(args)
            if head is None:
                raise DraftlabError(f"method '{method}' on llama-server needs an EAGLE-3 head (--head)")
            spec_args += ["-md", str(head_gguf(resolve_path(head), resolve_path(target.spec.name), binary))]
        base = {**variant_params(args, config), "engine": NAME, "quantization": gguf.spec.dtype}

        if not kind or not calibration:
            variants.append(
                _variant(
                    pool, method + SUFFIX, config, gguf, sampling, base, spec_args, "llama-server defaults"
                )
            )
            continue
        with progress_bar(
            "[bold]calibrate llama-server[/]", console=Console(stderr=True), disable=args.quiet
        ) as bar:
            task = bar.add_task(f"{method}: n-max", total=len(N_MAX_CANDIDATES) + (plain_tok_s is None))
            if plain_tok_s is None:
                plain_tok_s = plain_rate(pool, gguf.tokenizer, calibration, tokens)
                bar.advance(task)
            chosen = calibrate(
                pool,
                spec_args,
                gguf.tokenizer,
                calibration,
                tokens,
                plain_tok_s,
                on_candidate=lambda: bar.advance(task),  # noqa: B023 - used within this iteration
            )
        tuning[method] = chosen.to_dict()
        label = "chosen by cost" if chosen.chosen else "chosen by cost: no drafting pays"
        variants.append(_variant(pool, method + SUFFIX, config, gguf, sampling, base, chosen.chosen, label))
        variants.append(
            _variant(
                pool,
                method + SUFFIX + DEFAULTS_SUFFIX,
                config,
                gguf,
                sampling,
                base,
                spec_args,
                "llama-server defaults",
            )
        )
    record = {
        "binary": str(binary),
        "model": str(gguf.path),
        "threads": threads,
        "n_ctx": gguf.context_length,
        "not_run": {k: f"needs {v}, which draftlab does not have yet" for k, v in NOT_RUN.items()},
        "settings": tuning,
        "calibration": f"{len(calibration)} packaged distillation prompts, {tokens} new tokens each"
        if calibration
        else None,
    }
    return variants, {"record": record, "pool": pool}
