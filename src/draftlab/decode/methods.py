"""Build a decoder for a method name: the one place that knows which parts make up which method."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from draftlab.decode.hf import HFGenerateDecoder
from draftlab.decode.loop import Generation, SpeculativeDecoder
from draftlab.errors import DraftlabError
from draftlab.models.cached import CachedModel
from draftlab.models.loading import LoadedModel
from draftlab.proposers import BildProposer, DraftModelProposer, NoProposer, PromptLookupProposer
from draftlab.sampling import SamplingParams
from draftlab.verify.rules import BildRule, SpeculativeRule

METHODS = ("ar", "sps", "bild", "pld", "hf-greedy", "hf-assisted")
NEEDS_DRAFT = ("sps", "bild", "hf-assisted")


class Decoder(Protocol):
    def generate(self, prompt_ids: list[int], max_new_tokens: int, params: SamplingParams) -> Generation: ...


@dataclass(frozen=True)
class DecoderConfig:
    method: str = "sps"
    gamma: int = 4
    fallback_threshold: float = 0.6  # BiLD: the small model continues while max prob >= this
    rollback_threshold: float = 5.0  # BiLD: roll back where -log p_large(token) > this (inf: never)
    max_small_steps: int = 10  # BiLD: at most this many small-model tokens per block
    max_ngram: int = 3  # PLD: longest n-gram to match
    pld_tokens: int = 10  # PLD: most tokens proposed per round (HF's prompt_lookup_num_tokens default)
    use_cache: bool = True  # False recomputes the whole sequence each step (ablation)
    # sps and hf-assisted: stop drafting after a draft token with probability below this (0: off)
    draft_confidence: float = 0.0

    def __post_init__(self) -> None:
        if self.method not in METHODS:
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
        if not 0.0 <= self.draft_confidence <= 1.0:
            raise DraftlabError(f"draft confidence must be in [0, 1], got {self.draft_confidence}")

    @property
    def needs_draft(self) -> bool:
        return self.method in NEEDS_DRAFT


def build_decoder(config: DecoderConfig, target: LoadedModel, draft: LoadedModel | None = None) -> Decoder:
    if config.needs_draft and draft is None:
        raise DraftlabError(f"method '{config.method}' needs a draft model (--draft)")
    if config.method == "hf-greedy":
        return HFGenerateDecoder(target)
    if config.method == "hf-assisted":
        return HFGenerateDecoder(target, draft, config.gamma, config.draft_confidence)
    target_runner = CachedModel(target, use_cache=config.use_cache)
    if config.method == "ar":
        return SpeculativeDecoder(target_runner, NoProposer(), SpeculativeRule(), gamma=1)
    if config.method == "pld":
        return SpeculativeDecoder(
            target_runner, PromptLookupProposer(config.max_ngram), SpeculativeRule(), config.pld_tokens
        )
    assert draft is not None
    draft_runner = CachedModel(draft, use_cache=config.use_cache)
    stop = frozenset(target.eos_token_ids)
    if config.method == "sps":
        proposer = DraftModelProposer(draft_runner, target.vocab_size, config.draft_confidence, stop)
        return SpeculativeDecoder(target_runner, proposer, SpeculativeRule(), config.gamma)
    proposer = BildProposer(draft_runner, target.vocab_size, config.fallback_threshold, stop)
    return SpeculativeDecoder(
        target_runner, proposer, BildRule(config.rollback_threshold), gamma=config.max_small_steps
    )
