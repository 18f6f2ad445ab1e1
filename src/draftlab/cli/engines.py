"""`--engine` / `--engines` and the vLLM engine's arguments, shared by `bench` and `sweep`."""

from __future__ import annotations

import argparse
import dataclasses
from contextlib import contextmanager

from draftlab.bench.runner import Variant
from draftlab.cli.common import head_name, model_names
from draftlab.cli.engine_option import add_engine_option
from draftlab.cli.llamacpp_engine import add_llamacpp_args, check_gguf_type
from draftlab.decode.spec import DecoderConfig, method_spec
from draftlab.engines import ENGINES, engines_for
from draftlab.engines.vllm.config import EngineArgs, import_vllm, parse_engine_arg
from draftlab.engines.vllm.engine import EnginePool, VllmDecoder
from draftlab.errors import DraftlabError
from draftlab.models.loading import (
    LoadedModel,
    ModelSpec,
    check_compatible,
    compute_dtype,
    load_model,
    resolve_path,
)
from draftlab.sampling import SamplingParams

VLLM_SUFFIX = "@vllm"  # vllm variants are labelled "ar@vllm", "sps@vllm", ...


def add_engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engines")
    add_engine_option(g, ENGINES)
    g.add_argument("--engines", default=None, help="several engines in one run, e.g. hf,vllm or hf,llamacpp")
    g.add_argument(
        "--server-settings",
        choices=("auto", "default"),
        default="auto",
        help="llama-server: auto (default) chooses each drafter's --spec-draft-n-max by measured cost on "
        "calibration prompts (or no drafting where none pays) and runs llama-server's defaults beside it; "
        "default: its defaults only",
    )
    add_llamacpp_args(g)
    g.add_argument("--speculator", default=None, help="vllm: the folder of an eagle, eagle3 or mtp head")
    g.add_argument("--tensor-parallel-size", type=int, default=1, help="vllm: GPUs per pipeline stage")
    g.add_argument("--pipeline-parallel-size", type=int, default=1, help="vllm: pipeline stages (nodes)")
    g.add_argument(
        "--distributed-executor-backend",
        default=None,
        help="vllm: mp (one machine) or ray (a Ray cluster); default: vLLM's choice",
    )
    g.add_argument(
        "--vllm-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="vllm: any other LLM argument, VALUE parsed as JSON (repeatable), e.g. max_model_len=2048; "
        "speculative_config={...} is merged into each method's own",
    )
    g.add_argument(
        "--vllm-alive",
        type=int,
        default=0,
        help="vllm: LLMs (one per method) kept alive at once; 0 (default): all, alternating per "
        "example; fewer: blocks of --vllm-block examples per method in turn (A B A B ...)",
    )
    g.add_argument("--vllm-block", type=int, default=4, help="vllm: examples per block when rotating")


def engines_of(args: argparse.Namespace) -> list[str]:
    names = [e.strip() for e in args.engines.split(",") if e.strip()] if args.engines else [args.engine]
    for name in names:
        if name not in ENGINES:
            raise DraftlabError(f"unknown engine '{name}' (choose from {', '.join(ENGINES)})")
    if not names:
        raise DraftlabError("empty --engines list")
    return list(dict.fromkeys(names))


def check_methods(methods: list[str], engines: list[str]) -> None:
    """A method an engine lacks is refused before anything loads."""
    for engine in engines:
        for method in methods:
            on_engines = engines_for(method_spec(method))
            if engine not in on_engines:
                on = ", ".join(on_engines)
                raise DraftlabError(
                    f"method '{method}' is not available on engine {engine} (it runs on: {on})"
                )


def engine_args(args: argparse.Namespace):
    extra = dict(parse_engine_arg(text) for text in args.vllm_arg)
    return EngineArgs(
        args.tensor_parallel_size, args.pipeline_parallel_size, args.distributed_executor_backend, extra
    )


def check_engine_args(args: argparse.Namespace, engines: list[str]) -> None:
    """Engine arguments are checked before anything loads, whichever engines run."""
    engine_args(args)
    check_gguf_type(args)
    if args.vllm_alive < 0:
        raise DraftlabError(f"--vllm-alive must be >= 0, got {args.vllm_alive}")
    if args.vllm_block < 1:
        raise DraftlabError(f"--vllm-block must be >= 1, got {args.vllm_block}")
    if "vllm" in engines:
        import_vllm()


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


def vllm_dtype(args: argparse.Namespace, target: LoadedModel, hf_ran: bool) -> str:
    """The hf engine's dtype when it runs too (the same arithmetic on both), else --dtype or vLLM's auto."""
    if hf_ran or (args.target_dtype or args.dtype) != "auto":
        # Our 4-bit storage is our engine's: vLLM runs the checkpoint in the dtype it computes in.
        return compute_dtype(target.spec.dtype)
    return "auto"


def vllm_variants(
    args: argparse.Namespace,
    configs: dict[str, DecoderConfig],
    target: LoadedModel,
    draft: LoadedModel | None,
    sampling: SamplingParams,
    params_of,
    dtype: str,
):
    """One variant per method, each with its own `LLM` from one pool; and the pool (to close)."""
    warm = target.tokenizer("Hello, how are you?")["input_ids"]
    pool = EnginePool(target.path, target.path, dtype, args.seed, engine_args(args), args.vllm_alive, warm)
    variants = []
    for method, config in configs.items():
        decoder = VllmDecoder(
            pool,
            config,
            target.tokenizer,
            sorted(target.eos_token_ids),
            draft.path if (draft is not None and config.spec.needs_draft) else None,
            speculator_of(args, config),
        )
        params = {**params_of(config), "engine": "vllm", "vllm": pool.args.record(), "vllm_dtype": dtype}
        if decoder.speculative is not None:
            params["speculative_config"] = decoder.speculative
        uses_draft = draft if config.spec.needs_draft else None
        variants.append(
            Variant(method + VLLM_SUFFIX, config, target, uses_draft, sampling, params, _decoder=decoder)
        )
    # Build the LLMs that stay alive now, so that a bad engine argument stops the run before it writes.
    alive = variants if not pool.max_alive else variants[: pool.max_alive]
    pool.at_once = len(alive)
    try:
        for variant in alive:
            variant.decoder.llm  # noqa: B018 - builds it
    except BaseException:
        pool.close()
        raise
    if dtype == "auto":  # the weightless copies report the dtype vLLM chose (run.json, records)
        for lm in (target, draft):
            if lm is not None:
                lm.spec = dataclasses.replace(lm.spec, dtype=pool.dtype)
    return variants, pool


def speculator_of(args: argparse.Namespace, config: DecoderConfig) -> str | None:
    """--speculator, or for our EAGLE methods the head's folder (--head, or the shipped one)."""
    if args.speculator or not config.spec.needs_head:
        return args.speculator

    name = head_name(args)
    return resolve_path(name) if name else None


@contextmanager
def closing(pool):
    try:
        yield pool
    finally:
        if pool is not None:
            pool.close()
