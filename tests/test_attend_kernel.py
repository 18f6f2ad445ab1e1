"""draftlab's attention kernel (models/kernels/attend.cpp): a row's output depends only on that row
and on the keys and values it sees, in order; not on the pass's other rows, the window's width, nor
where hidden slots lie."""

from __future__ import annotations

import pytest
import torch
from test_q4_kernel import EVERY_PATH, _runs
from tolerance import sum_tol

from draftlab.models import attention, kernels, q4

HEADS, KV_HEADS = 6, 2
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _inputs(rows: int, slots: int, dim: int = 64, dtype=torch.bfloat16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (
        torch.randn(1, h, n, dim, generator=g).to(dtype)
        for h, n in ((HEADS, rows), (KV_HEADS, slots), (KV_HEADS, slots))
    )
    return q, k, v


def _causal(rows: int, slots: int) -> torch.Tensor:
    """A chain's mask: the pass's row r is the token in slot slots - rows + r."""
    return torch.ones(rows, slots, dtype=torch.bool).tril(slots - rows)[None, None]


def _reference(q, k, v, mask):
    """Attention in float64, keys and values repeated per query head."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(group, 1) for t in (k, v))
    scores = (q.double() @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~mask, float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2)


def _alone_equal(attend, q, k, v, mask) -> bool:
    """Whether each row of a pass gets the bits it gets as a pass of its own (with its mask row)."""
    together = attend(q, k, v, mask)
    return all(
        torch.equal(attend(q[:, :, r : r + 1], k, v, mask[:, :, r : r + 1]), together[:, r : r + 1])
        for r in range(q.shape[2])
    )


def _ours(q, k, v, mask, isa=-1):
    return kernels.attend(q, k, v, mask, q.shape[-1] ** -0.5, isa)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [64, 128, 40])
def test_every_path_gives_the_same_bits_and_the_attention_within_its_precision(dtype, dim):
    """AVX-512, AVX2 and the scalar reference compute each step in one order: equal, not close.
    A head size off the 16-lane grid (40) runs the reference on every path."""
    q, k, v = _inputs(5, 77, dim, dtype)
    mask = _causal(5, 77)
    paths = [isa for isa in EVERY_PATH if _runs(isa)]
    assert 0 in paths and len(paths) >= 2
    reference = _ours(q, k, v, mask, 0)
    for isa in paths:
        assert torch.equal(_ours(q, k, v, mask, isa), reference), kernels.ISA_NAMES[isa]
    # Within the dtype's rounding of the output, plus float32's over the dot products and sums.
    want = _reference(q, k, v, mask)
    scale = float(v.abs().max())
    tol = torch.finfo(dtype).eps * scale + sum_tol(dim + 77, torch.float32, scale * 8)
    torch.testing.assert_close(reference.double(), want, atol=tol, rtol=0)


@pytest.mark.parametrize("isa", EVERY_PATH)
@pytest.mark.parametrize("rows", [2, 3, 8, 37])
def test_a_row_gets_the_same_bits_whatever_else_the_pass_holds(isa, rows):
    if not _runs(isa):
        pytest.skip(f"this CPU lacks {kernels.ISA_NAMES[isa]}")
    for slots in (17, 64, 203):
        q, k, v = _inputs(rows, slots, seed=slots)
        assert _alone_equal(lambda *a: _ours(*a, isa=isa), q, k, v, _causal(rows, slots)), slots


@pytest.mark.parametrize("isa", EVERY_PATH)
def test_a_pass_gets_the_same_bits_on_any_number_of_threads_and_per_batch_row(isa):
    """How a pass's items (key heads x row groups) are shared among threads changes no bit; nor
    does a batch's other member, whose mask differs."""
    if not _runs(isa):
        pytest.skip(f"this CPU lacks {kernels.ISA_NAMES[isa]}")
    g = torch.Generator().manual_seed(5)
    for rows, slots in ((1, 40), (3, 90), (8, 203), (16, 150)):
        q = torch.randn(2, 9, rows, 64, generator=g).to(torch.bfloat16)
        k, v = (torch.randn(2, 3, slots, 64, generator=g).to(torch.bfloat16) for _ in range(2))
        # Member 0 a chain; member 1 a tree-like mask with slots hidden here and there.
        mask = _causal(rows, slots).repeat(2, 1, 1, 1)
        mask[1] &= torch.rand(rows, slots, generator=g) > 0.3
        mask[1, :, :, 0] = True
        before = torch.get_num_threads()
        try:
            outs = []
            for threads in (1, 2, 3):
                torch.set_num_threads(threads)
                outs.append(_ours(q, k, v, mask, isa))
        finally:
            torch.set_num_threads(before)
        assert all(torch.equal(o, outs[0]) for o in outs[1:]), (rows, slots)
        for b in range(2):
            alone = _ours(q[b : b + 1], k[b : b + 1], v[b : b + 1], mask[b : b + 1], isa)
            assert torch.equal(outs[0][b : b + 1], alone), (rows, slots, b)
        want = _reference(q, k, v, mask)
        tol = torch.finfo(torch.bfloat16).eps * float(v.abs().max()) + sum_tol(64 + slots, torch.float32, 8.0)
        torch.testing.assert_close(outs[0].double(), want, atol=tol, rtol=0)


def _shared_max_attention(q, k, v, mask):
    """A deliberately wrong kernel: softmax shifted by the pass's maximum score over all its rows,
    not each row's own. Equal in exact arithmetic, but a row rounds by what else the pass holds."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.float().repeat_interleave(group, 1) for t in (k, v))
    scores = ((q.float() @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5).masked_fill(~mask, float("-inf"))
    weights = (scores - scores.amax(dim=(-2, -1), keepdim=True)).exp()
    return ((weights @ v) / weights.sum(-1, keepdim=True)).transpose(1, 2).to(q.dtype)


def test_the_row_check_fails_a_kernel_whose_rows_depend_on_the_pass():
    """The power of the check above: a kernel that rounds a row by its pass's other rows fails it."""
    q, k, v = _inputs(8, 203, dtype=torch.float32, seed=3)
    q[:, :, 0] *= 4  # one row's scores far above the others'
    assert not _alone_equal(_shared_max_attention, q, k, v, _causal(8, 203))
    assert _alone_equal(_ours, q, k, v, _causal(8, 203))


def test_hidden_slots_change_nothing_wherever_they_lie():
    """A wider window, hidden slots between visible ones (a token tree's node, whose ancestors sit
    after its siblings) and an additive mask give the bits of the visible slots alone, in order."""
    q, k, v = _inputs(4, 50, seed=1)
    mask = _causal(4, 50)
    alone = _ours(q, k, v, mask)
    g = torch.Generator().manual_seed(2)
    # The same slots spread over 90, in the same order, noise in between.
    place = torch.sort(torch.randperm(90, generator=g)[:50]).values
    wide_k, wide_v = (torch.randn(1, KV_HEADS, 90, 64, generator=g).to(k.dtype) for _ in range(2))
    wide_k[:, :, place], wide_v[:, :, place] = k, v
    wide_mask = torch.zeros(1, 1, 4, 90, dtype=torch.bool)
    wide_mask[..., place] = mask
    assert torch.equal(_ours(q, wide_k, wide_v, wide_mask), alone)
    lowest = torch.finfo(torch.bfloat16).min
    additive = torch.zeros(1, 1, 4, 90, dtype=torch.bfloat16).masked_fill(~wide_mask, lowest)
    assert torch.equal(_ours(q, wide_k, wide_v, additive), alone)
    # No mask: a causal pass whose last row is the last slot.
    assert torch.equal(_ours(q, k, v, None), alone)
    # A row that sees nothing gets zeros, not NaN.
    assert torch.equal(_ours(q, k, v, torch.zeros_like(mask)), torch.zeros_like(alone))


@pytest.mark.parametrize("isa", ["avx512-vnni", "avx2"])
def test_a_prompt_attends_causally_over_its_own_rows_not_the_whole_bucket(monkeypatch, isa):
    """transformers leaves a prompt's pass unmasked (causal from slot 0). Over a static cache the
    keys span the whole bucket; the kernel then sees only the prompt's own slots, and a prompt too
    long for the AVX2 path's kernel goes through transformers' sdpa: the same attention both ways."""
    monkeypatch.setattr(kernels, "isa", lambda: isa)
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = HEADS // KV_HEADS, True
    for rows in (12, q4.AVX2_PROMPT_ROWS + 3):
        q, k, v = _inputs(rows, rows, dtype=torch.float32, seed=rows)
        g = torch.Generator().manual_seed(9)
        bucket_k, bucket_v = (torch.randn(1, KV_HEADS, rows + 50, 64, generator=g) for _ in range(2))
        bucket_k[:, :, :rows], bucket_v[:, :, :rows] = k, v
        out, _ = attention.row_attention(module, q, bucket_k, bucket_v, None)
        want = _reference(q, k, v, _causal(rows, rows))
        torch.testing.assert_close(out.double(), want, atol=sum_tol(64 + rows, torch.float32, 8.0), rtol=0)
        by_kernel = rows <= q4.AVX2_PROMPT_ROWS or isa != "avx2"
        assert torch.equal(out, _ours(q, k, v, None)) == by_kernel, rows


def test_bad_shapes_are_refused():
    q, k, v = _inputs(2, 10)
    with pytest.raises(RuntimeError, match="multiple of kv heads"):
        kernels.attend(q[:, :5], k, v, None, 0.125)
    with pytest.raises(RuntimeError, match="mask"):
        kernels.attend(q, k, v, torch.ones(1, 2, 2, 10, dtype=torch.bool), 0.125)
