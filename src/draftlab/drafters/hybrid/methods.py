"""The hybrid tree's row of the method table."""

from draftlab.decode.spec import register

register(
    "hybrid",
    "Hybrid",
    "draftlab.drafters.hybrid.build:build_hybrid",
    "the prompt-lookup tree and the draft tree merged into one token tree",
    "draft sized tree",
    ("gamma", "tree_width", "pld_tokens", "max_ngram"),
)
