"""Run method variants over a prompt suite, interleaved per example, writing each result at once.

For every example (and repeat) the variants run one after another, A B C, A B C, ..., so that
they share the machine's drift. Each finished generation is appended to results.jsonl and
flushed, so an interrupted run loses nothing and `resume` skips what is already there.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from draftlab.bench.records import RESULTS_FILE, RUN_FILE, Record, RunInfo, read_records
from draftlab.bench.suites import Example
from draftlab.decode.build import build_decoder, compiled_passes, warm_compiled_passes
from draftlab.decode.cost import CostModel
from draftlab.decode.spec import Decoder, DecoderConfig
from draftlab.decode.timing import collector_paused
from draftlab.errors import DraftlabError
from draftlab.files import write_text
from draftlab.models.compiled import RESERVE
from draftlab.models.loading import LoadedModel, check_context
from draftlab.models.prompting import Message, encode_prompt
from draftlab.progress import progress_bar
from draftlab.sampling import SamplingParams


@dataclass
class Variant:
    """One column of the comparison: a method with its settings and models."""

    label: str
    config: DecoderConfig
    target: LoadedModel
    draft: LoadedModel | None
    sampling: SamplingParams
    params: dict = field(default_factory=dict)
    cost: CostModel | None = None  # the machine's cost model: cost-aware methods size rounds from it
    # Copies of the target in other dtypes, with their cost models: routed per generation.
    alternatives: list[tuple[LoadedModel, CostModel]] = field(default_factory=list)
    _decoder: Decoder | None = None

    @property
    def decoder(self) -> Decoder:
        if self._decoder is None:
            self._decoder = build_decoder(
                self.config,
                self.target,
                self.draft if self.config.needs_draft else None,
                self.cost,
                self.alternatives,
            )
        return self._decoder


@dataclass
class BenchPlan:
    variants: list[Variant]
    examples: list[Example]
    max_new_tokens: int
    chat: bool = True
    repeats: int = 1
    warmup: int = 1
    baselines: dict[str, str] = field(default_factory=dict)  # label -> the label it is compared with
    # Examples per block: 1 alternates the variants per example (A B C, A B C, ...); more runs each
    # variant over a block of examples in turn (for engines that hold one model per variant).
    block: int = 1

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise DraftlabError(f"--repeats must be >= 1, got {self.repeats}")
        if self.warmup < 0:
            raise DraftlabError(f"--warmup must be >= 0, got {self.warmup}")
        labels = [v.label for v in self.variants]
        if len(set(labels)) != len(labels):
            raise DraftlabError(f"duplicate variant labels: {labels}")
        if not self.examples:
            raise DraftlabError("no examples to run (check --subtasks and --limit)")


# What a record depends on: a resumed run must match the folder's run.json on all of these.
RESUME_FIELDS = ("target", "draft", "dtype", "device", "temperature", "max_new_tokens", "labels", "suite")
RESUME_EXTRA = ("chat", "repeats", "sampling", "sizing", "variants")


def changed_settings(previous: RunInfo, now: RunInfo) -> list[str]:
    """Every setting that differs, as "name: old -> new" (settings an older run.json lacks are skipped)."""
    out = []
    for name in RESUME_FIELDS:
        if getattr(previous, name) != getattr(now, name):
            out.append(f"{name} was {getattr(previous, name)!r}, now {getattr(now, name)!r}")
    for name in RESUME_EXTRA:
        if name not in previous.extra:
            continue
        old, new = previous.extra[name], now.extra.get(name)
        if name == "variants" and isinstance(old, dict) and isinstance(new, dict):
            for label in sorted(set(old) & set(new)):
                for key in sorted(set(old[label]) | set(new[label])):
                    if old[label].get(key) != new[label].get(key):
                        out.append(f"{label} {key} was {old[label].get(key)!r}, now {new[label].get(key)!r}")
        elif old != new:
            out.append(f"{name} was {old!r}, now {new!r}")
    return out


def prepare_output(directory: Path, info: RunInfo, resume: bool) -> list[Record]:
    """Create or reopen a results folder. Returns the records already there (resume)."""
    directory.mkdir(parents=True, exist_ok=True)
    results = directory / RESULTS_FILE
    if not resume:
        if results.exists() and results.stat().st_size > 0:
            raise DraftlabError(
                f"'{directory}' already holds results: pass --resume to continue, or another --out"
            )
        info.save(directory)
        write_text(results, "")
        return []
    if (directory / RUN_FILE).exists():
        changed = changed_settings(RunInfo.load(directory), info)
        if changed:
            raise DraftlabError(f"cannot resume in '{directory}': changed settings: {'; '.join(changed)}")
    info.save(directory)
    done = read_records(results)
    # Drop a torn last line so that appends start on a fresh line.
    write_text(results, "".join(r.to_json() + "\n" for r in done))
    return done


def run_bench(
    plan: BenchPlan, directory: Path, info: RunInfo, resume: bool = False, quiet: bool = False
) -> Path:
    pairs = [(v.target, v.draft if v.config.needs_draft else None) for v in plan.variants]
    check_contexts(pairs, plan.examples, plan.max_new_tokens, plan.chat)
    done = prepare_output(directory, info, resume)
    finished = {(r.label, r.key): r for r in done}
    jobs = list(_jobs(plan))
    todo = sum(1 for job in jobs if (job[0].label, job[1:4]) not in finished)
    if plan.warmup and todo:
        _warm_up(plan)
    console = Console(stderr=True, quiet=quiet)
    progress = progress_bar("[bold]bench[/]", console=console, disable=quiet)
    results_path = directory / RESULTS_FILE
    answers: dict[tuple[str, str, int, int], list[int]] = {}  # (label, example, turn, repeat) -> tokens
    for r in done:
        answers[(r.label, r.example_id, r.turn, r.repeat)] = r.tokens
    baseline_tokens = {(r.label, r.key): r.tokens for r in done}
    by_id = {e.id: e for e in plan.examples}
    with progress, results_path.open("a", encoding="utf-8") as out:
        task = progress.add_task("", total=todo)
        last = None
        for variant, example_id, turn, repeat in jobs:
            key = (example_id, turn, repeat)
            if (variant.label, key) in finished:
                continue
            if last is not None and last is not variant:
                _pause(last)
            last = variant
            example = by_id[example_id]
            progress.update(task, description=f"{example.subtask} · {variant.label}")
            _tell_example(variant, example)
            ids = _prompt_ids(variant, example, turn, repeat, answers, plan.chat)
            _check_fits(variant, ids, plan.max_new_tokens)  # a later turn: the earlier answers count
            with collector_paused():
                result = variant.decoder.generate(
                    ids, plan.max_new_tokens, _seeded(variant.sampling, example_id, turn, repeat)
                )
            answers[(variant.label, example_id, turn, repeat)] = result.tokens
            baseline = plan.baselines.get(variant.label)
            reference = baseline_tokens.get((baseline, key)) if baseline else None
            greedy_match = None
            if variant.sampling.greedy and reference is not None and baseline != variant.label:
                greedy_match = result.tokens == reference
            baseline_tokens[(variant.label, key)] = result.tokens
            record = to_record(variant, example, turn, repeat, result, greedy_match)
            out.write(record.to_json() + "\n")
            out.flush()
            os.fsync(out.fileno())
            progress.advance(task)
        if last is not None:
            _pause(last)
    return results_path


def _pause(variant: Variant) -> None:
    """An engine that runs beside us (a server whose idle threads spin) stops while others run."""
    pause = getattr(variant._decoder, "pause", None)
    if pause is not None:
        pause()


def _tell_example(variant: Variant, example: Example) -> None:
    """A decoder whose settings follow the kind of task (chosen per subtask) hears of each example."""
    on_example = getattr(variant.decoder, "on_example", None)
    if on_example is not None:
        on_example(example)


def _check_fits(variant: Variant, prompt_ids: list[int], max_new_tokens: int) -> None:
    draft = variant.draft if variant.config.needs_draft else None
    check_context(variant.target, draft, len(prompt_ids), max_new_tokens)


def check_contexts(
    pairs: list[tuple[LoadedModel, LoadedModel | None]],
    examples: list[Example],
    max_new_tokens: int,
    chat: bool,
) -> None:
    """Every first turn fits each target and draft: checked before anything is profiled, written or run.

    Later turns hold earlier answers and are checked before each generation.
    """
    seen: set[tuple[int, int]] = set()
    for target, draft in pairs:
        if (id(target), id(draft)) in seen:
            continue
        seen.add((id(target), id(draft)))
        for example in examples:
            ids = encode_prompt(target, example.turns[0], chat=chat)
            check_context(target, draft, len(ids), max_new_tokens)


def _jobs(plan: BenchPlan) -> Iterator[tuple[Variant, str, int, int]]:
    # Baselines run first within each example (block) so that greedy matches can be checked at once.
    order = sorted(plan.variants, key=lambda v: v.label not in plan.baselines.values())
    if plan.block <= 1:
        for example in plan.examples:
            for repeat in range(plan.repeats):
                for turn in range(len(example.turns)):
                    for variant in order:
                        yield variant, example.id, turn, repeat
        return
    for start in range(0, len(plan.examples), plan.block):
        for variant in order:
            for example in plan.examples[start : start + plan.block]:
                for repeat in range(plan.repeats):
                    for turn in range(len(example.turns)):
                        yield variant, example.id, turn, repeat


def _prompt_ids(
    variant: Variant,
    example: Example,
    turn: int,
    repeat: int,
    answers: dict[tuple[str, str, int, int], list[int]],
    chat: bool,
) -> list[int]:
    """The conversation so far: each variant's later turns follow its own earlier answers (Spec-Bench)."""
    tokenizer = variant.target.tokenizer
    messages: list[Message] = []
    for earlier in range(turn):
        messages.append({"role": "user", "content": example.turns[earlier]})
        answer = tokenizer.decode(
            answers[(variant.label, example.id, earlier, repeat)], skip_special_tokens=True
        )
        messages.append({"role": "assistant", "content": answer})
    messages.append({"role": "user", "content": example.turns[turn]})
    return encode_prompt(variant.target, messages, chat=chat)


def _seeded(params: SamplingParams, example_id: str, turn: int, repeat: int) -> SamplingParams:
    """A per-generation seed, the same for every variant, so sampled runs are reproducible."""
    if params.greedy:
        return params
    base = params.seed or 0
    mixed = (base * 1_000_003 + sum(map(ord, example_id)) * 101 + turn * 7 + repeat) % (2**31)
    return SamplingParams(params.temperature, params.top_k, params.top_p, mixed)


WARMUP_TOKENS = 16


def _warm_up(plan: BenchPlan) -> None:
    """Untimed runs first: the first calls pay for allocations and lazy initialisation."""
    example = plan.examples[0]
    for variant in plan.variants:
        ids = encode_prompt(variant.target, example.turns[0], chat=plan.chat)
        for _ in range(plan.warmup):
            variant.decoder.generate(ids, min(plan.max_new_tokens, WARMUP_TOKENS), variant.sampling)
        _pause(variant)


def plan_need(target, examples: list[Example], max_new_tokens: int, chat: bool) -> int:
    """Tokens the longest generation of these examples may hold in a static cache: its prompt,
    the earlier turns and answers, and the cache's reserve (models/compiled.py's RESERVE)."""
    need = 0
    for example in examples:
        prompts = [len(encode_prompt(target, t, chat=chat)) for t in example.turns]
        need = max(need, sum(prompts) + len(example.turns) * max_new_tokens + RESERVE)
    return need


def warm_compiled(
    variants: list[Variant], examples: list[Example], max_new_tokens: int, chat: bool, quiet: bool = False
) -> None:
    """Get the one package the plan needs ready, untimed, so that no timed generation pays for a
    compile: that of the static cache the longest generation needs (a later turn's prompt holds
    the earlier turns and answers, bounded by their texts plus `max_new_tokens` each), or a longer
    one already built, which serves every shorter context too (models/compiled.py: one package per
    model). A progress line counts the passes: a package is built once per machine and cache length
    (about 1.5 min on 2 cores for the default target) and loaded by later runs."""

    plan: list[tuple[Variant, int]] = []
    for variant in variants:
        target = getattr(variant.decoder, "target", None)
        if getattr(target, "compiled", None) is None:
            continue
        plan.append((variant, plan_need(variant.target, examples, max_new_tokens, chat)))
    # Exact mode's width is chosen once per package, by the first variant warmed with a cost model
    # (decode/build.py); plain `ar` carries none, so the sized methods go first.
    plan.sort(key=lambda item: getattr(item[0].decoder, "sizer", None) is None)
    total = sum(len(compiled_passes(v.config)) for v, _ in plan)
    if not total:
        return
    progress = progress_bar("[bold]compile[/]", console=Console(stderr=True, quiet=quiet), disable=quiet)
    with progress:
        task = progress.add_task("", total=total)

        def on_pass(length: int, size: int) -> None:
            progress.update(task, advance=1, description=f"cache {length} · {size}-token pass")

        for variant, need in plan:
            warm_compiled_passes(variant.decoder, need, variant.config, on_pass)


def to_record(
    variant: Variant, example: Example, turn: int, repeat: int, result, greedy_match: bool | None
) -> Record:
    s = result.stats
    uses_draft = variant.config.needs_draft and variant.draft is not None
    return Record(
        label=variant.label,
        method=variant.config.method,
        example_id=example.id,
        subtask=example.subtask,
        turn=turn,
        repeat=repeat,
        temperature=variant.sampling.temperature,
        gamma=variant.config.spec.gamma(variant.config),
        target=variant.target.spec.name,
        draft=variant.draft.spec.name if uses_draft else None,
        prompt_tokens=s.prompt_tokens,
        new_tokens=s.new_tokens,
        prefill_s=s.prefill_s,
        first_tokens=s.first_tokens,
        decode_s=s.decode_s,
        total_s=s.total_s,
        target_calls=s.target_calls,
        draft_calls=s.draft_calls,
        drafted=s.drafted,
        accepted=s.accepted,
        drafted_per_position=s.drafted_per_position,
        accepted_per_position=s.accepted_per_position,
        rounds=s.rounds,
        fallbacks=s.fallbacks,
        rollbacks=s.rollbacks,
        draft_tokens_kept=s.draft_tokens_kept,
        propose_s=s.propose_s,
        propose_calls=s.propose_calls,
        tokens=result.tokens,
        greedy_match=greedy_match,
        draft_params=variant.draft.num_parameters if uses_draft else None,
        # A decoder may record settings chosen per generation (per subtask) over the variant's own.
        params={**variant.params, **s.proposer_info.get("params", {})},
        **s.round_details(),
    )
