"""Layer 2: proposers. Each one suggests the next few tokens; the target then verifies them."""

from draftlab.proposers.base import NoProposer, Proposal, Proposer
from draftlab.proposers.draft_model import BildProposer, DraftModelProposer
from draftlab.proposers.draft_tree import DraftTreeProposer
from draftlab.proposers.hybrid import HybridTreeProposer
from draftlab.proposers.lookup_tree import LookupTreeProposer
from draftlab.proposers.ngram import PromptLookupProposer
from draftlab.proposers.suffix import SuffixProposer

__all__ = [
    "BildProposer",
    "DraftModelProposer",
    "DraftTreeProposer",
    "HybridTreeProposer",
    "LookupTreeProposer",
    "NoProposer",
    "PromptLookupProposer",
    "Proposal",
    "Proposer",
    "SuffixProposer",
]
