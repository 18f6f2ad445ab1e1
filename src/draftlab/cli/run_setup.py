"""What `bench` and `sweep` share: suite and run arguments, the --out folder, variants and the run itself."""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import torch
import transformers
from rich.console import Console

from draftlab import __version__
from draftlab.bench.concurrency import ConcurrencyPlan, run_concurrency
from draftlab.bench.records import RUN_FILE, RunInfo
from draftlab.bench.runner import BenchPlan, Variant, run_bench
from draftlab.bench.suites import SUBTASKS
from draftlab.cli.common import add_method_args, add_model_args
from draftlab.cli.console import report_console
from draftlab.cli.report import render_report
from draftlab.errors import DraftlabError
from draftlab.hardware import hardware
from draftlab.models.loading import LoadedModel
from draftlab.outputs import check_folder, held_folder
from draftlab.plan.dtypes import DtypeChoice
from draftlab.plan.prompts import DEFAULT_LIMIT


def add_run_command_args(
    p: argparse.ArgumentParser,
    run: Callable[[argparse.Namespace], int],
    kind: Callable[[argparse.Namespace], str],
) -> None:
    """Model, decoding, prompt and run options; `run` runs with --out checked and held (default
    folder runs/<kind>-<time>)."""
    add_model_args(p)
    add_method_args(p)
    add_suite_args(p)
    add_run_args(p)

    def held(args: argparse.Namespace) -> int:
        with claimed_out(args, kind(args)):
            return run(args)

    p.set_defaults(func=held)


def add_suite_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("prompts")
    g.add_argument(
        "--suite",
        default="builtin",
        help="builtin, a JSONL file (Spec-Bench or generic), or hf:DATASET[:CONFIG]:SPLIT",
    )
    g.add_argument(
        "--subtasks",
        default=None,
        help=f"comma-separated subtasks (default: all; builtin: {', '.join(SUBTASKS)})",
    )
    g.add_argument(
        "--limit",
        type=int,
        default=None,
        help=f"prompts per subtask (default {DEFAULT_LIMIT}; bench: fewer, down to 1, where the cost "
        "profile predicts the default run past its time budget)",
    )
    g.add_argument(
        "--full",
        action="store_true",
        help="every prompt of the suite (ignores --limit), and for bench every method and dtype, "
        "whatever the time budget",
    )
    g.add_argument("--no-chat", action="store_true", help="do not apply the tokenizer's chat template")
    g.add_argument("--hf-field", default="text", help="hf suites: the text field")
    g.add_argument("--hf-subtask", default="summarization", help="hf suites: the subtask name")
    g.add_argument(
        "--hf-instruction", default="Summarize the following article.\n\n{text}", help="hf suites: template"
    )


def add_run_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("run")
    g.add_argument("--out", default=None, help="results folder (default: runs/<kind>-<time>)")
    g.add_argument("--resume", action="store_true", help="continue an interrupted run in --out")
    g.add_argument(
        "--force",
        action="store_true",
        help="write into an --out folder that holds files draftlab did not write (they may be replaced)",
    )
    g.add_argument("--repeats", type=int, default=1)
    g.add_argument("--warmup", type=int, default=1, help="untimed warm-up generations per variant")
    g.add_argument("--per-example", action="store_true", help="also print the per-example timing table")
    g.add_argument("--quiet", action="store_true", help="no progress bar")


def check_out(args: argparse.Namespace) -> None:
    """Refuse an unusable --out before any model loads: a file, a path under a file, no write
    access, or a folder of files draftlab did not write (draftlab/outputs.py)."""
    if args.resume and not args.out:
        raise DraftlabError("--resume needs --out (the folder of the run to continue)")
    if not args.out:
        return
    out = Path(args.out)
    check_folder(out, "--out", getattr(args, "force", False), legacy=RunInfo.written_here)
    if args.resume and (out / RUN_FILE).exists():
        RunInfo.load(out)  # a torn or foreign run.json is one line now, not mid-run


@contextmanager
def claimed_out(args: argparse.Namespace, kind: str) -> Iterator[Path]:
    """Check --out, then hold it (created if needed) for the whole run: one writer per folder.

    A folder this run created is removed again if the run fails before writing anything into it.
    """
    check_out(args)
    if not args.out:
        args.out = str(Path("runs") / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}")
    with held_folder(Path(args.out), kind) as out:
        yield out


def execute(
    args: argparse.Namespace,
    kind: str,
    variants: list[Variant],
    baselines: dict[str, str],
    target: LoadedModel,
    draft: LoadedModel | None,
    examples,
    extra: dict | None = None,
    block: int = 1,
    levels: list[int] | None = None,
    chosen: Mapping[str, DtypeChoice] | None = None,
) -> int:
    """Run the variants (with `levels`: a concurrency sweep) into --out, then print the report.
    `chosen`: the run's `--dtype auto` choices, by model name."""
    dtype_choice = (chosen or {}).get(target.spec.name)
    out = Path(args.out)  # set and held by claimed_out
    concurrency = None
    if levels:
        baseline = next(v.label for v in variants if v.config.method == "ar")
        concurrency = ConcurrencyPlan(
            variants, examples, levels, args.max_new_tokens, chat=not args.no_chat, baseline=baseline
        )
        baselines = concurrency.baselines()
        extra = {**(extra or {}), "concurrency_baseline": baseline}
    plan = BenchPlan(
        variants,
        examples,
        args.max_new_tokens,
        chat=not args.no_chat,
        repeats=args.repeats,
        warmup=args.warmup,
        baselines=baselines,
        block=block,
    )
    info = RunInfo(
        target=target.spec.name,
        draft=draft.spec.name if draft else None,
        dtype=target.spec.dtype if draft is None else f"{target.spec.dtype}/{draft.spec.dtype}",
        device=target.spec.device if draft is None else f"{target.spec.device}/{draft.spec.device}",
        temperature=args.temperature,
        max_new_tokens=args.max_new_tokens,
        baseline="ar" if "ar" in baselines.values() else next(iter(baselines.values())),
        labels=concurrency.labels() if concurrency else [v.label for v in variants],
        suite=args.suite,
        extra={
            "kind": kind,
            **({"target_storage": target.storage} if getattr(target, "storage", None) else {}),
            **({"draft_storage": draft.storage} if getattr(draft, "storage", None) else {}),
            "baselines": baselines,
            "examples": len(examples),
            "turns": sum(len(e.turns) for e in examples),
            "repeats": args.repeats,
            "chat": not args.no_chat,
            "sampling": {"top_k": args.top_k, "top_p": args.top_p, "seed": args.seed},
            "variants": {v.label: json.loads(json.dumps(v.params, default=str)) for v in variants},
            "torch_threads": torch.get_num_threads(),
            "versions": {
                "draftlab": __version__,
                "torch": torch.__version__,
                "transformers": transformers.__version__,
            },
            "host": {
                "machine": platform.machine(),
                "processor": platform.processor(),
                "python": platform.python_version(),
            },
            "hardware": hardware(target.device),
            "dtype_choice": dtype_choice.record() if dtype_choice is not None else None,
            "sizing": "fixed k" if getattr(args, "fixed_k", False) else "cost-aware",
            **(extra or {}),
        },
    )
    Console(stderr=True, quiet=args.quiet).print(
        f"[bold]draftlab {kind}[/] → {out}  ({len(examples)} examples, {len(variants)} variants)"
    )
    if concurrency is not None:
        run_concurrency(concurrency, out, info, resume=args.resume, quiet=args.quiet)
    else:
        run_bench(plan, out, info, resume=args.resume, quiet=args.quiet)
    render_report(out, report_console(False), per_example=args.per_example)
    return 0
