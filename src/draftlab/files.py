"""Files a run writes: whole or not at all, and one run at a time per results folder.

`atomic_path` hands out a temporary name beside the file and renames it over the file (os.replace)
once the block has written it, so a reader or an interrupted run never sees half a file.
`folder_lock` is an OS-level lock (the `filelock` package): the kernel drops it when its process
dies, even by kill -9, so a stale lock never blocks a `--resume`. The holder's pid, written beside
the lock, is only there to name the holder in the error.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from draftlab.errors import DraftlabError

LOCK_FILE = ".draftlab.lock"
PID_FILE = ".draftlab.lock.pid"


@contextmanager
def atomic_path(path: Path | str) -> Iterator[Path]:
    """A temporary path in `path`'s folder; it replaces `path` when the block ends without error."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def decode_utf8(data: bytes, what: str) -> str:
    """`data` as text, or a one-line error naming `what` and the first byte that is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DraftlabError(
            f"{what} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None


def read_text_file(path: Path | str, what: str) -> str:
    """A UTF-8 text file the user named; one-line errors for a file that cannot be read or decoded."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise DraftlabError(f"{what} '{path}' cannot be read: {exc.strerror or exc}") from None
    return decode_utf8(data, f"{what} '{path}'")


def write_text(path: Path | str, text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def lock_holder(directory: Path) -> str:
    try:
        return (directory / PID_FILE).read_text().strip() or "unknown"
    except OSError:
        return "unknown"


@contextmanager
def folder_lock(directory: Path) -> Iterator[None]:
    """Hold `directory` for this process; another holder ends in a one-line error naming its pid."""
    lock = FileLock(str(directory / LOCK_FILE), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise DraftlabError(
            f"'{directory}' is in use by another draftlab run (pid {lock_holder(directory)}): "
            "wait for it to end, or choose another --out"
        ) from None
    try:
        write_text(directory / PID_FILE, f"{os.getpid()}\n")  # a dead holder's pid is overwritten here
        yield
    finally:
        (directory / PID_FILE).unlink(missing_ok=True)  # before the release: the next holder's pid stays
        lock.release()


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold the output file `path` for this process (a lock file beside it, removed after): a second
    writer of the same file ends in a one-line error."""
    lock_path = path.parent / f".{path.name}.draftlab.lock"
    lock = FileLock(str(lock_path), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise DraftlabError(
            f"'{path}' is being written by another draftlab run: wait for it, or choose another name"
        ) from None
    try:
        yield
    finally:
        lock.release()
        lock_path.unlink(missing_ok=True)


def readable_as_usual(folder: Path) -> None:
    """Give the files in `folder` the mode a new file gets here (0666 less the umask): a library
    that writes through a private temporary file leaves them 0600, unreadable to anyone else."""
    umask = os.umask(0)
    os.umask(umask)
    for path in Path(folder).iterdir():
        if path.is_file() and not path.name.startswith("."):
            path.chmod(0o666 & ~umask)
