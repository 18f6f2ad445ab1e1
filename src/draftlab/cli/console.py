"""The console that reports print to."""

from __future__ import annotations

import sys

from rich.console import Console


def report_console(quiet: bool) -> Console:
    """Piped into a file or a log, keep the wide tables whole instead of wrapping them at 80 columns."""
    return Console(quiet=quiet, width=None if sys.stdout.isatty() else 200)
