"""Exact mode: every verification pass scores each position as plain decoding's pass does, bit for bit.

A pass of several tokens rounds unlike a pass of one: the kernels for a matrix of k rows sum in
another order than those for one row, and over a growing dynamic cache the attention's reduction
length changes with the pass too. So a near-tie can flip, and a lossless method writes other tokens
than plain decoding in bfloat16 or a 4-bit storage. Exact mode removes both causes:

* every pass runs over a static cache, whose attention always spans the same bucket of slots;
* every pass after the prompt runs with the same number of rows (`width`): shorter ones, plain
  decoding's one-token steps included, are padded with copies after the real tokens, which no
  real row can see, and whose slots are given back at once.

Which width is needed depends on the CPU and the kernels: on a Sapphire Rapids Xeon, eager bfloat16
and Q4_1 passes agreed unpadded, float32 and compiled passes needed 8 rows. So the width is measured,
not assumed: `choose_width` feeds one fixed token sequence in passes of every length up to MAX_PASS,
each padded to at least the candidate width, and keeps the narrowest (cheapest) width under which
every position's logits are bitwise equal to those of one-token passes.

A chain is exact by construction once the width is: its token at position p sits in slot p, as in
plain decoding, so its row attends over the same slots with the same bits. A token tree is not: a
node sits in the slot after its earlier siblings, and the attention sums its ancestors' slots in
another order than the chain would. On the Xeon a 4-node tree agreed with its chains after a
24-token prompt but not after 300 or 600, and `eagle-tree` wrote other tokens than `ar` on one
prompt of nine. So in exact mode tree methods verify their best chain each round.
"""

from __future__ import annotations

import torch

from draftlab.models.compiled import MAX_PASS

# Candidate widths, cheapest first: 1 means no padding at all.
WIDTHS = (1, 2, 4, MAX_PASS)
PREFIX = 24  # probe tokens fed as the prompt
PROBE = 17  # probe tokens scored after it


def probe_tokens(vocab: int) -> list[int]:
    """A fixed token sequence, spread over the vocabulary (the same on every run)."""
    return [(7919 * i + 13) % vocab for i in range(PREFIX + PROBE)]


def logits_in_passes(model, tokens: list[int], size: int, width: int) -> torch.Tensor:
    """The logits of every position after the prefix, fed `size` tokens a pass, padded to `width`."""
    model.start(tokens[:PREFIX])
    rows = [model.forward(tokens[:PREFIX], keep=1, pad_to=width)]
    position = PREFIX
    while position < len(tokens):
        chunk = tokens[position : position + size]
        rows.append(model.forward(chunk, pad_to=width))
        position += len(chunk)
    model.crop(0)
    return torch.cat(rows)


def is_exact(model, width: int) -> bool:
    """Whether passes of every length up to MAX_PASS, padded to `width`, score as one-token ones."""
    tokens = probe_tokens(int(model.lm.vocab_size))
    reference = logits_in_passes(model, tokens, 1, width)
    return all(
        torch.equal(logits_in_passes(model, tokens, size, width), reference)
        for size in range(2, MAX_PASS + 1)
    )


def choose_width(model, widths: tuple[int, ...] = WIDTHS) -> int | None:
    """The narrowest width under which this model's passes are exact here; None if none is."""
    return next((w for w in widths if is_exact(model, w)), None)


def record(model) -> dict:
    """What a run records of exact mode: the width and how the passes ran."""
    steps = model.compiled
    return {"width": steps.exact_width, "passes": "eager" if steps.eager else "compiled"}


def describe(rec: dict) -> str:
    width = rec["width"]
    rows = "unpadded" if width == 1 else f"padded to {width} rows"
    trees = (
        "token trees exact too" if rec["trees"] else "token trees not exact here: tree methods verify chains"
    )
    return f"exact mode: {rec['passes']} passes over a static cache, {rows} (measured on this CPU); {trees}"
