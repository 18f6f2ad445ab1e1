"""Our EAGLE-3 head (speculators format) as a GGUF for llama-server's draft-eagle3, written by
llama.cpp's own converter (kept beside the server by scripts/install-llamacpp.sh) with the target's
transformers folder as `--target-model-dir`, once per head."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from draftlab.children import run_child
from draftlab.errors import DraftlabError
from draftlab.models.cache import home
from draftlab.quiet import quiet_stderr

CONVERT_TIMEOUT_S = 900


def converter(server: Path) -> Path:
    script = server.parent.parent / "convert_hf_to_gguf.py"
    if not script.is_file():
        raise DraftlabError(
            f"llama.cpp's converter is not beside {server}: run scripts/install-llamacpp.sh again"
        )
    return script


def head_gguf(
    head_dir: str, target_dir: str, server: Path, out: Path | None = None, kind: str = "eagle3"
) -> Path:
    """A head folder (`kind`: an EAGLE-3 head, or a DFlash drafter) as a GGUF by llama.cpp's
    converter. `out` defaults to the model cache; `draftlab distill --head` writes it beside the head."""
    out = out or home() / "gguf" / f"{Path(head_dir).name}-{kind}-bf16.gguf"
    sources = [p for p in Path(head_dir).iterdir() if p.suffix != ".gguf"]
    return _converted(
        server, [str(head_dir), "--target-model-dir", str(target_dir), "--outtype", "bf16"], sources, out,
        f"the {kind} head {head_dir}",
    )  # fmt: skip


def model_gguf(folder: Path, outtype: str, server: Path) -> Path:
    """A transformers folder as a GGUF of `outtype` by llama.cpp's converter, once, in the model cache
    (again when the folder is newer)."""
    digest = hashlib.sha1(str(folder.resolve()).encode()).hexdigest()[:8]
    out = home() / "gguf" / f"{folder.name}-{digest}-{outtype}.gguf"
    sources = [p for p in folder.iterdir() if p.is_file()]
    return _converted(server, [str(folder), "--outtype", outtype], sources, out, str(folder))


def _converted(server: Path, args: list[str], sources: list[Path], out: Path, what: str) -> Path:
    """`out`, written by llama.cpp's converter with `args` unless it is newer than every source."""
    if out.is_file() and sources and out.stat().st_mtime >= max(p.stat().st_mtime for p in sources):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    Console(stderr=True).print(f"[dim]converting {what} for llama-server (once): {out}[/]")
    partial = out.with_suffix(".partial")  # a killed conversion leaves no GGUF that looks whole
    command = [sys.executable, str(converter(server)), *args, "--outfile", str(partial)]
    try:
        done = run_child(command, CONVERT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        partial.unlink(missing_ok=True)
        raise DraftlabError(f"llama.cpp's converter did not finish within {CONVERT_TIMEOUT_S} s") from None
    if done.returncode != 0 or not partial.is_file():
        lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        partial.unlink(missing_ok=True)
        raise DraftlabError(
            f"llama.cpp's converter failed on {what}: {lines[-1] if lines else done.returncode}"
        )
    partial.replace(out)
    return out


def q4_1_copy(gguf: Path) -> Path:
    """The file quantized to Q4_1 by llama.cpp's own quantizer, once: the audit's recheck file. Its
    matrix products quantize the activations and take the same dot kernel for passes of a few
    tokens and of one, so on one thread those round alike (audit/server.py handles longer ones)."""
    import llama_cpp  # the wheel scripts/install-llamacpp.sh builds; only the audit's recheck needs it

    out = home() / "gguf" / f"{gguf.stem}-q4_1-recheck.gguf"
    if out.is_file() and out.stat().st_mtime >= gguf.stat().st_mtime:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    Console(stderr=True).print(
        f"[dim]quantizing {gguf.name} to Q4_1 for the audit's recheck (once): {out}[/]"
    )
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_1
    partial = out.with_suffix(".partial")
    with quiet_stderr():
        failed = llama_cpp.llama_model_quantize(str(gguf).encode(), str(partial).encode(), params)
    if failed:
        partial.unlink(missing_ok=True)
        raise DraftlabError(f"llama.cpp could not quantize {gguf} to Q4_1")
    partial.replace(out)
    return out
