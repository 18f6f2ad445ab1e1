"""EAGLE-3 heads as proposers: the draft-model chain and the EAGLE-2 dynamic tree, drafting from
the target's features instead of a draft model's own layers.

The head behaves as a draft model over the same sequence (drafters/eagle3/cached.py), so the chain
and tree proposers of draft models drive it unchanged; what is added here is the hand-over of
the target's hidden states after each verification pass, and no draft before the first one.
"""

from __future__ import annotations

import torch

from draftlab.drafters.draft_model.proposer import DraftModelProposer
from draftlab.drafters.draft_model.tree import DraftTreeProposer
from draftlab.drafters.eagle3.cached import HeadModel
from draftlab.proposers.base import Proposal
from draftlab.sampling import Sampler, SamplingParams


class _HeadFeatures:
    """What both EAGLE proposers add to their draft-model parents (listed first in their bases)."""

    draft: HeadModel

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return self.draft.head.aux_layers

    def take_features(self, start: int, features: torch.Tensor) -> None:
        self.draft.take_features(start, features)

    def rollback(self, length: int) -> None:
        self.draft.crop(length)
        self.draft.trim_features(length)


class EagleProposer(_HeadFeatures, DraftModelProposer):
    """Chains of up to γ head tokens (the prefill round drafts nothing: no target features yet)."""

    def __init__(self, head: HeadModel, confidence: float = 0.0, stop_tokens: frozenset[int] = frozenset()):
        super().__init__(head, head.lm.vocab_size, confidence, stop_tokens, lazy_prefill=True)

    def propose(self, sequence: list[int], k: int, params: SamplingParams, sampler: Sampler) -> Proposal:
        if not self.draft.ready(len(sequence)):
            return Proposal()
        return super().propose(sequence, k, params, sampler)


class EagleTreeProposer(_HeadFeatures, DraftTreeProposer):
    """EAGLE-2's dynamic tree over the head: the likeliest leaves expanded level by level."""

    def __init__(
        self, head: HeadModel, width: int, stop_tokens: frozenset[int] = frozenset(), depth: int | None = None
    ):
        super().__init__(head, width, stop_tokens, lazy_prefill=True, depth=depth)

    def propose(self, sequence: list[int], k: int, params: SamplingParams, sampler: Sampler) -> Proposal:
        if not self.draft.ready(len(sequence)):
            return Proposal(parents=[])
        return super().propose(sequence, k, params, sampler)
