"""draftlab's own CPU kernels:

* GGUF block weights (Q4_1, Q8_0) times activations quantized to 8 bits per block of 32, in integer
  arithmetic (`quant_mm.cpp`), as llama.cpp computes those files;
* attention whose rows do not depend on the pass they are in (`attend.cpp`).

They are built once per torch version and source on first use, with torch's own extension builder,
into the draftlab home, and registered as the operators `draftlab::q4_1_q8_mm`,
`draftlab::q8_0_q8_mm` and `draftlab::attend`, which exported programs call like any other;
compiled packages call their C entry points directly (`c_shims`)."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil

import numpy as np
import torch

from draftlab.errors import DraftlabError, first_line

SOURCES = tuple(os.path.join(os.path.dirname(__file__), name) for name in ("quant_mm.cpp", "attend.cpp"))
HEADERS = (os.path.join(os.path.dirname(__file__), "isa.h"),)
GROUP = 32
LANES = 16  # output rows per tile: one AVX-512 vector of float32
# The paths the kernel takes, by the number it answers `isa` with (quant_mm.cpp's `Isa`).
ISA_NAMES = {0: "scalar", 1: "avx2", 2: "avx512-vnni"}


@functools.cache
def digest() -> str:
    """The kernels' source and torch's version: what a build, and a package calling it, depends on."""
    h = hashlib.sha256(torch.__version__.encode())
    for source in (*SOURCES, *HEADERS):
        with open(source, "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


@functools.cache
def load() -> None:
    """Build (first time) and load the kernels into this process."""
    from torch.utils import cpp_extension  # noqa: PLC0415

    from draftlab.models.cache import home  # noqa: PLC0415

    build = home() / "kernels" / f"quant_mm-{digest()}"
    if shutil.which("ninja") is None:  # pip's ninja, in a virtual environment not on PATH
        import ninja  # noqa: PLC0415

        os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, os.environ.get("PATH", "")])
    build.mkdir(parents=True, exist_ok=True)
    try:
        library = cpp_extension.load(
            name=f"draftlab_quant_mm_{digest()}",
            sources=list(SOURCES),
            build_directory=str(build),
            # at::parallel_for is inline: without OpenMP here it runs on one thread. The library it
            # links (libgomp.so.1) is the one torch has already loaded, so both share one pool.
            # No fused multiply-adds but the ones written out: each path must round alike.
            extra_cflags=["-O3", "-fopenmp", "-ffp-contract=off"],
            extra_ldflags=["-fopenmp"],
            is_python_module=False,
            verbose=False,
        )
    except (RuntimeError, OSError, ImportError) as exc:
        raise DraftlabError(
            f"draftlab's 4-bit CPU kernels did not build in '{build}' (it needs a C++ compiler and ninja): "
            f"{first_line(exc)}"
        ) from None
    # torch loaded the library for this process only; a compiled package calls its C entry points
    # (`c_shims`) by name, so they join the global symbols before any package is loaded.
    ctypes.CDLL(str(library), mode=os.RTLD_GLOBAL)

    @torch.library.register_fake("draftlab::q4_1_q8_mm")
    def _(x, codes, scales, minima, isa=-1):
        return x.new_empty((x.shape[0], codes.shape[0] * LANES), dtype=torch.float32)

    @torch.library.register_fake("draftlab::q8_0_q8_mm")
    def _(x, codes, scales, isa=-1):
        return x.new_empty((x.shape[0], codes.shape[0] * LANES), dtype=torch.float32)

    @torch.library.register_fake("draftlab::attend")
    def _(q, k, v, mask, scale, isa=-1):
        return q.new_empty((q.shape[0], q.shape[2], q.shape[1], q.shape[3]))


def calls_kernels(program) -> bool:
    """Whether an exported program calls draftlab's operators (a 4-bit model's do; others none)."""
    return any(getattr(node.target, "namespace", None) == "draftlab" for node in program.graph.nodes)


def c_shims() -> dict:
    """inductor's `aot_inductor.custom_ops_to_c_shims` for draftlab's operators: a package built with
    it calls each kernel's C entry point (quant_mm.cpp, attend.cpp) directly rather than through
    its proxy executor, which boxes every argument on each call."""
    load()
    ops = torch.ops.draftlab
    return {
        ops.q4_1_q8_mm.default: [
            "AOTITorchError aoti_torch_cpu_q4_1_q8_mm(AtenTensorHandle x, AtenTensorHandle codes, "
            "AtenTensorHandle scales, AtenTensorHandle minima, int64_t isa, AtenTensorHandle* ret0)"
        ],
        ops.q8_0_q8_mm.default: [
            "AOTITorchError aoti_torch_cpu_q8_0_q8_mm(AtenTensorHandle x, AtenTensorHandle codes, "
            "AtenTensorHandle scales, int64_t isa, AtenTensorHandle* ret0)"
        ],
        ops.attend.default: [
            "AOTITorchError aoti_torch_cpu_attend(AtenTensorHandle q, AtenTensorHandle k, AtenTensorHandle v, "
            "AtenTensorHandle* mask, double scale, int64_t isa, AtenTensorHandle* ret0)"
        ],
    }


def isa() -> str:
    """The path this CPU's kernels take (capped, like torch's, by ATEN_CPU_CAPABILITY)."""
    load()
    return ISA_NAMES[int(torch.ops.draftlab.q8_isa())]


def version() -> str:
    """Which kernels run here, for profiles' and packages' fingerprints: another path or another
    source prices (and compiles) otherwise."""
    return f"{isa()}-{digest()}"


def _by_group(codes: np.ndarray) -> np.ndarray:
    """Codes [N, K] as [N/16 tiles, K/32 blocks, 8 groups, 16 lanes, 4 inputs]."""
    rows, cols = codes.shape
    tiles, blocks = rows // LANES, cols // GROUP
    by_block = codes.reshape(tiles, LANES, blocks, 8, 4)  # [t, lane, b, g, i]
    return by_block.transpose(0, 2, 3, 1, 4)


def _tiled(values: np.ndarray) -> torch.Tensor:
    """Per-row, per-block float16 values [N, K/32] as [N/16, K/32, 16], their bits as int16 (so that a
    model's `.to(dtype)` leaves them alone)."""
    rows, blocks = values.shape
    tiled = values.astype(np.float16).reshape(rows // LANES, LANES, blocks).transpose(0, 2, 1)
    return torch.from_numpy(np.ascontiguousarray(tiled).view(np.int16).copy())


def pack_q4_1(
    codes: np.ndarray, d: np.ndarray, m: np.ndarray
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_1 codes [N, K] (0..15), scales and minima [N, K/32] in the kernel's layout: codes
    [N/16, K/32, 256] bytes, groups 0-3 in the low nibbles of four 64-byte chunks, 4-7 in the high."""
    groups = _by_group(codes).astype(np.uint8)
    packed = groups[:, :, :4] | (groups[:, :, 4:] << 4)
    return (
        torch.from_numpy(np.ascontiguousarray(packed).reshape(*packed.shape[:2], 256)),
        _tiled(d),
        _tiled(m),
    )


def pack_q8_0(codes: np.ndarray, d: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Q8_0 codes [N, K] (int8) and scales [N, K/32] in the kernel's layout: codes [N/16, K/32, 512]."""
    groups = np.ascontiguousarray(_by_group(codes.astype(np.int8)))
    return torch.from_numpy(groups.reshape(*groups.shape[:2], 512)), _tiled(d)


def q4_1_q8_mm(
    x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, minima: torch.Tensor, isa: int = -1
):
    """x [rows, K] times the Q4_1 matrix's transpose, float32 [rows, N]."""
    load()
    return torch.ops.draftlab.q4_1_q8_mm(x, codes, scales, minima, isa)


def q8_0_q8_mm(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, isa: int = -1):
    """x [rows, K] times the Q8_0 matrix's transpose, float32 [rows, N]."""
    load()
    return torch.ops.draftlab.q8_0_q8_mm(x, codes, scales, isa)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    isa: int = -1,
) -> torch.Tensor:
    """Attention of q [b, heads, rows, d] over k, v [b, kv heads, slots, d] under a mask [b, 1,
    rows, slots] (bool, or additive with the dtype's lowest value hiding a slot; None: causal),
    as [b, rows, heads, d]. Each row's output depends only on that row and the slots it sees."""
    load()
    return torch.ops.draftlab.attend(q, k, v, mask, scale, isa)
