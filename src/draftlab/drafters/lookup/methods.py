"""Prompt lookup's rows of the method table, and its settings (the other lookup drafters share them)."""

from draftlab.decode.spec import Setting, register

BUILD = "draftlab.drafters.lookup.build"

PLD_TOKENS = Setting(
    "pld_tokens",
    int,
    10,  # HF's prompt_lookup_num_tokens default
    "PLD (and suffix, pld-tree): most tokens proposed per path",
    minimum=1,
)
MAX_NGRAM = Setting("max_ngram", int, 3, "PLD: longest n-gram matched", minimum=1)
LOOKUP_SETTINGS = (PLD_TOKENS, MAX_NGRAM)

register(
    "pld",
    "PLD",
    f"{BUILD}:build_pld",
    "prompt lookup: drafts copied from earlier n-gram matches",
    "sized",
    ("pld_tokens", "max_ngram"),
    settings=LOOKUP_SETTINGS,
)
register(
    "pld-tree",
    "PLD-Tree",
    f"{BUILD}:build_pld_tree",
    "prompt lookup with every earlier match merged into one verified token tree",
    "sized tree",
    ("pld_tokens", "max_ngram"),
    settings=LOOKUP_SETTINGS,
)
