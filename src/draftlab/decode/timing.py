"""Clocks: one that waits for the device (a CUDA kernel still running is time not yet spent), and
one that counts its readings instead of reading the time."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch


class TickClock:
    """A clock whose every reading is `ms` later than the one before: a span it measures counts the
    readings taken inside it, so whatever is decided from such spans depends on the work done and
    never on how busy the machine is (for tests of sizing and pacing, and replays)."""

    def __init__(self, ms: float = 0.01) -> None:
        self.ms = ms
        self.now = 0.0

    def __call__(self) -> float:
        self.now += self.ms / 1000
        return self.now


def synchronized_clock(devices: Iterable[torch.device]) -> float:
    for device in {torch.device(d) for d in devices}:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return time.perf_counter()


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for a timed generation, as `timeit` times: a full
    collection walks every object the loaded models and compilers made, 0.2-0.4 s each (11 in a
    three-subtask bench on the Zen5, stop 77), and one landing in a 0.1-0.5 s generation made that
    generation's method look up to 3x slower than in its repeats. Garbage waits for the next
    collection after the generation (reference counting frees the rest as it goes)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
