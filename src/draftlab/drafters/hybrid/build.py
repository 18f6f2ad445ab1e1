"""The hybrid decoder: one tree from the draft model and from prompt lookup."""

from __future__ import annotations

from draftlab.decode.build import tree_decoder
from draftlab.drafters.draft_model.build import draft_tree
from draftlab.drafters.hybrid.proposer import HybridTreeProposer
from draftlab.drafters.lookup.tree import LookupTreeProposer


def build_hybrid(config, target, draft, cost):
    def proposer(sizer):
        lookup = LookupTreeProposer(config.max_ngram, depth=config.pld_tokens)
        return HybridTreeProposer(draft_tree(config, target, draft, sizer), lookup)

    depth = max(config.gamma, config.pld_tokens)
    return tree_decoder(config, target, cost, proposer, depth, config.gamma)
