"""`draftlab bench`: every method on the same prompts, interleaved, with an honest report."""

from __future__ import annotations

import argparse
import dataclasses

from draftlab import engines as registry
from draftlab.bench.runner import Variant, check_contexts, warm_compiled
from draftlab.cli.common import add_compile_arg
from draftlab.cli.engines import (
    add_engine_args,
    check_engine_args,
    check_methods,
    closing,
    engines_of,
    load_models,
)
from draftlab.cli.run_setup import add_run_command_args, execute
from draftlab.decode.build import check_fits
from draftlab.decode.spec import DecoderConfig, method_names
from draftlab.engines.base import BenchRequest
from draftlab.errors import DraftlabError
from draftlab.hardware import fingerprint_key, hardware, peak_rss_mb
from draftlab.models import exact
from draftlab.models.bandwidth import cached_bandwidth, weight_bytes
from draftlab.models.profile import profile_dir
from draftlab.plan.compile import compile_seconds
from draftlab.plan.run_plan import plan_run


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("bench", help="benchmark methods over a prompt suite, per subtask")
    p.add_argument(
        "--methods",
        default=None,
        help=f"comma-separated, from {', '.join(method_names())} (default, per engine: "
        + "; ".join(f"{name}: {registry.get(name).default_methods}" for name in registry.engine_names())
        + ")",
    )
    p.add_argument(
        "--ar-dtypes",
        default="supported",
        help="also run ar in these dtypes (comma-separated), so that 'vs best ar' compares with the "
        "fastest plain decoding here: supported (default: every dtype the device supports) or none; "
        "on llama.cpp, ar also runs on the catalogue target's other storage of its own GGUF and bf16",
    )
    add_compile_arg(
        p,
        "--compile: also run 'ar compiled', 'pld-tree compiled', ... for every method of draftlab's "
        "own loop, chains and token trees: the target's passes of up to 8 tokens through an "
        "AOTInductor package over a static cache (built once per machine, about 1-2 min on 2 cores, "
        "then loaded; untimed; the times are recorded in run.json). --no-compile: eager only. "
        "Default: compiled only (ar both ways) where this machine's compiled profile "
        "(`draftlab profile --compile`) predicts plain decoding at least 10%% faster than eager, else eager",
        auto=True,
    )
    add_engine_args(p)
    add_run_command_args(p, run, lambda args: "bench")


def run(args: argparse.Namespace) -> int:
    engines = engines_of(args)

    def check(chosen: dict[str, list[str]]) -> None:
        # Named methods must run on every engine asked for; the defaults are each engine's own set.
        for engine, names in chosen.items():
            check_methods(names, [engine])
        check_engine_args(args, engines)
        if getattr(args, "compile", None) and not any(registry.get(e).compiles for e in engines):
            raise DraftlabError(
                "--compile is for the hf engine (compiled transformers passes); add hf to --engines"
            )

    weights_read = any(registry.get(e).reads_weights for e in engines)
    plan = plan_run(args, engines, lambda e: registry.get(e).methods(args), check, weights_read)
    configs, sampling, examples = plan.configs, plan.sampling, list(plan.examples)
    needs_draft = plan.needs_draft
    target, draft = load_models(args, engines, needs_draft, plan)
    chosen = {engine: list(names) for engine, names in plan.methods.items()}
    for config in configs.values():
        check_fits(config, target)
    # Before profiling: a draft too short for these prompts is refused now, not mid-run.
    check_contexts(
        [(target, draft if needs_draft else None)], examples, args.max_new_tokens, not args.no_chat
    )
    # Engines not asked for may join a default run: the fastest plain decoding a user has (llama.cpp).
    missing = None  # why a run without an engine misses a comparison a user would expect
    for name in registry.engine_names():
        if name in chosen:
            continue
        engine = registry.get(name)
        why = engine.absent(target)
        if joined := engine.joins(args, engines, target):
            chosen[name] = joined
        elif why:
            missing = why
    extra: dict = {"engines": list(chosen)}
    variants: list[Variant] = []
    baselines: dict[str, str] = {}
    closers: list = []
    block = 1
    predictable = all(registry.get(e).predictable for e in engines)
    for name, names in chosen.items():
        engine = registry.get(name)
        own = {m: configs[m] if engine.compiles else not_exact(configs[m]) for m in names}
        request = BenchRequest(
            args, own, target, draft, sampling, examples, engines, weights_read, predictable, plan=plan
        )
        made = engine.bench_variants(request)
        variants += made.variants
        baselines.update(made.baselines)
        extra.update(made.extra)
        closers.append(made.close)
        examples = made.examples if made.examples is not None else examples
        block = max(block, made.block)
    if missing:
        extra["engines_missing"] = missing
    before = peak_rss_mb()
    if any(v.config.exact or v.config.compile for v in variants):
        warm_compiled(variants, examples, args.max_new_tokens, not args.no_chat, args.quiet)
    if any(v.config.compile for v in variants):
        extra["compile_s"] = compile_record(variants)
        steps = next(v.decoder.target.compiled for v in variants if v.config.compile)
        if steps.single_ms:
            extra["one_token_passes"] = {"padded": steps.pad_single, "ms": steps.single_ms}
        # Peak resident memory with every model loaded, then with the packages loaded and run too.
        extra["peak_rss_mb"] = {"before_packages": before, "with_packages": peak_rss_mb()}
    if any(v.config.exact for v in variants):  # widths measured while warming
        extra["exact"] = {v.label: exact.record(v.decoder.target) for v in variants if v.config.exact}
    if target.spec.device == "cpu":  # a GPU's bandwidth is another measurement
        extra["bandwidth"] = bandwidth_record(variants)
    with closing(closers):
        return execute(
            args,
            "bench",
            variants,
            baselines,
            target,
            draft,
            examples,
            extra,
            block=block,
            chosen=plan.dtypes,
        )


def compile_record(variants: list[Variant]) -> dict | None:
    """Seconds the first pass of each static-cache length took, compile included, if any compiled."""
    compiled = [v.target for v in variants if v.config.compile]
    return compile_seconds(compiled[0]) if compiled else None


def bandwidth_record(variants: list[Variant]) -> dict:
    """The machine's memory read bandwidth and the weight bytes each plain decoding reads per step."""

    measured = cached_bandwidth(profile_dir(), fingerprint_key(hardware("cpu")))
    plain = {v.label: weight_bytes(v.target) for v in variants if not v.config.spec.speculative}
    return {**dataclasses.asdict(measured), "weight_bytes": plain}


def not_exact(config: DecoderConfig) -> DecoderConfig:
    """Another engine's method runs as that engine runs it: exact mode is our own loop's passes."""
    return dataclasses.replace(config, exact=False)
