"""SuffixDecoding's row of the method table."""

from draftlab.decode.spec import register

register(
    "suffix",
    "Suffix",
    "draftlab.drafters.suffix.build:build_suffix",
    "SuffixDecoding (Oliaro et al. 2024): trees from the prompt and earlier outputs of the run",
    "sized tree",
    ("pld_tokens",),
)
