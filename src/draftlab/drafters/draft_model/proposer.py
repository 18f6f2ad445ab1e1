"""A small draft model proposes tokens autoregressively with its own KV cache."""

from __future__ import annotations

import torch

from draftlab.models.cached import CachedModel
from draftlab.proposers.base import Proposal, Proposer
from draftlab.sampling import Sampler, SamplingParams, argmax_rows, warp_probs


class DraftModelBase(Proposer):
    """A proposer that runs a draft model with its own cache, kept in step with the sequence."""

    def __init__(
        self, draft: CachedModel, stop_tokens: frozenset[int] = frozenset(), lazy_prefill: bool = False
    ) -> None:
        self.draft = draft
        # Drafting past an end-of-sequence token is wasted: nothing after it can be kept.
        self.stop_tokens = stop_tokens
        # With cost-aware sizing a round may never draft; the prompt then goes through the draft
        # only when it first drafts, as part of that round's (costed) catch-up pass.
        self.lazy_prefill = lazy_prefill

    @property
    def forward_calls(self) -> int:  # type: ignore[override]
        return self.draft.forward_calls

    def start(self, prompt_ids: list[int], prefix: list[int]) -> None:
        own_prefix = self.draft.start(prompt_ids)
        # Prefill everything but the last prefix token; `propose` feeds the rest.
        if len(own_prefix) > 1 and not self.lazy_prefill:
            self.draft.forward(own_prefix[:-1], keep=1)

    def rollback(self, length: int) -> None:
        self.draft.crop(length)

    def lag(self, sequence: list[int]) -> int:
        return len(sequence) - self.draft.length


class DraftModelProposer(DraftModelBase):
    """Drafts up to γ tokens; with `confidence` > 0 it stops early after a token it is unsure of.

    The early stop is HF's `assistant_confidence_threshold` (and the idea behind SpecDec++'s
    adaptive candidate length): a token the draft gives less than `confidence` probability is
    likely to be rejected, so drafting more after it mostly wastes draft passes. The stop
    depends only on the draft's own distribution, so verification stays exact.
    """

    def __init__(
        self,
        draft: CachedModel,
        target_vocab_size: int,
        confidence: float = 0.0,
        stop_tokens: frozenset[int] = frozenset(),
        lazy_prefill: bool = False,
    ) -> None:
        super().__init__(draft, stop_tokens, lazy_prefill)
        self.target_vocab_size = target_vocab_size
        self.confidence = confidence

    def _keep_going(self, probs: torch.Tensor | None, logits: torch.Tensor) -> bool:
        return True

    def propose(self, sequence: list[int], k: int, params: SamplingParams, sampler: Sampler) -> Proposal:
        # The cache may lag the sequence by a few tokens (the last draft token and the
        # target's correction or bonus token were never fed); catch up in one forward.
        pending = sequence[self.draft.length :]
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        fell_back = False
        for i in range(k):
            logits = self.draft.forward(pending, keep=1)[-1]
            probs = None if params.greedy else warp_probs(logits, params)
            if not self._keep_going(probs, logits):
                fell_back = True
                break
            # Its place in the sequence: a keyed sampler draws the draft's token with the noise the
            # target's token there will be drawn with.
            if probs is None:  # greedy: the argmax its compiled pass made, else the logits'
                made = getattr(self.draft, "argmax", None)
                token = made[-1] if made is not None else argmax_rows(logits)[0]
            else:
                token = sampler.draw(probs, len(sequence) + i)
            tokens.append(token)
            if probs is not None:
                rows.append(probs)
            pending = [token]
            if token in self.stop_tokens:
                break
            # Not after the last token: stopping there changes nothing, and the greedy check is a
            # softmax over the whole vocabulary (0.16 ms of a 1.2 ms k = 1 proposal on a Zen4).
            last = i == k - 1
            if self.confidence > 0 and not last and self._token_prob(token, probs, logits) < self.confidence:
                break
        stacked = self._pad_vocab(torch.stack(rows)) if rows else None
        return Proposal(tokens, stacked, fell_back)

    @staticmethod
    def _token_prob(token: int, probs: torch.Tensor | None, logits: torch.Tensor) -> float:
        if probs is None:  # greedy: the token is the argmax, so its probability is the top one
            return _top_probability(logits)
        return float(probs[token])

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

    def __init__(
        self,
        draft: CachedModel,
        target_vocab_size: int,
        fallback_threshold: float,
        stop_tokens: frozenset[int] = frozenset(),
    ) -> None:
        super().__init__(draft, target_vocab_size, stop_tokens=stop_tokens)
        self.fallback_threshold = fallback_threshold

    def _keep_going(self, probs: torch.Tensor | None, logits: torch.Tensor) -> bool:
        return _top_probability(logits) >= self.fallback_threshold


def _top_probability(logits: torch.Tensor) -> float:
    return float(torch.softmax(logits.float(), dim=-1).max())
