"""Attention for compiled passes over a static cache: over a window of the cache's slots, not the
whole bucket, with grouped keys read as they are; registered with transformers' attention interface
so that an exported model calls it in place of its sdpa attention (models/compiled.py).

A 4-bit target (models/q4.py), whose matrices score each row as they would alone, also attends
with draftlab's own kernel (`row_attention`), eager or compiled: then a pass of several tokens
scores each exactly as plain decoding's one-token passes do, and its lossless methods write
plain decoding's tokens without exact mode's padding (models/exact.py)."""

from __future__ import annotations

import contextlib

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from draftlab.models import kernels, q4

# A pass's attention spans the bucket's first slots up to the last one it fills, rounded up to a
# multiple of WINDOW_GRAIN, not the whole bucket, and reads grouped keys and values without copying
# them out per query head. On a 2-core AMD Zen4 (avx512_bf16) the default target's `q4_1` package
# took 8.1 ms for a one-token pass in a 512-slot bucket, against 25.4 ms (14.8 padded to two) over
# the whole bucket through transformers' sdpa path; plain decoding 9.9 against 16.0 ms a token.
# Exact mode keeps the whole bucket (models/exact.py: its passes' attention must span the same slots).
WINDOW = "draftlab_window"
ROWS = "draftlab_rows"
WINDOW_GRAIN = 64
# torch's CPU flash attention in bfloat16 (and float16) is slow on an odd number of query rows: on a
# 2-core AMD Zen4, one row over 1024 slots (the default target's 9 query and 3 key heads) took
# 614 µs, two 207, three 266, four 199 (1063 / 347 / 431 / 337 with torch's AVX2 kernels); float32
# took 75 µs for one row. Passes there attend with an even number of rows.
EVEN_ROW_DTYPES = (torch.bfloat16, torch.float16)


def _transformers_only(kwargs: dict) -> bool:
    """Whether a call asks for what only transformers' own sdpa path computes."""
    return any(kwargs.get(name) is not None for name in ("softcap", "position_bias", "s_aux", "sinks"))


def window_attention(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, slots=None, **kwargs
):
    """transformers' sdpa attention over the cache's first `slots` slots (all where None)."""
    key, value, attention_mask = in_window(key, value, attention_mask, slots)
    if _transformers_only(kwargs):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    gqa = getattr(module, "num_key_value_groups", 1) > 1
    out = attend(query, key, value, attention_mask, gqa=gqa, scale=scaling, dropout=dropout)
    return out.transpose(1, 2).contiguous(), None


def row_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, slots=None, **kwargs):
    """draftlab's kernel (models/kernels/attend.cpp), whose rows do not depend on the pass they are
    in, on the CPU; transformers' path where the kernel does not apply or is slower
    (q4.attends_by_rows)."""
    rows = query.shape[2]
    if not q4.attends_by_rows(rows) or dropout or _transformers_only(kwargs) or query.device.type != "cpu":
        if slots is None:  # an eager pass: transformers' own, which also reads a mask left out as causal
            return sdpa_attention_forward(
                module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
            )
        return window_attention(module, query, key, value, attention_mask, dropout, scaling, slots, **kwargs)
    if attention_mask is None and slots is None and rows > 1:
        # transformers leaves a pass of several rows unmasked only where it starts the cache (a
        # prompt): causal over its own rows, not the whole of a static cache's bucket.
        slots = rows
    key, value, attention_mask = in_window(key, value, attention_mask, slots)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return kernels.attend(query, key, value, attention_mask, scale), None


def attend(query, key, value, mask, slots=None, gqa: bool = False, scale=None, dropout: float = 0.0):
    """sdpa of `query` [b, heads, n, d] over the first `slots` slots of `key` and `value` (all where
    None) under an additive or boolean `mask`. Grouped keys and values are read as they are
    (`gqa`), not copied out per query head; in half precision the query has an even number of rows
    (EVEN_ROW_DTYPES)."""
    key, value, mask = in_window(key, value, mask, slots)
    rows = query.shape[2]
    even = query.dtype in EVEN_ROW_DTYPES and mask is not None
    if even:
        # An odd pass attends with its last query row twice. Rows are picked by index, not sliced:
        # export cannot prove the bounds of a slice whose length depends on the row count's parity.
        picked = torch.arange(2 * ((rows + 1) // 2), device=query.device).clamp(max=rows - 1)
        query, mask = query.index_select(2, picked), mask.index_select(2, picked)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout, scale=scale, enable_gqa=gqa
    )
    if even:
        out = out.index_select(2, torch.arange(rows, device=out.device))
    return out


def in_window(key, value, mask, slots):
    """Keys, values and mask cut to the first `slots` slots (as they are where None)."""
    if slots is None:
        return key, value, mask
    return key[:, :, :slots], value[:, :, :slots], mask[..., :slots] if mask is not None else None


def read_window(window: torch.Tensor | None, length: int) -> int | None:
    """A pass's window length, read inside an exported pass from its tensor input (bounded so that
    export can reason about the slices): an input dimension for it would have export guard on
    whether a key window is the whole bucket (a contiguity check)."""
    if window is None:
        return None
    slots = window.item()
    torch._check(slots >= 1)
    torch._check(slots <= length)
    return slots


AttentionInterface.register(WINDOW, window_attention)
AttentionMaskInterface.register(WINDOW, sdpa_mask)
AttentionInterface.register(ROWS, row_attention)
AttentionMaskInterface.register(ROWS, sdpa_mask)


def scores_rows_alone(lm) -> bool:
    """Whether a loaded model's passes after the prompt score each row with the bits of a
    one-token pass: a 4-bit model attending by rows (models/q4.py, `attend_by_rows`)."""
    return bool(getattr(lm, "storage", None)) and lm.model.config._attn_implementation == ROWS


def attend_by_rows(model: torch.nn.Module) -> bool:
    """Have a 4-bit model attend with `row_attention` where it would use transformers' sdpa
    attention (not where a user asked for another). Returns whether it does."""
    if (
        not getattr(model, "_supports_attention_backend", False)
        or model.config._attn_implementation != "sdpa"
    ):
        return False
    model.set_attn_implementation(ROWS)
    return True


def windows(model: torch.nn.Module) -> bool:
    """Whether the model's packages attend over a window: its attention is transformers' sdpa,
    reached through the attention interface (which lets `window_attention` stand in for it)."""
    return bool(getattr(model, "_supports_attention_backend", False)) and (
        model.config._attn_implementation in ("sdpa", ROWS)
    )


@contextlib.contextmanager
def attending_in_windows(model: torch.nn.Module):
    """The model's attention as `window_attention` while an export traces it (`row_attention`,
    which takes windows too, stays)."""
    before = model.config._attn_implementation
    if before == ROWS:
        yield
        return
    model.set_attn_implementation(WINDOW)
    try:
        yield
    finally:
        model.set_attn_implementation(before)


def window(past: int, n: int, length: int) -> int:
    """The slots a pass of n tokens after `past` attends over, in a bucket of `length`."""
    return min(length, -(-(past + n) // WINDOW_GRAIN) * WINDOW_GRAIN)
