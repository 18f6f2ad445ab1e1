"""Decoders of prompt lookup: its chain (pld) and its tree (pld-tree)."""

from __future__ import annotations

from draftlab.decode.build import chain_decoder, tree_decoder
from draftlab.drafters.lookup.ngram import PromptLookupProposer
from draftlab.drafters.lookup.tree import LookupTreeProposer


def build_pld(config, target, draft, cost):
    proposer = PromptLookupProposer(config.max_ngram)
    return chain_decoder(config, target, cost, proposer, config.pld_tokens, free_drafts=True)


def build_pld_tree(config, target, draft, cost):
    def proposer(sizer):
        return LookupTreeProposer(config.max_ngram, depth=config.pld_tokens)

    return tree_decoder(config, target, cost, proposer, config.pld_tokens, config.pld_tokens)
