"""One declaration per method: the one place that knows which parts make up which method.

A `MethodSpec` names a method, says whether it needs a draft model, whether it speculates,
which `DecoderConfig` settings it reads, how its draft length is reported, and how its
decoder is built. Adding a method is one entry in `REGISTRY` plus its proposer or rule.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Protocol

from draftlab.errors import DraftlabError

if TYPE_CHECKING:
    from draftlab.decode.cost import CostModel
    from draftlab.decode.loop import Generation
    from draftlab.models.loading import LoadedModel
    from draftlab.sampling import SamplingParams


class Decoder(Protocol):
    def generate(self, prompt_ids: list[int], max_new_tokens: int, params: SamplingParams) -> Generation: ...


@dataclass(frozen=True)
class DecoderConfig:
    """Every method setting, with its one default. The CLI reads its defaults from here."""

    method: str = "sps"
    gamma: int = 4  # sps: draft tokens per round (with cost-aware sizing: the most per round)
    fallback_threshold: float = 0.6  # BiLD: the small model continues while max prob >= this
    rollback_threshold: float = 5.0  # BiLD: roll back where -log p_large(token) > this (inf: never)
    max_small_steps: int = 10  # BiLD: at most this many small-model tokens per block
    max_ngram: int = 3  # PLD: longest n-gram to match
    pld_tokens: int = 10  # PLD: most tokens proposed per round (HF's prompt_lookup_num_tokens default)
    use_cache: bool = True  # False recomputes the whole sequence each step (ablation)
    # sps and hf-assisted: stop drafting after a draft token with probability below this (0: off).
    # 0.4 is HF's assistant_confidence_threshold default.
    draft_confidence: float = 0.4
    # sps and pld: False sizes every round from the machine's cost curve and the acceptance seen
    # so far (k = 0 is a plain target step); True drafts the full γ (or PLD's tokens) every round.
    fixed_k: bool = False
    # Tree methods: candidates per expanded node and leaves expanded per level (draft trees), and
    # a fixed node budget per round (None: chosen each round from the cost curve; without a
    # profile, a chain).
    tree_width: int = 8
    tree_budget: int | None = None
    # The target's passes of up to 8 tokens through a compiled package over a static cache (models/compiled.py);
    # chain methods of our own loop only.
    compile: bool = False

    def __post_init__(self) -> None:
        if self.method not in REGISTRY:
            raise DraftlabError(f"unknown method '{self.method}' (choose from {', '.join(METHODS)})")
        if self.gamma < 1:
            raise DraftlabError(f"gamma must be >= 1, got {self.gamma}")
        if not 0.0 <= self.fallback_threshold <= 1.0:
            raise DraftlabError(f"fallback threshold must be in [0, 1], got {self.fallback_threshold}")
        if not self.rollback_threshold > 0 or math.isnan(self.rollback_threshold):
            raise DraftlabError(f"rollback threshold must be > 0 (or inf), got {self.rollback_threshold}")
        if self.max_small_steps < 1:
            raise DraftlabError(f"BiLD max small steps must be >= 1, got {self.max_small_steps}")
        if self.max_ngram < 1:
            raise DraftlabError(f"max n-gram must be >= 1, got {self.max_ngram}")
        if self.pld_tokens < 1:
            raise DraftlabError(f"PLD tokens must be >= 1, got {self.pld_tokens}")
        if self.tree_width < 1:
            raise DraftlabError(f"tree width must be >= 1, got {self.tree_width}")
        if self.tree_budget is not None and self.tree_budget < 1:
            raise DraftlabError(f"tree budget must be >= 1, got {self.tree_budget}")
        if not 0.0 <= self.draft_confidence <= 1.0:
            raise DraftlabError(f"draft confidence must be in [0, 1], got {self.draft_confidence}")
        if self.compile and not REGISTRY[self.method].compilable:
            raise DraftlabError(
                f"--compile runs chain methods of draftlab's own loop (ar, sps, pld, bild, eagle), not '{self.method}'"
            )

    @property
    def spec(self) -> MethodSpec:
        return REGISTRY[self.method]

    @property
    def needs_draft(self) -> bool:
        """Whether the method runs a second model beside the target: a draft model or an EAGLE head."""
        return self.spec.needs_draft or self.spec.needs_head

    @property
    def compiled_passes(self) -> tuple[int, ...]:
        """With --compile, the pass sizes to warm: plain steps for ar, verification passes too."""
        from draftlab.models.compiled import PASS_SIZES

        return PASS_SIZES if self.spec.speculative else (1,)

    @property
    def adaptive(self) -> bool:
        """Whether rounds are sized from the cost curve (the method supports it and k is not fixed)."""
        return self.spec.cost_aware and not self.fixed_k

    def settings(self) -> dict:
        """The settings this method reads, as recorded with every result."""
        out = {"use_cache": self.use_cache}
        out.update({name: getattr(self, name) for name in self.spec.params})
        if self.spec.cost_aware:
            out["fixed_k"] = self.fixed_k
        if self.spec.tree:
            out["tree_budget"] = self.tree_budget
        if self.compile:
            out["compile"] = True
        return out


_FIELDS = {f.name for f in fields(DecoderConfig)}

Builder = Callable[["DecoderConfig", "LoadedModel", "LoadedModel | None", "CostModel | None"], Decoder]


@dataclass(frozen=True)
class MethodSpec:
    name: str
    summary: str
    build: Builder
    needs_draft: bool = False
    needs_head: bool = False  # drafts with an EAGLE-3 head (--head), which reads the target's features
    speculative: bool = True  # False: one target token per forward pass (a baseline)
    lossless: bool = True  # False: the output may differ from the target's by design (BiLD)
    external: bool = False  # True: decoded by another library (HF generate), not by our loop
    cost_aware: bool = False  # rounds can be sized from the cost curve
    params: tuple[str, ...] = ()  # the DecoderConfig fields the method reads
    draft_length: str | None = None  # the DecoderConfig field reported as the method's γ
    seed_name: str = ""  # the name the seed reports used ("AS", "SPS", ...)
    tree: bool = False  # proposes token trees (decoder-only targets)
    # The vllm engine's counterpart: None (none), "" (plain decoding) or its speculative method.
    vllm: str | None = None
    hf: bool = True  # False: runs on the vllm engine only (a trained head that vLLM loads)
    llamacpp_only: bool = False  # llama.cpp's own decoding (llama-cpp-python's generate), a peer

    @property
    def compilable(self) -> bool:
        """Whether --compile can run it: chains of our own loop (an EAGLE head's too: the head stays
        eager and reads the compiled target's features)."""
        return not (self.tree or self.external or self.llamacpp_only)

    @property
    def engines(self) -> tuple[str, ...]:
        if self.llamacpp_only:
            return ("llamacpp",)
        # llama.cpp runs our own loop over its model, so every method of that loop but those decoded
        # by transformers' generate() (and token trees fall back to chains there).
        ours = ("hf", "llamacpp") if not (self.external or self.needs_head) else ("hf",)
        return (*(ours if self.hf else ()), *(("vllm",) if self.vllm is not None else ()))

    def __post_init__(self) -> None:
        for name in (*self.params, *([self.draft_length] if self.draft_length else [])):
            if name not in _FIELDS:
                raise ValueError(f"method '{self.name}' names an unknown setting '{name}'")

    def gamma(self, config: DecoderConfig) -> int | None:
        """The draft length to report for this method (None where it has none)."""
        return getattr(config, self.draft_length) if self.draft_length else None


# ------------------------------------------------------------------ builders (imports are lazy so
# that reading the registry, as reports do, does not import torch)


def _target(config: DecoderConfig, target: LoadedModel):
    from draftlab.models.cached import cached

    return cached(target, use_cache=config.use_cache, compiled=config.compile)


def _most_drafts(config: DecoderConfig, n: int) -> int:
    """Drafts per round: with --compile, no more than the longest compiled pass verifies (a longer
    pass runs eagerly and cost 2-3x a compiled one on an AMD Zen5)."""
    if not config.compile:
        return n
    from draftlab.models.compiled import MAX_PASS

    return min(n, MAX_PASS - 1)


def _sizer(config: DecoderConfig, cost: CostModel | None, k_max: int, free_drafts: bool):
    if not config.adaptive or cost is None:
        return None
    from draftlab.decode.round_sizer import RoundSizer

    return RoundSizer(cost, k_max, free_drafts=free_drafts)


def _build_ar(config, target, draft, cost):
    """autoregressive baseline: one target pass per token"""
    from draftlab.decode.loop import SpeculativeDecoder
    from draftlab.proposers import NoProposer
    from draftlab.verify.rules import SpeculativeRule

    # With a cost model, a sizer that never drafts (k_max 0): its predicted and measured plain step
    # is what routing plain decoding across dtypes weighs, as for the methods (`build_decoder`).
    sizer = None
    if cost is not None:
        from draftlab.decode.round_sizer import RoundSizer

        sizer = RoundSizer(cost, k_max=0, free_drafts=False)
    return SpeculativeDecoder(_target(config, target), NoProposer(), SpeculativeRule(), gamma=1, sizer=sizer)


def _build_sps(config, target, draft, cost):
    """speculative sampling with a draft model (Leviathan et al. / Chen et al. 2023)"""
    from draftlab.decode.loop import SpeculativeDecoder
    from draftlab.models.cached import cached
    from draftlab.proposers import DraftModelProposer
    from draftlab.verify.rules import SpeculativeRule

    gamma = _most_drafts(config, config.gamma)
    sizer = _sizer(config, cost, gamma, free_drafts=False)
    proposer = DraftModelProposer(
        cached(draft, use_cache=config.use_cache),
        target.vocab_size,
        config.draft_confidence,
        frozenset(target.eos_token_ids),
        lazy_prefill=sizer is not None,
    )
    return SpeculativeDecoder(_target(config, target), proposer, SpeculativeRule(), gamma, sizer)


def _build_pld(config, target, draft, cost):
    """prompt lookup: drafts copied from earlier n-gram matches"""
    from draftlab.decode.loop import SpeculativeDecoder
    from draftlab.proposers import PromptLookupProposer
    from draftlab.verify.rules import SpeculativeRule

    most = _most_drafts(config, config.pld_tokens)
    sizer = _sizer(config, cost, most, free_drafts=True)
    return SpeculativeDecoder(
        _target(config, target), PromptLookupProposer(config.max_ngram), SpeculativeRule(), most, sizer
    )


def _tree_sizer(config: DecoderConfig, cost: CostModel | None, depth: int, free_drafts: bool):
    if not config.adaptive or cost is None or config.tree_budget is not None:
        return None
    from draftlab.decode.tree_sizer import TreeSizer

    return TreeSizer(cost, depth, config.tree_width, free_drafts=free_drafts)


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


def _tree_target(config: DecoderConfig, target: LoadedModel):
    check_fits(config, target)
    return _target(config, target)


def _draft_tree(config: DecoderConfig, target: LoadedModel, draft: LoadedModel, sizer):
    from draftlab.models.cached import cached
    from draftlab.proposers import DraftTreeProposer

    return DraftTreeProposer(
        cached(draft, use_cache=True),
        width=config.tree_width,
        stop_tokens=frozenset(target.eos_token_ids),
        lazy_prefill=sizer is not None,
        depth=config.gamma,
    )


def _tree_decoder(config: DecoderConfig, target: LoadedModel, cost, proposer, depth: int, sized_depth: int):
    """A decoder for a tree method; `proposer(sizer)` builds its proposer."""
    from draftlab.decode.loop import SpeculativeDecoder
    from draftlab.verify.rules import SpeculativeRule

    main = _tree_target(config, target)
    sizer = _tree_sizer(config, cost, sized_depth, free_drafts=not config.needs_draft)
    return SpeculativeDecoder(main, proposer(sizer), SpeculativeRule(), depth, sizer, config.tree_budget)


def _build_pld_tree(config, target, draft, cost):
    """prompt lookup with every earlier match merged into one verified token tree"""
    from draftlab.proposers import LookupTreeProposer

    def proposer(sizer):
        return LookupTreeProposer(config.max_ngram, depth=config.pld_tokens)

    return _tree_decoder(config, target, cost, proposer, config.pld_tokens, config.pld_tokens)


def _build_sps_tree(config, target, draft, cost):
    """draft-model token trees, expanded by draft probability as in EAGLE-2"""

    def proposer(sizer):
        return _draft_tree(config, target, draft, sizer)

    return _tree_decoder(config, target, cost, proposer, config.gamma, config.gamma)


def _build_hybrid(config, target, draft, cost):
    """the prompt-lookup tree and the draft tree merged into one token tree"""
    from draftlab.proposers import HybridTreeProposer, LookupTreeProposer

    def proposer(sizer):
        lookup = LookupTreeProposer(config.max_ngram, depth=config.pld_tokens)
        return HybridTreeProposer(_draft_tree(config, target, draft, sizer), lookup)

    depth = max(config.gamma, config.pld_tokens)
    return _tree_decoder(config, target, cost, proposer, depth, config.gamma)


def _build_suffix(config, target, draft, cost):
    """SuffixDecoding (Oliaro et al. 2024): trees from the prompt and earlier outputs of the run"""
    from draftlab.proposers import SuffixProposer

    def proposer(sizer):
        return SuffixProposer(max_depth=config.pld_tokens)

    return _tree_decoder(config, target, cost, proposer, config.pld_tokens, config.pld_tokens)


def _build_bild(config, target, draft, cost):
    """Big Little Decoder (Kim et al. 2023): fallback and rollback thresholds"""
    from draftlab.decode.loop import SpeculativeDecoder
    from draftlab.models.cached import cached
    from draftlab.proposers import BildProposer
    from draftlab.verify.rules import BildRule

    proposer = BildProposer(
        cached(draft, use_cache=config.use_cache),
        target.vocab_size,
        config.fallback_threshold,
        frozenset(target.eos_token_ids),
    )
    return SpeculativeDecoder(
        _target(config, target), proposer, BildRule(config.rollback_threshold), gamma=config.max_small_steps
    )


def _head_model(draft):
    from draftlab.models.eagle_cached import HeadModel

    if not getattr(draft, "is_head", False):
        raise DraftlabError(f"'{draft.spec.name}' is a model, not an EAGLE-3 head (--head)")
    return HeadModel(draft)


def _build_eagle(config, target, draft, cost):
    """EAGLE-3 (Li et al. 2025): a one-layer head drafts chains from the target's own hidden states"""
    from draftlab.decode.loop import SpeculativeDecoder
    from draftlab.proposers.eagle import EagleProposer
    from draftlab.verify.rules import SpeculativeRule

    check_fits(config, target)
    gamma = _most_drafts(config, config.gamma)
    sizer = _sizer(config, cost, gamma, free_drafts=False)
    proposer = EagleProposer(_head_model(draft), config.draft_confidence, frozenset(target.eos_token_ids))
    return SpeculativeDecoder(_target(config, target), proposer, SpeculativeRule(), gamma, sizer)


def _build_eagle_tree(config, target, draft, cost):
    """the EAGLE-3 head's dynamic draft tree, expanded by head probability (EAGLE-2)"""
    from draftlab.proposers.eagle import EagleTreeProposer

    def proposer(sizer):
        eos = frozenset(target.eos_token_ids)
        return EagleTreeProposer(_head_model(draft), config.tree_width, eos, depth=config.gamma)

    return _tree_decoder(config, target, cost, proposer, config.gamma, config.gamma)


def _vllm_only(config, target, draft, cost):
    """a trained speculator head, loaded by vLLM (--engine vllm --speculator FOLDER)"""
    raise DraftlabError(f"method '{config.method}' runs on the vllm engine only (--engine vllm)")


def _build_hf_greedy(config, target, draft, cost):
    """Hugging Face generate()"""
    from draftlab.decode.hf import HFGenerateDecoder

    return HFGenerateDecoder(target)


def _build_hf_assisted(config, target, draft, cost):
    """Hugging Face assisted generation with the draft"""
    from draftlab.decode.hf import HFGenerateDecoder

    return HFGenerateDecoder(target, draft, config.gamma, config.draft_confidence)


def _build_llamacpp_pld(config, target, draft, cost):
    """llama.cpp's own prompt lookup (llama-cpp-python's LlamaPromptLookupDecoding)"""
    from draftlab.decode.llamacpp_native import LlamaCppLookupDecoder
    from draftlab.models.llamacpp import runs_on_llamacpp

    if not runs_on_llamacpp(target):
        raise DraftlabError(f"method '{config.method}' is llama.cpp's own decoding: use --engine llamacpp")
    return LlamaCppLookupDecoder(target, config.max_ngram, config.pld_tokens)


# The methods, one row each: name, the seed reports' name, builder (its docstring is the summary),
# flags (draft: needs a draft model; head: an EAGLE-3 head, passed where a draft goes; plain: a baseline, one target token per pass; sized: rounds
# sized from the cost curve; tree: token trees; lossy: not lossless by design; external: another
# library's decoder, not our loop; llamacpp: llama.cpp's own, on that engine only), the settings it reads (the first reported as γ), and its
# vllm engine counterpart (None: none; "": plain decoding; else vLLM's speculative method).
_TABLE = (
    ("ar", "AS", _build_ar, "plain", (), ""),
    ("sps", "SPS", _build_sps, "draft sized", ("gamma", "draft_confidence"), "draft_model"),
    (
        "bild",
        "BiLD",
        _build_bild,
        "draft lossy",
        ("max_small_steps", "fallback_threshold", "rollback_threshold"),
        None,
    ),
    ("pld", "PLD", _build_pld, "sized", ("pld_tokens", "max_ngram"), "ngram"),
    ("pld-tree", "PLD-Tree", _build_pld_tree, "sized tree", ("pld_tokens", "max_ngram"), None),
    ("sps-tree", "SPS-Tree", _build_sps_tree, "draft sized tree", ("gamma", "tree_width"), None),
    (
        "hybrid",
        "Hybrid",
        _build_hybrid,
        "draft sized tree",
        ("gamma", "tree_width", "pld_tokens", "max_ngram"),
        None,
    ),
    ("suffix", "Suffix", _build_suffix, "sized tree", ("pld_tokens",), "suffix"),
    ("eagle", "EAGLE", _build_eagle, "head sized", ("gamma", "draft_confidence"), "eagle3"),
    ("eagle-tree", "EAGLE-Tree", _build_eagle_tree, "head sized tree", ("gamma", "tree_width"), None),
    ("hf-greedy", "HF", _build_hf_greedy, "plain external", (), None),
    ("hf-assisted", "HF-AG", _build_hf_assisted, "draft external", ("gamma", "draft_confidence"), None),
    ("llamacpp-pld", "LCPP-PLD", _build_llamacpp_pld, "external llamacpp", ("pld_tokens", "max_ngram"), None),
    # Trained heads that vLLM loads from --speculator (eagle3: the same heads as `eagle`, on vLLM only).
    ("eagle1", "EAGLE-1", _vllm_only, "external", ("gamma",), "eagle"),
    ("eagle3", "EAGLE-3", _vllm_only, "external", ("gamma",), "eagle3"),
    ("mtp", "MTP", _vllm_only, "external", ("gamma",), "mtp"),
)


def _spec(
    name: str, seed: str, build: Builder, flags: str, params: tuple[str, ...], vllm: str | None
) -> MethodSpec:
    unknown = set(flags.split()) - {
        "draft",
        "head",
        "plain",
        "sized",
        "tree",
        "lossy",
        "external",
        "llamacpp",
    }
    if unknown:
        raise ValueError(f"method '{name}' has unknown flags {sorted(unknown)}")
    return MethodSpec(
        name,
        " ".join((build.__doc__ or "").split()),
        build,
        needs_draft="draft" in flags,
        needs_head="head" in flags,
        speculative="plain" not in flags,
        cost_aware="sized" in flags,
        params=params,
        draft_length=params[0] if params else None,
        seed_name=seed,
        tree="tree" in flags,
        lossless="lossy" not in flags,
        external="external" in flags,
        vllm=vllm,
        hf=build is not _vllm_only,
        llamacpp_only="llamacpp" in flags,
    )


REGISTRY: dict[str, MethodSpec] = {row[0]: _spec(*row) for row in _TABLE}
METHODS = tuple(REGISTRY)
DEFAULTS = DecoderConfig()


def method_spec(name: str) -> MethodSpec:
    if name not in REGISTRY:
        raise DraftlabError(f"unknown method '{name}' (choose from {', '.join(METHODS)})")
    return REGISTRY[name]


def is_speculative(method: str | None) -> bool:
    """Unknown methods (records from another version) count as speculative: they are not baselines."""
    spec = REGISTRY.get(method or "")
    return spec.speculative if spec else True


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
        raise DraftlabError(f"method '{config.method}' needs an EAGLE-3 head (--head)")
    draft = draft if config.needs_draft else None
    main = spec.build(config, target, draft, cost)
    if not alternatives or getattr(main, "sizer", None) is None:
        return main
    from draftlab.decode.router import DtypeRouter

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
