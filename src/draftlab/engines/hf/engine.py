"""`hf`: draftlab's own loop over transformers models, eager and compiled, and transformers' generate()."""

from __future__ import annotations

import argparse
import dataclasses

from rich.console import Console

from draftlab.bench.runner import Variant
from draftlab.decode.spec import DecoderConfig, MethodSpec, method_names, method_spec
from draftlab.engines.base import BenchRequest, EngineDefaults, EngineVariants
from draftlab.engines.hf import methods
from draftlab.models.cache import local_dir, packaged_problem
from draftlab.models.loading import LoadedModel
from draftlab.models.registry import ENTRIES
from draftlab.plan.budget import fit_budget
from draftlab.plan.compile import CompileChoice, compile_choice
from draftlab.plan.configs import variant_params
from draftlab.plan.dtypes import other_dtypes
from draftlab.plan.profiles import cost_model, load_spec
from draftlab.plan.roles import head_name, load_head, load_pair

DEFAULT_METHODS = "ar,sps,pld,hf-assisted,pld-tree,sps-tree,hybrid,suffix"
DEFAULT_HEAD_METHODS = "eagle,eagle-tree"
# Plain decoding routed per request across the dtype copies, as the cost-aware methods are.
ROUTED_AR = "ar routed"
FAST_AR = "ar not exact"  # plain decoding beside exact mode's, for what exactness costs


class HfEngine(EngineDefaults):
    name = methods.NAME
    help = "draftlab's own decode loop over transformers models (default)"
    default_methods = DEFAULT_METHODS
    reads_weights = True
    compiles = True
    runs_here = True

    def counterpart(self, spec: MethodSpec) -> str | None:
        return methods.counterpart(spec)

    def methods(self, args: argparse.Namespace) -> str:
        """The default set, with the EAGLE-3 methods wherever a head is at hand (the shipped one for
        the default target, or --head), and the methods of any other drafter given by its own
        option (--dflash: dflash, dflash-tree), each sized by cost (k = 0 where drafting does not pay)."""
        given = [
            m
            for m in method_names()
            if (spec := method_spec(m)).head_option not in (None, "head")
            and getattr(args, spec.head_option, None)
            and spec.engine is None  # our loop's
            and m not in DEFAULT_METHODS.split(",")
        ]
        extra = "".join("," + m for m in given)
        name = head_name(args)
        if name is None:
            return DEFAULT_METHODS + extra
        entry = ENTRIES.get(name)
        if entry is not None and entry.kind == "packaged" and packaged_problem(local_dir(entry)):
            return DEFAULT_METHODS + extra  # not shipped in this build
        return DEFAULT_METHODS + "," + DEFAULT_HEAD_METHODS + extra

    def load_pair(self, args, need_draft: bool, engines: list[str], plan=None):
        if self.name not in engines:
            return None
        return load_pair(args, need_draft, plan.dtypes if plan is not None else None)

    def load_here(self, args, need_draft: bool, chosen=None):
        return load_pair(args, need_draft, chosen)

    def bench_variants(self, request: BenchRequest) -> EngineVariants:
        args, target = request.args, request.target
        dtype = request.plan.dtype_choice(target.spec.name) if request.plan is not None else None
        others, skipped = other_dtypes(args, target, dtype)
        compiled = compile_choice(args, target)
        variants = hf_variants(
            args, request.configs, target, request.draft, request.sampling, others, compiled
        )
        extra: dict = {}
        heads = {
            f"{v.draft.spec.name} ({v.config.spec.head_kind.split(' ', 1)[1]})"
            for v in variants
            if v.config.spec.needs_head and v.draft is not None
        }
        if heads:  # each named with its kind: an EAGLE-3 head, a DFlash drafter
            extra["head"] = ", ".join(sorted(heads))
        examples = None
        if request.predictable:
            variants, examples, extra["plan"] = fit_budget(
                args, variants, request.examples, target, dtype, skipped
            )
        # A routed method's speed-up over plain decoding in its own engine is over plain decoding routed alike.
        routed = any(v.label == ROUTED_AR for v in variants)
        baselines = {
            v.label: ROUTED_AR if routed and v.alternatives and v.label != ROUTED_AR else "ar"
            for v in variants
        }
        extra["compile"] = compiled.record()
        if not args.quiet:
            Console(stderr=True).print(f"[dim]compiled passes: {compiled.why}[/]")
        return EngineVariants(variants, baselines, extra, examples)


def hf_variants(
    args,
    configs: dict[str, DecoderConfig],
    target: LoadedModel,
    draft: LoadedModel | None,
    sampling,
    other_dtypes: list[str] = (),
    choice: CompileChoice | None = None,
) -> list[Variant]:
    """Our own loop: every method, plus ar in `other_dtypes` for "vs best ar"; compiled, eager or
    both as `choice` says (default: as the profiles decide).

    EAGLE methods take the head where draft-model methods take the draft: it is their second
    model, profiled and priced the same way."""
    heads = {m: load_head(args, target, m) for m, c in configs.items() if c.spec.needs_head}
    others = [load_spec(dataclasses.replace(target.spec, dtype=d)) for d in other_dtypes]
    costs: dict[int, tuple] = {}  # id(second model) -> its cost model and its routes

    def priced(second: LoadedModel | None) -> tuple:
        if id(second) not in costs:
            cost = cost_model(args.fixed_k, target, second)
            # With --dtype auto, cost-aware methods run each generation in the dtype predicted fastest for it.
            # Not in exact mode: its plain decoding is the baseline in the one dtype it ran.
            routed = (args.target_dtype or args.dtype) == "auto" and not args.exact
            routes = [(o, cost_model(args.fixed_k, o, second)) for o in others] if routed else []
            costs[id(second)] = (cost, routes)
        return costs[id(second)]

    def second_of(config: DecoderConfig) -> LoadedModel | None:
        return heads[config.method] if config.spec.needs_head else draft

    adaptive = any(c.adaptive for c in configs.values())
    choice = choice or compile_choice(args, target)
    variants = []
    for m, config in configs.items():
        if m != "ar" and not choice.eager and config.spec.compilable:
            continue  # runs compiled only (below)
        second = second_of(config)
        params = variant_params(args, config)
        # The cost model prices every method for the budget; plain `ar` takes none (with one it
        # would carry a sizer: see ROUTED_AR below), except in exact mode, which chooses its pass
        # width from it (no routing there, and a sizer of plain decoding never drafts).
        cost, routes = priced(second) if adaptive and (m != "ar" or args.exact) else (None, [])
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
            sized = config.adaptive or (args.exact and m == "ar")
            cost = cost_model(args.fixed_k, target, priced_with, compiled=True) if sized else None
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
