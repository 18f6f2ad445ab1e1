"""The proposer interface, in the spirit of vLLM's proposer / rejection-sampler split."""

from __future__ import annotations

from draftlab.proposal import Proposal
from draftlab.sampling import Sampler, SamplingParams

__all__ = ["NoProposer", "Proposal", "Proposer"]


class Proposer:
    """Suggests up to k tokens that continue `sequence`. Stateless proposers need no start/rollback.

    What only some proposers do (drafting the sizer may skip, a free lookup part, the target's hidden
    states) are small protocols of their own: proposers/capabilities.py."""

    forward_calls: int = 0
    makes_trees: bool = False  # proposes token trees (Proposal.parents)

    def start(self, prompt_ids: list[int], prefix: list[int]) -> None:
        """A new generation: `prompt_ids` is the user's prompt, `prefix` the target's sequence start."""

    def propose(self, sequence: list[int], k: int, params: SamplingParams, sampler: Sampler) -> Proposal:
        raise NotImplementedError

    def rollback(self, length: int) -> None:
        """The first `length` tokens of the sequence are final; forget any state past them."""

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
