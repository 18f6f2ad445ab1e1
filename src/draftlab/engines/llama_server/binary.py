"""Where the llama-server binary is: `DRAFTLAB_LLAMA_SERVER`, or the one scripts/install-llamacpp.sh
built for this CPU (a folder per llama.cpp version and CPU, holding `bin/llama-server` and `cpu.txt`)."""

from __future__ import annotations

import os
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
    found = [
        folder / "bin" / "llama-server"
        for folder in sorted(build_cache().glob("llama.cpp-*"), key=lambda p: p.stat().st_mtime, reverse=True)
        if (folder / "bin" / "llama-server").is_file()
        and (folder / "cpu.txt").is_file()
        and (folder / "cpu.txt").read_text().strip() == here.strip()
    ]
    return found[0] if found else None


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
