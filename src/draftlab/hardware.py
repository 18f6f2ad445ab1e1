"""The machine a model runs on: CPU identity, the ISA flags that pick kernels, the kernel environment.

Light (no torch at import): profiles, compiled packages and llama.cpp probes key their caches on it.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path

# Every cost fingerprint carries it: bumping it re-measures every cached profile.
PROFILE_SCHEMA = 4

ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_fp16")
# Environment variables that change which kernels torch picks, or how its threads wait between
# them (and so what a pass costs): with OMP_WAIT_POLICY=PASSIVE the 4-bit target's compiled
# one-token pass took 24 ms on a Zen5 against 3 by default (its ~300 parallel regions each wake the
# threads).
KERNEL_ENV = (
    "ONEDNN_MAX_CPU_ISA",
    "ATEN_CPU_CAPABILITY",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OMP_WAIT_POLICY",
    "GOMP_SPINCOUNT",
)


def cpu_model_and_flags() -> tuple[str, str, list[str]]:
    """Model name, identity and ISA flags of the first CPU listed in /proc/cpuinfo.

    The identity (vendor, family, model) matters because virtual machines often report a generic
    name ("AMD EPYC Processor") for CPUs as different as Zen3 and Zen4."""
    name, flags = platform.processor() or platform.machine(), []
    ident: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return name, "", flags
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "model name" and value and name != value:
            name = value
        elif key in ("vendor_id", "cpu family", "model") and key not in ident:
            ident[key] = value
        elif key in ("flags", "Features") and not flags:
            present = set(value.split())
            flags = [f for f in ISA_FLAGS if f in present]
        elif not line.strip() and ident:
            break  # the first processor's block is enough
    cpu_id = " ".join(
        part
        for part in (
            ident.get("vendor_id", ""),
            f"family {ident['cpu family']}" if "cpu family" in ident else "",
            f"model {ident['model']}" if "model" in ident else "",
        )
        if part
    )
    return name, cpu_id, flags


def hardware(device) -> dict:
    """The processor a model runs on, with what decides its speed."""
    if str(device).startswith("cuda"):
        import torch  # noqa: PLC0415 - only for a GPU: CPU figures need no torch

        device = torch.device(device)
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        return {
            "kind": "cuda",
            "name": props.name,
            "capability": f"{props.major}.{props.minor}",
            "memory_gib": round(props.total_memory / 2**30, 1),
            "bf16": bool(torch.cuda.is_bf16_supported()),
        }
    name, cpu_id, flags = cpu_model_and_flags()
    return {
        "kind": "cpu",
        "name": name,
        "cpu_id": cpu_id,
        "isa_flags": effective_isa(flags),
        "cpu_flags": flags,
        "cores": os.cpu_count(),
    }


# What each ONEDNN_MAX_CPU_ISA ceiling still lets oneDNN use, of the flags above.
_ONEDNN_CEILINGS = {
    "AVX2": {"avx2"},
    "AVX2_VNNI": {"avx2"},
    "AVX512_CORE": {"avx2", "avx512f"},
    "AVX512_CORE_VNNI": {"avx2", "avx512f"},
    "AVX512_CORE_BF16": {"avx2", "avx512f", "avx512_bf16"},
    "AVX512_CORE_FP16": {"avx2", "avx512f", "avx512_bf16", "avx512_fp16"},
    "AVX512_CORE_AMX": {"avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16"},
}


def effective_isa(flags: list[str]) -> list[str]:
    """The ISA flags torch may use: ONEDNN_MAX_CPU_ISA / ATEN_CPU_CAPABILITY can hide the newer ones."""
    onednn = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    aten = os.environ.get("ATEN_CPU_CAPABILITY", "").lower()
    allowed = set(flags)
    if onednn in _ONEDNN_CEILINGS:
        allowed &= _ONEDNN_CEILINGS[onednn]
    elif onednn.startswith(("SSE", "AVX")) and not onednn.startswith("AVX512"):
        allowed = set()  # SSE4.1 or AVX: older than anything listed
    if aten == "default":
        allowed = set()
    elif aten == "avx2":
        allowed &= {"avx2"}
    return [f for f in flags if f in allowed]


def supported_dtypes(device) -> list[str]:
    """The dtypes worth trying on a device: float16 on a CPU only where it has native fp16 units."""
    hw = hardware(device)
    if hw["kind"] == "cuda":
        return ["float16", "bfloat16", "float32"] if hw["bf16"] else ["float16", "float32"]
    dtypes = ["float32", "bfloat16"]
    if {"avx512_fp16", "amx_fp16"} & set(hw["isa_flags"]):
        dtypes.append("float16")
    return dtypes


def kernel_env() -> dict[str, str]:
    """The variables that change torch's (or llama.cpp's) kernels: part of every cost fingerprint."""
    return {k: os.environ[k] for k in KERNEL_ENV if k in os.environ}


def fingerprint_key(fp: dict) -> str:
    return hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:16]


def native_bf16() -> bool:
    """Whether this CPU computes in bfloat16 natively (AVX512-BF16 or AMX), where torch's bfloat16 pays
    off; elsewhere it is emulated. ONEDNN_MAX_CPU_ISA and ATEN_CPU_CAPABILITY ceilings count."""
    return bool({"avx512_bf16", "amx_bf16"} & set(effective_isa(cpu_model_and_flags()[2])))


# Measured on a 2-core AMD Zen3 without native bfloat16 (issue 46): the compiled bfloat16 package
# took 189 s to build, and its 8-token pass cost 3.5x its 1-token pass (167.8 against 47.7 ms).
EMULATED_HALF = {
    "bfloat16": ("avx512_bf16", "amx_bf16"),
    "float16": ("avx512_fp16", "amx_fp16"),
}
# 4-bit weights (`q4_1`, bfloat16 arithmetic) get a package on every CPU: their step reads a quarter
# of bfloat16's bytes, and plain decoding pays where verification does not. On a Zen4 under AVX2
# kernel ceilings the default target's compiled `q4_1` passes took 15.95 / 17.73 / 23.58 / 34.09
# ms for 1 / 2 / 4 / 8 tokens, against 21.7 ms for a compiled float32 step (stop 62).


def compile_skip_reason(dtype: str, isa_flags: list[str]) -> str | None:
    """Why compiled passes in `dtype` are not worth building on a CPU torch may use these ISA flags
    of (`effective_isa`), or None. A half-precision dtype without native units is emulated: its
    compiled multi-token passes grow steeply with the pass length, so verification never pays."""
    native = EMULATED_HALF.get(dtype)
    if native is None or set(native) & set(isa_flags):
        return None
    return (
        f"{dtype} is emulated on this CPU (no {' or '.join(native)}): its compiled multi-token passes "
        "cost several steps (on a Zen3, 8 tokens 3.5x one), so no package is built"
    )


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MB (Linux reports kilobytes, macOS bytes)."""
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (1e6 if sys.platform == "darwin" else 1e3), 1)
