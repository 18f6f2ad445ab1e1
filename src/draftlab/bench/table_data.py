"""A table as data (title, headers, rows, note), written as Markdown or as a console table."""

from __future__ import annotations

from collections.abc import Sequence

from rich import box
from rich.table import Table
from rich.text import Text

from draftlab.bench.formatting import EQUAL_WORK_NOTE, UNEQUAL


class TableData:
    """`bold`: the (row, column) cells to highlight, such as the best method of a subtask.

    A table with a figure marked as over equal work (UNEQUAL) carries the note that says what it
    shows, whichever table it is."""

    def __init__(
        self,
        title: str,
        headers: Sequence[str],
        rows: list[list[str]],
        note: str = "",
        bold: set[tuple[int, int]] | None = None,
    ) -> None:
        if EQUAL_WORK_NOTE not in note and any(UNEQUAL in cell for row in rows for cell in row):
            note = f"{note}; {EQUAL_WORK_NOTE}" if note else EQUAL_WORK_NOTE
        self.title, self.headers, self.rows, self.note = title, list(headers), rows, note
        self.bold = bold or set()

    def is_bold(self, row: int, column: int) -> bool:
        return (row, column) in self.bold and self.rows[row][column] not in ("", "-")


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(table: TableData) -> str:
    lines = [
        "| " + " | ".join(_md_cell(h) for h in table.headers) + " |",
        "|" + "|".join("---" for _ in table.headers) + "|",
    ]
    for i, row in enumerate(table.rows):
        cells = [f"**{_md_cell(c)}**" if table.is_bold(i, j) else _md_cell(c) for j, c in enumerate(row)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def rich_table(table: TableData) -> Table:
    out = Table(title=table.title, caption=table.note or None, box=box.SIMPLE_HEAD, padding=(0, 1))
    for i, header in enumerate(table.headers):
        out.add_column(
            header, justify="left" if i == 0 or header in ("label", "subtask", "method", "draft") else "right"
        )
    for i, row in enumerate(table.rows):
        out.add_row(*(Text(c, style="bold") if table.is_bold(i, j) else c for j, c in enumerate(row)))
    return out
