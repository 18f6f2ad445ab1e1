"""Exact mode: every verification pass scores each position as plain decoding's pass does, bit for bit.

A pass of several tokens rounds unlike a pass of one: the kernels for a matrix of k rows sum in
another order than those for one row, and over a growing dynamic cache the attention's reduction
length changes with the pass too. So a near-tie can flip, and a lossless method writes other tokens
than plain decoding in bfloat16 (a 4-bit target no longer: its kernels and attention score a row
as alone, models/attention.py). Exact mode removes both causes:

* every pass runs over a static cache, whose attention always spans the same bucket of slots;
* every pass after the prompt runs with the same number of rows (`width`): shorter ones, plain
  decoding's one-token steps included, are padded with copies after the real tokens, which no
  real row can see, and whose slots are given back at once.

Every pass is padded to one width, so all run the same kernels on the same shapes; a longer pass runs
as several of that width. What is left is a row's place in the pass (row 0 in plain decoding, row i
in a verification), which `choose_width` checks: one fixed token sequence fed in passes of every
length up to the width, at contexts from short to the bucket's end, must give bitwise the logits of
one-token passes, or that width is refused. Which widths are tried first is the caller's choice
(decode/cost.py `exact_width_order`, by the machine's cost curve): a wide pass leaves room for long
drafts, but every plain step pays for all of its rows.

A chain is exact by construction once the width is: its token at position p sits in slot p, as in
plain decoding, so its row attends over the same slots with the same bits. A token tree is not: a
node sits in the slot after its earlier siblings, and the attention sums its ancestors' slots in
another order than the chain would. On the Xeon a 4-node tree agreed with its chains after a
24-token prompt but not after 300 or 600, and `eagle-tree` wrote other tokens than `ar` on one
prompt of nine. So in exact mode tree methods verify their best chain each round.
"""

from __future__ import annotations

import torch

from draftlab.models.compiled import MAX_PASS, PASS_SIZES

# The widths a pass may be padded to: the compiled pass sizes above one. Never unpadded: passes of
# varying length run other kernels, and a probe cannot prove them alike (unpadded eager bfloat16
# passes agreed at every probed context and still differed after 469 tokens in a run). Without a
# cost curve to choose by, the widest, which leaves drafting its full room.
WIDTHS = tuple(size for size in PASS_SIZES if size > 1)
DEFAULT_ORDER = (MAX_PASS,)
PREFIX = 24  # probe tokens fed as the prompt
PROBE = 17  # probe tokens scored after it


def probe_tokens(vocab: int, n: int) -> list[int]:
    """A fixed token sequence, spread over the vocabulary (the same on every run)."""
    return [(7919 * i + 13) % vocab for i in range(n)]


def prefixes(bucket: int, limit: int | None) -> tuple[int, ...]:
    """The contexts probed, from a short one to the longest the bucket holds with the probe after it.
    Rounding shows only where a difference crosses a bfloat16 step, so one context proves little:
    in an eager bfloat16 static cache unpadded passes agreed after 24 and 487 tokens and differed
    after 469 (a generation found it)."""
    room = min(bucket, limit or bucket) - PROBE - MAX_PASS
    if room <= PREFIX:
        return (PREFIX,)
    return tuple(sorted({PREFIX, room // 4, room // 2, 3 * room // 4, room} - {0}))


def logits_in_passes(model, tokens: list[int], prefix: int, size: int, width: int) -> torch.Tensor:
    """The logits of every position after `prefix` (already in the cache), fed `size` tokens a pass,
    padded to `width`; the cache is cut back to the prefix after."""
    rows, position = [], prefix
    while position < len(tokens):
        chunk = tokens[position : position + size]
        rows.append(model.forward(chunk, pad_to=width))
        position += len(chunk)
    model.crop(prefix)
    return torch.cat(rows)


def is_exact(model, width: int, bucket: int) -> bool:
    """Whether passes of every length up to `width`, padded to it, score as one-token ones, after a
    short and a long context in the static cache of `bucket` slots."""
    for prefix in prefixes(bucket, model.lm.context_length):
        tokens = probe_tokens(int(model.lm.vocab_size), prefix + PROBE)
        model.start(tokens[:prefix])
        model._cache = model.compiled.new_cache(bucket)
        model.forward(tokens[:prefix], keep=1)
        reference = logits_in_passes(model, tokens, prefix, 1, width)
        for size in range(2, width + 1):
            if not torch.equal(logits_in_passes(model, tokens, prefix, size, width), reference):
                model.crop(0)
                return False
        model.crop(0)
    return True


def choose_width(model, bucket: int, order: tuple[int, ...] = DEFAULT_ORDER) -> int | None:
    """The first width of `order` under which this model's passes are exact in `bucket`; None if
    none is."""
    return next((w for w in order if is_exact(model, w, bucket)), None)


def record(model) -> dict:
    """What a run records of exact mode: the width per static-cache bucket and how the passes ran."""
    steps = model.compiled
    return {
        "width": {str(bucket): w for bucket, w in sorted(steps.exact_widths.items())},
        "tried": list(steps.exact_order),  # preferred first (the cost profile's order, if any)
        "passes": "eager" if steps.eager else "compiled",
    }


def describe(rec: dict) -> str:
    widths = ", ".join(
        ("unpadded" if w == 1 else f"padded to {w} rows") + f" ({bucket}-token cache)"
        for bucket, w in rec["width"].items()
    )
    return (
        f"exact mode: {rec['passes']} passes over a static cache, {widths or 'not measured yet'} "
        "(chosen by the cost profile where one is cached, probed exact on this CPU); drafts up to "
        "the width less one; tree methods verify their best chain"
    )
