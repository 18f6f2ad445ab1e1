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


class Proposer:
    """Suggests up to k tokens that continue `sequence`. Stateless proposers need no start/rollback."""

    forward_calls: int = 0

    def start(self, prompt_ids: list[int], prefix: list[int]) -> None:
        """A new generation: `prompt_ids` is the user's prompt, `prefix` the target's sequence start."""

    def propose(self, sequence: list[int], k: int, params: SamplingParams, sampler: Sampler) -> Proposal:
        raise NotImplementedError

    def rollback(self, length: int) -> None:
        """The first `length` tokens of the sequence are final; forget any state past them."""


class NoProposer(Proposer):
    """Proposes nothing: the decode loop then is plain autoregressive decoding."""

    def propose(self, sequence: list[int], k: int, params: SamplingParams, sampler: Sampler) -> Proposal:
        return Proposal()
