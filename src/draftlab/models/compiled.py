"""torch.compile for a target's passes of up to 8 tokens, over transformers' `StaticCache`.

Plain decoding on a CPU spends most of a step launching small batch-1 matrix products one by one
(issue 22: 211 products of about 158 µs each, per step); inductor's CPU GEMM templates over frozen
weights replace them. Graphs need fixed shapes, so the cache is transformers' `StaticCache`, whose
length comes in buckets (512, 1024, 2048, ... tokens), and passes come in PASS_SIZES: one graph
per (bucket, pass size). Prompts run eagerly over the same cache; rollback is the cache's `crop`.

Compiling takes about 45 s per graph on a 2-core CPU, recorded in `compile_seconds` (the first
call of each graph, compile included). Each process compiles again: with frozen weights torch
bypasses its AOTAutograd cache, and its FX graph cache too (freezing prepacks the weights as mkldnn
tensors, which it cannot pickle), so a second process measured no faster compile.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch._dynamo import config as dynamo_config
from torch._inductor import config as inductor_config
from transformers import StaticCache
from transformers.generation.configuration_utils import CompileConfig

# torch.compile's "max-autotune-no-cudagraphs" mode, as options.
INDUCTOR_OPTIONS = {"max_autotune": True, "coordinate_descent_tuning": True}
FIRST_BUCKET = 512
# Token counts of the compiled passes: a plain step, and verification passes padded up to the next
# size (on an AMD Zen5, float32, a pass of 5 tokens took 27.2 ms compiled against 16.7 ms for one,
# and 54.9 ms eager). Longer passes (prompts) run eagerly.
PASS_SIZES = (1, 2, 4, 8)
RECOMPILE_LIMIT = 64
# Tokens a new generation's static cache holds beyond its prompt before it must grow.
RESERVE = 256


def pass_size(n: int) -> int | None:
    """The compiled pass that takes `n` tokens, or None (eager)."""
    return next((size for size in PASS_SIZES if size >= n), None)


def static_length(needed: int, limit: int | None = None) -> int:
    """The bucket that holds `needed` tokens: 512 doubled as often as needed, capped at `limit`."""
    length = FIRST_BUCKET
    while length < needed:
        length *= 2
    return min(length, limit) if limit else length


@dataclass
class CompiledSteps:
    """One model's compiled one-token forward, shared by every cache-aware wrapper of that model."""

    model: torch.nn.Module
    # (bucket, pass size) -> the first call's seconds, compile included
    compile_seconds: dict[tuple[int, int], float] = field(default_factory=dict)
    calls: int = 0  # passes run through the compiled call

    def __post_init__(self) -> None:
        # transformers' own switch between eager prefill and compiled decoding (what generate() uses
        # with a static cache); one graph per cache length, no dynamic shapes. On a CPU, inductor's
        # own GEMM templates (max_autotune) over frozen, prepacked weights are what beat the eager
        # per-product overhead; plain compilation gained nothing on an AMD Zen5 (docs/engines.md).
        # A graph per (bucket, pass size): past dynamo's default of 8 it would silently run the rest
        # eagerly (seen: the 1024-token bucket's passes of 4 and 8 "compiled" in 0.1 s).
        dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, RECOMPILE_LIMIT)
        config = CompileConfig(fullgraph=False, dynamic=False, mode=None, options=INDUCTOR_OPTIONS)
        self._call = self.model.get_compiled_call(config)
        self.caches: dict[int, StaticCache] = {}

    @property
    def limit(self) -> int | None:
        return getattr(self.model.config, "max_position_embeddings", None)

    @torch.inference_mode()  # the cache's tensors are made, and emptied, under inference mode
    def new_cache(self, needed: int) -> StaticCache:
        """The static cache of the bucket that holds `needed` tokens, emptied.

        Frozen graphs hold the very cache tensors they were compiled with (a fresh cache gave
        logits off by 20-30 in a probe), so each bucket has one cache for the model's life, and a
        new generation empties it: its length goes to 0, and older keys past the length are masked
        by causality until they are overwritten, as after `crop`.
        """
        length = static_length(needed, self.limit)
        cache = self.caches.get(length)
        if cache is None:
            cache = self.caches[length] = StaticCache(config=self.model.config, max_cache_len=length)
        for layer in cache.layers:
            if layer.is_initialized:
                layer.cumulative_length.zero_()
        return cache

    def grown(self, cache: StaticCache, needed: int) -> StaticCache:
        """A bigger static cache holding what `cache` holds (a generation outgrew its bucket)."""
        bigger = self.new_cache(needed)
        for old, new in zip(cache.layers, bigger.layers, strict=True):
            if not old.is_initialized:
                continue
            if not new.is_initialized:
                new.lazy_initialization(old.keys, old.values)
            n = int(old.cumulative_length)
            new.keys[:, :, :n].copy_(old.keys[:, :, :n])
            new.values[:, :, :n].copy_(old.values[:, :, :n])
            new.cumulative_length.fill_(n)
        return bigger

    def __call__(self, cache: StaticCache, **kwargs):
        length = (capacity(cache), int(kwargs["input_ids"].shape[1]))
        self.calls += 1
        # Freezing is read from inductor's global config (as an option it is not honoured): it is
        # set only while this model's graphs run, and so compile.
        with inductor_config.patch(freezing=True):
            if length in self.compile_seconds:
                return self._call(cache=cache, **kwargs)
            t0 = time.perf_counter()
            out = self._call(cache=cache, **kwargs)
        self.compile_seconds[length] = time.perf_counter() - t0
        return out


def capacity(cache: StaticCache) -> int:
    return cache.layers[0].max_cache_len


def compiled_steps(model: torch.nn.Module) -> CompiledSteps:
    """The model's `CompiledSteps`, made once per model object."""
    steps = getattr(model, "_draftlab_compiled_steps", None)
    if steps is None:
        steps = CompiledSteps(model)
        model._draftlab_compiled_steps = steps
    return steps
