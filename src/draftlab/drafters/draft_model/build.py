"""Decoders of the draft-model methods: sps, sps-tree and BiLD."""

from __future__ import annotations

from draftlab.decode.build import chain_decoder, target_of, tree_decoder
from draftlab.decode.loop import SpeculativeDecoder
from draftlab.drafters.draft_model.proposer import BildProposer, DraftModelProposer
from draftlab.drafters.draft_model.tree import DraftTreeProposer
from draftlab.models.cached import cached, draft_compiles
from draftlab.verify.rules import BildRule


def draft_of(config, target, draft, use_cache: bool):
    """The draft behind its cache; with --compile through its own compiled packages too, where it can:
    an eager pass of the default draft (4 layers) cost 5.6 ms, as much as the 4-bit target's compiled
    step, and 1.7 ms compiled (AMD Zen4), so drafting could not pay."""
    compiled = config.compile and use_cache and draft_compiles(draft, target)
    return cached(draft, use_cache=use_cache, compiled=compiled)


def build_sps(config, target, draft, cost):
    proposer = DraftModelProposer(
        draft_of(config, target, draft, config.use_cache),
        target.vocab_size,
        config.draft_confidence,
        frozenset(target.eos_token_ids),
        lazy_prefill=config.adaptive and cost is not None,
    )
    return chain_decoder(config, target, cost, proposer, config.gamma, free_drafts=False)


def draft_tree(config, target, draft, sizer) -> DraftTreeProposer:
    return DraftTreeProposer(
        draft_of(config, target, draft, use_cache=True),
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
        draft_of(config, target, draft, config.use_cache),
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
