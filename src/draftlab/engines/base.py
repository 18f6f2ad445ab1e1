"""What an engine is to the commands: one object per engine folder (`engines/<name>/engine.py`).

The commands loop over these objects and never name an engine: each says which methods it runs,
offers its own options, loads what it decodes, and builds its variants beside the others'.
`engines/__init__.py` holds the list; `register` adds one from anywhere (a test's toy engine).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from draftlab.audit.runner import Float32Recheck, Recheck
from draftlab.plan.profiles import load_spec

if TYPE_CHECKING:
    from draftlab.bench.runner import Variant
    from draftlab.decode.spec import DecoderConfig, MethodSpec
    from draftlab.models.loading import LoadedModel
    from draftlab.plan.dtypes import DtypeChoice
    from draftlab.plan.run_plan import RunPlan
    from draftlab.sampling import SamplingParams


@dataclass
class BenchRequest:
    """What one engine's variants are built from in `draftlab bench` (or a sweep)."""

    args: argparse.Namespace
    configs: dict[str, DecoderConfig]  # this engine's methods, ar first
    target: LoadedModel
    draft: LoadedModel | None
    sampling: SamplingParams
    examples: list  # the run's prompts so far (an engine that fits the time budget may cut them)
    engines: list[str]  # every engine of the run, by name
    weights_read: bool  # whether the target's transformers weights are loaded (an engine reads them)
    predictable: bool  # whether every engine of the run has cost profiles that predict its times
    concurrent: bool = False  # `sweep concurrency`: many requests at once, each engine's own settings
    plan: RunPlan | None = None  # what the run decided before loading (`draftlab bench`)


@dataclass
class EngineVariants:
    """One engine's part of a run."""

    variants: list[Variant]
    baselines: dict[str, str]  # label -> the label of the plain decoding it is compared with
    extra: dict = field(default_factory=dict)  # what run.json records of this engine
    examples: list | None = None  # the prompts, where this engine cut them to fit the budget
    close: Callable[[], None] | None = None  # servers or pools to stop when the run ends
    # Variants of this engine are run in blocks of this many examples (1: interleaved per example).
    block: int = 1


class Engine(Protocol):
    name: str  # as --engine / --engines names it
    suffix: str  # appended to its labels ("ar@vllm"); "" for our own loop
    help: str  # one line for --engine's help
    default_methods: str  # what `draftlab bench --engines <name>` runs without --methods
    # Whether its decoders read the target's transformers weights (else a tokenizer and config do).
    reads_weights: bool
    predictable: bool  # whether cost profiles predict its times (a run's time budget needs them)
    compiles: bool  # whether it runs our loop's own passes, compiled (--compile) and exact (--exact)
    batches: bool  # whether it serves many requests at once (`sweep concurrency`)
    runs_here: bool  # whether it decodes in this process (`load_here`): generate, profile, audit

    def counterpart(self, spec: MethodSpec) -> str | None:
        """Its own name for this method ("" for plain decoding where it has none), None if it cannot run it."""
        ...

    def add_args(self, group: argparse._ArgumentGroup) -> None:
        """Its own options, in the commands that take --engine."""
        ...

    def check_args(self, args: argparse.Namespace, engines: list[str]) -> None:
        """Refuse a bad option value before anything loads (a one-line DraftlabError)."""
        ...

    def methods(self, args: argparse.Namespace) -> str:
        """The methods it runs by default in this run (default_methods, plus what the run has at hand)."""
        ...

    def load_pair(
        self, args: argparse.Namespace, need_draft: bool, engines: list[str], plan: RunPlan | None
    ) -> tuple[LoadedModel, LoadedModel | None] | None:
        """Target and draft where this engine is the one that loads them (e.g. a GGUF target), else None."""
        ...

    def load_here(
        self, args: argparse.Namespace, need_draft: bool, chosen: Mapping[str, DtypeChoice] | None = None
    ) -> tuple[LoadedModel, LoadedModel | None] | None:
        """Target and draft for a command that decodes in this process (generate, profile, audit);
        None where the engine decodes elsewhere (a server, vLLM). `chosen`: `--dtype auto`'s choices
        made already (an audit records them), by model name."""
        ...

    def joins(self, args: argparse.Namespace, engines: list[str], target: LoadedModel) -> list[str]:
        """Methods it adds to a run that did not name it: the fastest plain decoding a user has."""
        ...

    def absent(self, target: LoadedModel) -> str | None:
        """Why a run without this engine misses a comparison a user would expect (None: it misses none)."""
        ...

    def bench_variants(self, request: BenchRequest) -> EngineVariants: ...

    def recheck(self) -> Recheck:
        """Where `draftlab audit` reruns a greedy difference on this engine (one that runs here)."""
        ...

    def versions(self) -> dict[str, str]:
        """The versions of what it runs on, beside torch's and transformers' in an audit's record."""
        ...

    # Optional: `audit(args, texts, bar) -> (result, audits)`, an engine's own audit where it does not
    # decode in this process (llama-server's drafters against its own plain decoding).
    # `gamma_grid` (sweep gamma), `export_head` and `answerer` (distill) are optional too; `hasattr`
    # finds them.


class EngineDefaults:
    """What most engines answer; an engine subclasses it and overrides what it does otherwise."""

    suffix = ""
    reads_weights = False
    predictable = True
    compiles = False
    batches = False
    runs_here = False  # decodes one generation in this process: generate, profile and audit offer it
    default_methods = "ar"

    def add_args(self, group: argparse._ArgumentGroup) -> None:
        return None

    def check_args(self, args: argparse.Namespace, engines: list[str]) -> None:
        return None

    def methods(self, args: argparse.Namespace) -> str:
        return self.default_methods

    def load_pair(self, args, need_draft: bool, engines: list[str], plan=None):
        return None

    def load_here(self, args, need_draft: bool, chosen=None):
        return None

    def joins(self, args, engines, target) -> list[str]:
        return []

    def absent(self, target) -> str | None:
        return None

    def recheck(self) -> Recheck:
        return Float32Recheck(load_spec)

    def versions(self) -> dict[str, str]:
        return {}
