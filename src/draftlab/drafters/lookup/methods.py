"""Prompt lookup's rows of the method table."""

from draftlab.decode.spec import register

BUILD = "draftlab.drafters.lookup.build"

register(
    "pld",
    "PLD",
    f"{BUILD}:build_pld",
    "prompt lookup: drafts copied from earlier n-gram matches",
    "sized",
    ("pld_tokens", "max_ngram"),
)
register(
    "pld-tree",
    "PLD-Tree",
    f"{BUILD}:build_pld_tree",
    "prompt lookup with every earlier match merged into one verified token tree",
    "sized tree",
    ("pld_tokens", "max_ngram"),
)
