"""Where the llama-server binary is: `DRAFTLAB_LLAMA_SERVER`, or the one scripts/install-llamacpp.sh
built for this CPU (a folder per llama.cpp version and CPU, holding `bin/llama-server` and `cpu.txt`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from draftlab.errors import DraftlabError

ENV = "DRAFTLAB_LLAMA_SERVER"
INSTALL_HINT = "run scripts/install-llamacpp.sh (it builds llama-server too), or set DRAFTLAB_LLAMA_SERVER"


def build_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(os.environ.get("DRAFTLAB_BUILD_CACHE") or Path(base) / "draftlab" / "builds")


def cpu_identity() -> str:
    """The lines the install script keys a native build on: the CPU's model name and its flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return ""
    wanted = []
    for prefix in ("model name", "flags"):
        wanted += [line for line in lines if line.startswith(prefix)][:1]
    return "\n".join(wanted)


def find_server() -> Path | None:
    explicit = os.environ.get(ENV)
    if explicit:
        path = Path(explicit).expanduser()
        return path if path.is_file() and os.access(path, os.X_OK) else None
    here = cpu_identity()
    installed = installed_build()
    # Within the build cache in use only: DRAFTLAB_BUILD_CACHE set elsewhere means other builds.
    if installed is not None and installed.parent == build_cache() and _built_here(installed, here):
        return installed / "bin" / "llama-server"
    newest_first = sorted(build_cache().glob("llama.cpp-*"), key=lambda p: p.stat().st_mtime, reverse=True)
    found = [folder / "bin" / "llama-server" for folder in newest_first if _built_here(folder, here)]
    return found[0] if found else None


# scripts/install-llamacpp.sh names, in the environment, the build its llama-cpp-python came from.
BUILD_POINTER = "draftlab-llama.cpp-build"


def installed_build() -> Path | None:
    """The build folder this Python environment's llama-cpp-python was installed from, if named."""
    try:
        return Path((Path(sys.prefix) / BUILD_POINTER).read_text().strip())
    except OSError:
        return None


def _built_here(folder: Path, here: str) -> bool:
    cpu = folder / "cpu.txt"
    return (
        (folder / "bin" / "llama-server").is_file()
        and cpu.is_file()
        and cpu.read_text().strip() == here.strip()
    )


def server_binary() -> Path:
    path = find_server()
    if path is None:
        where = os.environ.get(ENV)
        if where:
            raise DraftlabError(f"{ENV}='{where}' is not an executable llama-server")
        raise DraftlabError(f"the llama-server engine needs llama-server, built for this CPU: {INSTALL_HINT}")
    return path


def installed() -> bool:
    return find_server() is not None
