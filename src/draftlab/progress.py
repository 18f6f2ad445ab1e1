"""The progress bar long runs draw on stderr: bench generations, distillation data and training."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


def progress_bar(title: str | None = None, info: bool = False, **kwargs) -> Progress:
    """`title` (or the task's description) · bar · n/N · [description] · elapsed · ETA · [info field]."""
    columns = [TextColumn(title or "{task.description}"), BarColumn(), MofNCompleteColumn()]
    if title:
        columns.append(TextColumn("{task.description}"))
    columns += [TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn()]
    if info:
        columns.append(TextColumn("{task.fields[info]}"))
    return Progress(*columns, **kwargs)


@contextmanager
def maybe_progress(enabled: bool) -> Iterator[Progress | None]:
    """A live progress bar with an info field, or None where nothing is drawn (--quiet)."""
    if not enabled:
        yield None
        return
    with progress_bar(info=True, transient=False) as progress:
        yield progress
