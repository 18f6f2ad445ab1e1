"""The proposer interface: each drafter (drafters/<algorithm>/) suggests the next tokens; the target verifies them."""

from draftlab.proposers.base import NoProposer, Proposal, Proposer

__all__ = ["NoProposer", "Proposal", "Proposer"]
