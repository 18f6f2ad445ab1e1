"""An EAGLE-3 head behind the decode loop's model interface: start, forward, crop, trees.

The head sees the same token sequence as the target. Its entry for the token at position p reads
the feature of position p - 1: the target's (fused) feature where the target has scored p - 1, and
otherwise, while drafting, the head's own output for p - 1 (its parent, in a tree). Entries made
from the head's own features are dropped as soon as the target's features for them arrive, so the
accepted tokens are re-read with the target's features, as EAGLE does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from transformers import DynamicCache

from draftlab.drafters.eagle3.compiled import compiled_head
from draftlab.drafters.eagle3.head import Eagle3Head
from draftlab.errors import DraftlabError
from draftlab.models.cached import TreeArea, crop_sequence
from draftlab.models.compiled import RESERVE, bucket_mask
from draftlab.models.loading import LoadedModel, ModelSpec

# The version of the head's passes in its compiled profiles: 2, a prompt's catch-up computes the
# logits of its last row only and attends causally through draftlab's kernel (stop 80: 256 tokens
# 26 -> 16 ms on a Zen4), so profiles that priced the old one are measured again.
HEAD_PASSES = 2


class Rows:
    """Rows [n, width] in a buffer that doubles when full. Writing rows from a position on replaces
    everything after it without copying what comes before: torch.cat of the whole history did, in
    every pass and every round (an EAGLE round's bookkeeping took 0.7 ms of a 6.7 ms round)."""

    @torch.inference_mode()  # the buffer is written inside and outside the passes' inference mode
    def __init__(self, width: int, dtype: torch.dtype, device: torch.device) -> None:
        self._buffer = torch.zeros(256, width, dtype=dtype, device=device)
        self.length = 0
        # Puts not yet written (`put_later`), in order: writing them in that order gives every row
        # below `length` its latest value, whatever cuts came between.
        self._later: list[tuple[int, torch.Tensor]] = []

    def __len__(self) -> int:
        return self.length

    def view(self) -> torch.Tensor:
        """The rows kept, [length, width] (a view of the buffer: the next `put` may change it)."""
        self._write_later()
        return self._buffer[: self.length]

    def __getitem__(self, i: int) -> torch.Tensor:
        if not 0 <= i < self.length:
            raise IndexError(f"row {i} of {self.length}")
        self._write_later()
        return self._buffer[i]

    def put_later(self, start: int, rows: torch.Tensor) -> None:
        """`put`, written when the rows are next read: for rows that may never be (an EAGLE head's
        target features in rounds that do not draft: writing them took ~50 µs of a 3.8 ms round).
        `rows` must not change afterwards (a pass's own output)."""
        if start > self.length:
            raise DraftlabError(f"rows from {start}, but only {self.length} are kept")
        self._later.append((start, rows))
        self.length = start + rows.shape[0]

    def _write_later(self) -> None:
        if self._later:
            later, self._later, length = self._later, [], self.length
            for start, rows in later:
                self._write(start, rows)
            self.length = length

    def put(self, start: int, rows: torch.Tensor) -> None:
        """Rows start, start + 1, ... become `rows`, and the rows after them are dropped."""
        if start > self.length:
            raise DraftlabError(f"rows from {start}, but only {self.length} are kept")
        self._write_later()
        self._write(start, rows)

    @torch.inference_mode()
    def _write(self, start: int, rows: torch.Tensor) -> None:
        end = start + rows.shape[0]
        if end > self._buffer.shape[0]:
            old = self._buffer
            bigger = old.new_zeros(max(end, 2 * old.shape[0]), old.shape[1])
            bigger[: old.shape[0]] = old  # whole: rows past `length` may be put later's, not yet replayed
            self._buffer = bigger
        self._buffer[start:end] = rows
        self.length = end

    def cut(self, length: int) -> None:
        self.length = min(self.length, length)


@dataclass
class HeadLM:
    """A loaded head with what the CLI, the profile and the reports read of a loaded model."""

    model: Eagle3Head
    tokenizer: object  # the target's
    spec: ModelSpec
    path: str
    eos_token_ids: set[int] = field(default_factory=set)
    target_context: int | None = None
    is_encoder_decoder: bool = False
    is_head: bool = True
    storage: str | None = None  # heads run in their dtype (no 4-bit storage)
    # Its passes have a compiled package of their own (drafters/eagle3/compiled.py) on a CPU.
    packaged: ClassVar[bool] = True
    engine: ClassVar[str] = "hf"

    def fingerprint(self, compiled: bool = False) -> dict:
        """A transformers model's fields (the head's own config, device and weights); a compiled
        profile also names the version of the head's passes (HEAD_PASSES), its package's does not."""
        fp = LoadedModel.fingerprint(self, compiled)
        return {**fp, "head_passes": HEAD_PASSES} if compiled else fp

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    @property
    def context_length(self) -> int | None:
        return self.target_context

    @property
    def num_parameters(self) -> int:
        """The head's own weights: the embedding is the target's and not counted; a block layer
        (Q8_0 beside a 4-bit target) counts the matrix it holds."""
        return sum(p.numel() for p in self._own_weights()) + sum(
            m.in_features * m.out_features for m in self._block_layers()
        )

    def weight_bytes(self) -> int:
        """Bytes a pass reads: its own weights (a block layer's codes and scales), of its copy of the
        target's embedding a row a token."""
        return sum(p.numel() * p.element_size() for p in self._own_weights()) + sum(
            m.step_bytes() for m in self._block_layers()
        )

    def _own_weights(self):
        return (p for n, p in self.model.named_parameters() if not n.startswith("embed_tokens"))

    def _block_layers(self):
        from draftlab.models.q4 import block_layers  # noqa: PLC0415

        return block_layers(self.model)

    def cached_model(self, use_cache: bool = True, compiled: bool = False) -> HeadModel:
        # What `draftlab profile` times: the head's passes, with zero features where none are known;
        # `compiled`: through its own package, as a compiled target's decoder drafts with it.
        return HeadModel(self, blind=True, compiled=compiled)


class HeadModel:
    """The head with its own KV cache (a transformers DynamicCache, rolled back with `crop`)."""

    def __init__(self, lm: HeadLM, blind: bool = False, compiled: bool = False) -> None:
        self.lm = lm
        # Passes through the head's compiled package over a static cache (drafters/eagle3/compiled.py).
        self.compiled = compiled_head(lm) if compiled else None
        self.head = lm.model
        self.device = lm.device
        self.blind = blind  # profiling only: a position without a known feature reads zeros
        self.forward_calls = 0
        self.dtype = self.head.dtype
        self.hidden = self.head.config.hidden_size
        self._tokens: list[int] = []
        self._cache = DynamicCache()
        self._own = Rows(self.hidden, self.dtype, self.device)  # outputs per slot
        self._features = Rows(self.hidden, self.dtype, self.device)  # fused, per position
        # The target's features (aux layers side by side, held in the head's dtype), fused only when the head
        # next drafts: in one pass over the fuse's weights for every row since, and never in the
        # rounds that do not draft (fusing each round took 0.9 ms of a 15 ms round on a Zen3).
        self._aux = Rows(self.head.fc.in_features, self.dtype, self.device)
        self._first_own: int | None = None  # the first slot fed with the head's own feature
        self._tree: TreeArea | None = None

    @property
    def length(self) -> int:
        return len(self._tokens)

    @property
    def known(self) -> int:
        """Positions whose target feature is known (0 .. known - 1)."""
        return len(self._aux)

    def ready(self, sequence_length: int) -> bool:
        """Whether the head can draft after a sequence of this length: the target has scored all
        but its last token (in a generation's first round it has scored nothing yet)."""
        return self.known >= sequence_length - 1

    def supports_trees(self) -> bool:
        return True

    def start(self, prompt_ids: list[int]) -> list[int]:
        self._tokens = []
        if self.compiled is not None:
            self._cache = self.compiled.new_cache(len(prompt_ids) + RESERVE)
        else:
            self._cache = DynamicCache()
        self._own.cut(0)
        self._features.cut(0)
        self._aux.cut(0)
        self._first_own = None
        self._tree = None
        return list(prompt_ids)

    def take_features(self, start: int, aux: torch.Tensor) -> None:
        """The target's features for positions start, start + 1, ... ([n, layers·Ht], aux layers side
        by side; the pass's own tensor, never written after)."""
        if start > self.known:
            raise DraftlabError(f"target features from position {start}, but only {self.known} are known")
        self._aux.put_later(start, aux if aux.device == self.device else aux.to(self.device))
        self._features.cut(start)
        if self._first_own is not None:
            self.crop(self._first_own)  # re-read with the target's features

    def trim_features(self, length: int) -> None:
        self._features.cut(length)
        self._aux.cut(length)

    def _fuse_pending(self) -> None:
        """Fuse the target features taken since the head last drafted, all in one pass."""
        done, known = len(self._features), len(self._aux)
        if done < known:
            self._features.put(done, self.head.fuse(self._aux.view()[done:known]))

    def _feature(self, position: int, parent_slot: int | None) -> torch.Tensor | None:
        if position == 0:
            return None
        if position - 1 < self.known:
            return self._features[position - 1]
        if parent_slot is not None and parent_slot < len(self._own):
            return self._own[parent_slot]
        return None

    @torch.inference_mode()
    def forward(
        self, new_ids: list[int], keep: int | None = None, tree: list[int] | None = None
    ) -> torch.Tensor:
        """Logits [keep, target V] for the new tokens (-inf outside the draft vocabulary)."""
        self._fuse_pending()
        start = len(self._tokens)
        n = len(new_ids)
        n_chain = n - (len(tree) if tree is not None else 0)
        if tree is None:
            self._tree = None
            positions = list(range(start, start + n))
            parents = [p - 1 for p in positions]
            mask = None
            if n > 1:
                mask = torch.ones(n, start + n, dtype=torch.bool, device=self.device).tril(diagonal=start)
                mask = mask[None, None]
        else:
            if self._tree is None or n_chain > 0:
                self._tree = TreeArea(start + n_chain)
            area = self._tree
            first = len(area.parents)
            additive, pos = area.extend(start, n_chain, tree, self.dtype)
            mask = additive.to(self.device)
            positions = pos[0].tolist()
            parents = [p - 1 for p in positions[:n_chain]] + [
                area.base + p if p >= 0 else area.base - 1 for p in area.parents[first:]
            ]
        feats = []
        for i, (position, parent) in enumerate(zip(positions, parents, strict=True)):
            own = start + i > 0 and position - 1 >= self.known
            feature = self._feature(position, parent)
            if feature is None:
                if position > 0 and not self.blind:
                    raise DraftlabError(f"the head has no feature for position {position - 1}")
                feature = torch.zeros(self.hidden, dtype=self.dtype, device=self.device)
            elif own and self._first_own is None:
                self._first_own = start + i
            feats.append(feature)
        self._tokens.extend(new_ids)
        head = self.head
        ids = torch.tensor([new_ids], device=self.device)
        features = torch.stack(feats)[None]
        place = torch.tensor([positions], device=self.device)
        keep = n if keep is None else min(keep, n)
        if self.compiled is not None:
            out, small = self._static_pass(ids, features, place, mask, tree is not None, keep)
            self._own.put(start, out)
            self.forward_calls += 1
            return head.to_target(small[-keep:], self.lm.vocab_size).float()
        embeds = head.embed_tokens(ids).to(self.dtype)
        cos, sin = head.rope(features, place)
        layer = head.layer
        q, k, v, residual = layer.project(embeds, features, cos, sin)
        k, v = self._cache.update(k, v, 0)
        out = layer.finish(q, k, v, mask, residual)[0]
        self._own.put(start, out)
        self.forward_calls += 1
        return head.full_logits(out[-keep:], self.lm.vocab_size).float()

    def _static_pass(self, ids, features, positions, mask, tree: bool, keep: int):
        """A pass over the static cache: a chain's mask is causal over the bucket, a tree's is
        widened to it (the slots past the tree masked); logits for at least the last `keep` rows."""
        cache = self._cache
        if len(self._tokens) > cache.capacity:
            cache = self._cache = self.compiled.grown(cache, len(self._tokens))
        n = ids.shape[1]
        mask = bucket_mask(mask, cache.capacity) if tree else cache.mask(n, self.dtype)
        return self.compiled(cache, ids, features, positions, mask, keep=keep, chain=not tree)

    def warm(self, needed: int, sizes: tuple[int, ...] = (1,)) -> None:
        """Get the package of the bucket that holds `needed` ready (untimed), and run these passes once."""
        if self.compiled is None:
            return
        cache = self.compiled.new_cache(needed)
        for n in sizes:
            ids = torch.zeros((1, n), dtype=torch.long, device=self.device)
            features = torch.zeros((1, n, self.hidden), dtype=self.dtype, device=self.device)
            with torch.inference_mode():
                self.compiled(cache, ids, features, torch.arange(n)[None], cache.mask(n, self.dtype))
            cache.length.zero_()

    def crop(self, length: int) -> None:
        self._tree = None
        if not crop_sequence(self._tokens, self._cache, length):
            return
        self._own.cut(length)
        if self._first_own is not None and self._first_own >= length:
            self._first_own = None
