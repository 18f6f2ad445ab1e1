"""What a forward pass costs on the machine at hand: ms per pass of N new tokens at a context length.

Whether speculation pays depends on how the cost of one pass grows with the number of tokens it
scores. With native bfloat16 (AMX, or any GPU) scoring 8 tokens costs about as much as scoring 1;
with emulated bfloat16 on an AVX2-only CPU it costs about 8 times as much. So the cost is
measured, once per machine, model, dtype and software version, and cached under the draftlab home.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from rich.console import Console

from draftlab.files import write_text
from draftlab.hardware import fingerprint_key, hardware
from draftlab.models.cached import CachedModel, cached
from draftlab.models.compiled import PASS_SIZES
from draftlab.models.cost_curve import (
    CostCurve,
    Profile,
)
from draftlab.models.loading import LoadedModel
from draftlab.sampling import argmax_rows

# The ISA features that decide how a CPU multiplies bfloat16 / float16 matrices.
FULL_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 128)
QUICK_SIZES = (1, 2, 3, 4, 6, 8, 12, 16)


def default_contexts(limit: int | None, quick: bool) -> list[int]:
    top = min(limit or 2048, 2048 if quick else 1 << 30)
    points = [64, 256, 1024, 2048] if quick else [64, 256, 1024, 2048, 4096, 8192, 16384, 32768]
    out = [c for c in points if c + 128 <= top]
    return out or [max(min(top - 130, 64), 1)]


# Contexts of a compiled profile, measured in the one package of the model that later runs use
# (`measure`'s bucket_need). Its passes attend over a window of the bucket that grows with the
# context (models/compiled.py `window`), so the curve also takes the last context of that package
# (`with_far_context`). With 64 and 256 alone, and 256 read no dearer than 64 within the noise, the
# curve held the 8-token pass at its 256-token cost for the suite's 430-720-token prompts; on a
# Zen4 it cost 9.8 ms there by the profile and 15.9 ms at 512, 19.8 ms at 960 (docs/results.md).
COMPILED_CONTEXTS = (64, 256)


def with_far_context(contexts: Sequence[int], capacity: int, longest_pass: int) -> list[int]:
    """`contexts` that a package of `capacity` slots holds with a pass of `longest_pass` tokens (and
    its reserve slot) after them, and the last such context."""
    far = capacity - longest_pass - 1
    held = [c for c in contexts if c <= far]
    return held + [far] if far >= 1 and (not held or far > held[-1]) else held


def profile_points(
    limit: int | None, quick: bool, compiled: bool
) -> tuple[tuple[int, ...], list[int], list[int]]:
    """(pass sizes, contexts, prefill lengths) a profile measures. Compiled: the compiled pass
    sizes at COMPILED_CONTEXTS, prefills up to 256 (they run eagerly over the static cache)."""
    if compiled:
        contexts = [c for c in COMPILED_CONTEXTS if limit is None or c + 16 <= limit]
        return PASS_SIZES, contexts or [max(min(limit - 16, 64), 1)], [16, 64, 256]
    sizes = QUICK_SIZES if quick else FULL_SIZES
    lengths = [16, 64, 256, 1024] if quick else [16, 64, 256, 1024, 2048, 4096]
    return sizes, default_contexts(limit, quick), lengths


def _timed(fn: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) * 1000


def _random_ids(lm: LoadedModel, seed: int) -> Callable[[int], list[int]]:
    """n token ids drawn from the model's vocabulary, the same draws for the same seed."""
    generator = torch.Generator().manual_seed(seed)
    vocab = min(lm.vocab_size, len(lm.tokenizer))
    return lambda n: torch.randint(0, vocab, (n,), generator=generator).tolist()


def measure(
    lm: LoadedModel,
    sizes: Sequence[int] = QUICK_SIZES,
    contexts: Sequence[int] | None = None,
    prefill_lengths: Sequence[int] | None = None,
    repeats: int = 3,
    on_step: Callable[[str], None] | None = None,
    compiled: bool = False,
    bucket_need: int = 0,
    far_context: bool = False,
) -> CostCurve:
    """Median ms of `repeats` passes for every (context, size), interleaved so drift spreads evenly.

    `compiled`: through the compiled package over a static cache, made ready before it is timed:
    the package of the bucket that holds `bucket_need` tokens (the one later runs will use, so it
    is built once), or the shortest bucket that holds the contexts measured. `far_context`: the
    last context that package holds is measured too (`with_far_context`)."""
    runner = cached(lm, compiled=compiled)
    limit = lm.context_length
    contexts = list(contexts) if contexts is not None else default_contexts(limit, quick=True)
    if limit is not None:
        contexts = [c for c in contexts if c + max(sizes) <= limit] or [max(limit - max(sizes) - 1, 1)]
    if compiled and far_context:
        # The package that holds bucket_need (or, without one, the contexts asked for) serves them all.
        need = max(bucket_need, max(contexts) + max(sizes) + 1)
        contexts = with_far_context(contexts, runner.compiled.bucket(need), max(sizes))
    prefill_lengths = list(prefill_lengths) if prefill_lengths is not None else [16, 64, 256, 1024]
    if limit is not None:
        prefill_lengths = [p for p in prefill_lengths if p <= limit] or [min(16, limit)]
    ids = _random_ids(lm, seed=0)
    start_ids = runner.start([0])
    if compiled:  # one package holds them all, and bucket_need
        runner.warm(max(bucket_need, max(contexts) + max(sizes) + 1), tuple(sizes))
    # A compiled pass takes milliseconds: its contexts are visited in turn, `repeats` times, so that
    # a host slowing down or speeding up weighs on each alike. Measured one context after the other,
    # profiles (Zen5, Zen4) read passes at context 256 up to 8-12% cheaper than at 64 (docs/results.md).
    rounds, per_round = (repeats, 3) if compiled else (1, repeats)
    samples: dict[tuple[int, int], list[float]] = {(c, n): [] for c in contexts for n in sizes}
    for round_ in range(rounds):
        for context in contexts:
            if on_step:
                on_step(f"context {context}" + (f", round {round_ + 1} of {rounds}" if rounds > 1 else ""))
            runner.start([0])
            runner.forward((start_ids + ids(context))[:context], keep=1)
            _timed(lambda: runner.forward(ids(max(sizes)), keep=max(sizes)), lm.device)  # warm-up
            runner.crop(context)
            for _ in range(per_round):
                for n in sizes:
                    feed = ids(n)
                    took = _timed(lambda feed=feed, n=n: runner.forward(feed, keep=n), lm.device)
                    samples[context, n].append(took)
                    runner.crop(context)
    ms = [[statistics.median(samples[c, n]) for n in sizes] for c in contexts]
    prefill: list[float] = []
    for length in prefill_lengths:
        if on_step:
            on_step(f"prefill {length}")
        times = []
        for _ in range(repeats):
            runner.start([0])
            feed = ids(length)
            times.append(_timed(lambda feed=feed: runner.forward(feed, keep=1), lm.device))
        prefill.append(statistics.median(times))
    curve = CostCurve(list(sizes), list(contexts), ms, list(prefill_lengths), prefill)
    curve.step_factor = _plain_step_factor(runner, curve, ids, repeats, lm.device, limit)
    return curve


def _plain_step_factor(
    runner: CachedModel,
    curve: CostCurve,
    ids,
    repeats: int,
    device,
    limit,
    prompt: int = 128,
    steps: int = 16,
) -> float:
    """Time a short real plain decode (argmax, one token a pass) against the curve's prediction."""
    if limit is not None:
        prompt = max(min(prompt, limit - steps - 1), 1)
    ratios = []
    for _ in range(max(repeats, 2)):
        runner.start([0])
        last = argmax_rows(runner.forward(ids(prompt), keep=1)[-1])[0]

        def decode(last: int = last) -> None:
            for _ in range(steps):  # the token picked as the decode loop picks it
                last = argmax_rows(runner.forward([last], keep=1)[-1])[0]

        elapsed = _timed(decode, device)
        predicted = sum(curve.forward_ms(1, prompt + i) for i in range(steps))
        if predicted > 0:
            ratios.append(elapsed / predicted)
    return statistics.median(ratios) if ratios else 1.0


# A cached profile is measured again when a short plain decode now takes more than this factor
# more or less time than it predicts: it was measured under another load. (A first run of the
# README's command beside a busy job kept such a profile until `draftlab profile --refresh`, and
# its curve priced five methods out of every later default run.)
SPOT_BAND = 1.3


def spot_ratio(lm: LoadedModel, curve: CostCurve, repeats: int = 3) -> float:
    """A plain decode of 8 tokens after a 64-token prompt, timed now, over the curve's prediction
    (its step factor included): about half a second for the default target."""
    runner = cached(lm)
    ids = _random_ids(lm, seed=1)
    runner.start([0])
    runner.forward(ids(16), keep=1)  # the first pass of a process pays for kernel set-up
    factor = _plain_step_factor(runner, curve, ids, repeats, lm.device, lm.context_length, prompt=64, steps=8)
    return factor / (curve.step_factor or 1.0)


def spot_checks_on() -> bool:
    """$DRAFTLAB_SPOT_CHECK=0 turns spot checks off (the test suite does, for its tiny models)."""
    return os.environ.get("DRAFTLAB_SPOT_CHECK", "1") != "0"


def hand_written(profile: Profile) -> bool:
    """A profile that took no time to measure was written, not measured (tests pin decisions with
    such curves, and so can a user): it is used as it is, never spot-checked."""
    return profile.seconds <= 0


def off_band(ratio: float) -> bool:
    return not 1 / SPOT_BAND <= ratio <= SPOT_BAND


def profile_dir() -> Path:
    """$DRAFTLAB_PROFILE_DIR, else profiles/ under the draftlab home."""
    from draftlab.models.cache import home

    env = os.environ.get("DRAFTLAB_PROFILE_DIR")
    return Path(env).expanduser() if env else home() / "profiles"


def profile_path(lm: LoadedModel, compiled: bool = False) -> Path:
    fp = lm.fingerprint(compiled)
    slug = "".join(ch if ch.isalnum() or ch in "-." else "_" for ch in Path(lm.spec.name).name)
    kind = "-compiled" if compiled else ""
    return profile_dir() / f"{slug}-{lm.spec.dtype}{kind}-{fingerprint_key(fp)}.json"


def find_cached(name: str, dtype: str, device: str = "cpu") -> Profile | None:
    """The newest cached profile of a model in a dtype on this machine's hardware, whatever library
    versions measured it: for predictions beside another engine, which loads no weights of ours."""
    want = hardware(device)
    found: list[Profile] = []
    for path in profile_dir().glob("*.json"):
        try:
            profile = Profile.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError, KeyError):
            continue
        fp = profile.fingerprint
        same = fp.get("model") == name and fp.get("dtype") == dtype and fp.get("hardware") == want
        if same and not fp.get("compiled"):
            found.append(profile)
    return max(found, key=lambda p: p.measured_at) if found else None


def load_cached(lm: LoadedModel, compiled: bool = False) -> Profile | None:
    """The cached profile for this model on this machine, or None if absent, stale or foreign."""
    path = profile_path(lm, compiled)
    try:
        profile = Profile.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return profile if profile.fingerprint == lm.fingerprint(compiled) else None


def save(lm: LoadedModel, profile: Profile) -> Path:
    path = profile_path(lm, bool(profile.fingerprint.get("compiled")))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, profile.to_json())
    return path


def load_or_measure(
    lm: LoadedModel,
    *,
    quick: bool = True,
    refresh: bool = False,
    repeats: int = 3,
    on_step: Callable[[str], None] | None = None,
    compiled: bool = False,
    bucket_need: int = 0,
) -> tuple[Profile, bool]:
    """The model's profile on this machine, and whether it was measured now (False: from the cache).

    `compiled`: the curve of the target's compiled passes (the pass sizes that are compiled, at
    COMPILED_CONTEXTS), for sizing `--compile` runs."""
    if not refresh:
        cached = load_cached(lm, compiled)
        if cached is not None and (quick or compiled or max(cached.curve.sizes) >= max(FULL_SIZES)):
            return cached, False
    t0 = time.perf_counter()
    sizes, contexts, lengths = profile_points(lm.context_length, quick, compiled)
    curve = measure(
        lm,
        sizes,
        contexts,
        lengths,
        repeats=repeats,
        on_step=on_step,
        compiled=compiled,
        bucket_need=bucket_need,
        far_context=compiled,
    )
    profile = Profile(
        lm.fingerprint(compiled),
        curve,
        repeats,
        time.perf_counter() - t0,
        time.strftime("%Y-%m-%dT%H:%M:%S"),
    )
    try:
        save(lm, profile)
    except OSError as exc:  # a read-only draftlab home: use what was measured, say it is not kept
        Console(stderr=True).print(
            f"[yellow]warning:[/yellow] the cost profile could not be cached in {profile_dir()} "
            f"({exc.strerror or exc}); it is measured again next run",
            highlight=False,
        )
    return profile, True
