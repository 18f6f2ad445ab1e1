"""DFlash as a proposer: one block pass proposes k tokens after the last one.

The loop hands over the target's hidden states at the drafter's taps for every position that became
final (TakesFeatures). They wait here until the next block pass fuses them into context rows and
caches their keys and values; the pass then runs the anchor (the sequence's last token, whose own
hidden states the target has not computed yet) and k mask tokens, and the cache is cropped back to
the context, so that it only ever holds final positions. The pass always runs the whole block, as the
drafter was trained; only the first k rows go through the output head.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from draftlab.drafters.dflash.head import crop_to
from draftlab.drafters.dflash.lm import DFlashLM
from draftlab.errors import DraftlabError
from draftlab.proposers.base import Proposal, Proposer
from draftlab.sampling import Sampler, SamplingParams, argmax_rows, warp_probs


class DFlashProposer(Proposer):
    def __init__(self, lm: DFlashLM, stop_tokens: frozenset[int] = frozenset()) -> None:
        self.draft = lm  # what the loop reads of a proposer's second model (its device)
        self.model = lm.model
        self.feature_layers = self.model.feature_layers
        self.stop_tokens = stop_tokens
        self.forward_calls = 0
        self._cache = DynamicCache()
        self._cached = 0  # context rows in the cache: positions 0 .. _cached - 1
        width = len(self.model.taps) * self.model.target_hidden_size
        self._waiting = torch.zeros(0, width, device=lm.device)  # features of positions _cached ..

    @property
    def known(self) -> int:
        """Positions whose target features are here (cached or waiting): 0 .. known - 1."""
        return self._cached + len(self._waiting)

    def start(self, prompt_ids: list[int], prefix: list[int]) -> None:
        self._cache, self._cached = DynamicCache(), 0
        self._waiting = self._waiting[:0]

    def take_features(self, start: int, features: torch.Tensor) -> None:
        if start > self.known:
            raise DraftlabError(f"target features from position {start}, but only {self.known} are known")
        if start < self._cached:
            crop_to(self._cache, start)
            self._cached, self._waiting = start, self._waiting[:0]
        kept = self._waiting[: start - self._cached]
        self._waiting = torch.cat([kept, features.to(self.draft.device, kept.dtype)])

    def rollback(self, length: int) -> None:
        if length < self._cached:
            crop_to(self._cache, length)
            self._cached, self._waiting = length, self._waiting[:0]
        else:
            self._waiting = self._waiting[: length - self._cached]

    @torch.inference_mode()
    def propose(self, sequence: list[int], k: int, params: SamplingParams, sampler: Sampler) -> Proposal:
        anchor = len(sequence) - 1
        k = min(k, self.model.block_size - 1)
        if k <= 0 or self.known < anchor:  # the first round: no target features yet
            return Proposal()
        draft, device = self.model, self.draft.device
        context = draft.fuse(self._waiting[: anchor - self._cached])[None]
        # The whole block, as trained, whatever k is asked for: its rows see each other.
        size = draft.block_size
        ids = torch.tensor([[sequence[-1]] + [draft.mask_token_id] * (size - 1)], device=device)
        block = self.draft.embedding(ids).to(context.dtype)
        positions = torch.arange(self._cached, anchor + size, device=device)[None]
        out = draft(block, context, positions, self._cache)
        crop_to(self._cache, anchor)
        self._waiting = self._waiting[anchor - self._cached :]
        self._cached = anchor
        self.forward_calls += 1
        logits = self.draft.output_head(out[0, 1 : k + 1])
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        for i in range(k):
            if params.greedy:
                token = argmax_rows(logits[i : i + 1])[0]
            else:
                probs = warp_probs(logits[i], params)
                # A keyed sampler draws with the noise the target's token at that position will use.
                token = sampler.draw(probs, len(sequence) + i)
                rows.append(probs)
            tokens.append(token)
            if token in self.stop_tokens:
                break
        return Proposal(tokens, torch.stack(rows) if rows else None)
