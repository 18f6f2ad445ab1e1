"""Decoders of the EAGLE-3 head: chains (eagle) and dynamic trees (eagle-tree)."""

from __future__ import annotations

from draftlab.decode.build import chain_decoder, check_fits, tree_decoder
from draftlab.drafters.eagle3.cached import HeadModel
from draftlab.drafters.eagle3.proposer import EagleProposer, EagleTreeProposer
from draftlab.errors import DraftlabError


def head_model(draft, compiled: bool = False) -> HeadModel:
    """The head behind its cache; with --compile its passes run through its own package too."""
    if not getattr(draft, "is_head", False):
        raise DraftlabError(f"'{draft.spec.name}' is a model, not an EAGLE-3 head (--head)")
    return HeadModel(draft, compiled=compiled)


def build_eagle(config, target, draft, cost):
    check_fits(config, target)
    proposer = EagleProposer(
        head_model(draft, config.compile), config.draft_confidence, frozenset(target.eos_token_ids)
    )
    return chain_decoder(config, target, cost, proposer, config.gamma, free_drafts=False)


def build_eagle_tree(config, target, draft, cost):
    def proposer(sizer):
        eos = frozenset(target.eos_token_ids)
        return EagleTreeProposer(
            head_model(draft, config.compile), config.tree_width, eos, depth=config.gamma
        )

    return tree_decoder(config, target, cost, proposer, config.gamma, config.gamma)
