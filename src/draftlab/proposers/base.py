"""The proposer interface, in the spirit of vLLM's proposer / rejection-sampler split."""

from __future__ import annotations

import torch

from draftlab.proposal import Proposal
from draftlab.sampling import Sampler, SamplingParams

__all__ = ["NoProposer", "Proposal", "Proposer"]


class Proposer:
    """Suggests up to k tokens that continue `sequence`. Stateless proposers need no start/rollback."""

    forward_calls: int = 0
    makes_trees: bool = False  # proposes token trees (Proposal.parents)
    draft_passes: bool = False  # proposing costs draft-model passes (the sizer decides whether to draft)
    has_lookup: bool = False  # a draft-model tree that can still propose from lookups without drafting
    use_draft: bool = True  # set before each round when `draft_passes`
    min_value: float = 0.0  # draft trees: grow a level only while the best leaf is this likely
    # Target hidden-state layers the proposer drafts from (EAGLE heads); the loop hands them over.
    feature_layers: tuple[int, ...] = ()

    def lookup_tree(self, sequence: list[int]) -> Proposal:
        """`has_lookup` proposers: the free (prompt-lookup) part of this round's proposal."""
        return Proposal(parents=[])

    def start(self, prompt_ids: list[int], prefix: list[int]) -> None:
        """A new generation: `prompt_ids` is the user's prompt, `prefix` the target's sequence start."""

    def propose(self, sequence: list[int], k: int, params: SamplingParams, sampler: Sampler) -> Proposal:
        raise NotImplementedError

    def rollback(self, length: int) -> None:
        """The first `length` tokens of the sequence are final; forget any state past them."""

    def take_features(self, start: int, features: torch.Tensor) -> None:
        """`feature_layers` proposers: the target's hidden states for sequence positions start, start + 1, ..."""

    def lag(self, sequence: list[int]) -> int:
        """Tokens of `sequence` a model-based proposer has not consumed yet (its next pass feeds them)."""
        return 0

    def finish(self, prompt_ids: list[int], output_ids: list[int]) -> None:
        """A generation ended with `output_ids` (a proposer may learn from earlier outputs)."""

    def info(self) -> dict:
        """What the report should say about this generation's proposals (empty: nothing)."""
        return {}

    def share(self, other: Proposer) -> None:
        """Learn into (and from) `other`'s memory: the same method's proposer in another dtype."""


class NoProposer(Proposer):
    """Proposes nothing: the decode loop then is plain autoregressive decoding."""

    def propose(self, sequence: list[int], k: int, params: SamplingParams, sampler: Sampler) -> Proposal:
        return Proposal()
