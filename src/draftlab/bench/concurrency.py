"""Concurrency sweeps: many requests at once through an engine that batches (vLLM, llama-server).

At each level c, each variant gets c requests from the suite in one submission (a batch); the
methods alternate level by level, the baseline first. A request's record keeps honest sums:
its `total_s` is its share of the batch's wall time (wall / c), so Σ tokens / Σ total_s over a
level is the batch's output tokens per second; its own latency, time to first token and time
per output token go into `params`. A batch is written at once; on resume a batch whose records
are not all there is run again.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from draftlab.bench.concurrency_summary import LEVEL_SEPARATOR, level_label
from draftlab.bench.records import RESULTS_FILE, Record, RunInfo
from draftlab.bench.runner import Variant, check_contexts, prepare_output, to_record
from draftlab.bench.suites import Example
from draftlab.errors import DraftlabError
from draftlab.files import write_text
from draftlab.models.prompting import encode_prompt
from draftlab.progress import progress_bar


@dataclass
class ConcurrencyPlan:
    variants: list[Variant]  # each decoder has generate_many
    examples: list[Example]
    levels: list[int]
    max_new_tokens: int
    chat: bool = True
    baseline: str = "ar"  # the variant label every other one is compared with, level by level

    def __post_init__(self) -> None:
        if not self.levels or any(c < 1 for c in self.levels):
            raise DraftlabError(f"--concurrency levels must be >= 1, got {self.levels}")
        for v in self.variants:
            if not hasattr(v.decoder, "generate_many"):
                raise DraftlabError(
                    f"'{v.label}' decodes one request at a time: concurrency needs a batching engine "
                    "(--engine vllm or llama-server)"
                )

    def labels(self) -> list[str]:
        return [level_label(v.label, c) for c in self.levels for v in self.variants]

    def baselines(self) -> dict[str, str]:
        return {
            level_label(v.label, c): level_label(self.baseline, c) for c in self.levels for v in self.variants
        }


def requests(examples: Sequence[Example], level: int) -> list[tuple[Example, int]]:
    """c requests: the suite's first turns in order, cycled; the repeat index keeps keys distinct."""
    return [(examples[i % len(examples)], i // len(examples)) for i in range(level)]


def _complete(done: list[Record], plan: ConcurrencyPlan) -> list[Record]:
    """Records of whole batches only: a batch interrupted while being written is redone."""
    wanted = {
        level_label(v.label, c): {(e.id, 0, r) for e, r in requests(plan.examples, c)}
        for c in plan.levels
        for v in plan.variants
    }
    have: dict[str, set] = {}
    for r in done:
        have.setdefault(r.label, set()).add(r.key)
    whole = {label for label, keys in wanted.items() if keys <= have.get(label, set())}
    return [r for r in done if r.label in whole]


def run_concurrency(
    plan: ConcurrencyPlan, directory: Path, info: RunInfo, resume: bool = False, quiet: bool = False
) -> Path:
    pairs = [(v.target, v.draft if v.config.needs_draft else None) for v in plan.variants]
    check_contexts(pairs, plan.examples, plan.max_new_tokens, plan.chat)
    done = _complete(prepare_output(directory, info, resume), plan)
    results = directory / RESULTS_FILE
    write_text(results, "".join(r.to_json() + "\n" for r in done))
    finished = {r.label for r in done}
    order = sorted(plan.variants, key=lambda v: v.label != plan.baseline)
    jobs = [(c, v) for c in plan.levels for v in order if level_label(v.label, c) not in finished]
    reference: dict[tuple[int, tuple], list[int]] = {
        (int(r.label.rsplit(LEVEL_SEPARATOR, 1)[1]), r.key): r.tokens
        for r in done
        if r.label.startswith(plan.baseline + LEVEL_SEPARATOR)
    }
    console = Console(stderr=True, quiet=quiet)
    progress = progress_bar("[bold]concurrency[/]", console=console, disable=quiet)
    with progress, results.open("a", encoding="utf-8") as out:
        task = progress.add_task("", total=len(jobs))
        for level, variant in jobs:
            progress.update(task, description=f"c={level} · {variant.label}")
            batch = requests(plan.examples, level)
            prompts = [encode_prompt(variant.target, e.turns[0], chat=plan.chat) for e, _ in batch]
            generations = variant.decoder.generate_many(
                prompts, plan.max_new_tokens, [variant.sampling] * level
            )
            wall = _batch_wall(generations)
            lines = []
            for (example, repeat), generation in zip(batch, generations, strict=True):
                key = (example.id, 0, repeat)
                s = generation.stats
                latency, ttft = s.total_s, s.prefill_s
                share = wall / level
                s.prefill_s = share * (ttft / latency) if latency > 0 else share
                s.decode_s = share - s.prefill_s
                ref = reference.get((level, key))
                match = None
                if variant.sampling.greedy and variant.label != plan.baseline and ref is not None:
                    match = generation.tokens == ref
                if variant.label == plan.baseline:
                    reference[(level, key)] = generation.tokens
                record = to_record(variant, example, 0, repeat, generation, match)
                record.label = level_label(variant.label, level)
                record.params = {
                    **record.params,
                    "concurrency": level,
                    "batch_wall_s": wall,
                    "latency_s": latency,
                    "ttft_s": ttft,
                    "tpot_s": (latency - ttft) / (s.new_tokens - 1) if s.new_tokens > 1 else None,
                }
                lines.append(record.to_json() + "\n")
            out.write("".join(lines))
            out.flush()
            os.fsync(out.fileno())
            progress.advance(task)
    return results


def _batch_wall(generations) -> float:
    """The batch's wall time: generate_many reports it on every request (proposer_info)."""
    walls = {g.stats.proposer_info.get("batch_wall_s") for g in generations}
    walls.discard(None)
    if len(walls) != 1:
        raise DraftlabError("the engine did not report one wall time for the batch")
    return float(walls.pop())
