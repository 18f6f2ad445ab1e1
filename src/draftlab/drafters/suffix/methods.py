"""SuffixDecoding's row of the method table."""

from draftlab.decode.spec import register
from draftlab.drafters.lookup.methods import PLD_TOKENS

register(
    "suffix",
    "Suffix",
    "draftlab.drafters.suffix.build:build_suffix",
    "SuffixDecoding (Oliaro et al. 2024): trees from the prompt and earlier outputs of the run",
    "sized tree",
    ("pld_tokens",),
    settings=(PLD_TOKENS,),
)
