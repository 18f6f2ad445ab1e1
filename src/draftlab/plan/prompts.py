"""The prompts a run measures, and held-out ones of the same subtasks to choose settings on."""

from __future__ import annotations

import argparse

from draftlab.bench.suites import load_suite

DEFAULT_LIMIT = 2


def prompt_limit(args: argparse.Namespace) -> int:
    return DEFAULT_LIMIT if args.limit is None else args.limit


def suite_examples(args: argparse.Namespace):
    subtasks = [s.strip() for s in args.subtasks.split(",")] if args.subtasks else None
    return load_suite(
        args.suite,
        subtasks,
        None if args.full else prompt_limit(args),
        hf_field=args.hf_field,
        hf_subtask=args.hf_subtask,
        hf_instruction=args.hf_instruction,
    )


def held_out_examples(args: argparse.Namespace, run: list, per_subtask: int) -> list:
    """The suite's last `per_subtask` examples of each of the run's subtasks that the run leaves out:
    prompts of the same kind as the measured ones, none of them measured (for choosing settings).
    Empty for a Hugging Face suite (its whole split is not read for this) or where none is left out."""
    if args.suite.startswith("hf:"):
        return []
    subtasks = list(dict.fromkeys(e.subtask for e in run))
    measured = {e.id for e in run}
    rest = [e for e in load_suite(args.suite, subtasks, None) if e.id not in measured]
    chosen = []
    for subtask in subtasks:
        chosen += [e for e in rest if e.subtask == subtask][-per_subtask:]
    return chosen
