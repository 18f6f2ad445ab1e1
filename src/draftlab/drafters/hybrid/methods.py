"""The hybrid tree's row of the method table."""

from draftlab.decode.spec import register
from draftlab.drafters.draft_model.methods import TREE_WIDTH
from draftlab.drafters.lookup.methods import LOOKUP_SETTINGS

register(
    "hybrid",
    "Hybrid",
    "draftlab.drafters.hybrid.build:build_hybrid",
    "the prompt-lookup tree and the draft tree merged into one token tree",
    "draft sized tree",
    ("gamma", "tree_width", "pld_tokens", "max_ngram"),
    settings=(TREE_WIDTH, *LOOKUP_SETTINGS),
)
