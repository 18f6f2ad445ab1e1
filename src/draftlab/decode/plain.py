"""Plain autoregressive decoding: the baseline every method is measured against."""

from draftlab.decode.spec import register

register(
    "ar",
    "AS",
    "draftlab.decode.build:build_ar",
    "autoregressive baseline: one target pass per token",
    "plain",
)
