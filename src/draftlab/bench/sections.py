"""Sections an engine adds to a run's summary and report: figures only it has (llama-server's cost
per round and its settings chosen per subtask). The engine's `report.py` registers them (the
commands load them with `draftlab.engines.load_reports()` before a report is made), so the summary and the report render them without knowing which engine ran."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from draftlab.bench.records import Record, RunInfo
from draftlab.bench.table_data import TableData


@dataclass(frozen=True)
class EngineSection:
    key: str  # its key in summary.json
    summarize: Callable[[Sequence[Record], RunInfo], dict | None]  # None: this run has nothing for it
    tables: Callable[[dict], Sequence[TableData | None]]  # from the whole summary


SECTIONS: dict[str, EngineSection] = {}


def register_section(section: EngineSection) -> None:
    SECTIONS[section.key] = section


def section_summaries(records: Sequence[Record], run: RunInfo) -> dict[str, dict | None]:
    return {key: section.summarize(records, run) for key, section in SECTIONS.items()}


def section_tables(summary: dict) -> list[TableData | None]:
    return [table for section in SECTIONS.values() for table in section.tables(summary)]
