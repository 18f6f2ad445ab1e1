"""Reports rendered from a results folder: console tables, summary.json/.csv, report.md, per_example.csv, plots.

`render(directory, console)` is the only entry point: the live benchmark calls it when it ends and
`draftlab report DIR` calls it on saved results, so both print and write the same thing.
Every figure comes from `summary.summarize`; the modules it calls only format and write.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from draftlab.bench.csv_files import per_example_rows, write_per_example_csv, write_summary_csv
from draftlab.bench.engine_tables import concurrency_lines, concurrency_table, engine_table
from draftlab.bench.losslessness import with_plain_matches
from draftlab.bench.markdown_report import markdown_report
from draftlab.bench.plots import write_plots
from draftlab.bench.records import RESULTS_FILE, Record, RunInfo, read_records
from draftlab.bench.report_warnings import warnings
from draftlab.bench.result_lines import result_lines
from draftlab.bench.round_split import round_split_table
from draftlab.bench.run_header import header_lines
from draftlab.bench.sections import section_tables
from draftlab.bench.sizing_tables import sizing_table, tree_table
from draftlab.bench.summary import summarize
from draftlab.bench.sweep_tables import sweep_tables
from draftlab.bench.table_data import TableData, rich_table
from draftlab.bench.tables import (
    acceptance_table,
    overall_table,
    per_example_table,
    subtask_grid,
    subtask_table,
    timing_table,
)
from draftlab.errors import DraftlabError
from draftlab.files import write_text

SUMMARY_JSON = "summary.json"
SUMMARY_CSV = "summary.csv"
REPORT_MD = "report.md"
PER_EXAMPLE_CSV = "per_example.csv"


def load_results(
    directory: Path, on_torn: Callable[[int], None] | None = None
) -> tuple[RunInfo, list[Record]]:
    """run.json and results.jsonl of a results folder; a one-line DraftlabError if either is unusable.
    `on_torn` hears of a torn last line, which is left out (see `read_records`)."""
    if not directory.exists():
        raise DraftlabError(f"results folder '{directory}' does not exist")
    if not directory.is_dir():
        raise DraftlabError(f"'{directory}' is not a folder")
    run = RunInfo.load(directory)
    records = read_records(directory / RESULTS_FILE, on_torn)
    if not records:
        raise DraftlabError(f"no results in '{directory}' ({RESULTS_FILE} is missing or empty)")
    return run, records


def render(directory: Path | str, console: Console | None = None, per_example: bool = False) -> dict:
    """Read results.jsonl + run.json in `directory`, write every report file there, print the tables.

    Writes summary.json, summary.csv, report.md, per_example.csv and the plots; prints the overall
    and per-subtask tables, the seed-style result lines, any sweep tables and (with `per_example`)
    one row per generation. Returns the summary dict (the content of summary.json).
    """
    directory = Path(directory)
    console = console if console is not None else Console()
    torn: list[int] = []
    run, records = load_results(directory, torn.append)
    records = with_plain_matches(records)
    summary = summarize(records, run)
    rows = per_example_rows(records)

    write_text(
        directory / SUMMARY_JSON, json.dumps(summary, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    )
    write_summary_csv(summary, directory / SUMMARY_CSV)
    write_per_example_csv(rows, directory / PER_EXAMPLE_CSV)
    plots = write_plots(summary, directory)

    main_tables = [overall_table(summary), subtask_grid(summary), subtask_table(summary)]
    engines, concurrency = engine_table(summary), concurrency_table(summary)
    sizing, trees, acceptance = sizing_table(summary), tree_table(summary), acceptance_table(summary)
    server = section_tables(summary)  # each engine's own (bench/sections.py)
    sweeps, examples = sweep_tables(summary), per_example_table(rows)
    rounds = round_split_table(summary)
    md_tables = [
        *main_tables,
        timing_table(summary),
        *_present(rounds, engines, *server, sizing, trees, acceptance),
    ]
    md_tables += sweeps
    md_tables.append(examples)
    write_text(directory / REPORT_MD, markdown_report(summary, md_tables, plots))

    console.print(f"[bold]draftlab report[/bold] · {directory}", highlight=False)
    for line in header_lines(summary):
        console.print(f"  {line}", markup=False, highlight=False)
    console.print(rich_table(main_tables[0]))
    for line in result_lines(summary, subtasks=False):
        console.print(line, markup=False, highlight=False)
    console.print(rich_table(main_tables[1]))
    console.print(rich_table(main_tables[2]))
    for table in _present(rounds, engines, *server, concurrency, sizing, trees):
        console.print(rich_table(table))
    for line in concurrency_lines(summary):
        console.print(line, markup=False, highlight=False)
    for table in sweeps:
        console.print(rich_table(table))
    if per_example:
        console.print(rich_table(examples))
    notes = [
        f"{RESULTS_FILE}:{line} is cut short (an interrupted write) and left out; "
        "`draftlab bench --resume` runs that generation again"
        for line in torn
    ]
    seen: dict[tuple, int] = {}
    for record in records:
        seen[(record.label, record.key)] = seen.get((record.label, record.key), 0) + 1
    twice = [key for key, count in seen.items() if count > 1]
    if twice:
        label, (example, turn, repeat) = twice[0]
        notes.append(
            f"{RESULTS_FILE} holds {len(twice)} generation(s) more than once (e.g. {label} on {example}, "
            f"turn {turn}, repeat {repeat}): each copy is counted; was the file appended to by hand?"
        )
    for note in [*notes, *warnings(summary)]:
        console.print(f"[yellow]warning:[/yellow] {note}", highlight=False)
    written = [SUMMARY_JSON, SUMMARY_CSV, REPORT_MD, PER_EXAMPLE_CSV, *(p.name for p in plots)]
    console.print(f"wrote {', '.join(written)} in {directory}", markup=False, highlight=False)
    return summary


def _present(*tables: TableData | None) -> list[TableData]:
    """The tables this run has (a table a run has nothing for is None)."""
    return [table for table in tables if table is not None]
