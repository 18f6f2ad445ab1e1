"""The DFlash decoders: block drafts as chains (dflash) or as token trees (dflash-tree), sized each
round from the cost curve (k = 0: a plain step)."""

from __future__ import annotations

import dataclasses

from draftlab.decode.build import chain_decoder, check_fits, tree_decoder
from draftlab.drafters.dflash.lm import DFlashLM
from draftlab.drafters.dflash.proposer import DFlashProposer, DFlashTreeProposer
from draftlab.errors import DraftlabError


def _drafter(draft, target, config, cost):
    check_fits(config, target)
    if not isinstance(draft, DFlashLM):
        raise DraftlabError(f"'{draft.spec.name}' is not a DFlash drafter (--dflash)")
    # One pass drafts all k tokens: the cost model prices a block, not k chained passes.
    return dataclasses.replace(cost, block=draft.model.block_size) if cost is not None else None


def build_dflash(config, target, draft, cost):
    cost = _drafter(draft, target, config, cost)
    proposer = DFlashProposer(draft, frozenset(target.eos_token_ids))
    k_max = min(config.gamma, draft.model.block_size - 1)
    return chain_decoder(config, target, cost, proposer, k_max, free_drafts=False)


def build_dflash_tree(config, target, draft, cost):
    cost = _drafter(draft, target, config, cost)
    depth = min(config.gamma, draft.model.block_size - 1)
    eos = frozenset(target.eos_token_ids)
    return tree_decoder(
        config, target, cost, lambda sizer: DFlashTreeProposer(draft, config.tree_width, eos), depth, depth
    )
