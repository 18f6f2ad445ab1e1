"""The target's linear layers run from 4-bit Q4_1 blocks, as llama.cpp stores them and as llama.cpp
computes them: the default target's GGUF holds them, so this is the target itself in a quarter of the
bytes of bfloat16, not a quantized variant of it.

Q4_1 (ggml): blocks of 32 weights along the input dimension, each a float16 scale `d`, a float16 minimum
`m` and 16 bytes of 4-bit codes `q`, low nibbles first; a weight is `q·d + m`.

Steps, verification passes and prompts (of any length but on an AMX CPU) run draftlab's own kernel
(models/kernels): the activations quantized to 8 bits per block of 32 (llama.cpp's q8_1), integer
sums inside a block, the GGUF's own d and m outside it. Its cost barely grows with the rows of a
short pass (the codes are unpacked once per pass), a row's output does not depend on what else the
pass holds, and its 8-bit products outran bfloat16 and float32 ones on prompts of every length
measured. The output head runs from the GGUF's Q8_0 blocks (its tied embedding) through
the same kernels; the input embedding stays as loaded.

A checkpoint without Q4_1 blocks (a user's bfloat16 folder) can be quantized to Q4_1 here (gguf-py's own
quantizer): that is a quantized target, and its label says so (`QUANTIZED`).
"""

from __future__ import annotations

import contextvars
import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from draftlab.errors import DraftlabError
from draftlab.models import kernels

GROUP = kernels.GROUP  # inputs per block, in the GGUF and in the kernels
ROWS = kernels.LANES  # the kernel takes output rows in tiles of 16
BLOCK_BYTES = 20  # float16 d, float16 m, 16 bytes of codes
Q8_BLOCK_BYTES = 34  # float16 d, 32 signed codes
STORAGE = "q4_1"
# Prompts run the kernels too, whatever their length, except where the CPU has AMX (`dense_rows`).
# A dense copy of the weights lost at every prompt length measured, all 30 layers' matrices on 2
# threads: on a Zen5, 256 / 512 / 1024 / 2048 rows 61.7 / 124 / 261 / 534 ms against the bfloat16
# copy's 78.3 / 141 / 313 / 583; under AVX2 ceilings 150 / 307 / 694 / 1316 against float32's 328 /
# 625 / 1312 / 2460 (stop 76). Until then prompts past 512 tokens ran the copy: on a Zen4 at stop 65,
# before the kernels fetched ahead, it had been close to the kernel there.
# A prompt's pass attends with draftlab's kernel too, over the slots each row sees: per layer
# (bfloat16, 9 query / 3 key heads of 64, 2 threads, Zen5), a causal prompt of 50 / 300 / 590 /
# 1000 / 2000 rows took 0.06 / 0.99 / 3.23 / 10.2 / 30.5 ms against 0.58 / 3.10 / 7.05 / 13.1 / 39.1
# in torch's flash attention over the bucket. On the AVX2 path it wins only on shorter prompts
# (0.11 / 2.37 / 8.22 / 16.1 / 63.7 against 0.73 / 4.09 / 9.03 / 13.4 / 41.8 ms): longer ones there
# attend with transformers' sdpa.
AVX2_PROMPT_ROWS = 640
# Set while a pass after the prompt runs (models/cached.py): then every pass, however long, runs
# the kernels, whose rows round as they would alone, and lossless methods write plain decoding's bits.
_ROWWISE: contextvars.ContextVar[bool] = contextvars.ContextVar("draftlab_rowwise", default=False)


class rowwise:  # noqa: N801 - used as a function: `with rowwise():`
    """Passes of any length through the row-invariant kernels while this lasts. A class, not a
    generator: every pass enters it, and right after a pass a generator's context manager cost
    about 13 us against 3 for the bare ContextVar calls."""

    __slots__ = ("_token",)

    def __enter__(self) -> None:
        self._token = _ROWWISE.set(True)

    def __exit__(self, *exc) -> None:
        _ROWWISE.reset(self._token)


@functools.cache
def dense_rows() -> int | None:
    """The longest pass the kernels run outside `rowwise` where the CPU multiplies bfloat16 in AMX
    tiles: 8, since their dense products are several times a vector unit's (not measured here: no
    AMX CPU was at hand). None elsewhere: passes of any length run the kernels, and the layers keep
    no dense copy."""
    from draftlab.hardware import cpu_model_and_flags, effective_isa  # noqa: PLC0415

    return 8 if "amx_bf16" in effective_isa(cpu_model_and_flags()[2]) else None


def dense(rows: int) -> bool:
    """Whether a pass of this many rows runs the dense copy: a prompt longer than `dense_rows()`."""
    longest = dense_rows()
    return longest is not None and rows > longest and not _ROWWISE.get()


def prompt_path() -> str:
    """How prompts multiply, for profiles' fingerprints."""
    longest = dense_rows()
    return "kernels" if longest is None else f"{dense_dtype()} past {longest} tokens"


def attends_by_rows(rows: int) -> bool:
    """Whether a pass of this many rows attends with draftlab's row kernel: every pass after the
    prompt (`rowwise`), and a prompt's unless the kernels take their AVX2 path and it is longer
    than AVX2_PROMPT_ROWS."""
    return rows <= AVX2_PROMPT_ROWS or _ROWWISE.get() or kernels.isa() == "avx512-vnni"


OWN = "the GGUF's own Q4_1 blocks"
QUANTIZED = "quantized to Q4_1 by draftlab"
Q8_QUANTIZED = "quantized to Q8_0 by draftlab"
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


def _blocks(raw: np.ndarray, rows: int, cols: int, block_bytes: int, name: str) -> np.ndarray:
    """ggml's bytes of a matrix as [rows, cols/32, block_bytes], each block's float16 scale first."""
    if cols % GROUP:
        raise DraftlabError(f"a {name} matrix needs a multiple of {GROUP} columns, got {cols}")
    return np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows, cols // GROUP, block_bytes)


def _halves(blocks: np.ndarray, start: int) -> np.ndarray:
    """The float16 values at byte `start` of every block."""
    return blocks[..., start : start + 2].copy().view(np.float16)[..., 0]


def _gguf_quantized(weight: torch.Tensor, ggml_type: str) -> np.ndarray:
    """A float matrix's bytes quantized by gguf-py (llama.cpp's reference rounding)."""
    from gguf import GGMLQuantizationType, quants  # noqa: PLC0415

    return quants.quantize(weight.detach().float().cpu().numpy(), GGMLQuantizationType[ggml_type])


def _per_group(values: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(values.astype(np.float32)).repeat_interleave(GROUP, dim=1)


@dataclass(frozen=True)
class Q4Blocks:
    """One matrix as Q4_1: codes [N, K] in 0..15, scales d and minima m [N, K/32], float16 values."""

    codes: np.ndarray  # uint8
    d: np.ndarray  # float16
    m: np.ndarray  # float16

    @classmethod
    def from_raw(cls, raw: np.ndarray, rows: int, cols: int) -> Q4Blocks:
        """ggml's bytes (rows × cols/32 blocks of 20 bytes) as codes, scales and minima."""
        blocks = _blocks(raw, rows, cols, BLOCK_BYTES, "Q4_1")
        qs = blocks[..., 4:]
        codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(rows, cols)
        return cls(codes, _halves(blocks, 0), _halves(blocks, 2))

    @classmethod
    def quantize(cls, weight: torch.Tensor) -> Q4Blocks:
        return cls.from_raw(_gguf_quantized(weight, "Q4_1"), *weight.shape)

    def rows(self, order: np.ndarray) -> Q4Blocks:
        return Q4Blocks(self.codes[order], self.d[order], self.m[order])

    def dequantize(self) -> torch.Tensor:
        """The GGUF's float32 values, q·d + m (as llama.cpp dequantizes)."""
        return torch.from_numpy(self.codes.astype(np.float32)) * _per_group(self.d) + _per_group(self.m)


@dataclass(frozen=True)
class Q8Blocks:
    """One matrix as Q8_0: codes [N, K] in -127..127 and scales d [N, K/32], float16 values."""

    codes: np.ndarray  # int8
    d: np.ndarray  # float16

    @classmethod
    def from_raw(cls, raw: np.ndarray, rows: int, cols: int) -> Q8Blocks:
        """ggml's bytes (rows × cols/32 blocks of a float16 d and 32 signed codes) as codes and scales."""
        blocks = _blocks(raw, rows, cols, Q8_BLOCK_BYTES, "Q8_0")
        return cls(blocks[..., 2:].copy().view(np.int8).reshape(rows, cols), _halves(blocks, 0))

    @classmethod
    def quantize(cls, weight: torch.Tensor) -> Q8Blocks:
        return cls.from_raw(_gguf_quantized(weight, "Q8_0"), *weight.shape)

    def dequantize(self) -> torch.Tensor:
        """The GGUF's float32 values, q·d."""
        return torch.from_numpy(self.codes.astype(np.float32)) * _per_group(self.d)


def weight_tolerance(blocks: Q4Blocks) -> torch.Tensor:
    """Per weight, how far the layer may move it from the GGUF's q·d + m, read back by a one-hot row
    as a bfloat16 output. The kernel uses d and m exactly (a one-hot row's activation quantizes
    exactly up to float32 rounding), the prompt path's bfloat16 copy rounds the weight (≤ u·|w|), and
    the output is rounded to bfloat16 (u·|w|, |w| ≤ 15|d| + |m|): u·(31|d| + 2|m|) bounds either,
    plus float32's own rounding. What the 8-bit activations move is the kernel's own (test_q4_kernel)."""
    u = torch.finfo(torch.bfloat16).eps / 2
    d, m = _per_group(blocks.d).abs(), _per_group(blocks.m).abs()
    return (u + 4 * torch.finfo(torch.float32).eps) * (31 * d + 2 * m)


@functools.cache
def dense_dtype() -> torch.dtype:
    """The dtype of the copy long passes (prompts) run: bfloat16 where the CPU computes in it
    natively, else float32. On a Zen4 under AVX2 kernel ceilings plain decoding of a 256-token
    prompt and 64 tokens was predicted at 2.44 s with a bfloat16 copy, against 1.77 s for the whole
    model in float32: the emulated bfloat16 prompt outweighed the cheaper 4-bit steps (stop 62)."""
    from draftlab.hardware import native_bf16  # noqa: PLC0415

    return torch.bfloat16 if native_bf16() else torch.float32


class BlockLinear(nn.Module):
    """A bias-free linear layer over GGUF blocks packed for draftlab's kernels (models/kernels).

    Passes run the integer kernel over the packed codes: every decoding step and verification, and
    prompts too unless the CPU has AMX (`dense_rows`). There prompts run a copy of the same values
    made once at load (`dense_dtype`), where the CPU's dense products outrun the kernel. The copy is
    a plain attribute, not a buffer, so compiled packages (passes of at most 8 tokens) neither hold
    nor read it. Outputs are bfloat16, the dtype the rest of the model computes in."""

    storage = ""
    kernel_buffers: tuple[str, ...] = ()  # what the kernel reads; `stacked` joins them along the outputs

    def __init__(
        self, shape: tuple[int, int], dense: torch.Tensor | None, buffers: dict[str, torch.Tensor]
    ) -> None:
        super().__init__()
        kernels.load()
        self.out_features, self.in_features = shape
        for name, tensor in buffers.items():
            self.register_buffer(name, tensor)
        self.dense = None if dense is None else dense.to(dense_dtype())

    @classmethod
    def stacked(cls, layers: list[BlockLinear]) -> BlockLinear:
        """One layer whose outputs are those of `layers` side by side (their tiles stacked: the
        kernel computes each output from its own row's blocks, so each keeps its bits)."""
        layer = cls.__new__(cls)
        rows = sum(m.out_features for m in layers)
        buffers = {name: torch.cat([getattr(m, name) for m in layers]) for name in cls.kernel_buffers}
        copy = None if layers[0].dense is None else torch.cat([m.dense for m in layers])
        BlockLinear.__init__(layer, (rows, layers[0].in_features), copy, buffers)
        return layer

    def kernel(self, rows: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def step_bytes(self) -> int:
        """What a decoding step reads of this layer: the packed codes and their scales."""
        return sum(t.numel() * t.element_size() for t in self.buffers())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        rows = x.reshape(-1, shape[-1])
        if dense(rows.shape[0]):
            out = nn.functional.linear(rows.to(self.dense.dtype), self.dense)
        else:
            out = self.kernel(rows)
        return out.to(torch.bfloat16).reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, storage={self.storage}"


class Q4Linear(BlockLinear):
    """A decoder layer's matrix as Q4_1: a quarter of bfloat16's bytes a step."""

    storage = "q4_1"
    kernel_buffers = ("packed", "scales", "minima")

    def __init__(self, blocks: Q4Blocks) -> None:
        packed, scales, minima = kernels.pack_q4_1(blocks.codes, blocks.d, blocks.m)
        copy = blocks.dequantize() if dense_rows() is not None else None
        super().__init__(blocks.codes.shape, copy, {"packed": packed, "scales": scales, "minima": minima})

    def kernel(self, rows: torch.Tensor) -> torch.Tensor:
        return kernels.q4_1_q8_mm(rows, self.packed, self.scales, self.minima)


class Q8Linear(BlockLinear):
    """A matrix as Q8_0: half the bytes of bfloat16 a step (a draft's layers, `attach_q8`)."""

    storage = "q8_0"
    kernel_buffers = ("codes", "scales")

    def __init__(self, blocks: Q8Blocks, keep_dense: bool = False) -> None:
        codes, scales = kernels.pack_q8_0(blocks.codes, blocks.d)
        copy = blocks.dequantize() if keep_dense or dense_rows() is not None else None
        super().__init__(blocks.codes.shape, copy, {"codes": codes, "scales": scales})

    def kernel(self, rows: torch.Tensor) -> torch.Tensor:
        return kernels.q8_0_q8_mm(rows, self.codes, self.scales)


class Q8Head(Q8Linear):
    """The output head as Q8_0 (llama.cpp's storage of this target's tied embedding): half the bytes
    of bfloat16 a step."""

    def __init__(self, blocks: Q8Blocks) -> None:
        super().__init__(blocks, keep_dense=True)

    @property
    def weight(self) -> torch.Tensor:
        """The head's values, dense, for readers of an output head's weight (vocabulary size, drafters'
        heads distilled from it)."""
        return self.dense


# Matrices of one module that read the same input: an attention's q, k and v, an MLP's gate and up.
SHARED_INPUT = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class SharedInput(nn.Module):
    """Matrices that read the same input, run as one: their blocks stacked, one kernel call (one
    quantization of the input, one start of the threads) instead of one each. A decoding step
    made 210 calls, most of them short enough that starting one cost as much as reading its
    blocks. The model still calls each matrix (`InputShare`); the first call computes all of
    them and each of the others takes its part, once, if it passes the same tensor."""

    def __init__(self, layers: list[BlockLinear]) -> None:
        super().__init__()
        self.stacked = type(layers[0]).stacked(layers)
        self.sizes = [m.out_features for m in layers]
        # The input the parts were computed for, the parts, and which of them were taken.
        self._pending: tuple[torch.Tensor, tuple[torch.Tensor, ...], set[int]] | None = None

    def part(self, x: torch.Tensor, index: int) -> torch.Tensor:
        pending = self._pending
        # By identity: the same tensor object, still held here, so never another one at its address.
        if pending is None or pending[0] is not x or index in pending[2]:
            pending = self._pending = (x, self.stacked(x).split(self.sizes, dim=-1), set())
        pending[2].add(index)
        if len(pending[2]) == len(self.sizes):
            self._pending = None
        return pending[1][index]


class InputShare(nn.Module):
    """One matrix of a `SharedInput`, where the model calls it: its part of the shared call."""

    def __init__(self, shared: SharedInput, index: int) -> None:
        super().__init__()
        object.__setattr__(self, "shared", shared)  # registered once, on the parent; not a child here
        self.storage = shared.stacked.storage
        self.index = index
        self.out_features, self.in_features = shared.sizes[index], shared.stacked.in_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shared.part(x, self.index)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, part {self.index} of one call"
        )


def share_inputs(model: nn.Module) -> int:
    """Run the block matrices that read the same input (of one storage) as one call each
    (`SharedInput`); how many groups were made."""
    made = 0
    for module in list(model.modules()):
        for names in SHARED_INPUT:
            layers = [getattr(module, n, None) for n in names]
            if not all(isinstance(m, BlockLinear) for m in layers):
                continue
            if len({type(m) for m in layers}) != 1 or len({m.in_features for m in layers}) != 1:
                continue
            shared = SharedInput(layers)
            module.add_module("_".join(n.removesuffix("_proj") for n in names) + "_blocks", shared)
            for i, name in enumerate(names):
                setattr(module, name, InputShare(shared, i))
            made += 1
    return made


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
    from gguf import GGMLQuantizationType  # noqa: PLC0415

    out: dict[str, Q4Blocks] = {}
    for tensor in gguf_tensors(path).values():
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
    """Whether the kernel takes a matrix of this shape."""
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


def all_blocks(model: nn.Module) -> bool:
    """Whether every matrix of the model runs from blocks (none left dense: a shape the kernel does
    not take, a head it could not replace), so that every pass's rows round as they would alone."""
    return not any(isinstance(m, nn.Linear) for m in model.modules())


def own_gguf(name: str) -> Path | None:
    """The GGUF whose Q4_1 blocks are the catalogue model `name`'s own weights, or None."""
    from draftlab.models import install  # noqa: PLC0415
    from draftlab.models.catalogue import ENTRIES  # noqa: PLC0415

    entry = ENTRIES.get(name)
    gguf = install.gguf_path(entry) if entry is not None and entry.gguf_file else None
    return gguf if gguf is not None and _is_q4_1(gguf) else None


def gguf_head(path: Path) -> Q8Blocks | None:
    """The output head's Q8_0 blocks in a GGUF (`output`, else the tied `token_embd`), or None."""
    from gguf import GGMLQuantizationType  # noqa: PLC0415

    tensors = gguf_tensors(path)
    tensor = tensors.get("output.weight", tensors.get("token_embd.weight"))
    if tensor is None or tensor.tensor_type != GGMLQuantizationType.Q8_0:
        return None
    cols, rows = (int(n) for n in tensor.shape)
    return Q8Blocks.from_raw(np.asarray(tensor.data), rows, cols)


def apply_head(model: nn.Module, blocks: Q8Blocks | None) -> None:
    """Run the output head from Q8_0 blocks, where there are some and its shape fits the kernel."""
    head = model.get_output_embeddings()
    if blocks is None or not isinstance(head, nn.Linear) or head.bias is not None:
        return
    if tuple(head.weight.shape) != blocks.codes.shape:
        raise DraftlabError(
            f"Q8_0 head {blocks.codes.shape} does not fit the model's {tuple(head.weight.shape)}"
        )
    model.set_output_embeddings(Q8Head(blocks))


def attach(model: nn.Module, name: str) -> str:
    """Run `model`'s linear layers from Q4_1 and its output head from Q8_0, as llama.cpp stores them:
    a catalogue target's own GGUF blocks where it has them, else its weights quantized here; the
    matrices that read one input run as one call (`share_inputs`). Returns which (OWN or
    QUANTIZED), for labels and fingerprints."""
    gguf = own_gguf(name)
    if gguf is not None:
        apply(model, gguf_blocks(gguf, model.config))
        apply_head(model, gguf_head(gguf))
        source = OWN
    else:
        apply(model, quantized_blocks(model))
        head = model.get_output_embeddings()
        if isinstance(head, nn.Linear) and fits(*head.weight.shape):
            apply_head(model, Q8Blocks.quantize(head.weight))
        source = QUANTIZED
    share_inputs(model)
    return source


def quantize_q8(module: nn.Module) -> int:
    """Replace each bias-free linear layer of `module` that the kernel takes by its Q8_0 blocks
    (gguf-py's quantizer); how many were replaced."""
    made = 0
    for parent in list(module.modules()):
        for child_name, child in list(parent.named_children()):
            if not isinstance(child, nn.Linear):
                continue
            if child.bias is None and fits(child.out_features, child.in_features):
                setattr(parent, child_name, Q8Linear(Q8Blocks.quantize(child.weight)))
                made += 1
    return made


def block_layers(module: nn.Module):
    """The layers of `module` that run from blocks (each stacked call once, never its parts)."""
    return (m for m in module.modules() if isinstance(m, BlockLinear))


def attach_q8(model: nn.Module) -> str:
    """Run a model's linear layers and output head from Q8_0 blocks quantized here, as llama.cpp's
    drafts commonly run: a draft beside the 4-bit target (models/loading.py `draft_dtype`). On a
    Zen4 torch's bfloat16 products of one row read the draft's 49152 x 192 output head at 9-13
    GB/s (1.4 ms), the kernel its Q8_0 blocks in 0.15 ms; a draft step ran 8.3 ms eagerly in
    bfloat16 and 2.9 ms from Q8_0 (stop 79). The input embedding stays as loaded."""
    head = model.get_output_embeddings()
    if isinstance(head, nn.Linear) and head.bias is None and fits(*head.weight.shape):
        model.set_output_embeddings(Q8Head(Q8Blocks.quantize(head.weight)))
    if quantize_q8(model) == 0 and not isinstance(model.get_output_embeddings(), Q8Head):
        raise DraftlabError(
            "--dtype q8_0: no linear layer of this model can run from Q8_0 blocks (bias-free, inputs a multiple "
            f"of {GROUP}, outputs a multiple of {ROWS}); run it in float32 or bfloat16"
        )
    share_inputs(model)
    return Q8_QUANTIZED


def _is_q4_1(path: Path) -> bool:
    from gguf import GGMLQuantizationType  # noqa: PLC0415

    return any(
        t.tensor_type == GGMLQuantizationType.Q4_1
        for name, t in gguf_tensors(path).items()
        if name.startswith("blk.")
    )


def gguf_tensors(path: Path) -> dict:
    """A GGUF's tensors by name (gguf's `ReaderTensor`s, their data mapped from the file), parsed
    once per process and file version: a read parses every metadata field too, the tokenizer's
    49152 strings among them, 2.4-2.8 s for the default target's file on an AMD Zen5, and loading
    a 4-bit target asks three times (is it Q4_1, its matrices, its head)."""
    stat = Path(path).stat()
    return _read_tensors(Path(path).resolve(), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _read_tensors(path: Path, size: int, mtime_ns: int) -> dict:
    from gguf import GGUFReader  # noqa: PLC0415

    return {t.name: t for t in GGUFReader(path).tensors}
