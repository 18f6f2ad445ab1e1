"""Clocks that wait for the device: a CUDA kernel still running is time not yet spent."""

from __future__ import annotations

import time
from collections.abc import Iterable

import torch


def synchronized_clock(devices: Iterable[torch.device]) -> float:
    for device in {torch.device(d) for d in devices}:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return time.perf_counter()
