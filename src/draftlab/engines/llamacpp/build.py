"""The decoder of llama.cpp's own prompt lookup."""

from __future__ import annotations

from draftlab.engines.llamacpp.native import LlamaCppLookupDecoder
from draftlab.errors import DraftlabError


def build_llamacpp_pld(config, target, draft, cost):
    if target.engine != "llamacpp":
        raise DraftlabError(f"method '{config.method}' is llama.cpp's own decoding: use --engine llamacpp")
    return LlamaCppLookupDecoder(target, config.max_ngram, config.pld_tokens)
