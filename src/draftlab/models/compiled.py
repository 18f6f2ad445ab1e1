"""Compiled passes of up to 8 tokens over transformers' `StaticCache`: AOTInductor packages, built
once per machine, model and cache length, and loaded by every later run.

Plain decoding on a CPU spends most of a step launching small batch-1 matrix products one by one
(issue 22: 211 products of about 158 µs each, per step); inductor's CPU GEMM templates over frozen
weights replace them. The target's forward over a static cache is exported with `torch.export`
(the pass length dynamic, 1 to MAX_PASS tokens; the cache's key, value and length tensors passed in
and updated in place; positions and an additive 4-D mask over the whole bucket passed in too, so one
package verifies chains and token trees alike) and compiled by `aoti_compile_and_package` with freezing and max-autotune.
The package lands in `compiled/` under the draftlab home, named by the model's fingerprint (the
profile's, plus its weight files), so a second process loads it (about 1 s) instead of compiling
again: torch.compile had to, since with frozen weights it bypasses its own caches (docs/engines.md).

Static caches come in buckets of length (512, 1024, 2048, ... tokens): one package per bucket.
Prompts run eagerly over the same cache; rollback is the cache's `crop`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import torch
from filelock import FileLock
from torch.utils import _pytree as pytree
from transformers import StaticCache

from draftlab.errors import DraftlabError, first_line
from draftlab.hardware import fingerprint_key
from draftlab.models import kernels
from draftlab.models.attention import attending_in_windows, read_window, window, windows
from draftlab.models.cache import home
from draftlab.models.loading import LoadedModel
from draftlab.quiet import quiet_stderr

# inductor's "max-autotune-no-cudagraphs" mode, with frozen (constant-folded, prepacked) weights.
# Its autotuning tables stay off the terminal (a build's stderr would be pages of them).
INDUCTOR_CONFIGS = {
    "freezing": True,
    "max_autotune": True,
    "coordinate_descent_tuning": True,
    "max_autotune_report_choices_stats": False,
    "autotune_num_choices_displayed": 0,
}
# In bfloat16 and float16, freezing alone: on an AMD Zen5 with avx512_bf16 max-autotune's GEMM
# templates made the decode step slower (22.0-23.0 ms against 18.4-19.3, docs/results.md) and the
# build twice as long (1 min 57 s against 59 s).
HALF_INDUCTOR_CONFIGS = {"freezing": True}
# 4-bit layers call draftlab's own kernel (models/kernels), so a 4-bit package's only GEMM left is the
# bfloat16 output head: freezing alone, as in bfloat16. (Before that kernel, max-autotune picked
# inductor's WOQ int4 template over aten's int4 kernel: 4.9 / 9.7 ms against 10.2 / 22.8 ms for 30
# layers' passes of 1 / 8 tokens on a Sapphire Rapids.)
AUTOTUNED_DTYPES = ("float32",)


def autotuning() -> bool:
    """$DRAFTLAB_AUTOTUNE=0 builds float32 packages with freezing alone: on a 2-core AMD EPYC Zen3
    stories260K's package took 34 s against 90 s, and its passes 1.0 ms against 0.4 (the test suite
    builds so, its autotuned builds aside; docs/development.md)."""
    return os.environ.get("DRAFTLAB_AUTOTUNE", "1") != "0"


def inductor_configs(dtype: str) -> dict:
    # A copy: aoti_compile_and_package adds its own keys to the dict it is given, and a package's
    # name is made from these settings.
    tuned = dtype in AUTOTUNED_DTYPES and autotuning()
    return dict(INDUCTOR_CONFIGS if tuned else HALF_INDUCTOR_CONFIGS)


FIRST_BUCKET = 512
# The longest pass a package runs; longer ones (prompts) run eagerly.
MAX_PASS = 8
# The passes warmed and profiled. On an AMD Zen5 in float32 the one package per bucket took 16.4,
# 16.5, 17.7, 18.2, 22.4 and 28.8 ms for passes of 1, 2, 3, 4, 5 and 8 tokens (eager: 40.5 for 1).
PASS_SIZES = (1, 2, 4, 8)
# torch.export specialises a dimension whose example size is 0 or 1: the example pass is longer.
EXAMPLE_PASS = 4
# A one-token chain pass runs as a two-token one (the token twice, the copy dropped) where that is
# at least this much faster: in bfloat16 on an AMD Zen5 a frozen package's 1-token pass took 17.8
# ms and its 2-token pass 13.5 ms (oneDNN's kernels for one row lose to those for two).
PAD_GAIN = 0.9
# Room a static cache needs beyond the tokens it holds: one more pass. A generation starts in the
# loaded package's bucket where its prompt fits (runs warm the bucket of their longest generation,
# prompt plus answer), and grows into a longer bucket only if it outgrows that. (It reserved 256
# tokens beyond the prompt before; the default suite's longest prompt then asked for a 2048-token
# bucket, whose passes attend over twice the cache of the 1024 that holds its answer.)
RESERVE = MAX_PASS + 1
# 2: positions and a 4-D mask over the bucket are inputs (token trees). 3: and the window's length
# (models/attention.py). 4: half-precision attention over an even number of query rows. 5: 4-bit
# layers through draftlab's integer kernel. 6: 4-bit matrices that read one input in one call. 7:
# draftlab's kernels called through their C entry points, not the proxy executor. 8: each row's
# argmax as a second output. 9: logits and argmax without the batch dimension.
PACKAGE_SCHEMA = 9


def static_length(needed: int, limit: int | None = None) -> int:
    """The bucket that holds `needed` tokens: 512 doubled as often as needed, capped at `limit`."""
    length = FIRST_BUCKET
    while length < needed:
        length *= 2
    return min(length, limit) if limit else length


class StaticStep(torch.nn.Module):
    """A pass over a static cache whose tensors come in as arguments: (logits [n, V], argmax [n],
    *hidden states). Each row's argmax is made inside the pass: greedy verification then reads a
    few ids instead of the logits, which right after a pass took 90-140 us to widen and read for
    one row of 49,152 bfloat16 logits on the Zen5, 12 us a moment later (docs/results.md). The
    logits come without the batch dimension, so the usual pass, all of whose rows are kept, hands
    them on as they are (a view costs tens of microseconds right after a pass).

    Masked, `positions` [1, n] and the additive `mask` [1, 1, n, bucket] come in too: a chain's
    are causal, a token tree's let each node see the sequence and its own ancestors only
    (transformers takes a 4-D mask as it is). A model whose attention cannot take a custom mask
    (Bloom's ALiBi reads its positions from a 2-D one) is exported unmasked, for chains."""

    def __init__(self, model: torch.nn.Module, length: int) -> None:
        super().__init__()
        self.model = model
        self.length = length

    def forward(
        self, input_ids, lengths: list, keys: list, values: list, positions=None, mask=None, window=None
    ):
        cache = StaticCache(config=self.model.config, max_cache_len=self.length)
        for layer, k, v, n in zip(cache.layers, keys, values, lengths, strict=True):
            layer.keys, layer.values, layer.cumulative_length = k, v, n
            layer.device = k.device
            layer.batch_size, layer.num_heads = k.shape[:2]
            layer.k_head_dim, layer.v_head_dim = k.shape[-1], v.shape[-1]
            layer.is_initialized = True
        slots = read_window(window, self.length)
        extra = {} if slots is None else {"slots": slots}
        out = self.model(
            input_ids=input_ids,
            position_ids=positions,
            attention_mask=mask,
            cache=cache,
            use_cache=True,
            output_hidden_states=True,
            **extra,
        )
        logits = out.logits[0]
        return (logits, logits.argmax(-1), *out.hidden_states)


def compiled_dir() -> Path:
    """$DRAFTLAB_COMPILED_DIR, else compiled/ under the draftlab home."""

    env = os.environ.get("DRAFTLAB_COMPILED_DIR")
    return Path(env).expanduser() if env else home() / "compiled"


def weights_stamp(path: str) -> list:
    """What a package's weights depend on beyond the model's name: its weight files' sizes and times."""
    folder = Path(path)
    if not folder.is_dir():
        return [path]
    files = sorted(p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin", ".json"))
    return [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]


def package_path(lm: LoadedModel, length: int, masked: bool = True) -> Path:
    fp = {**lm.fingerprint(compiled=True), "weights": weights_stamp(lm.path), "package": PACKAGE_SCHEMA}
    fp["inductor"] = inductor_configs(lm.spec.dtype)
    if not masked:
        fp["masked"] = False
    elif not windows(lm.model):
        fp["window"] = False
    slug = "".join(ch if ch.isalnum() or ch in "-." else "_" for ch in Path(lm.spec.name).name)
    return compiled_dir() / f"{slug}-{lm.spec.dtype}-{fingerprint_key(fp)}" / f"{length}.pt2"


@dataclass
class CompiledSteps:
    """One model's compiled passes, shared by every cache-aware wrapper of that model."""

    lm: LoadedModel
    # Whether passes take positions and a 4-D mask (token trees): the model's attention honours a
    # custom mask (CachedModel.supports_trees, checked eagerly when the first wrapper is made).
    masked: bool = True
    # cache length -> seconds to get its package ready: export and compile, or load from disk
    compile_seconds: dict[int, float] = field(default_factory=dict)
    loaded: dict[int, bool] = field(default_factory=dict)  # cache length -> built by an earlier run
    calls: int = 0  # passes run through a package
    run_s: float = 0.0  # Σ s inside the package's runner: the pass itself, without its inputs' making
    # Whether one-token chain passes run padded to two (`pads`), decided by timing both when the
    # first package is warmed (None: not yet); the medians timed, ms.
    pad_single: bool | None = None
    single_ms: dict[str, float] = field(default_factory=dict)
    caches: dict[int, StaticCache] = field(default_factory=dict)
    runners: dict[int, object] = field(default_factory=dict)
    # Static-cache passes run by `StaticStep` uncompiled (exact mode without --compile: a static
    # cache's passes attend over the same bucket whatever their length).
    eager: bool = False
    # Exact mode (models/exact.py), measured per bucket (each its own package and attention length):
    # the pass width under which passes of every length score as one-token ones (None: none is).
    exact_widths: dict[int, int | None] = field(default_factory=dict)
    # The widths to try, preferred first (decode/cost.py `exact_width_order`, from the cost curve).
    exact_order: tuple[int, ...] = (MAX_PASS,)

    @property
    def model(self) -> torch.nn.Module:
        return self.lm.model

    @property
    def limit(self) -> int | None:
        return getattr(self.model.config, "max_position_embeddings", None)

    @torch.inference_mode()  # the cache's tensors are made, and emptied, under inference mode
    def new_cache(self, needed: int) -> StaticCache:
        """The static cache of the bucket that holds `needed` tokens, emptied: its length goes to
        0, and older keys past the length are masked by causality until overwritten, as after
        `crop` (one cache per bucket for the model's life, so a generation allocates nothing)."""
        length = self.bucket(needed)
        cache = self.caches.get(length)
        if cache is None:
            cache = self.caches[length] = StaticCache(config=self.model.config, max_cache_len=length)
        for layer in cache.layers:
            if layer.is_initialized:
                layer.cumulative_length.zero_()
        return cache

    def bucket(self, needed: int) -> int:
        """The static-cache length a generation needing `needed` tokens runs in. One package per
        model serves every shorter context too: the loaded one where it holds them, else the
        shortest one on disk that does, else the bucket `static_length` gives. A pass attends over
        its whole bucket, so a longer one costs more: the default target's plain decoding of a
        256-token prompt took 1.10x (bfloat16) and 1.13x (float32) as long in a 1024-token bucket
        as in a 512 one (docs/results.md), against a second build (1-5 min) and a second package in
        memory on the first run (issue 46)."""
        on_disk = functools.partial(packages_on_disk, self.lm, self.masked)
        return choose_bucket(needed, self.runners, on_disk, self.limit)

    def grown(self, cache: StaticCache, needed: int) -> StaticCache:
        """A bigger static cache holding what `cache` holds (a generation outgrew its bucket)."""
        bigger = self.new_cache(needed)
        for old, new in zip(cache.layers, bigger.layers, strict=True):
            if not old.is_initialized:
                continue
            if not new.is_initialized:
                new.lazy_initialization(old.keys, old.values)
            n = int(old.cumulative_length)
            new.keys[:, :, :n].copy_(old.keys[:, :, :n])
            new.values[:, :, :n].copy_(old.values[:, :, :n])
            new.cumulative_length.fill_(n)
        return bigger

    def __call__(
        self,
        cache: StaticCache,
        input_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        pad_to: int | None = None,
        whole: bool | None = None,
    ) -> SimpleNamespace:
        """A pass of up to MAX_PASS tokens; the cache's layers must hold keys already (a prompt
        ran eagerly over it first). Without `positions` and `mask`, a chain's (else a mask over the
        whole bucket). `pad_to`: a shorter pass runs as one of that many rows (exact mode,
        models/exact.py), whose attention spans the `whole` bucket (by default where padded so)."""
        n = input_ids.shape[1]
        whole = pad_to is not None if whole is None else whole
        if pad_to is None:  # exact mode gives its own; else a one-token pass runs as two where faster
            pad_to = 2 if n == 1 and positions is None and self.pad_single else 1
        if n < pad_to:
            return self._padded(cache, input_ids, positions, mask, pad_to, whole)
        runner = self.runner(cache)
        masks = self._mask_args(cache, n, positions, mask, whole)
        args = (input_ids, *_cache_args(cache), *masks)
        t0 = time.perf_counter()
        out = runner(*args)
        self.run_s += time.perf_counter() - t0
        self.calls += 1
        return SimpleNamespace(logits=out[0], argmax=out[1], hidden_states=tuple(out[2:]))

    def _padded(self, cache, input_ids, positions, mask, rows: int, whole: bool) -> SimpleNamespace:
        """The pass as one of `rows` rows: the last token repeated after the real ones, as a chain
        (each copy sees every earlier slot), so no real row can see a copy; their slots are given
        back at once."""
        n = input_ids.shape[1]
        chain_positions, chain_mask = chain_inputs(cache, rows, self.dtype)
        if positions is not None and mask is not None:
            positions = torch.cat([positions, chain_positions[:, n:]], dim=1)
            mask = torch.cat([mask, chain_mask[:, :, n:]], dim=2)
        elif self.masked:
            positions, mask = chain_positions, chain_mask
        ids = torch.cat([input_ids, input_ids[:, -1:].repeat(1, rows - n)], dim=1)
        out = self(cache, ids, positions, mask, whole=whole)
        for layer in cache.layers:
            layer.cumulative_length.sub_(rows - n)
        return SimpleNamespace(
            logits=out.logits[:n],
            argmax=out.argmax[:n],
            hidden_states=tuple(h[:, :n] for h in out.hidden_states),
        )

    def runner(self, cache: StaticCache):
        length = capacity(cache)
        runner = self.runners.get(length)
        if runner is None and self.eager:
            keep_longest(self.runners, self.caches, length)
            runner = self.runners[length] = StaticStep(self.model, length)
        if runner is None:
            t0 = time.perf_counter()
            path = package_path(self.lm, length, self.masked)
            if self.lm.storage:  # a 4-bit model's package calls draftlab's kernels by their C names
                kernels.load()
            runner, self.loaded[length] = ready_package(path, lambda p: self._build(cache, p))
            self._check_one_token(runner, cache)
            # At most one package of a model resident: a longer bucket's serves every shorter one.
            keep_longest(self.runners, self.caches, length)
            self.runners[length] = runner
            self.compile_seconds[length] = time.perf_counter() - t0
        return runner

    @torch.inference_mode()
    def _check_one_token(self, runner, cache: StaticCache) -> None:
        """Refuse an exported pass (or a package) that cannot take one token (on copies of the
        cache's tensors): OPT's export assumes passes of 2 tokens or more, and its positions do
        not export at 1."""
        lengths, keys, values = ([t.clone() for t in group] for group in _cache_args(cache))
        ids = torch.zeros((1, 1), dtype=torch.long, device=self.lm.device)
        try:
            with quiet_stderr():  # the package's C++ check prints its own "Error:" line
                runner(ids, lengths, keys, values, *self._mask_args(cache, 1))
        except RuntimeError as error:
            raise DraftlabError(
                f"--compile cannot run '{self.lm.spec.name}': its one-token pass does not export "
                f"({first_line(error)}); decode it without --compile"
            ) from None

    def _mask_args(
        self,
        cache: StaticCache,
        n: int,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        whole: bool = False,
    ) -> tuple:
        """The package's positions and mask for a pass of n tokens (a chain's unless given), and
        the length of its window of the bucket (the `whole` bucket's where asked)."""
        if not self.masked:
            return ()
        past = int(cache.layers[0].get_seq_length())  # read once: each read is a torch call
        if positions is None or mask is None:
            positions, mask = chain_inputs(cache, n, self.dtype, past)
        if not self.windowed:
            return positions, mask
        length = capacity(cache)
        slots = length if whole else window(past, n, length)
        return positions, mask, _slots_tensor(slots)

    @property
    def windowed(self) -> bool:
        """Whether this model's packages attend over a window (masked passes only)."""
        return self.masked and not self.eager and self._attends_in_windows

    @functools.cached_property
    def _attends_in_windows(self) -> bool:
        # Read once: transformers' config lookups cost tens of µs a pass, of a 6 ms pass.
        return windows(self.model)

    @functools.cached_property
    def dtype(self) -> torch.dtype:
        """The model's dtype (its property walks the parameters on every call)."""
        return self.model.dtype

    def _build(self, cache: StaticCache, path: Path) -> None:
        """Export the pass over this cache's shapes and compile it into a package at `path`."""
        layers = cache.layers
        # Outside inference mode: export traces with ordinary tensors (clones of the cache's).
        with torch.inference_mode(False), torch.no_grad():
            ids = torch.zeros((1, EXAMPLE_PASS), dtype=torch.long, device=self.lm.device)
            example = (
                ids,
                [layer.cumulative_length.clone() for layer in layers],
                [layer.keys.clone() for layer in layers],
                [layer.values.clone() for layer in layers],
                # Fresh, contiguous copies: the mask may be a view of a cached table (chain_inputs).
                *(t.clone() for t in self._mask_args(cache, EXAMPLE_PASS)),
            )
            fixed = [None] * len(layers)
            tokens = torch.export.Dim("tokens", min=1, max=MAX_PASS)
            shapes = {"input_ids": {1: tokens}, "lengths": fixed, "keys": fixed, "values": fixed}
            shapes |= {"positions": {1: tokens}, "mask": {2: tokens}} if self.masked else {}
            shapes |= {"window": None} if self.windowed else {}
            try:
                step = StaticStep(self.model, capacity(cache))
                with attending_in_windows(self.model) if self.windowed else contextlib.nullcontext():
                    program = torch.export.export(step, example, dynamic_shapes=shapes, strict=False)
            except Exception as error:  # noqa: BLE001 - torch.export raises many kinds
                raise DraftlabError(
                    f"--compile cannot export '{self.lm.spec.name}' ({first_line(error)}); "
                    "decode it without --compile"
                ) from None
        # The exported graph runs eagerly in about a second: a pass it cannot take is found before
        # inductor spends a minute compiling and autotuning it.
        self._check_one_token(program.module(), cache)
        write_package(program, path, self.lm.spec.dtype)
        (path.parent / "model.json").write_text(
            json.dumps({"model": self.lm.spec.name, "path": self.lm.path})
        )


def packages_on_disk(lm: LoadedModel, masked: bool = True) -> list[int]:
    """The static-cache lengths whose packages of this model an earlier run built here."""
    return package_lengths(package_path(lm, FIRST_BUCKET, masked).parent)


def package_lengths(folder: Path) -> list[int]:
    return sorted(int(p.stem) for p in folder.glob("*.pt2") if p.stem.isdigit())


def choose_bucket(needed: int, loaded, on_disk, limit: int | None) -> int:
    """A package loaded in this process that holds `needed` tokens, else the shortest built one
    that does, else the bucket `static_length` gives (a new build). `on_disk`: the built lengths,
    or a function giving them, called only where no loaded package fits (listing them reads the
    model's fingerprint: 7 ms at the start of every generation of the 4-bit target on a Zen4)."""
    fits = [n for n in loaded if n >= needed]
    if not fits:
        built = on_disk() if callable(on_disk) else on_disk
        fits = [n for n in built if n >= needed]
    return min(fits) if fits else static_length(needed, limit)


def keep_longest(runners: dict, caches: dict, length: int) -> None:
    """Drop the packages (and caches) shorter than `length`, whose runner has just been loaded."""
    for shorter in [n for n in runners if n < length]:
        del runners[shorter]
        caches.pop(shorter, None)


def ready_package(path: Path, build) -> tuple[object, bool]:
    """(the package at `path`, loaded; whether an earlier run had built it). `build(path)` makes it
    first where it is absent. Another process (a second run, a test worker) may be building the
    same package: wait for it and load its package rather than compile it again."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path.with_suffix(".lock"))):
        earlier = path.exists()
        if not earlier:
            build(path)
    return FlatRunner(torch._inductor.aoti_load_package(str(path))), earlier


class FlatRunner:
    """An AOTInductor package called with its tensors as they are.

    torch's wrapper parses the package's input and output specs (JSON strings) and walks both trees
    at every call: about 1 ms of a 27 ms one-token pass of the default target on a Xeon, whose
    outputs hold every layer's hidden states. Our passes take positional tensors, so the specs are
    read once, here, and each call hands the loader the leaves of its arguments; a flat tuple of
    outputs comes back as one without a walk."""

    def __init__(self, package) -> None:
        self.package = package
        self.loader = package.loader
        out_spec = pytree.treespec_loads(self.loader.get_call_spec()[1])
        self.out_spec = out_spec
        self.flat_out = out_spec.type is tuple and all(c.is_leaf() for c in out_spec.children())

    def __call__(self, *args):
        # The package's inputs are the leaves of (args, kwargs), and it takes no keywords; ours are
        # tensors and lists of tensors (the cache's layers), flattened here without a tree walk.
        flat = self.loader.boxed_run([t for a in args for t in (a if isinstance(a, list) else (a,))])
        return tuple(flat) if self.flat_out else pytree.tree_unflatten(flat, self.out_spec)


def write_package(program, path: Path, dtype: str) -> None:
    """Compile an exported program into a package at `path`, whole or absent (also with two
    processes at once)."""
    with torch.inference_mode(False), torch.no_grad():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.stem}.{os.getpid()}.partial.pt2")
        try:
            with warnings.catch_warnings():  # torch's own deprecation notices, not the user's
                warnings.simplefilter("ignore", UserWarning)
                shims = kernels.c_shims() if kernels.calls_kernels(program) else {}
                with torch._inductor.config.patch({"aot_inductor.custom_ops_to_c_shims": shims}):
                    torch._inductor.aoti_compile_and_package(
                        program, package_path=str(partial), inductor_configs=inductor_configs(dtype)
                    )
        except Exception as error:  # noqa: BLE001 - a missing or failing C++ compiler, among others
            partial.unlink(missing_ok=True)
            raise DraftlabError(
                f"--compile could not build a package ({type(error).__name__}: {first_line(error)[:300]}); "
                "run without --compile"
            ) from None
        os.replace(partial, path)


def _cache_args(cache: StaticCache) -> tuple[list, list, list]:
    """The cache's tensors as a package takes them. A static cache keeps its tensors for its life
    (crop and update write into them), so the lists are made once per cache."""
    made = getattr(cache, "_draftlab_args", None)
    if made is None or made[1][0] is not cache.layers[0].keys:
        layers = cache.layers
        made = (
            [layer.cumulative_length for layer in layers],
            [layer.keys for layer in layers],
            [layer.values for layer in layers],
        )
        cache._draftlab_args = made
    return made


@functools.lru_cache(maxsize=64)
def _slots_tensor(slots: int) -> torch.Tensor:
    """A window's length as the package's tensor input (read there, never written)."""
    return torch.tensor(slots)


def pads(one_ms: float, two_ms: float) -> bool:
    """Whether one-token passes should run as two-token ones, from the medians timed of each."""
    return two_ms < PAD_GAIN * one_ms


def chain_inputs(
    cache: StaticCache, n: int, dtype: torch.dtype, past: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions [1, n] and the additive mask [1, 1, n, bucket] of n chain tokens fed after the
    `past` tokens the cache holds (read from it unless given): each sees every earlier slot and
    itself. Rows of one causal table per bucket (views, contiguous, made once per place and length),
    where the table is small: building the mask took 0.6 ms of every pass, and slicing it 10-20 us."""
    past = int(cache.layers[0].get_seq_length()) if past is None else past
    device = cache.layers[0].keys.device if cache.layers[0].is_initialized else None
    length = capacity(cache)
    if length <= CAUSAL_TABLE_MAX and past + n <= length:
        return _chain_rows(length, dtype, device, past, n)
    allowed = torch.ones(n, length, dtype=torch.bool, device=device).tril(diagonal=past)
    return torch.arange(past, past + n, device=device)[None], additive(allowed, dtype)[None, None]


CAUSAL_TABLE_MAX = 2048  # slots: a table of 2048² float32 is 16 MB


@functools.lru_cache(maxsize=CAUSAL_TABLE_MAX * MAX_PASS)
def _chain_rows(
    length: int, dtype: torch.dtype, device, past: int, n: int
) -> tuple[torch.Tensor, torch.Tensor]:
    positions, table = _causal_table(length, dtype, device)
    return positions[None, past : past + n], table[None, None, past : past + n]


@functools.lru_cache(maxsize=4)
def _causal_table(length: int, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions 0..length-1 and the additive causal mask [length, length]: row r sees slots 0..r."""
    allowed = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    return torch.arange(length, device=device), additive(allowed, dtype)


def bucket_mask(mask: torch.Tensor, length: int) -> torch.Tensor:
    """A tree's additive mask [1, 1, n, past + n] widened to a bucket of `length` slots (the slots
    past the tree are masked)."""
    wide = torch.full((*mask.shape[:-1], length), torch.finfo(mask.dtype).min, dtype=mask.dtype)
    wide[..., : mask.shape[-1]] = mask
    return wide


def additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
        ~allowed, torch.finfo(dtype).min
    )


def capacity(cache: StaticCache) -> int:
    return cache.layers[0].max_cache_len


def compiled_steps(lm: LoadedModel, eager: bool = False) -> CompiledSteps:
    """The model's `CompiledSteps`, made once per model object (`eager`: its uncompiled static-cache
    passes, a second object)."""
    if eager:
        steps = getattr(lm.model, "_draftlab_static_steps", None)
        if steps is None:
            steps = lm.model._draftlab_static_steps = CompiledSteps(lm, eager=True)
        return steps
    if lm.device.type != "cpu":
        # On an H100 (torch 2.11+cu130) every CUDA package built here crashed the process as it
        # loaded, with freezing and autotuning on or off (docs/engines.md): refuse before building.
        raise DraftlabError(
            f"--compile builds CPU packages; '{lm.spec.name}' is on {lm.device.type}: "
            "decode it there without --compile"
        )
    steps = getattr(lm.model, "_draftlab_compiled_steps", None)
    if steps is None:
        steps = CompiledSteps(lm)
        lm.model._draftlab_compiled_steps = steps
    return steps
