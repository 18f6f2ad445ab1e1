"""`draftlab report DIR`: re-render every table, file and plot from saved results (no model is loaded)."""

from __future__ import annotations

import argparse
from pathlib import Path

from draftlab import engines
from draftlab.bench.report import render
from draftlab.cli.console import report_console


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "report",
        help="re-render the report of a results folder (results.jsonl + run.json)",
        description="Recompute every figure from a results folder and rewrite summary.json, summary.csv, "
        "report.md, per_example.csv and the plots in it. Loads no model.",
    )
    p.add_argument("directory", type=Path, help="a results folder written by `draftlab bench`")
    p.add_argument("--per-example", action="store_true", help="also print one row per generation")
    p.add_argument("--quiet", action="store_true", help="write the files, print nothing")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    render_report(args.directory, report_console(args.quiet), per_example=args.per_example)
    return 0


def render_report(directory: Path, console, per_example: bool = False) -> dict:
    """`bench.report.render`, with every engine's own sections (its report.py) registered first."""
    engines.load_reports()
    return render(directory, console, per_example=per_example)
