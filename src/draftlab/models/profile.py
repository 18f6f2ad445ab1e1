"""What a forward pass costs on the machine at hand: ms per pass of N new tokens at a context length.

Whether speculation pays depends on how the cost of one pass grows with the number of tokens it
scores. With native bfloat16 (AMX, or any GPU) scoring 8 tokens costs about as much as scoring 1;
with emulated bfloat16 on an AVX2-only CPU it costs about 8 times as much. So the cost is
measured, once per machine, model, dtype and software version, and cached under the draftlab home.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from draftlab.files import write_text
from draftlab.models.cached import CachedModel, cached
from draftlab.models.loading import LoadedModel

PROFILE_SCHEMA = 4
# The ISA features that decide how a CPU multiplies bfloat16 / float16 matrices.
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_fp16")
# Environment variables that change which kernels torch picks (and so what a pass costs).
KERNEL_ENV = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS", "MKL_NUM_THREADS")

FULL_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 128)
QUICK_SIZES = (1, 2, 3, 4, 6, 8, 12, 16)


def _cpu_model_and_flags() -> tuple[str, str, list[str]]:
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


def hardware(device: torch.device | str) -> dict:
    """The processor a model runs on, with what decides its speed."""
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        return {
            "kind": "cuda",
            "name": props.name,
            "capability": f"{props.major}.{props.minor}",
            "memory_gib": round(props.total_memory / 2**30, 1),
            "bf16": bool(torch.cuda.is_bf16_supported()),
        }
    name, cpu_id, flags = _cpu_model_and_flags()
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


def supported_dtypes(device: torch.device | str) -> list[str]:
    """The dtypes worth trying on a device: float16 on a CPU only where it has native fp16 units."""
    hw = hardware(device)
    if hw["kind"] == "cuda":
        return ["float16", "bfloat16", "float32"] if hw["bf16"] else ["float16", "float32"]
    dtypes = ["float32", "bfloat16"]
    if {"avx512_fp16", "amx_fp16"} & set(hw["isa_flags"]):
        dtypes.append("float16")
    return dtypes


def fingerprint(lm: LoadedModel, compiled: bool = False) -> dict:
    """Everything a cost curve depends on: a profile with another fingerprint is re-measured.

    `compiled`: the target's passes through its compiled package (models/compiled.py), a curve of its own."""
    from draftlab.models.llamacpp import runs_on_llamacpp  # noqa: PLC0415

    if runs_on_llamacpp(lm):
        return _llamacpp_fingerprint(lm)
    import transformers

    extra = {"compiled": True} if compiled else {}
    return {
        **extra,
        "model": lm.spec.name,
        "path": lm.path,
        "parameters": lm.num_parameters,
        "dtype": lm.spec.dtype,
        "attn_implementation": lm.model.config._attn_implementation,
        "hardware": hardware(lm.device),
        "threads": torch.get_num_threads(),
        "kernel_env": {k: os.environ[k] for k in KERNEL_ENV if k in os.environ},
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "schema": PROFILE_SCHEMA,
    }


def _llamacpp_fingerprint(lm) -> dict:
    """A GGUF run by llama.cpp: its quantization stands as the dtype, llama.cpp's threads as torch's."""
    import llama_cpp  # noqa: PLC0415

    return {
        "model": lm.spec.name,
        "path": lm.path,
        "parameters": lm.num_parameters,
        "dtype": lm.spec.dtype,
        "engine": "llamacpp",
        "hardware": hardware("cpu"),
        "threads": lm.threads,
        "kernel_env": {k: os.environ[k] for k in KERNEL_ENV if k in os.environ},
        "llama_cpp": llama_cpp.__version__,
        "schema": PROFILE_SCHEMA,
    }


def fingerprint_key(fp: dict) -> str:
    return hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:16]


def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear through the points, extended linearly past both ends (never below 0)."""
    if len(xs) == 1:
        return ys[0]
    i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    if x < x0 and i == 1:
        # Below the first point: hold the value rather than extrapolate a pass to zero cost.
        return y0
    if x > x1 and y1 <= y0:
        # Past the last point a cost never falls: noise between the last two points must not
        # extrapolate toward zero.
        return y1
    return max(y0 + (y1 - y0) * (x - x0) / (x1 - x0), 0.0)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def _ascending(xs) -> bool:
    return (
        isinstance(xs, list)
        and all(isinstance(x, int) and not isinstance(x, bool) for x in xs)
        and all(a < b for a, b in zip(xs, xs[1:], strict=False))
    )


def _curve_problem(curve: CostCurve) -> str | None:
    """What makes a curve unusable (a hand-edited or damaged profile), or None."""
    if not curve.sizes or not _ascending(curve.sizes) or curve.sizes[0] < 1:
        return f"pass sizes {curve.sizes!r} are not ascending whole numbers"
    if not curve.contexts or not _ascending(curve.contexts):
        return f"contexts {curve.contexts!r} are not ascending whole numbers"
    rows = curve.ms
    if not isinstance(rows, list) or len(rows) != len(curve.contexts):
        return (
            f"{len(curve.contexts)} contexts but {len(rows) if isinstance(rows, list) else rows!r} rows of ms"
        )
    for row in rows:
        if not isinstance(row, list) or len(row) != len(curve.sizes) or not all(map(_is_number, row)):
            return f"a row of ms {row!r} is not {len(curve.sizes)} non-negative numbers"
    if not (_ascending(curve.prefill_lengths) and isinstance(curve.prefill_ms, list)):
        return "prefill lengths or times are not lists"
    if len(curve.prefill_ms) != len(curve.prefill_lengths) or not all(map(_is_number, curve.prefill_ms)):
        return f"prefill times {curve.prefill_ms!r} do not match lengths {curve.prefill_lengths!r}"
    if not _is_number(curve.step_factor) or curve.step_factor <= 0:
        return f"step factor {curve.step_factor!r} is not a positive number"
    return None


@dataclass
class CostCurve:
    """ms per forward pass of `sizes[j]` new tokens on a cache of `contexts[i]` tokens, plus prefill."""

    sizes: list[int]
    contexts: list[int]
    ms: list[list[float]]  # [context][size], medians
    prefill_lengths: list[int] = field(default_factory=list)
    prefill_ms: list[float] = field(default_factory=list)
    # Measured plain decoding step / the curve's 1-token pass at the same context: what a real
    # decode step adds (sampling the token, growing the cache) on this machine and dtype.
    step_factor: float = 1.0

    def __post_init__(self) -> None:
        problem = _curve_problem(self)
        if problem:
            raise ValueError(f"not a cost curve: {problem}")
        # Sizers ask for several pass sizes at every round's context; interpolating each anew cost
        # about 40 µs a round, 1% of a llama.cpp step. Not a field: profiles are saved without it.
        self._memo: dict[tuple[int, int], float] = {}

    def forward_ms(self, n: int, context: int) -> float:
        """One pass scoring `n` new tokens after `context` cached ones, interpolated."""
        key = (n, context)
        ms = self._memo.get(key)
        if ms is None:
            if len(self._memo) > 65536:
                self._memo.clear()
            per_context = [_interp(self.sizes, row, n) for row in self.ms]
            ms = self._memo[key] = _interp(self.contexts, per_context, context)
        return ms

    def prefill(self, length: int) -> float:
        if not self.prefill_lengths:
            return self.forward_ms(length, 0)
        return _interp(self.prefill_lengths, self.prefill_ms, length)

    def plain_decoding_ms(self, prompt: int, new_tokens: int) -> float:
        """Predicted time of plain decoding: the prefill, then one pass per token."""
        middle = prompt + new_tokens // 2
        return self.prefill(prompt) + (new_tokens - 1) * self.forward_ms(1, middle) * self.step_factor


@dataclass
class Profile:
    fingerprint: dict
    curve: CostCurve
    repeats: int
    seconds: float  # how long measuring took
    measured_at: str

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_dict(cls, data: dict) -> Profile:
        """A saved profile; ValueError or TypeError for one whose values cannot be a profile (it is
        then measured again, as a truncated one is)."""
        profile = cls(**{**data, "curve": CostCurve(**data["curve"])})
        if not isinstance(profile.fingerprint, dict) or not isinstance(profile.measured_at, str):
            raise ValueError("not a profile: its fingerprint or its date has the wrong type")
        return profile


# Plain decoding predicted within this share of the fastest counts as a tie. On a 2-core Xeon with
# AMX the profile predicted float16 7% faster than bfloat16 (2.18 vs 2.34 s), while whole plain
# generations measured in one interleaved bench differed by 1% (26.6 vs 26.5 tok/s).
TIE_BAND = 0.10


def verify_slope(curve: CostCurve, k: int = 4, context: int = 256) -> float:
    """What verifying k drafts costs relative to a plain step: 1 is free speculation."""
    return curve.forward_ms(k + 1, context) / curve.forward_ms(1, context)


def pick_dtype(curves: dict[str, CostCurve], prompt_tokens: int, new_tokens: int) -> tuple[str, dict]:
    """The dtype of the fastest predicted plain decoding, and every candidate's prediction in ms.

    Among dtypes tied with the fastest (within TIE_BAND), the one whose multi-token pass is
    cheapest wins: plain decoding costs the same in each, and speculation gains most there.
    """
    predicted = {dtype: curve.plain_decoding_ms(prompt_tokens, new_tokens) for dtype, curve in curves.items()}
    fastest = min(predicted.values())
    tied = [d for d, ms in predicted.items() if ms <= fastest * (1 + TIE_BAND)]
    return min(tied, key=lambda d: (verify_slope(curves[d]), predicted[d])), predicted


def default_contexts(limit: int | None, quick: bool) -> list[int]:
    top = min(limit or 2048, 2048 if quick else 1 << 30)
    points = [64, 256, 1024, 2048] if quick else [64, 256, 1024, 2048, 4096, 8192, 16384, 32768]
    out = [c for c in points if c + 128 <= top]
    return out or [max(min(top - 130, 64), 1)]


# Contexts of a compiled profile: both in the first static-cache bucket (512 tokens), where the
# default suite's generations run. Its graphs attend over the whole bucket, so within a bucket the
# cost hardly moves with the context; a longer context's bucket would cost another package (about
# 1.5 min to build on 2 cores), and past 256 the curve extends the line through the two points.
COMPILED_CONTEXTS = (64, 256)


def profile_points(
    limit: int | None, quick: bool, compiled: bool
) -> tuple[tuple[int, ...], list[int], list[int]]:
    """(pass sizes, contexts, prefill lengths) a profile measures. Compiled: the compiled pass
    sizes at COMPILED_CONTEXTS, prefills up to 256 (they run eagerly over the static cache)."""
    if compiled:
        from draftlab.models.compiled import PASS_SIZES  # noqa: PLC0415

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
) -> CostCurve:
    """Median ms of `repeats` passes for every (context, size), interleaved so drift spreads evenly.

    `compiled`: through the compiled package over a static cache, made ready before it is timed."""
    runner = cached(lm, compiled=compiled)
    limit = lm.context_length
    contexts = list(contexts) if contexts is not None else default_contexts(limit, quick=True)
    if limit is not None:
        contexts = [c for c in contexts if c + max(sizes) <= limit] or [max(limit - max(sizes) - 1, 1)]
    prefill_lengths = list(prefill_lengths) if prefill_lengths is not None else [16, 64, 256, 1024]
    if limit is not None:
        prefill_lengths = [p for p in prefill_lengths if p <= limit] or [min(16, limit)]
    ids = _random_ids(lm, seed=0)
    start_ids = runner.start([0])
    ms: list[list[float]] = []
    for context in contexts:
        if on_step:
            on_step(f"context {context}")
        if compiled:
            runner.warm(context + max(sizes) + 1, tuple(sizes))
        runner.start([0])
        runner.forward((start_ids + ids(context))[:context], keep=1)
        _timed(lambda: runner.forward(ids(max(sizes)), keep=max(sizes)), lm.device)  # warm-up
        runner.crop(context)
        samples: dict[int, list[float]] = {n: [] for n in sizes}
        for _ in range(repeats):
            for n in sizes:
                feed = ids(n)
                samples[n].append(_timed(lambda feed=feed, n=n: runner.forward(feed, keep=n), lm.device))
                runner.crop(context)
        ms.append([statistics.median(samples[n]) for n in sizes])
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
        last = int(runner.forward(ids(prompt), keep=1)[-1].argmax())

        def decode(last: int = last) -> None:
            for _ in range(steps):
                last = int(runner.forward([last], keep=1)[-1].argmax())

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
    fp = fingerprint(lm, compiled)
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
    return profile if profile.fingerprint == fingerprint(lm, compiled) else None


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
    curve = measure(lm, sizes, contexts, lengths, repeats=repeats, on_step=on_step, compiled=compiled)
    profile = Profile(
        fingerprint(lm, compiled),
        curve,
        repeats,
        time.perf_counter() - t0,
        time.strftime("%Y-%m-%dT%H:%M:%S"),
    )
    try:
        save(lm, profile)
    except OSError as exc:  # a read-only draftlab home: use what was measured, say it is not kept
        from rich.console import Console  # noqa: PLC0415

        Console(stderr=True).print(
            f"[yellow]warning:[/yellow] the cost profile could not be cached in {profile_dir()} "
            f"({exc.strerror or exc}); it is measured again next run",
            highlight=False,
        )
    return profile, True
