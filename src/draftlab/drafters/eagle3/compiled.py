"""The EAGLE-3 head's passes through an AOTInductor package over a static KV cache (with --compile).

Eagerly, a head pass of one token cost 2.6 ms on an AMD Zen5 in float32, a sixth of the compiled
target's step, and mostly launch overhead: its weights are 40 MB. The pass from token embeddings
and features to the pre-norm output and the draft-vocabulary logits is exported once per cache
bucket, with the pass length dynamic (1 to MAX_PASS tokens: a tree level or a catch-up), its
positions and an additive mask over the whole bucket as inputs (chains and tree levels alike; the
pass attends over the window of the bucket up to the last slot it fills, also an input), and
compiled as the target's passes are (models/compiled.py); longer passes (a prompt's catch-up) run
the same module eagerly over the same cache.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from draftlab.errors import DraftlabError, first_line
from draftlab.hardware import fingerprint_key
from draftlab.models import q4
from draftlab.models.attention import read_window, window
from draftlab.models.compiled import (
    EXAMPLE_PASS,
    FIRST_BUCKET,
    MAX_PASS,
    additive,
    choose_bucket,
    compiled_dir,
    inductor_configs,
    keep_longest,
    package_lengths,
    ready_package,
    weights_stamp,
    write_package,
)

# 2: the pass attends over a window of the bucket, in half precision over an even number of rows
# (models/attention.py), as the target's passes do.
HEAD_PACKAGE_SCHEMA = 2


class HeadStep(nn.Module):
    """One head pass over a static cache whose tensors come in as arguments: (output [n, H],
    draft-vocabulary logits [n, draft V]); the new keys and values go to the slots after `length`,
    which grows by n."""

    def __init__(self, head) -> None:
        super().__init__()
        self.head = head

    def forward(
        self, ids, features, positions, mask, length, keys, values, window=None, keep=None, causal=False
    ):
        """Eagerly only: `keep`, logits for the last `keep` rows only (a prompt's catch-up needs one);
        `causal`, the pass is a chain after the cache's tokens (`mask` is then not read)."""
        head = self.head
        layer = head.layer
        embeds = head.embed_tokens(ids).to(features.dtype)
        cos, sin = head.rope(features, positions)
        q, k, v, residual = layer.project(embeds, features, cos, sin)
        filled = torch.arange(ids.shape[1], device=ids.device) + length
        keys.index_copy_(2, filled, k)
        values.index_copy_(2, filled, v)
        length.add_(ids.shape[1])
        if causal:
            out = layer.finish(q, keys, values, None, residual, causal=int(length))[0]
        else:
            out = layer.finish(q, keys, values, mask, residual, slots=read_window(window, keys.shape[2]))[0]
        return out, head.logits(out if keep is None else out[-keep:])


@dataclass
class HeadCache:
    """The head's keys and values [1, kv heads, bucket, d] and how many slots hold tokens."""

    keys: torch.Tensor
    values: torch.Tensor
    length: torch.Tensor  # a 0-d long tensor, updated in place by the package

    @property
    def capacity(self) -> int:
        return self.keys.shape[2]

    def crop(self, tokens: int) -> None:
        """transformers' convention: crop(-n) forgets the last n tokens."""
        self.length.sub_(abs(tokens))

    def mask(self, n: int, dtype: torch.dtype) -> torch.Tensor:
        """The additive mask [1, 1, n, bucket] of n chain tokens after the cache's own."""
        past = int(self.length)
        allowed = torch.ones(n, self.capacity, dtype=torch.bool, device=self.keys.device).tril(past)
        return additive(allowed, dtype)[None, None]


@dataclass
class CompiledHead:
    """One head's packages (one per bucket), shared by every HeadModel of that head."""

    lm: object  # a HeadLM
    compile_seconds: dict[int, float] = field(default_factory=dict)
    loaded: dict[int, bool] = field(default_factory=dict)
    calls: int = 0
    runners: dict[int, object] = field(default_factory=dict)

    @property
    def head(self):
        return self.lm.model

    def bucket(self, needed: int) -> int:
        """The cache length a draft needing `needed` positions runs in (models/compiled.py's rule)."""
        return choose_bucket(needed, self.runners, self.on_disk, self.lm.context_length)

    def on_disk(self) -> list[int]:
        """The cache lengths whose packages of this head an earlier run built here."""
        return package_lengths(self.path(FIRST_BUCKET).parent)

    def new_cache(self, needed: int) -> HeadCache:
        layer = self.head.layer
        length = self.bucket(needed)
        shape = (1, layer.kv_heads, length, layer.head_dim)
        dtype, device = self.head.dtype, self.lm.device
        return HeadCache(
            torch.zeros(shape, dtype=dtype, device=device),
            torch.zeros(shape, dtype=dtype, device=device),
            torch.zeros((), dtype=torch.long, device=device),
        )

    def grown(self, cache: HeadCache, needed: int) -> HeadCache:
        bigger = self.new_cache(needed)
        n = int(cache.length)
        bigger.keys[:, :, :n].copy_(cache.keys[:, :, :n])
        bigger.values[:, :, :n].copy_(cache.values[:, :, :n])
        bigger.length.fill_(n)
        return bigger

    def __call__(
        self, cache: HeadCache, *args, keep: int | None = None, chain: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(output, draft logits) of a pass: through the package up to MAX_PASS tokens, else eagerly;
        the logits of at least the last `keep` rows (None: all). `chain`: the pass's mask is the
        causal one after the cache's tokens (not a tree's)."""
        n = args[0].shape[1]
        span = torch.tensor(window(int(cache.length), n, cache.capacity))
        if n > MAX_PASS:
            # Over the window too: a prompt's catch-up over the whole 1024-slot bucket took 62.7 ms
            # for 585 tokens, over its window 45.4 (q8_0 head, Zen4, stop 79). And only the kept
            # rows' logits: the draft vocabulary's LM head over every row of a 256-token catch-up
            # was 7.8 of its 26 ms (stop 80). A chain attends causally through draftlab's kernel
            # where it is the faster (q4.attends_by_rows).
            causal = chain and q4.attends_by_rows(n)
            step = HeadStep(self.head)
            return step(*args, cache.length, cache.keys, cache.values, span, keep, causal)
        out = self.runner(cache)(*args, cache.length, cache.keys, cache.values, span)
        self.calls += 1
        return out[0], out[1]

    def runner(self, cache: HeadCache):
        length = cache.capacity
        runner = self.runners.get(length)
        if runner is None:
            t0 = time.perf_counter()
            runner, self.loaded[length] = ready_package(self.path(length), lambda p: self._build(cache, p))
            keep_longest(self.runners, {}, length)
            self.runners[length] = runner
            self.compile_seconds[length] = time.perf_counter() - t0
        return runner

    def path(self, length: int) -> Path:
        dtype = self.lm.spec.dtype
        fp = {
            **self.lm.fingerprint(),
            "weights": weights_stamp(self.lm.path),
            "package": HEAD_PACKAGE_SCHEMA,
            "inductor": inductor_configs(dtype),
        }
        slug = "".join(ch if ch.isalnum() or ch in "-." else "_" for ch in Path(self.lm.spec.name).name)
        return compiled_dir() / f"{slug}-head-{dtype}-{fingerprint_key(fp)}" / f"{length}.pt2"

    def _build(self, cache: HeadCache, path: Path) -> None:
        head, n = self.head, EXAMPLE_PASS
        dtype, device = head.dtype, self.lm.device
        with torch.inference_mode(False), torch.no_grad():
            example = (
                torch.zeros((1, n), dtype=torch.long, device=device),
                torch.zeros((1, n, head.config.hidden_size), dtype=dtype, device=device),
                torch.arange(n, device=device)[None],
                HeadCache(cache.keys.clone(), cache.values.clone(), torch.zeros((), dtype=torch.long)).mask(
                    n, dtype
                ),
                torch.zeros((), dtype=torch.long, device=device),
                cache.keys.clone(),
                cache.values.clone(),
                torch.tensor(window(0, n, cache.capacity)),
            )
            tokens = torch.export.Dim("tokens", min=1, max=MAX_PASS)
            shapes = {
                "ids": {1: tokens},
                "features": {1: tokens},
                "positions": {1: tokens},
                "mask": {2: tokens},
                "length": None,
                "keys": None,
                "values": None,
                "window": None,
            }
            try:
                program = torch.export.export(HeadStep(head), example, dynamic_shapes=shapes, strict=False)
            except Exception as error:  # noqa: BLE001 - torch.export raises many kinds
                raise DraftlabError(
                    f"--compile cannot export the head '{self.lm.spec.name}' ({first_line(error)}); "
                    "run it without --compile"
                ) from None
        write_package(program, path, self.lm.spec.dtype)


def compiled_head(lm) -> CompiledHead:
    """The head's `CompiledHead`, made once per head object."""
    if lm.device.type != "cpu":
        raise DraftlabError(
            f"--compile builds CPU packages; the head '{lm.spec.name}' is on {lm.device.type}"
        )
    steps = getattr(lm.model, "_draftlab_compiled_head", None)
    if steps is None:
        steps = CompiledHead(lm)
        lm.model._draftlab_compiled_head = steps
    return steps
