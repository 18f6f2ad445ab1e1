"""`--engine` / `--engines` and every engine's own options, shared by `bench` and `sweep`; the
commands loop over the engine objects (engines/base.py) and never name one."""

from __future__ import annotations

import argparse
from contextlib import contextmanager

from draftlab import engines as registry
from draftlab.cli.engine_option import add_engine_option
from draftlab.decode.spec import method_spec
from draftlab.engines.base import Engine
from draftlab.errors import DraftlabError
from draftlab.models.loading import LoadedModel
from draftlab.plan.roles import load_shells
from draftlab.plan.run_plan import RunPlan


def add_engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engines")
    add_engine_option(g, registry.engine_names())
    g.add_argument("--engines", default=None, help="several engines in one run, e.g. hf,vllm or hf,llamacpp")
    for engine in _engines():
        engine.add_args(g)


def _engines() -> list[Engine]:
    return [registry.get(name) for name in registry.engine_names()]


def engines_of(args: argparse.Namespace) -> list[str]:
    names = [e.strip() for e in args.engines.split(",") if e.strip()] if args.engines else [args.engine]
    for name in names:
        registry.get(name)  # an unknown name is one line
    if not names:
        raise DraftlabError("empty --engines list")
    return list(dict.fromkeys(names))


def check_methods(methods: list[str], engines: list[str]) -> None:
    """A method an engine lacks is refused before anything loads."""
    for engine in engines:
        for method in methods:
            on_engines = registry.engines_for(method_spec(method))
            if engine not in on_engines:
                on = ", ".join(on_engines)
                raise DraftlabError(
                    f"method '{method}' is not available on engine {engine} (it runs on: {on})"
                )


def check_engine_args(args: argparse.Namespace, engines: list[str]) -> None:
    """Engine arguments are checked before anything loads, whichever engines run."""
    for engine in _engines():
        engine.check_args(args, engines)


def load_models(
    args: argparse.Namespace, engines: list[str], need_draft: bool, plan: RunPlan | None = None
) -> tuple[LoadedModel, LoadedModel | None]:
    """Target and draft as the run's engines need them: loaded by the engine that claims them (one
    that runs a file of its own first), else without their weights (tokenizer, config, end tokens)."""
    for engine in sorted(_engines(), key=lambda e: e.reads_weights):
        pair = engine.load_pair(args, need_draft, engines, plan)
        if pair is not None:
            return pair
    return load_shells(args, need_draft)


@contextmanager
def closing(closers: list):
    try:
        yield closers
    finally:
        for close in closers:
            if close is not None:
                close()
