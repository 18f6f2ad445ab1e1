"""How `draftlab audit --engine llamacpp` reruns a greedy difference.

On one llama.cpp thread every pass size takes the same kernels, so a difference that is gone there
was a near-tie that the many-thread passes of several tokens round differently; the GGUF's
quantization cannot change in a rerun. A GGUF exported from a transformers checkpoint in another
storage is rerun on that checkpoint in float32 instead (`checkpoint_of`).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata

from draftlab.audit.runner import Float32Recheck
from draftlab.engines.llamacpp.load import load_llamacpp
from draftlab.engines.llamacpp.methods import NAME
from draftlab.engines.llamacpp.model import OWN_STORAGE
from draftlab.models.loading import ModelSpec
from draftlab.plan.profiles import load_spec


def checkpoint_of(lm) -> str | None:
    """The transformers checkpoint a llama.cpp model was exported from (`--gguf-type` other than own),
    or None. Its storages are not batch-invariant even on one thread (BF16 and F32 passes of one and
    of several tokens differed by up to 0.23 and 0.012 in the logits on the Zen5, where the Q4_1 file's
    were bitwise equal), so a difference is rerun on the checkpoint in float32 instead."""
    storage = getattr(lm.spec, "storage", OWN_STORAGE)
    return lm.spec.name if lm.engine == NAME and storage != OWN_STORAGE else None


def one_thread(lm):
    """A llama.cpp model's copy on one thread: there every pass size takes the same kernels."""
    return load_llamacpp(
        lm.spec.name, tokenizer=lm.tokenizer, n_ctx=lm.context_length, n_threads=1, storage=lm.spec.storage
    )


@dataclass(frozen=True)
class LlamaCppRecheck:
    """A llama.cpp model's rerun on one thread (or its checkpoint in float32); a transformers draft
    beside it is rerun in float32."""

    def key(self, target, draft) -> str | None:
        return "float32" if checkpoint_of(target) else "one_thread"

    def copy(self, lm):
        checkpoint = checkpoint_of(lm)
        if checkpoint:
            return load_spec(ModelSpec(checkpoint, dtype="float32"))
        if lm.engine == NAME:
            return one_thread(lm)
        return Float32Recheck(load_spec).copy(lm)


def versions() -> dict:
    return {"llama_cpp": metadata.version("llama-cpp-python")}
