"""Models loaded once per process, and their cost profiles on this machine (measured once, then cached)."""

from __future__ import annotations

import math

from rich.console import Console

from draftlab.decode.cost import CostModel
from draftlab.models.cached import draft_compiles
from draftlab.models.loading import LoadedModel, ModelSpec, load_model
from draftlab.models.profile import (
    FULL_SIZES,
    Profile,
    hand_written,
    load_cached,
    load_or_measure,
    off_band,
    profile_dir,
    profile_path,
    spot_checks_on,
    spot_ratio,
)

_LOADED: dict[ModelSpec, LoadedModel] = {}  # one load per spec per process (auto profiles several)


def load_spec(spec: ModelSpec) -> LoadedModel:
    if spec not in _LOADED:
        _LOADED[spec] = load_model(spec)
    return _LOADED[spec]


def _status(message: str) -> None:
    Console(stderr=True).print(f"[dim]{message}[/]")


# Profiles spot-checked in this process (models/profile.py, SPOT_BAND).
_SPOT_CHECKED: set = set()


def machine_profile(lm: LoadedModel, compiled: bool = False, check: bool = True) -> Profile:
    """The model's cost profile on this machine, measured once and then read from the cache.

    `compiled`: its compiled passes' profile (compiling them, untimed, if this process has not).
    `check=False`: a cached profile as it is, for comparing configurations that may not run: only
    the one chosen to run is spot-checked (a noisy host once re-profiled eager float32 for minutes
    before a `generate` that ran the 4-bit package)."""
    cached = load_cached(lm, compiled)
    kind = ", compiled passes" if compiled else ""
    if cached is not None:
        path = profile_path(lm)
        if not check or compiled or hand_written(cached) or not spot_checks_on() or path in _SPOT_CHECKED:
            return cached
        # Once per process, a short plain decode checks that the machine still runs as profiled;
        # a second one confirms a miss before minutes go into measuring again (a head's 2 ms passes
        # once read 0.75x on a quiet first run, minutes after its profile was measured).
        ratio = spot_ratio(lm, cached.curve)
        _SPOT_CHECKED.add(path)
        if off_band(ratio):
            again = spot_ratio(lm, cached.curve)
            ratio = again if abs(math.log(again)) < abs(math.log(ratio)) else ratio
        if not off_band(ratio):
            return cached
        _status(
            f"{lm.spec.name} ({lm.spec.dtype}) now decodes at {ratio:.2f}× the time its cached profile "
            f"predicts (measured {cached.measured_at}, under another load?): profiling it again"
        )
        return load_or_measure(lm, quick=max(cached.curve.sizes) < max(FULL_SIZES), refresh=True)[0]
    _status(
        f"profiling {lm.spec.name} ({lm.spec.dtype}{kind}) on this machine, once: cached in {profile_dir()}"
    )
    return load_or_measure(lm, compiled=compiled)[0]


def cost_model(
    fixed_k: bool, target: LoadedModel, draft: LoadedModel | None, compiled: bool = False
) -> CostModel | None:
    """The machine's cost model for this pair, or None when rounds are not sized from it.

    `compiled`: the target runs its compiled passes (--compile), which cost otherwise than eager
    ones, and so does a draft model that can (drafters/draft_model/build.py)."""
    if fixed_k:
        return None
    second = machine_profile(draft, compiled and draft_compiles(draft, target)).curve if draft else None
    return CostModel(machine_profile(target, compiled).curve, second)
