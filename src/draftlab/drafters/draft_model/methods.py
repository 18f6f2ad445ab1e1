"""The draft-model methods' rows of the method table, their settings, and BiLD's own."""

import argparse
import math

from draftlab.decode.spec import Setting, register

BUILD = "draftlab.drafters.draft_model.build"


def threshold(text: str) -> float:
    """A threshold that may be off: inf, none or off mean never."""
    if text.lower() in ("inf", "none", "off"):
        return math.inf
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid threshold value: '{text}'") from None


DRAFT_CONFIDENCE = Setting(
    "draft_confidence",
    float,
    0.4,  # HF's assistant_confidence_threshold default
    "sps and hf-assisted: stop drafting after a token the draft gives less than this probability "
    "(HF's assistant_confidence_threshold, whose default is also 0.4; 0: always draft γ)",
    minimum=0.0,
    maximum=1.0,
    aliases=("--assistant-confidence",),
)
TREE_WIDTH = Setting(
    "tree_width",
    int,
    8,
    "sps-tree and hybrid: draft candidates per expanded node, and nodes expanded per level",
    minimum=1,
)

BILD_SETTINGS = (
    Setting("max_small_steps", int, 10, "BiLD: most small-model tokens per block", minimum=1),
    Setting(
        "fallback_threshold",
        float,
        0.6,
        "BiLD: the small model continues while its top probability is at least this, in [0, 1]",
        minimum=0.0,
        maximum=1.0,
    ),
    Setting(
        "rollback_threshold",
        threshold,
        5.0,
        "BiLD: roll back a small-model token whose -log p under the large model exceeds this (> 0, or inf: never)",
        rule=(lambda v: v > 0 and not math.isnan(v), "> 0 (or inf)"),
    ),
)

register(
    "sps",
    "SPS",
    f"{BUILD}:build_sps",
    "speculative sampling with a draft model (Leviathan et al. / Chen et al. 2023)",
    "draft sized",
    ("gamma", "draft_confidence"),
    settings=(DRAFT_CONFIDENCE,),
)
register(
    "bild",
    "BiLD",
    f"{BUILD}:build_bild",
    "Big Little Decoder (Kim et al. 2023): fallback and rollback thresholds",
    "draft lossy",
    ("max_small_steps", "fallback_threshold", "rollback_threshold"),
    settings=BILD_SETTINGS,
)
register(
    "sps-tree",
    "SPS-Tree",
    f"{BUILD}:build_sps_tree",
    "draft-model token trees, expanded by draft probability as in EAGLE-2",
    "draft sized tree",
    ("gamma", "tree_width"),
    settings=(TREE_WIDTH,),
)
