"""`llama-server`: llama.cpp's server, started and stopped by draftlab one at a time, its plain
decoding and its own drafters, beside our loop's variants in the same report."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
from pathlib import Path

import torch
from rich.console import Console

from draftlab.bench.records import RUN_FILE
from draftlab.bench.runner import Variant
from draftlab.decode.spec import DecoderConfig, MethodSpec, method_spec
from draftlab.distill.config import package_data
from draftlab.engines.base import BenchRequest, EngineDefaults, EngineVariants
from draftlab.engines.llama_server import methods
from draftlab.engines.llama_server.answers import ServerAnswers, answer_gguf
from draftlab.engines.llama_server.audit import run_server_audit
from draftlab.engines.llama_server.binary import find_server, server_binary
from draftlab.engines.llama_server.convert import head_gguf
from draftlab.engines.llama_server.decoder import LlamaServerDecoder, ServerPool
from draftlab.engines.llama_server.methods import NAME, NOT_RUN
from draftlab.engines.llama_server.server_args import (
    DEFAULT_METHODS,
    default_methods,
    method_server_args,
    server_methods,
    server_target,
)
from draftlab.engines.llama_server.tuning import (
    Calibration,
    calibrate,
    candidates_for,
    length_args,
    plain_rates,
)
from draftlab.errors import DraftlabError
from draftlab.files import read_text_file
from draftlab.models.loading import LoadedModel, resolve_path
from draftlab.models.prompting import encode_prompt
from draftlab.plan.configs import decoder_config, variant_params
from draftlab.plan.profiles import machine_profile
from draftlab.plan.prompts import held_out_examples
from draftlab.plan.roles import load_shells
from draftlab.progress import progress_bar

SUFFIX = "@" + NAME
# Beside a trained head, per kind: -md FOLDER/head-eagle3-bf16.gguf --spec-type draft-eagle3
# (head-dflash-bf16.gguf: --spec-type draft-dflash).
HEAD_GGUF = "head-{kind}-bf16.gguf"
DEFAULTS_SUFFIX = " default"  # the same drafter at llama-server's own settings, beside the chosen ones
CALIBRATION_TOKENS = 64  # at most: the run's --max-new-tokens if fewer
CALIBRATION_PER_SUBTASK = 2


def _calibration_prompts(lm, subtasks: list[str], held_out: list) -> tuple[dict[str, list[list[int]]], str]:
    """CALIBRATION_PER_SUBTASK prompts per subtask, as token ids after the chat template, and where
    they came from: the suite's own held-out examples of that subtask (the run measures none of
    them), else packaged distillation prompts of its category (none is in a benchmark suite); for
    a run whose subtasks have neither, distillation prompts of every category (the pooled choice
    serves it)."""
    chosen: dict[str, list[list[int]]] = {}
    for example in held_out:
        chosen.setdefault(example.subtask, []).append(encode_prompt(lm, example.turns[0], chat=True))
    rows = [
        json.loads(line)
        for line in read_text_file(package_data("distill_prompts.jsonl"), "calibration prompts").splitlines()
        if line
    ]
    categories = {row["category"] for row in rows}
    wanted = {s for s in subtasks if s not in chosen} & categories
    if not chosen and not wanted:
        wanted = categories
    for row in rows:
        if row["category"] not in wanted:
            continue
        group = chosen.setdefault(row["category"], [])
        if len(group) < CALIBRATION_PER_SUBTASK:
            text = row["turns"][0] if "turns" in row else row["prompt"]
            group.append(encode_prompt(lm, text, chat=True))
    where = "the suite's held-out examples" if held_out else "packaged distillation prompts"
    if held_out and wanted:
        where += f" (distillation prompts for {', '.join(sorted(wanted))})"
    return chosen, where


def _earlier_settings(args: argparse.Namespace) -> dict[str, dict]:
    """The choices a resumed run made before: a resumed run keeps them rather than calibrate again
    (a second calibration may choose otherwise, and the records so far ran with the first)."""
    if not getattr(args, "resume", False):
        return {}
    path = Path(args.out) / RUN_FILE
    try:
        extra = json.loads(path.read_text()).get("extra") or {}
    except (OSError, ValueError):
        return {}
    return (extra.get("llama_server") or {}).get("settings") or {}


def _pool(args: argparse.Namespace, gguf, binary: Path) -> ServerPool:
    log = Path(args.out) / "llama-server.log"
    return ServerPool(binary, Path(gguf.path), torch.get_num_threads(), gguf.context_length, log)


def grid_variants(
    args: argparse.Namespace,
    methods: list[str],
    target,
    draft,
    sampling,
    gammas: list[int],
    p_mins: list[float] | None,
) -> tuple[list[Variant], ServerPool, dict]:
    """`draftlab sweep gamma --engine llama-server`: each drafter with its drafts capped at γ tokens
    (its own knob: tuning.length_args) and, for a draft model or head, at each --spec-draft-p-min,
    beside the plain server, for users who want the whole grid."""
    binary = server_binary()
    gguf = server_target(args, target)
    pool = _pool(args, gguf, binary)
    plain = decoder_config(args, "ar")
    base = {"engine": NAME, "quantization": gguf.spec.dtype}
    variants = [
        _variant(pool, "ar" + SUFFIX, plain, gguf, sampling, {**variant_params(args, plain), **base}, [], "-")
    ]
    for method in methods:
        spec_args = method_server_args(method, args, target, draft, binary)
        kind = methods.counterpart(method_spec(method))
        takes_p_min = "draft-" in kind
        for gamma in gammas:
            length = length_args(kind, gamma)
            for p_min in p_mins if takes_p_min and p_mins else [None]:
                config = decoder_config(args, method, gamma=gamma)
                extra = [*(length or [])]
                label = f"{method}{SUFFIX}" + (f" γ={gamma}" if length is not None else " (fixed 8)")
                if p_min is not None:
                    extra += ["--spec-draft-p-min", f"{p_min:g}"]
                    label += f" p-min={p_min:g}"
                params = {**variant_params(args, config), **base, "gamma": gamma, "p_min": p_min}
                variants.append(
                    _variant(pool, label, config, gguf, sampling, params, [*spec_args, *extra], "grid")
                )
            if length is None:
                break  # ngram-cache drafts a fixed 8 tokens: one variant
    record = {"binary": str(binary), "model": str(gguf.path), "threads": pool.threads}
    record["cost_curve"] = _cost_curve(gguf)
    return variants, pool, record


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
    subtasks: list[str] | None = None,
    held_out: list | None = None,
    settings: str | None = None,
) -> tuple[list[Variant], dict]:
    """`subtasks`: the run's, which the settings are calibrated for; `held_out`: examples of the
    suite the run does not measure, to calibrate on."""
    binary = server_binary()
    gguf = server_target(args, target)
    pool = _pool(args, gguf, binary)
    threads = pool.threads
    variants = []
    tuning: dict[str, dict] = {}
    calibration, source = (
        _calibration_prompts(gguf, subtasks or [], held_out or [])
        if (settings or args.server_settings) == "auto"
        else ({}, "")
    )
    earlier = _earlier_settings(args)
    plain: dict[str, float] | None = None
    tokens = min(args.max_new_tokens, CALIBRATION_TOKENS)
    for method, config in configs.items():
        kind = methods.counterpart(method_spec(method))
        spec_args = method_server_args(method, args, target, draft, binary)
        base = {**variant_params(args, config), "engine": NAME, "quantization": gguf.spec.dtype}

        if not kind or not calibration:
            variants.append(
                _variant(
                    pool, method + SUFFIX, config, gguf, sampling, base, spec_args, "llama-server defaults"
                )
            )
            continue
        if method in earlier:
            chosen = Calibration.from_dict(earlier[method])
        else:
            with progress_bar(
                "[bold]calibrate llama-server[/]", console=Console(stderr=True), disable=args.quiet
            ) as bar:
                candidates = candidates_for(kind)
                task = bar.add_task(f"{method}: settings", total=len(candidates) + (plain is None))
                if plain is None:
                    plain = plain_rates(pool, gguf.tokenizer, calibration, tokens)
                    bar.advance(task)
                chosen = calibrate(
                    pool,
                    spec_args,
                    gguf.tokenizer,
                    calibration,
                    tokens,
                    plain,
                    candidates,
                    on_candidate=lambda: bar.advance(task),  # noqa: B023 - used within this iteration
                )
                bar.update(task, completed=bar.tasks[task].total)  # candidates past the best: not run
        tuning[method] = chosen.to_dict()
        decoder = LlamaServerDecoder(
            pool,
            chosen.server_args(spec_args, None),
            gguf.tokenizer,
            per_subtask=functools.partial(chosen.server_args, spec_args),
        )
        params = {**base, "server_settings": "chosen by cost per subtask"}
        variants.append(Variant(method + SUFFIX, config, gguf, None, sampling, params, _decoder=decoder))
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
        "calibration": f"{sum(map(len, calibration.values()))} prompts ({CALIBRATION_PER_SUBTASK} per "
        f"subtask) from {source}, {tokens} new tokens each"
        if calibration
        else None,
        "cost_curve": _cost_curve(gguf),
    }
    return variants, {"record": record, "pool": pool}


def _cost_curve(gguf) -> dict:
    """The llama.cpp cost curve of the file the server runs (the same ggml kernels), as measured for
    our loop over it: the report prices each server round's verification with it."""
    return dataclasses.asdict(machine_profile(gguf).curve)


def _pruned(head: Path) -> bool:
    try:
        config = json.loads((head / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(config.get("draft_vocab_size")) and config["draft_vocab_size"] < config.get("vocab_size", 0)


class LlamaServerEngine(EngineDefaults):
    name = NAME
    suffix = SUFFIX
    help = (
        "llama.cpp's server, started and stopped by draftlab, one at a time, with its own drafters "
        "(ngram-mod, ngram-simple, ngram-map-k, ngram-cache; sps: draft-simple with our draft, eagle: "
        "draft-eagle3 with our head) on the target's BF16 copy (scripts/install-llamacpp.sh builds it)"
    )
    default_methods = DEFAULT_METHODS
    batches = True
    takes_gguf = True  # a user's .gguf target, draft and EAGLE-3 head, as they are

    def counterpart(self, spec: MethodSpec) -> str | None:
        return methods.counterpart(spec)

    def add_args(self, group: argparse._ArgumentGroup) -> None:
        group.add_argument(
            "--server-settings",
            choices=("auto", "default"),
            default="auto",
            help="llama-server: auto (default) chooses each drafter's --spec-draft-n-max by measured cost "
            "on calibration prompts (or no drafting where none pays) and runs llama-server's defaults "
            "beside it; default: its defaults only",
        )

    def methods(self, args: argparse.Namespace) -> str:
        return default_methods(args)

    def bench_variants(self, request: BenchRequest) -> EngineVariants:
        args, examples = request.args, request.examples
        if request.concurrent:
            # llama-server's own settings: the choice by cost is made one request at a time, and a
            # busy server is what the sweep asks about.
            variants, made = server_variants(
                args, request.configs, request.target, request.draft, request.sampling, settings="default"
            )
            extra = {
                "llama_server": made["record"],
                "interleaving": "methods alternate level by level (one server at a time, -np = level)",
            }
            return EngineVariants(variants, {}, extra, close=made["pool"].close)
        subtasks = list(dict.fromkeys(e.subtask for e in examples))
        held_out = held_out_examples(args, examples, CALIBRATION_PER_SUBTASK)
        variants, made = server_variants(
            args, request.configs, request.target, request.draft, request.sampling, subtasks, held_out
        )
        baselines = {v.label: "ar" + SUFFIX for v in variants}
        return EngineVariants(variants, baselines, {"llama_server": made["record"]}, close=made["pool"].close)

    def audit(self, args: argparse.Namespace, texts: list[str], bar) -> tuple[dict, list]:
        """Its drafters' greedy tokens against its own plain decoding (engines/llama_server/audit.py)."""
        return run_server_audit(args, texts, bar)

    def gamma_grid(self, args, sampling, examples, gammas: list[int], p_mins: list[float] | None):
        """`draftlab sweep gamma --engine llama-server`: the whole grid (grid_variants), and the
        target and draft it was built for."""
        methods = server_methods(args)
        need_draft = any(method_spec(m).needs_draft for m in methods)
        target, draft = load_shells(args, need_draft)
        variants, pool, record = grid_variants(args, methods, target, draft, sampling, gammas, p_mins)
        baselines = {v.label: variants[0].label for v in variants}
        return EngineVariants(variants, baselines, {"llama_server": record}, close=pool.close), target, draft

    def answerer(
        self, target: str, dtype: str, max_new_tokens: int, max_len: int, work: Path, required: bool = False
    ):
        """`draftlab distill --answers-with`: a function that starts llama-server to answer for
        `target` (engines/llama_server/answers.py), or None where llama-server is not built (an
        error where it was asked for by name)."""
        server = server_binary() if required else find_server()
        if server is None:
            return None

        def start() -> ServerAnswers:
            gguf = answer_gguf(target, dtype, server)
            return ServerAnswers(
                server, gguf, max_new_tokens, max_len + max_new_tokens, work / "llama-server.log"
            )

        return start

    def export_head(self, head: Path, target: str, kind: str = "eagle3") -> dict[str, str | None]:
        """A trained head (an EAGLE-3 head, a DFlash drafter) as a GGUF for llama-server's
        draft-eagle3 or draft-dflash, beside it, where llama-server is built (its converter comes
        with it); a failed conversion is a warning: the head itself is done."""
        server = find_server()
        if server is None:
            return {"gguf": None}
        if kind == "dflash" and _pruned(head):
            Console(stderr=True).print(
                "[yellow]warning:[/] the DFlash drafter was not converted for llama-server: llama.cpp's "
                "DFlash converter reads full-vocabulary drafters only (train without --draft-vocab)"
            )
            return {"gguf": None}
        try:
            out = head / HEAD_GGUF.format(kind=kind)
            return {"gguf": str(head_gguf(str(head), resolve_path(target), server, out, kind))}
        except DraftlabError as exc:
            Console(stderr=True).print(
                f"[yellow]warning:[/] the head was not converted for llama-server: {exc}"
            )
            return {"gguf": None}
