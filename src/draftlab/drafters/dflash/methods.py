"""DFlash's rows of the method table, and the option that names its drafter."""

from draftlab.decode.spec import Setting, register
from draftlab.drafters.draft_model.methods import TREE_WIDTH

DFLASH = Setting(
    "dflash",
    str,
    None,
    "DFlash drafter for the dflash method: a folder in the DFlashDraftModel layout (draftlab distill "
    "--head dflash writes one)",
)

HEAD = ("dflash", "draftlab.drafters.dflash.lm:load_dflash_lm", "a DFlash drafter")  # --dflash names it

register(
    "dflash",
    "DFlash",
    "draftlab.drafters.dflash.build:build_dflash",
    "DFlash (Chen et al. 2026): a block drafter fills k masked positions after the last token in one "
    "pass, from the target's hidden states",
    "head sized",
    ("gamma", "dflash"),
    settings=(DFLASH,),
    head=HEAD,
)
register(
    "dflash-tree",
    "DFlash-Tree",
    "draftlab.drafters.dflash.build:build_dflash_tree",
    "a token tree from one DFlash block pass: each row's likeliest tokens, taken best first by path probability",
    "head sized tree",
    ("gamma", "tree_width", "dflash"),
    settings=(TREE_WIDTH, DFLASH),
    head=HEAD,
)
