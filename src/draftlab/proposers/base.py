"""The proposer interface, in the spirit of vLLM's proposer / rejection-sampler split."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from draftlab.sampling import Sampler, SamplingParams


@dataclass
class Proposal:
    tokens: list[int] = field(default_factory=list)
    # The (warped) draft distribution each token was drawn from, [k, V]; None means the
    # proposer is deterministic, i.e. q is one-hot on the proposed token.
    probs: torch.Tensor | None = None
    # BiLD: the small model stopped because it was unsure, so the target writes the next token.
    fell_back: bool = False
    # What sort of evidence the proposal rests on (prompt lookup: the n-gram length matched), so
    # that acceptance can be estimated per sort; None where there is one sort only.
    kind: str | None = None

    def truncate(self, k: int) -> Proposal:
        if k >= len(self.tokens):
            return self
        probs = self.probs[:k] if self.probs is not None and k else None
        return Proposal(self.tokens[:k], probs, self.fell_back, self.kind)


class Proposer:
    """Suggests up to k tokens that continue `sequence`. Stateless proposers need no start/rollback."""

    forward_calls: int = 0

    def start(self, prompt_ids: list[int], prefix: list[int]) -> None:
        """A new generation: `prompt_ids` is the user's prompt, `prefix` the target's sequence start."""

    def propose(self, sequence: list[int], k: int, params: SamplingParams, sampler: Sampler) -> Proposal:
        raise NotImplementedError

    def rollback(self, length: int) -> None:
        """The first `length` tokens of the sequence are final; forget any state past them."""

    def lag(self, sequence: list[int]) -> int:
        """Tokens of `sequence` a model-based proposer has not consumed yet (its next pass feeds them)."""
        return 0


class NoProposer(Proposer):
    """Proposes nothing: the decode loop then is plain autoregressive decoding."""

    def propose(self, sequence: list[int], k: int, params: SamplingParams, sampler: Sampler) -> Proposal:
        return Proposal()
