"""EAGLE-3's rows of the method table."""

from draftlab.decode.spec import register
from draftlab.drafters.draft_model.methods import DRAFT_CONFIDENCE, TREE_WIDTH

BUILD = "draftlab.drafters.eagle3.build"
# --head names it; the shipped head goes with the default target
HEAD = ("head", "draftlab.drafters.eagle3.io:load_head_lm", "an EAGLE-3 head", "smollm2-135m-eagle3")

register(
    "eagle",
    "EAGLE",
    f"{BUILD}:build_eagle",
    "EAGLE-3 (Li et al. 2025): a one-layer head drafts chains from the target's own hidden states",
    "head sized",
    ("gamma", "draft_confidence"),
    settings=(DRAFT_CONFIDENCE,),
    head=HEAD,
)
register(
    "eagle-tree",
    "EAGLE-Tree",
    f"{BUILD}:build_eagle_tree",
    "the EAGLE-3 head's dynamic draft tree, expanded by head probability (EAGLE-2)",
    "head sized tree",
    ("gamma", "tree_width"),
    settings=(TREE_WIDTH,),
    head=HEAD,
)
