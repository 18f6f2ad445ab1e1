"""Decoders of the draft-model methods: sps, sps-tree and BiLD."""

from __future__ import annotations

from draftlab.decode.build import chain_decoder, target_of, tree_decoder
from draftlab.decode.loop import SpeculativeDecoder
from draftlab.drafters.draft_model.proposer import BildProposer, DraftModelProposer
from draftlab.drafters.draft_model.tree import DraftTreeProposer
from draftlab.models.cached import cached
from draftlab.verify.rules import BildRule


def build_sps(config, target, draft, cost):
    proposer = DraftModelProposer(
        cached(draft, use_cache=config.use_cache),
        target.vocab_size,
        config.draft_confidence,
        frozenset(target.eos_token_ids),
        lazy_prefill=config.adaptive and cost is not None,
    )
    return chain_decoder(config, target, cost, proposer, config.gamma, free_drafts=False)


def draft_tree(config, target, draft, sizer) -> DraftTreeProposer:
    return DraftTreeProposer(
        cached(draft, use_cache=True),
        width=config.tree_width,
        stop_tokens=frozenset(target.eos_token_ids),
        lazy_prefill=sizer is not None,
        depth=config.gamma,
    )


def build_sps_tree(config, target, draft, cost):
    def proposer(sizer):
        return draft_tree(config, target, draft, sizer)

    return tree_decoder(config, target, cost, proposer, config.gamma, config.gamma)


def build_bild(config, target, draft, cost):
    proposer = BildProposer(
        cached(draft, use_cache=config.use_cache),
        target.vocab_size,
        config.option("fallback_threshold"),
        frozenset(target.eos_token_ids),
    )
    return SpeculativeDecoder(
        target_of(config, target),
        proposer,
        BildRule(config.option("rollback_threshold")),
        gamma=config.option("max_small_steps"),
    )
