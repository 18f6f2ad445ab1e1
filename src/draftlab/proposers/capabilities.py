"""What only some proposers do, each a small protocol that those proposers implement and the loop
checks for (decode/loop.py); the base class (proposers/base.py) carries none of it."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from draftlab.proposal import Proposal


@runtime_checkable
class SizedDrafting(Protocol):
    """Proposing costs draft-model passes: before each round the tree sizer decides whether drafting
    pays (`use_draft`) and how likely the best leaf must be for the tree to grow a level (`min_value`)."""

    use_draft: bool
    min_value: float


@runtime_checkable
class LookupPart(Protocol):
    """A draft tree with a free part: what lookups propose without drafting (the hybrid's prompt
    lookup), which the draft must add to, not merely beat a plain step."""

    def lookup_tree(self, sequence: list[int]) -> Proposal: ...


@runtime_checkable
class TakesFeatures(Protocol):
    """Drafts from the target's hidden states (EAGLE heads): the loop asks the target's pass for
    `feature_layers` and hands over the rows of the positions that became final."""

    feature_layers: tuple[int, ...]

    def take_features(self, start: int, features: torch.Tensor) -> None:
        """The target's hidden states for sequence positions start, start + 1, ..."""
        ...
