"""Layer 4: the decode loop that joins a proposer, the target and an acceptance rule."""

from draftlab.decode.loop import Generation, GenerationStats, SpeculativeDecoder
from draftlab.decode.methods import METHODS, DecoderConfig, build_decoder

__all__ = ["METHODS", "DecoderConfig", "Generation", "GenerationStats", "SpeculativeDecoder", "build_decoder"]
