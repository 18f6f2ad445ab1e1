"""Decoders of transformers' generate(), plain and assisted."""

from __future__ import annotations

from draftlab.engines.hf.generate import HFGenerateDecoder


def build_hf_greedy(config, target, draft, cost):
    return HFGenerateDecoder(target)


def build_hf_assisted(config, target, draft, cost):
    return HFGenerateDecoder(target, draft, config.gamma, config.draft_confidence)
