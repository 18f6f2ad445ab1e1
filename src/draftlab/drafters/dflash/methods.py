"""DFlash's rows of the method table, and the option that names its drafter."""

from draftlab.decode.spec import Setting, register

DFLASH = Setting(
    "dflash",
    str,
    None,
    "DFlash drafter for the dflash method: a folder in the DFlashDraftModel layout (draftlab distill "
    "--head dflash writes one)",
)

register(
    "dflash",
    "DFlash",
    "draftlab.drafters.dflash.build:build_dflash",
    "DFlash (Chen et al. 2026): a block drafter fills k masked positions after the last token in one "
    "pass, from the target's hidden states",
    "head sized",
    ("gamma", "dflash"),
    settings=(DFLASH,),
    head=("dflash", "draftlab.drafters.dflash.lm:load_dflash_lm", "a DFlash drafter"),
)
