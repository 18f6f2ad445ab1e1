"""The draft-model methods' rows of the method table."""

from draftlab.decode.spec import register

BUILD = "draftlab.drafters.draft_model.build"

register(
    "sps",
    "SPS",
    f"{BUILD}:build_sps",
    "speculative sampling with a draft model (Leviathan et al. / Chen et al. 2023)",
    "draft sized",
    ("gamma", "draft_confidence"),
)
register(
    "bild",
    "BiLD",
    f"{BUILD}:build_bild",
    "Big Little Decoder (Kim et al. 2023): fallback and rollback thresholds",
    "draft lossy",
    ("max_small_steps", "fallback_threshold", "rollback_threshold"),
)
register(
    "sps-tree",
    "SPS-Tree",
    f"{BUILD}:build_sps_tree",
    "draft-model token trees, expanded by draft probability as in EAGLE-2",
    "draft sized tree",
    ("gamma", "tree_width"),
)
