"""draftlab's own block kernels (models/kernels): GGUF Q4_1 and Q8_0 weights times activations
quantized per block of 32 to 8 bits, integer sums inside a block, as llama.cpp computes those files."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tolerance import sum_tol

from draftlab.models import kernels, q4

EVERY_PATH = list(kernels.ISA_NAMES)
FORMATS = ("q4_1", "q8_0")


def _blocks(fmt: str, rows: int, cols: int, seed: int = 0):
    torch.manual_seed(seed)
    weight = torch.randn(rows, cols) * 0.05
    return q4.Q4Blocks.quantize(weight) if fmt == "q4_1" else q4.Q8Blocks.quantize(weight)


def _mm(x, blocks, isa=-1):
    if isinstance(blocks, q4.Q4Blocks):
        return kernels.q4_1_q8_mm(x, *kernels.pack_q4_1(blocks.codes, blocks.d, blocks.m), isa)
    return kernels.q8_0_q8_mm(x, *kernels.pack_q8_0(blocks.codes, blocks.d), isa)


def _runs(isa: int) -> bool:
    """Whether this CPU runs the path (a CPU without AVX-512 VNNI tests the others)."""
    need = {1: ["avx2", "fma", "f16c"], 2: ["avx512f", "avx512bw", "avx512vl", "avx512_vnni"]}.get(isa, [])
    with open("/proc/cpuinfo") as f:
        flags = set(f.read().split())
    return all(flag in flags for flag in need)


def _quantized_rows(x: torch.Tensor) -> torch.Tensor:
    """The activations as the kernel reads them: per row and block of 32, round(x / d)·d, d = max|x|/127."""
    blocks = x.double().reshape(x.shape[0], -1, 32)
    d = blocks.abs().amax(-1, keepdim=True) / 127
    return (torch.round(blocks / torch.where(d > 0, d, 1)) * d).reshape(x.shape)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_path_gives_the_same_bits_as_the_scalar_reference(fmt):
    """AVX-512 VNNI, AVX2 and scalar sum each output in the same order: equal, not merely close."""
    blocks = _blocks(fmt, 64, 192)
    x = torch.randn(7, 192)
    paths = [isa for isa in EVERY_PATH if _runs(isa)]
    assert 0 in paths and len(paths) >= 2  # every x86-64 CPU we run on has AVX2
    reference = _mm(x, blocks, 0)
    for isa in paths:
        assert torch.equal(_mm(x, blocks, isa), reference), kernels.ISA_NAMES[isa]
    # Half-precision activations are read as they are: as their float32 values would be.
    for half in (torch.bfloat16, torch.float16):
        assert torch.equal(_mm(x.to(half), blocks), _mm(x.to(half).float(), blocks))


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_largest_codes_times_the_largest_activations_sum_exactly(fmt):
    """Every code at its largest magnitude against activations at +-127: the integer sums the vector
    paths keep in 16 bits (AVX2 adds a Q4_1 block's eight groups before widening) must not saturate."""
    rows, cols = 32, 256
    top = 15 if fmt == "q4_1" else 127
    codes = np.full((rows, cols), top, np.int64)
    codes[1::2] = 0 if fmt == "q4_1" else -127  # odd rows: the other end of the range
    ones = np.ones((rows, cols // 32), np.float16)
    blocks = (
        q4.Q4Blocks(codes.astype(np.uint8), ones, np.zeros_like(ones))
        if fmt == "q4_1"
        else q4.Q8Blocks(codes.astype(np.int8), ones)
    )
    x = torch.ones(4, cols)
    x[1] = -1
    x[2, ::2] = -1  # signs alternating within each group of 4
    x[3, :128] = -1
    reference = _mm(x, blocks, 0)
    for isa in (i for i in EVERY_PATH if _runs(i)):
        assert torch.equal(_mm(x, blocks, isa), reference), kernels.ISA_NAMES[isa]
    # Each activation quantizes to +-127 with scale 1/127: the exact products are the codes times the signs.
    want = x.double() @ torch.from_numpy(codes).double().T
    assert float((reference.double() - want).abs().max()) <= sum_tol(
        cols // 32 + 1, torch.float32, top * cols
    )


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_row_gets_the_same_bits_whatever_else_the_pass_holds(fmt):
    """Passes of 1 to 9 tokens (9 crosses the kernel's sweep of 8 rows): each row as alone."""
    blocks = _blocks(fmt, 48, 128, seed=1)
    x = torch.randn(9, 128)
    alone = torch.cat([_mm(x[i : i + 1], blocks) for i in range(9)])
    for n in range(1, 10):
        assert torch.equal(_mm(x[:n], blocks), alone[:n]), n
    # A prompt's rows are quantized on both threads (past kernels' kQuantizeGrain blocks): the same bits.
    prompt = torch.randn(600, 128).bfloat16()
    assert prompt.numel() // 32 > 512
    torch.testing.assert_close(
        _mm(prompt, blocks), torch.cat([_mm(row[None], blocks) for row in prompt]), rtol=0, atol=0
    )


@pytest.mark.parametrize("fmt", FORMATS)
def test_outputs_are_the_blocks_values_times_the_quantized_activations(fmt):
    blocks = _blocks(fmt, 32, 256, seed=2)
    x = torch.randn(5, 256) * 3
    x[0, :32] = 0  # a block of zeros quantizes to zeros (its scale 0)
    weights = blocks.dequantize().double()
    want = _quantized_rows(x) @ weights.T
    # float32 sums over the 8 blocks of each output, each term a block's exact integer sum scaled.
    tol = sum_tol(2 * 256 // 32 + 2, torch.float32, float((_quantized_rows(x).abs() @ weights.abs().T).max()))
    for isa in (i for i in EVERY_PATH if _runs(i)):
        got = _mm(x, blocks, isa).double()
        assert float((got - want).abs().max()) <= tol, kernels.ISA_NAMES[isa]
    # Half a quantization step per activation bounds the distance to the float product.
    step = x.reshape(5, -1, 32).abs().amax(-1).repeat_interleave(32, 1).double() / 254
    assert torch.all((got - x.double() @ weights.T).abs() <= step @ weights.abs().T + tol)
    # The check can fail: the two halves of each block's codes swapped in the packing.
    halves = np.ascontiguousarray(blocks.codes.reshape(32, -1, 2, 16)[:, :, ::-1]).reshape(32, 256)
    swapped = type(blocks)(halves, *[getattr(blocks, f) for f in ("d", "m") if hasattr(blocks, f)])
    assert float((_mm(x, swapped).double() - want).abs().max()) > 100 * tol


def test_the_path_follows_torchs_kernel_ceiling(monkeypatch):
    """ATEN_CPU_CAPABILITY=avx2 (an AVX2-only CPU emulated) takes the AVX2 path, like torch's kernels."""
    best = kernels.isa()
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert kernels.isa() == "avx2"
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    assert kernels.isa() == "scalar"
    monkeypatch.undo()  # the run's own setting (the AVX2 test stage sets avx2)
    assert kernels.isa() == best


def test_q8_0_blocks_read_as_gguf_py_dequantizes_them():
    from gguf import GGMLQuantizationType, quants

    torch.manual_seed(0)
    w = torch.randn(48, 96).numpy()
    raw = quants.quantize(w, GGMLQuantizationType.Q8_0)
    blocks = q4.Q8Blocks.from_raw(raw, 48, 96)
    assert np.array_equal(blocks.dequantize().numpy(), quants.dequantize(raw, GGMLQuantizationType.Q8_0))
    assert np.abs(blocks.codes.astype(int)).max() == 127
