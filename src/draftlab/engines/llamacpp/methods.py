"""llama.cpp's own prompt lookup as a method (llamacpp-pld), and what the llamacpp engine runs."""

from __future__ import annotations

from draftlab.decode.spec import MethodSpec, register
from draftlab.drafters.lookup.methods import LOOKUP_SETTINGS

NAME = "llamacpp"

register(
    "llamacpp-pld",
    "LCPP-PLD",
    "draftlab.engines.llamacpp.build:build_llamacpp_pld",
    "llama.cpp's own prompt lookup (llama-cpp-python's LlamaPromptLookupDecoding)",
    params=("pld_tokens", "max_ngram"),
    engine=NAME,
    settings=LOOKUP_SETTINGS,
)


def counterpart(spec: MethodSpec) -> str | None:
    """Our loop over llama.cpp's model runs every method of that loop but those that read a
    transformers model's hidden states (an EAGLE head); token trees fall back to chains there."""
    if spec.engine == NAME or (spec.engine is None and not spec.needs_head):
        return spec.name
    return None
