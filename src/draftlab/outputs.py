"""Where draftlab writes: never over anything it did not write.

Every folder draftlab writes its outputs into (a run's results, a profile, a distilled draft or
head) carries a marker file, `.draftlab-output`, that only draftlab writes. A folder that exists
and holds anything but has no marker is someone else's, and is refused in one line naming it,
unless the user passes `--force`. A file draftlab would create (a GGUF export) is refused where a
file already is, unless `--force`. `bench`, `sweep`, `profile`, `distill`, `audit --json` and
`models export-gguf` all go through here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from draftlab.errors import DraftlabError
from draftlab.files import LOCK_FILE, PID_FILE, folder_lock, write_text

MARKER = ".draftlab-output"
# Names draftlab leaves in a folder it has not yet claimed: its lock and the lock holder's pid.
_OURS = {MARKER, LOCK_FILE, PID_FILE}


def is_ours(folder: Path) -> bool:
    return (folder / MARKER).is_file()


def check_folder(
    folder: Path, option: str, force: bool = False, legacy: Callable[[Path], bool] | None = None
) -> None:
    """Refuse, before anything loads, an output folder draftlab cannot write: a file, a path under
    a file, a folder without write access, or a folder of someone else's files. `legacy(folder)`
    recognises a folder an earlier draftlab wrote before markers existed."""
    if folder.exists() and not folder.is_dir():
        raise DraftlabError(f"{option} '{folder}' is a file, not a folder")
    existing = next((p for p in [folder, *folder.parents] if p.exists()), Path("."))
    if not existing.is_dir():
        raise DraftlabError(f"{option} '{folder}' lies under '{existing}', which is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise DraftlabError(f"{option} '{folder}' is not writable ('{existing}' does not allow it)")
    if not folder.is_dir() or force or is_ours(folder) or (legacy is not None and legacy(folder)):
        return
    theirs = sorted(p.name for p in folder.iterdir() if p.name not in _OURS)
    if theirs:
        shown = ", ".join(theirs[:3]) + (", ..." if len(theirs) > 3 else "")
        raise DraftlabError(
            f"{option} '{folder}' holds files draftlab did not write ({shown}): choose a new or empty "
            "folder, or pass --force to write into it"
        )


def claim_folder(folder: Path, kind: str) -> None:
    """Create `folder` if needed and mark it as draftlab's (after `check_folder`)."""
    folder.mkdir(parents=True, exist_ok=True)
    if not is_ours(folder):
        write_text(folder / MARKER, json.dumps({"tool": "draftlab", "kind": kind}) + "\n")


@contextmanager
def held_folder(folder: Path, kind: str) -> Iterator[Path]:
    """Create `folder` if needed, hold it (one writer at a time) and mark it as draftlab's, for the
    block (after `check_folder`). A folder this made is removed again if the block fails before
    writing anything into it."""
    created = [p for p in [folder, *folder.parents] if not p.exists()]  # the folder first, then its parents
    folder.mkdir(parents=True, exist_ok=True)
    try:
        with folder_lock(folder):
            claim_folder(folder, kind)
            yield folder
    except BaseException:
        if created and {p.name for p in folder.iterdir()} <= _OURS:
            for name in (MARKER, LOCK_FILE):
                (folder / name).unlink(missing_ok=True)
            with suppress(OSError):
                for made in created:
                    made.rmdir()  # only while empty: nothing the run wrote is removed
        raise


def check_new_file(path: Path, option: str, force: bool = False) -> None:
    """Refuse to replace an existing file (unless `force`), a folder, or a path in no folder."""
    if path.is_dir():
        raise DraftlabError(f"{option} '{path}' is a folder; give a file name")
    if path.exists() and not force:
        raise DraftlabError(
            f"{option} '{path}' already exists: choose another name, or pass --force to replace it"
        )
    if not path.parent.is_dir():
        raise DraftlabError(f"{option} '{path}': folder '{path.parent}' does not exist")
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise DraftlabError(f"{option} '{path}' is not writable ('{path.parent}' does not allow it)")
