"""`draftlab sweep`: drafts × γ, BiLD thresholds, draft confidence, temperature, and the ablation."""

from __future__ import annotations

import argparse
import dataclasses

from draftlab import engines as registry
from draftlab.bench.runner import Variant, check_contexts
from draftlab.cli import engines as engine_cli
from draftlab.cli.run_setup import add_run_command_args, execute
from draftlab.decode.build import check_fits
from draftlab.decode.spec import method_spec
from draftlab.drafters.draft_model.methods import threshold
from draftlab.engines.base import BenchRequest
from draftlab.errors import DraftlabError
from draftlab.plan.configs import decoder_config, parse_list, sampling_from, variant_params
from draftlab.plan.dtypes import dtype_choices
from draftlab.plan.profiles import cost_model
from draftlab.plan.prompts import suite_examples
from draftlab.plan.roles import load_draft, load_pair, load_role, load_shells, model_names
from draftlab.sampling import SamplingParams

KINDS = ("gamma", "bild", "confidence", "temperature", "ablation", "sizing", "tree", "concurrency")
TREE_METHODS = "pld-tree,sps-tree,hybrid,suffix"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "sweep", help="sweep drafts × γ, BiLD thresholds, temperature, or run the ablation"
    )
    p.add_argument(
        "kind", choices=KINDS, help="sizing: sps and pld with a fixed k against cost-aware rounds, in one run"
    )
    p.add_argument("--drafts", default=None, help="gamma: comma-separated drafts (default: --draft)")
    p.add_argument(
        "--gammas",
        default="1,2,3,4,6,8",
        help="gamma: values of γ (llama-server: each drafter's own length cap, e.g. --spec-draft-n-max)",
    )
    p.add_argument(
        "--p-mins",
        default=None,
        help="gamma on llama-server: values of --spec-draft-p-min, crossed with --gammas (default: its own)",
    )
    p.add_argument("--fallbacks", default="0.5,0.6,0.7", help="bild: fallback thresholds")
    p.add_argument("--rollbacks", default="3,4,5", help="bild: rollback thresholds")
    p.add_argument(
        "--confidences",
        default="0,0.2,0.4,0.6",
        help="confidence: draft-confidence thresholds, each run by sps and hf-assisted",
    )
    p.add_argument("--temperatures", default="0,1", help="temperature: values")
    p.add_argument("--budgets", default="4,8,16,32,64", help="tree: fixed node budgets per round")
    p.add_argument("--tree-methods", default=TREE_METHODS, help="tree: the tree methods to sweep")
    p.add_argument("--method", default="sps", help="temperature / ablation: the speculative method")
    p.add_argument("--concurrency", default="1,4,16,64", help="concurrency: requests submitted at once")
    p.add_argument(
        "--methods",
        default=None,
        help="concurrency: the methods (ar is always run; default ar,pld,sps on vllm, llama-server's "
        "drafters on llama-server)",
    )
    engine_cli.add_engine_args(p)
    add_run_command_args(p, run, lambda args: "ablation" if args.kind == "ablation" else f"sweep-{args.kind}")


def run(args: argparse.Namespace) -> int:
    # Sweeps over γ, τ, thresholds and the ablation compare settings, so every round drafts the
    # setting's full length; the temperature sweep keeps the default cost-aware sizing.
    if args.kind not in ("temperature", "sizing"):
        args.fixed_k = True
    engines = engine_cli.engines_of(args)
    grid = registry.get(engines[0]) if len(engines) == 1 else None
    on_grid = args.kind == "gamma" and grid is not None and hasattr(grid, "gamma_grid")
    if args.kind != "concurrency" and not on_grid and (args.engine != registry.DEFAULT or args.engines):
        raise DraftlabError(
            f"sweep {args.kind} runs on the {registry.DEFAULT} engine only (sweep concurrency takes a batching engine: "
            f"--engine {' or '.join(_batching())}; sweep gamma also takes --engine "
            f"{' or '.join(n for n in registry.engine_names() if hasattr(registry.get(n), 'gamma_grid'))})"
        )
    examples = suite_examples(args)
    sampling = sampling_from(args)
    if on_grid:
        return _engine_grid(args, grid, examples, sampling)
    if args.kind == "concurrency":
        return _concurrency(args, examples, sampling)
    # `--dtype auto` decides once, before anything loads; every model of the sweep reads it.
    chosen = dtype_choices(args, model_names(args, need_draft=False)[0])
    base = decoder_config(args, "ar")
    if args.kind == "gamma":
        gammas = parse_list(args.gammas, int, "gamma")
        if args.drafts:
            target = load_role(args, model_names(args, need_draft=False)[0], "target", chosen=chosen)
            drafts = [load_draft(args, name, target) for name in parse_list(args.drafts, str, "draft")]
        else:
            target, draft = load_pair(args, True, chosen)
            drafts = [draft]
        variants = [Variant("ar", base, target, None, sampling, variant_params(args, base))]
        for d in drafts:
            for g in gammas:
                cfg = decoder_config(args, "sps", gamma=g)
                label = f"sps γ={g}" if len(drafts) == 1 else f"sps {d.spec.name} γ={g}"
                variants.append(Variant(label, cfg, target, d, sampling, variant_params(args, cfg)))
        baselines = {v.label: "ar" for v in variants}
        return execute(
            args,
            "sweep-gamma",
            variants,
            baselines,
            target,
            drafts[0],
            examples,
            {"gammas": gammas},
            chosen=chosen,
        )
    if args.kind == "bild":
        fallbacks = parse_list(args.fallbacks, float, "fallback")
        rollbacks = [threshold(x) for x in parse_list(args.rollbacks, str, "rollback")]
        target, draft = load_pair(args, True, chosen)
        variants = [Variant("ar", base, target, None, sampling, variant_params(args, base))]
        for fb in fallbacks:
            for rb in rollbacks:
                cfg = decoder_config(args, "bild").with_options(fallback_threshold=fb, rollback_threshold=rb)
                variants.append(
                    Variant(
                        f"bild fb={fb:g} rb={rb:g}", cfg, target, draft, sampling, variant_params(args, cfg)
                    )
                )
        return _against_ar(args, "sweep-bild", variants, target, draft, examples, chosen)
    if args.kind == "confidence":
        confidences = parse_list(args.confidences, float, "confidence")
        target, draft = load_pair(args, True, chosen)
        variants = [Variant("ar", base, target, None, sampling, variant_params(args, base))]
        for tau in confidences:
            for method in ("sps", "hf-assisted"):
                cfg = decoder_config(args, method).with_options(draft_confidence=tau)
                variants.append(
                    Variant(f"{method} τ={tau:g}", cfg, target, draft, sampling, variant_params(args, cfg))
                )
        return _against_ar(args, "sweep-confidence", variants, target, draft, examples, chosen)
    if args.kind == "temperature":
        temperatures = parse_list(args.temperatures, float, "temperature")
        cfg = decoder_config(args, args.method)
        target, draft = load_pair(args, cfg.needs_draft, chosen)
        check_contexts([(target, draft)], examples, args.max_new_tokens, not args.no_chat)
        cost = cost_model(args.fixed_k, target, draft if cfg.needs_draft else None) if cfg.adaptive else None
        variants, baselines = [], {}
        for t in temperatures:
            params = SamplingParams(t, args.top_k, args.top_p, args.seed)
            ar_label = f"ar T={t:g}"
            variants.append(Variant(ar_label, base, target, None, params, variant_params(args, base)))
            variants.append(
                Variant(f"{args.method} T={t:g}", cfg, target, draft, params, variant_params(args, cfg), cost)
            )
            baselines[ar_label] = ar_label
            baselines[f"{args.method} T={t:g}"] = ar_label
        return execute(args, "sweep-temperature", variants, baselines, target, draft, examples, chosen=chosen)
    if args.kind == "sizing":
        return _sizing(args, examples, sampling, chosen)
    if args.kind == "tree":
        return _tree(args, examples, sampling, chosen)
    if args.kind == "concurrency":
        return _concurrency(args, examples, sampling)
    return _ablation(args, examples, sampling, chosen)


def _against_ar(args, kind: str, variants, target, draft, examples, chosen: dict, extra=None) -> int:
    """Run a sweep whose every variant is compared with plain decoding (`ar`)."""
    baselines = {v.label: "ar" for v in variants}
    return execute(args, kind, variants, baselines, target, draft, examples, extra, chosen=chosen)


def _sizing(args: argparse.Namespace, examples, sampling: SamplingParams, chosen: dict) -> int:
    """sps and pld with a fixed k and with cost-aware rounds, in one interleaved run."""
    target, draft = load_pair(args, True, chosen)
    check_contexts([(target, draft)], examples, args.max_new_tokens, not args.no_chat)
    base = decoder_config(args, "ar")
    cost = cost_model(args.fixed_k, target, draft)
    variants = [Variant("ar", base, target, None, sampling, variant_params(args, base))]
    for method in ("sps", "pld"):
        for fixed in (True, False):
            cfg = dataclasses.replace(decoder_config(args, method), fixed_k=fixed)
            label = f"{method} {'fixed k' if fixed else 'cost-aware'}"
            variants.append(
                Variant(
                    label, cfg, target, draft, sampling, variant_params(args, cfg), None if fixed else cost
                )
            )
    return _against_ar(args, "sweep-sizing", variants, target, draft, examples, chosen)


def _tree(args: argparse.Namespace, examples, sampling: SamplingParams, chosen: dict) -> int:
    """Each tree method at each fixed node budget, against ar, in one interleaved run."""
    budgets = parse_list(args.budgets, int, "budget")
    methods = parse_list(args.tree_methods, str, "method")
    for method in methods:
        if not method_spec(method).tree:
            raise DraftlabError(f"'{method}' is not a tree method (tree methods: {TREE_METHODS})")
    for budget in budgets:
        if budget < 1:
            raise DraftlabError(f"tree budget must be >= 1, got {budget}")
    need_draft = any(method_spec(m).needs_draft for m in methods)
    target, draft = load_pair(args, need_draft, chosen)
    check_contexts([(target, draft)], examples, args.max_new_tokens, not args.no_chat)
    for method in methods:
        check_fits(decoder_config(args, method), target)
    base = decoder_config(args, "ar")
    variants = [Variant("ar", base, target, None, sampling, variant_params(args, base))]
    for method in methods:
        for budget in budgets:
            cfg = dataclasses.replace(decoder_config(args, method), tree_budget=budget)
            variants.append(
                Variant(f"{method} n={budget}", cfg, target, draft, sampling, variant_params(args, cfg))
            )
    extra = {"budgets": budgets, "methods": methods}
    return _against_ar(args, "sweep-tree", variants, target, draft, examples, chosen, extra)


def _batching() -> list[str]:
    return [name for name in registry.engine_names() if registry.get(name).batches]


def _concurrency(args: argparse.Namespace, examples, sampling: SamplingParams) -> int:
    """Each method with 1, 4, 16, ... requests submitted at once, through a batching engine."""
    engines = engine_cli.engines_of(args)
    if len(engines) != 1 or not registry.get(engines[0]).batches:
        raise DraftlabError(
            f"sweep concurrency needs --engine {' or '.join(_batching())}: the hf engine decodes one "
            "request at a time"
        )
    levels = parse_list(args.concurrency, int, "concurrency")
    for level in levels:
        if level < 1:
            raise DraftlabError(f"concurrency must be >= 1, got {level}")
    engine = registry.get(engines[0])
    if args.methods is None:
        args.methods = engine.methods(args)
    methods = parse_list(args.methods, str, "method")
    for m in methods:
        method_spec(m)
    if "ar" not in methods:
        methods.insert(0, "ar")
    engine_cli.check_methods(methods, engines)
    engine_cli.check_engine_args(args, engines)
    configs = {m: decoder_config(args, m) for m in methods}
    need_draft = any(c.needs_draft for c in configs.values())
    target, draft = load_shells(args, need_draft)
    request = BenchRequest(
        args, configs, target, draft, sampling, examples, engines, False, False, concurrent=True
    )
    made = engine.bench_variants(request)
    extra = {"engines": engines, **made.extra, "levels": levels}
    with engine_cli.closing([made.close]):
        return execute(
            args, "sweep-concurrency", made.variants, {}, target, draft, examples, extra, levels=levels
        )


def _engine_grid(args: argparse.Namespace, engine, examples, sampling: SamplingParams) -> int:
    """An engine's drafters with drafts capped at each γ (by each drafter's own setting) and, with
    --p-mins, a draft model or head at each --spec-draft-p-min."""
    gammas = parse_list(args.gammas, int, "gamma")
    for gamma in gammas:
        if gamma < 1:
            raise DraftlabError(f"gamma must be >= 1, got {gamma}")
    p_mins = parse_list(args.p_mins, float, "p-min") if args.p_mins else None
    for p_min in p_mins or []:
        if not 0 <= p_min <= 1:
            raise DraftlabError(f"p-min must be in [0, 1], got {p_min}")
    made, target, draft = engine.gamma_grid(args, sampling, examples, gammas, p_mins)
    extra = {"engines": [engine.name], **made.extra, "gammas": gammas, "p_mins": p_mins}
    with engine_cli.closing([made.close]):
        return execute(args, "sweep-gamma", made.variants, made.baselines, target, draft, examples, extra)


def _ablation(args: argparse.Namespace, examples, sampling: SamplingParams, chosen: dict) -> int:
    """Seed 003's "combining methods": KV cache × attention implementation × speculative decoding."""
    target_name, draft_name = model_names(args, need_draft=True)
    if draft_name is None:
        raise DraftlabError("the ablation needs a draft model: pass --draft")
    variants, baselines = [], {}
    plain = "ar no-cache eager"
    first_target = first_draft = None
    for attn in ("eager", "sdpa"):
        target = load_role(args, target_name, "target", attn, chosen)
        draft = load_draft(args, draft_name, target, attn)
        first_target, first_draft = first_target or target, first_draft or draft
        for use_cache in (False, True):
            for method in ("ar", args.method):
                cfg = dataclasses.replace(decoder_config(args, method), use_cache=use_cache)
                label = f"{method} {'cache' if use_cache else 'no-cache'} {attn}"
                params = variant_params(args, cfg, attn_implementation=attn)
                variants.append(Variant(label, cfg, target, draft, sampling, params))
                baselines[label] = plain
    return execute(args, "ablation", variants, baselines, first_target, first_draft, examples, chosen=chosen)
