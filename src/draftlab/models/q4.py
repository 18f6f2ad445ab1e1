"""The target's linear layers run from 4-bit Q4_1 blocks, as llama.cpp stores them, through torch's CPU
int4 kernel: the default target's GGUF holds them, so this is the target itself in a quarter of the bytes
of bfloat16, not a quantized variant of it.

Q4_1 (ggml): blocks of 32 weights along the input dimension, each a float16 scale `d`, a float16 minimum
`m` and 16 bytes of 4-bit codes `q`, low nibbles first; a weight is `q·d + m`.

torch's kernel (`_weight_int4pack_mm_for_cpu`) computes `(q - 8)·s + z` per group of 32, with the
activations' dtype for `s` and `z`; only its bfloat16 path is fast (float32 activations take ~20× as long), so the
layers compute in bfloat16 with `s = d` and `z = m + 8·d`, both rounded to bfloat16: the only change to
the GGUF's values, bounded by `weight_tolerance`. The embedding (tied to the output head, Q8_0 in the GGUF) stays as loaded.

A checkpoint without Q4_1 blocks (a user's bfloat16 folder) can be quantized to Q4_1 here (gguf-py's own
quantizer): that is a quantized target, and its label says so (`QUANTIZED`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from draftlab.errors import DraftlabError

GROUP = 32
ROWS = 16  # torch's CPU int4 packing takes output rows in multiples of 16
BLOCK_BYTES = 20  # float16 d, float16 m, 16 bytes of codes
STORAGE = "q4_1"
# Passes longer than this run a bfloat16 copy (Q4Linear): the int4 kernel's time grows with the rows,
# and at 8 rows it matched bfloat16's (11.8 against 12.0 ms for the default target's 210 matrices).
DENSE_ROWS = 8
OWN = "the GGUF's own Q4_1 blocks"
QUANTIZED = "quantized to Q4_1 by draftlab"
# llama.cpp's tensor names for a llama block's matrices, and where transformers keeps them.
GGUF_TO_HF = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


@dataclass(frozen=True)
class Q4Blocks:
    """One matrix as Q4_1: codes [N, K] in 0..15, scales d and minima m [N, K/32], float16 values."""

    codes: np.ndarray  # uint8
    d: np.ndarray  # float16
    m: np.ndarray  # float16

    @classmethod
    def from_raw(cls, raw: np.ndarray, rows: int, cols: int) -> Q4Blocks:
        """ggml's bytes (rows × cols/32 blocks of 20 bytes) as codes, scales and minima."""
        if cols % GROUP:
            raise DraftlabError(f"a Q4_1 matrix needs a multiple of {GROUP} columns, got {cols}")
        blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows, cols // GROUP, BLOCK_BYTES)
        d = blocks[..., 0:2].copy().view(np.float16)[..., 0]
        m = blocks[..., 2:4].copy().view(np.float16)[..., 0]
        qs = blocks[..., 4:]
        codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(rows, cols)
        return cls(codes, d, m)

    @classmethod
    def quantize(cls, weight: torch.Tensor) -> Q4Blocks:
        """A float matrix quantized to Q4_1 by gguf-py (llama.cpp's reference rounding)."""
        from gguf import GGMLQuantizationType, quants  # noqa: PLC0415

        rows, cols = weight.shape
        raw = quants.quantize(weight.detach().float().cpu().numpy(), GGMLQuantizationType.Q4_1)
        return cls.from_raw(raw, rows, cols)

    def rows(self, order: np.ndarray) -> Q4Blocks:
        return Q4Blocks(self.codes[order], self.d[order], self.m[order])

    def dequantize(self) -> torch.Tensor:
        """The GGUF's float32 values, q·d + m (as llama.cpp dequantizes)."""
        d = torch.from_numpy(self.d.astype(np.float32)).repeat_interleave(GROUP, dim=1)
        m = torch.from_numpy(self.m.astype(np.float32)).repeat_interleave(GROUP, dim=1)
        return torch.from_numpy(self.codes.astype(np.float32)) * d + m


def weight_tolerance(blocks: Q4Blocks) -> torch.Tensor:
    """Per weight, how far the layer's bfloat16 arithmetic may move it from the GGUF's q·d + m, read
    back as a bfloat16 output. The kernel rounds d and m + 8d to bfloat16 (≤ u·(16|d| + |m|) for codes
    0..15, u bfloat16's unit roundoff), the prompt path the weight itself (≤ u·|w|), and the output
    is rounded once more (u·|w|, |w| ≤ 15|d| + |m|): u·(31|d| + 2|m|)
    bounds either, plus float32's own rounding of the sum."""
    u = torch.finfo(torch.bfloat16).eps / 2
    d = torch.from_numpy(blocks.d.astype(np.float32)).abs().repeat_interleave(GROUP, dim=1)
    m = torch.from_numpy(blocks.m.astype(np.float32)).abs().repeat_interleave(GROUP, dim=1)
    return (u + 4 * torch.finfo(torch.float32).eps) * (31 * d + 2 * m)


@functools.cache
def dense_dtype() -> torch.dtype:
    """The dtype of the copy long passes (prompts) run: bfloat16 where the CPU computes in it
    natively, else float32. On a Zen4 under AVX2 kernel ceilings plain decoding of a 256-token
    prompt and 64 tokens was predicted at 2.44 s with a bfloat16 copy, against 1.77 s for the whole
    model in float32: the emulated bfloat16 prompt outweighed the cheaper 4-bit steps (stop 62)."""
    from draftlab.hardware import native_bf16  # noqa: PLC0415

    return torch.bfloat16 if native_bf16() else torch.float32


class Q4Linear(nn.Module):
    """A bias-free linear layer over packed Q4_1 codes; computes in bfloat16.

    Passes of up to DENSE_ROWS tokens (every decoding step and every compiled verification) run
    torch's int4 kernel over the packed codes, reading a quarter of bfloat16's bytes. Longer ones
    (prompts) run a copy of the same values made once at load (`dense_dtype`): the int4 kernel's time grows
    with the rows (a 256-token prompt of the default target took 460 ms through it, 127 ms in
    bfloat16), while a long pass is bound by arithmetic, not bytes. The copy is a plain attribute,
    not a buffer, so compiled packages (passes of at most 8 tokens) neither hold nor read it."""

    def __init__(self, blocks: Q4Blocks) -> None:
        super().__init__()
        rows, cols = blocks.codes.shape
        self.in_features, self.out_features = cols, rows
        codes = torch.from_numpy(blocks.codes.astype(np.int32))
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1))
        d = torch.from_numpy(blocks.d.astype(np.float32))
        m = torch.from_numpy(blocks.m.astype(np.float32))
        # [K/32, N, 2]: scale and zero per group and output row, the kernel's layout.
        sz = torch.stack([d, m + 8 * d], dim=-1).transpose(0, 1).contiguous()
        self.register_buffer("scales_and_zeros", sz.to(torch.bfloat16))
        self.dense = blocks.dequantize().to(dense_dtype())

    def step_bytes(self) -> int:
        """What a decoding step reads of this layer: the packed codes and their scales."""
        return sum(t.numel() * t.element_size() for t in (self.packed, self.scales_and_zeros))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        rows = x.reshape(-1, shape[-1]).to(torch.bfloat16)
        if rows.shape[0] > DENSE_ROWS:
            out = nn.functional.linear(rows.to(self.dense.dtype), self.dense).to(torch.bfloat16)
        else:
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.packed, GROUP, self.scales_and_zeros)
        return out.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, storage=q4_1"


def transformers_rows(name: str, rows: int, config) -> np.ndarray:
    """Which of the GGUF tensor `name`'s rows each of transformers' rows is: llama.cpp's converter
    interleaves the halves of each head's q and k rows for its rope, and transformers' own GGUF
    loader (which made our checkpoint) undoes it; applied here to the row numbers."""
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor  # noqa: PLC0415

    heads = {
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
    }
    return np.asarray(LlamaTensorProcessor(config=heads).process(np.arange(rows), name).weights)


def gguf_blocks(path: Path, config) -> dict[str, Q4Blocks]:
    """The Q4_1 matrices of a llama GGUF, by transformers' module name, rows in transformers' order."""
    from gguf import GGMLQuantizationType, GGUFReader  # noqa: PLC0415

    reader = GGUFReader(path)
    out: dict[str, Q4Blocks] = {}
    for tensor in reader.tensors:
        parts = tensor.name.split(".")
        if len(parts) != 4 or parts[0] != "blk" or parts[2] not in GGUF_TO_HF:
            continue
        if tensor.tensor_type != GGMLQuantizationType.Q4_1:
            raise DraftlabError(f"{path.name}: {tensor.name} is {tensor.tensor_type.name}, not Q4_1")
        cols, rows = (int(n) for n in tensor.shape)
        blocks = Q4Blocks.from_raw(np.asarray(tensor.data), rows, cols)
        blocks = blocks.rows(transformers_rows(tensor.name, rows, config))
        out[f"model.layers.{parts[1]}.{GGUF_TO_HF[parts[2]]}"] = blocks
    if not out:
        raise DraftlabError(f"{path.name} holds no Q4_1 matrices of a llama model")
    return out


def quantized_blocks(model: nn.Module) -> dict[str, Q4Blocks]:
    """Every decoder-layer linear of `model` quantized to Q4_1 (the output head and embedding stay)."""
    out = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and ".layers." in f".{name}" and module.bias is None:
            if fits(module.out_features, module.in_features):
                out[name] = Q4Blocks.quantize(module.weight)
    if not out:
        raise DraftlabError(
            "--dtype q4_1: no linear layer of this model can run from Q4_1 blocks (bias-free, inputs a multiple of "
            f"{GROUP}, outputs a multiple of {ROWS}); run it in float32 or bfloat16"
        )
    return out


def fits(rows: int, cols: int) -> bool:
    """Whether torch's int4 kernel takes a matrix of this shape."""
    return rows % ROWS == 0 and cols % GROUP == 0


def apply(model: nn.Module, blocks: dict[str, Q4Blocks]) -> None:
    """Replace each named linear layer by its Q4_1 blocks, checking the shapes agree."""
    for name, b in blocks.items():
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        old = getattr(parent, child)
        if not isinstance(old, nn.Linear) or tuple(old.weight.shape) != b.codes.shape:
            raise DraftlabError(
                f"Q4_1 matrix {name} {b.codes.shape} does not fit the model's "
                f"{tuple(getattr(old, 'weight', torch.empty(0)).shape)}"
            )
        setattr(parent, child, Q4Linear(b))


def own_gguf(name: str) -> Path | None:
    """The GGUF whose Q4_1 blocks are the catalogue model `name`'s own weights, or None."""
    from draftlab.models import install  # noqa: PLC0415
    from draftlab.models.catalogue import ENTRIES  # noqa: PLC0415

    entry = ENTRIES.get(name)
    gguf = install.gguf_path(entry) if entry is not None and entry.gguf_file else None
    return gguf if gguf is not None and _is_q4_1(gguf) else None


def attach(model: nn.Module, name: str) -> str:
    """Run `model`'s linear layers from Q4_1: a catalogue target's own GGUF blocks where it has them,
    else its weights quantized here. Returns which (OWN or QUANTIZED), for labels and fingerprints."""
    gguf = own_gguf(name)
    if gguf is not None:
        apply(model, gguf_blocks(gguf, model.config))
        return OWN
    apply(model, quantized_blocks(model))
    return QUANTIZED


@functools.lru_cache(maxsize=8)
def _is_q4_1(path: Path) -> bool:
    from gguf import GGMLQuantizationType, GGUFReader  # noqa: PLC0415

    return any(
        t.tensor_type == GGMLQuantizationType.Q4_1
        for t in GGUFReader(path).tensors
        if t.name.startswith("blk.")
    )
