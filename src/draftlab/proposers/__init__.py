"""Layer 2: proposers. Each one suggests the next few tokens; the target then verifies them."""

from draftlab.proposers.base import NoProposer, Proposal, Proposer
from draftlab.proposers.draft_model import BildProposer, DraftModelProposer
from draftlab.proposers.ngram import PromptLookupProposer

__all__ = [
    "BildProposer",
    "DraftModelProposer",
    "NoProposer",
    "PromptLookupProposer",
    "Proposal",
    "Proposer",
]
