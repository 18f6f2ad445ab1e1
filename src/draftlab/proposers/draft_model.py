"""A small draft model proposes tokens autoregressively with its own KV cache."""

from __future__ import annotations

import torch

from draftlab.models.cached import CachedModel
from draftlab.proposers.base import Proposal, Proposer
from draftlab.sampling import Sampler, SamplingParams, warp_probs


class DraftModelProposer(Proposer):
    def __init__(self, draft: CachedModel, target_vocab_size: int) -> None:
        self.draft = draft
        self.target_vocab_size = target_vocab_size

    @property
    def forward_calls(self) -> int:  # type: ignore[override]
        return self.draft.forward_calls

    def start(self, prompt_ids: list[int], prefix: list[int]) -> None:
        own_prefix = self.draft.start(prompt_ids)
        # Prefill everything but the last prefix token; `propose` feeds the rest.
        if len(own_prefix) > 1:
            self.draft.forward(own_prefix[:-1], last_only=True)

    def rollback(self, length: int) -> None:
        self.draft.crop(length)

    def _keep_going(self, probs: torch.Tensor | None, logits: torch.Tensor) -> bool:
        return True

    def propose(self, sequence: list[int], k: int, params: SamplingParams, sampler: Sampler) -> Proposal:
        # The cache may lag the sequence by a few tokens (the last draft token and the
        # target's correction or bonus token were never fed); catch up in one forward.
        pending = sequence[self.draft.length :]
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        fell_back = False
        for _ in range(k):
            logits = self.draft.forward(pending, last_only=True)[-1]
            probs = None if params.greedy else warp_probs(logits, params)
            if not self._keep_going(probs, logits):
                fell_back = True
                break
            token = int(torch.argmax(logits).item()) if probs is None else sampler.draw(probs)
            tokens.append(token)
            if probs is not None:
                rows.append(probs)
            pending = [token]
        stacked = self._pad_vocab(torch.stack(rows)) if rows else None
        return Proposal(tokens, stacked, fell_back)

    def _pad_vocab(self, probs: torch.Tensor) -> torch.Tensor:
        """Draft and target may pad their embedding tables differently; align q to the target's V."""
        extra = self.target_vocab_size - probs.shape[-1]
        if extra > 0:
            return torch.nn.functional.pad(probs, (0, extra))
        return probs[..., : self.target_vocab_size]


class BildProposer(DraftModelProposer):
    """BiLD's small-model loop: generate while the small model is confident, at most N tokens.

    When the small model's top probability drops below the fallback threshold the block
    ends and the large model writes the next token (fallback). Reaching N tokens ends the
    block without a fallback: the large model then only checks the block for rollbacks.
    """

    def __init__(self, draft: CachedModel, target_vocab_size: int, fallback_threshold: float) -> None:
        super().__init__(draft, target_vocab_size)
        self.fallback_threshold = fallback_threshold

    def _keep_going(self, probs: torch.Tensor | None, logits: torch.Tensor) -> bool:
        confidence = torch.softmax(logits.float(), dim=-1).max().item()
        return confidence >= self.fallback_threshold
