"""A run's plan: what the parsed arguments and this machine's cached profiles decide before the
first generation. One function makes it; every later step reads it, none writes back."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from draftlab.decode.spec import DecoderConfig, method_spec
from draftlab.plan.configs import decoder_config, parse_list, sampling_from
from draftlab.plan.dtypes import DtypeChoice, dtype_choices
from draftlab.plan.prompts import suite_examples
from draftlab.plan.roles import model_names
from draftlab.sampling import SamplingParams


@dataclass(frozen=True)
class RunPlan:
    engines: tuple[str, ...]  # as asked for (engines that join a default run are the engines' call)
    methods: Mapping[str, tuple[str, ...]]  # per engine, plain decoding first
    configs: Mapping[str, DecoderConfig]  # per method
    sampling: SamplingParams
    examples: tuple  # the suite's prompts (the time budget may cut them later)
    dtypes: Mapping[str, DtypeChoice]  # `--dtype auto`'s choice, per model name
    needs_draft: bool

    def dtype_choice(self, name: str) -> DtypeChoice | None:
        return self.dtypes.get(name)


def plan_run(
    args: argparse.Namespace,
    engines: list[str],
    methods_of: Callable[[str], str],
    check: Callable[[dict[str, list[str]]], None],
    weights_read: bool,
) -> RunPlan:
    """`methods_of(engine)`: the engine's default methods where --methods names none; `check`
    refuses what the engines cannot run before anything loads; `weights_read`: an engine of the
    run loads the target's weights, so `--dtype auto` chooses a dtype (from loaded models' profiles)."""
    chosen = {}
    for engine in engines:
        names = parse_list(args.methods if args.methods is not None else methods_of(engine), str, "method")
        if "ar" not in names:
            names.insert(0, "ar")  # speed-ups are always measured against AR on the same engine
        chosen[engine] = names
    methods = list(dict.fromkeys(m for names in chosen.values() for m in names))
    configs = {m: decoder_config(args, m) for m in methods}
    sampling = sampling_from(args)
    # An unknown name is refused here, before the engines' own check can misname it.
    needs_draft = any([method_spec(m).needs_draft for m in methods])
    check(chosen)
    examples = tuple(suite_examples(args))
    target = model_names(args, needs_draft)[0]
    choices = dtype_choices(args, target) if weights_read else {}
    per_engine = {engine: tuple(names) for engine, names in chosen.items()}
    return RunPlan(tuple(engines), per_engine, configs, sampling, examples, choices, needs_draft)
