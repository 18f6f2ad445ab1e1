"""The SuffixDecoding decoder."""

from __future__ import annotations

from draftlab.decode.build import tree_decoder
from draftlab.drafters.suffix.proposer import SuffixProposer


def build_suffix(config, target, draft, cost):
    def proposer(sizer):
        return SuffixProposer(max_depth=config.pld_tokens)

    return tree_decoder(config, target, cost, proposer, config.pld_tokens, config.pld_tokens)
