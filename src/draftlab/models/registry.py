"""Models known to work offline (filled in by the registry work; see `draftlab models`)."""

from __future__ import annotations


def resolve(name: str) -> str | None:
    """The local folder for a registry name, or None when `name` is not a registry name."""
    return None
