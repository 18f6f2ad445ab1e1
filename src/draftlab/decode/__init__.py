"""Layer 4: the decode loop that joins a proposer, the target and an acceptance rule.

Names are imported lazily so that reading the method registry (as reports do) loads no torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Generation": "draftlab.decode.loop",
    "GenerationStats": "draftlab.decode.loop",
    "SpeculativeDecoder": "draftlab.decode.loop",
    "METHODS": "draftlab.decode.methods",
    "REGISTRY": "draftlab.decode.methods",
    "DecoderConfig": "draftlab.decode.methods",
    "build_decoder": "draftlab.decode.methods",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'draftlab.decode' has no attribute {name!r}")
