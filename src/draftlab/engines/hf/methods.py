"""transformers' generate() as methods (hf-greedy, hf-assisted), and what the hf engine runs."""

from __future__ import annotations

from draftlab.decode.spec import MethodSpec, register
from draftlab.drafters.draft_model.methods import DRAFT_CONFIDENCE

BUILD = "draftlab.engines.hf.build"
NAME = "hf"

register("hf-greedy", "HF", f"{BUILD}:build_hf_greedy", "Hugging Face generate()", "plain", engine=NAME)
register(
    "hf-assisted",
    "HF-AG",
    f"{BUILD}:build_hf_assisted",
    "Hugging Face assisted generation with the draft",
    "draft",
    ("gamma", "draft_confidence"),
    engine=NAME,
    settings=(DRAFT_CONFIDENCE,),
)


def counterpart(spec: MethodSpec) -> str | None:
    """Transformers models run every method of our loop, and transformers' own generate()."""
    return spec.name if spec.engine in (None, NAME) else None
