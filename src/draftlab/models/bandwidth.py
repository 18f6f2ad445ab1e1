"""The memory-bandwidth limit of plain decoding: how fast any engine could write one token at most.

A batch-1 decoding step reads every weight once, so it cannot take less than (bytes of weights) /
(memory read bandwidth). The bandwidth is measured here, once per machine and thread count, by
summing a buffer far larger than the caches with torch on the threads the engines use; the bytes
are the model's own (a transformers model's parameters in their dtype, a GGUF's quantized tensors).
An engine's measured ms per token over that limit says how much room it leaves.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from draftlab.files import write_text

BUFFER_BYTES = 1 << 29  # 512 MiB: far past any CPU's last-level cache
REPEATS = 7


@dataclass(frozen=True)
class Bandwidth:
    gb_per_s: float  # 1e9 bytes per second, read
    threads: int
    buffer_bytes: int
    measured_at: str


def measure_read_bandwidth(buffer_bytes: int = BUFFER_BYTES, repeats: int = REPEATS) -> Bandwidth:
    """The median of `repeats` timed full reads (a sum) of a float32 buffer, after one to warm it."""
    data = torch.ones(buffer_bytes // 4, dtype=torch.float32)
    data.sum()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        data.sum()
        times.append(time.perf_counter() - t0)
    seconds = statistics.median(times)
    return Bandwidth(
        data.numel() * 4 / seconds / 1e9,
        torch.get_num_threads(),
        data.numel() * 4,
        time.strftime("%Y-%m-%dT%H:%M:%S"),
    )


def cached_bandwidth(folder: Path, hardware_key: str) -> Bandwidth:
    """This machine's bandwidth at torch's thread count, measured once and kept beside the profiles."""
    path = folder / f"bandwidth-{hardware_key}-{torch.get_num_threads()}t.json"
    try:
        return Bandwidth(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        pass
    found = measure_read_bandwidth()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(asdict(found), indent=1))
    return found


def weight_bytes(lm) -> int:
    """Bytes a plain decoding step reads: every weight once (a tied embedding once, as the output)."""

    # Another engine's model counts its own (a GGUF's), and so does an EAGLE-3 head (not its embedding).
    own = getattr(lm, "weight_bytes", None)
    if own is not None:
        return int(own())
    # parameters() yields a tied weight once; a shell's (meta) parameters have their dtype's size too.
    # A 4-bit layer's packed codes and scales are buffers (models/q4.py), which it reports itself.
    params = sum(p.numel() * p.element_size() for p in lm.model.parameters())
    output = getattr(lm.model, "get_output_embeddings", None)  # a drafter's head has no such method
    if output is not None and hasattr(output(), "step_bytes"):
        # A Q8_0 head (models/q4.py) is read instead of the tied embedding, of which a step reads a row.
        embedding = lm.model.get_input_embeddings().weight
        params -= embedding.numel() * embedding.element_size()
    return params + sum(m.step_bytes() for m in lm.model.modules() if hasattr(m, "step_bytes"))


def limit_ms(weight_bytes_: int, bandwidth: Bandwidth) -> float:
    """The least time one plain decoding step can take on this machine, in ms."""
    return weight_bytes_ / (bandwidth.gb_per_s * 1e9) * 1000


# How far below the measured limit a real step might still go (a part of the weights staying in the
# last-level cache, a read faster than torch's sum): none measured here came closer than 1.4x the
# limit (docs/results.md: llama.cpp, our compiled passes, float32 to 4-bit), so a bound divided by
# this much is one no engine has broken.
HEADROOM = 1.5


def least_decoding_ms(weight_bytes_: int, bandwidth: Bandwidth, new_tokens: int) -> float:
    """A lower bound on plain decoding of `new_tokens` here, in ms: a step per token after the
    first (the prefill's, bounded by nothing), each reading every weight once."""
    return max(new_tokens - 1, 0) * limit_ms(weight_bytes_, bandwidth) / HEADROOM
