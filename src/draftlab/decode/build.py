"""Building a method's decoder: the parts every builder shares, the baseline's, and routing across dtypes.

Each drafter's builder (drafters/<algorithm>/build.py) joins its proposer to the loop through these.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from draftlab.decode.cost import CostModel, exact_width_order
from draftlab.decode.loop import SpeculativeDecoder
from draftlab.decode.round_sizer import RoundSizer
from draftlab.decode.router import DtypeRouter
from draftlab.decode.spec import Decoder, DecoderConfig
from draftlab.decode.tree_sizer import TreeSizer
from draftlab.errors import DraftlabError
from draftlab.models.cached import cached
from draftlab.models.compiled import MAX_PASS, PASS_SIZES
from draftlab.models.exact import WIDTHS
from draftlab.models.loading import LoadedModel
from draftlab.proposers import NoProposer, Proposer
from draftlab.verify.rules import SpeculativeRule


def target_of(config: DecoderConfig, target: LoadedModel):
    """The target behind its cache (a compiled package's static one with --compile or --exact)."""
    return cached(target, use_cache=config.use_cache, compiled=config.compile, exact=config.exact)


def compiled_passes(config: DecoderConfig) -> tuple[int, ...]:
    """With --compile, the pass sizes to warm: plain steps for ar, verification passes too."""
    return PASS_SIZES if config.spec.speculative else (1,)


def warm_compiled_passes(decoder, needed: int, config: DecoderConfig, on_pass=None) -> None:
    """Get every package a compiled decoder runs over the bucket that holds `needed` ready, untimed:
    the target's, and a compiled drafter's (an EAGLE head or a draft model: one token, a tree level)."""
    sizer = getattr(decoder, "sizer", None)
    steps = decoder.target.compiled
    exact = config.exact and steps is not None
    if exact and sizer is not None and steps.bucket(needed) not in steps.exact_widths:
        # The first variant to warm a bucket chooses its width for all: they share one cost curve.
        steps.exact_order = exact_width_order(sizer.cost, WIDTHS, needed // 2)
    decoder.target.warm(needed, compiled_passes(config), on_pass)
    if exact:
        width = decoder.target.exact_width(steps.bucket(needed))
        # No draft longer than a pass of that width verifies; a longer one would run as two passes.
        decoder.gamma = min(decoder.gamma, width - 1)
        if sizer is not None:
            # Every pass costs at least one of that width; a copy, since variants share cost models.
            sizer.cost = dataclasses.replace(sizer.cost, min_rows=width)
            sizer.k_max = min(sizer.k_max, width - 1)
    head = getattr(getattr(decoder, "proposer", None), "draft", None)
    if getattr(head, "compiled", None) is not None:
        head.warm(needed, (1, min(config.tree_width, MAX_PASS)) if config.spec.tree else (1,))


def most_drafts(config: DecoderConfig, n: int) -> int:
    """Drafts per round: with --compile, no more than the longest compiled pass verifies (a longer
    pass runs eagerly and cost 2-3x a compiled one on an AMD Zen5); with --exact, no more than the
    longest pass whose rows were found exact."""
    return min(n, MAX_PASS - 1) if config.compile or config.exact else n


def round_sizer(
    config: DecoderConfig, cost: CostModel | None, k_max: int, free_drafts: bool
) -> RoundSizer | None:
    if not config.adaptive or cost is None:
        return None
    return RoundSizer(cost, k_max, free_drafts=free_drafts)


def chain_decoder(
    config: DecoderConfig,
    target: LoadedModel,
    cost: CostModel | None,
    proposer: Proposer,
    k_max: int,
    free_drafts: bool,
) -> SpeculativeDecoder:
    """A chain method: the proposer's drafts, at most `k_max` a round (sized where a profile allows)."""
    most = most_drafts(config, k_max)
    sizer = round_sizer(config, cost, most, free_drafts)
    return SpeculativeDecoder(target_of(config, target), proposer, SpeculativeRule(), most, sizer)


def check_fits(config: DecoderConfig, target: LoadedModel) -> None:
    """Refuse a method the target cannot run, before anything is profiled or generated."""
    if config.spec.needs_head and target.is_encoder_decoder:
        raise DraftlabError(
            f"method '{config.method}' drafts from a decoder-only target's hidden states; "
            f"{target.spec.name} is an encoder-decoder model"
        )
    if config.spec.tree and target.is_encoder_decoder:
        raise DraftlabError(
            f"method '{config.method}' verifies token trees, which needs a decoder-only target; "
            f"{target.spec.name} is an encoder-decoder model (use the chain methods: sps, pld)"
        )


def tree_decoder(
    config: DecoderConfig,
    target: LoadedModel,
    cost: CostModel | None,
    proposer: Callable[[TreeSizer | None], Proposer],
    depth: int,
    sized_depth: int,
) -> SpeculativeDecoder:
    """A tree method's decoder; `proposer(sizer)` builds its proposer."""
    check_fits(config, target)
    sizer = None
    # Compiled, a tree verifies in one package pass: its nodes and the token before them fit in
    # the longest compiled pass (a longer one runs eagerly).
    depth, sized_depth = most_drafts(config, depth), most_drafts(config, sized_depth)
    budget = config.tree_budget if config.tree_budget is None else most_drafts(config, config.tree_budget)
    if config.adaptive and cost is not None and budget is None:
        max_nodes = MAX_PASS - 1 if config.compile or config.exact else None
        sizer = TreeSizer(
            cost, sized_depth, config.tree_width, free_drafts=not config.needs_draft, max_nodes=max_nodes
        )
    main = target_of(config, target)
    return SpeculativeDecoder(main, proposer(sizer), SpeculativeRule(), depth, sizer, budget)


def build_ar(config, target, draft, cost):
    """autoregressive baseline: one target pass per token"""
    # With a cost model, a sizer that never drafts (k_max 0): its predicted and measured plain step
    # is what routing plain decoding across dtypes weighs, as for the methods (`build_decoder`).
    sizer = RoundSizer(cost, k_max=0, free_drafts=False) if cost is not None else None
    return SpeculativeDecoder(
        target_of(config, target), NoProposer(), SpeculativeRule(), gamma=1, sizer=sizer
    )


def build_decoder(
    config: DecoderConfig,
    target: LoadedModel,
    draft: LoadedModel | None = None,
    cost: CostModel | None = None,
    alternatives: Sequence[tuple[LoadedModel, CostModel]] = (),
) -> Decoder:
    """`cost` is the machine's cost model; without one, cost-aware methods draft a fixed k.

    `alternatives` are copies of the target in other dtypes with their cost models: a cost-aware
    method then runs each generation in the dtype predicted fastest for it (decode/router.py).
    """
    spec = config.spec
    if spec.needs_draft and draft is None:
        raise DraftlabError(f"method '{config.method}' needs a draft model (--draft)")
    if spec.needs_head and draft is None:
        flag = "--" + spec.head_option.replace("_", "-")
        raise DraftlabError(f"method '{config.method}' needs {spec.head_kind} ({flag})")
    draft = draft if config.needs_draft else None
    main = spec.build(config, target, draft, cost)
    if not alternatives or getattr(main, "sizer", None) is None:
        return main
    decoders = {target.spec.dtype: main}
    for other, other_cost in alternatives:
        decoder = spec.build(config, other, draft, other_cost)
        if not routable(main, decoder):
            continue
        decoder.sizer.share(main.sizer.evidence)
        decoder.proposer.share(main.proposer)
        decoders[other.spec.dtype] = decoder
    return DtypeRouter(decoders) if len(decoders) > 1 else main


def routable(main, other) -> bool:
    """Whether `other` (the method in another dtype) may take generations from `main`.

    Both must size rounds from a cost model, and decode the same way: a copy that fell back from
    trees to chains (its dtype failed the tree check) would run another method under the same label.
    """
    return (
        other.sizer is not None
        and type(other.sizer) is type(main.sizer)
        and getattr(other, "trees", None) == getattr(main, "trees", None)
    )
