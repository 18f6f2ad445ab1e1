"""The first run's decisions, on synthetic CPUs and profiles (issue 46): which dtypes get a compiled
package, which static-cache bucket a generation runs in (one package per model), and the joint
choice of dtype and compilation that `--dtype auto` makes where bench decides compilation."""

from __future__ import annotations

import argparse

import pytest

from draftlab.hardware import compile_skip_reason
from draftlab.models.compiled import choose_bucket, keep_longest, static_length
from draftlab.models.cost_curve import CostCurve, Profile, pick_checked, pick_dtype
from draftlab.models.loading import ModelSpec, draft_dtype, load_model
from draftlab.models.profile import load_cached, save
from draftlab.plan import dtypes as common
from draftlab.plan import profiles

ZEN3 = ["avx2"]
XEON_AVX512 = ["avx2", "avx512f"]
ZEN5 = ["avx2", "avx512f", "avx512_bf16"]
SAPPHIRE_RAPIDS = ["avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16"]


@pytest.mark.parametrize(
    ("flags", "bf16", "fp16"),
    [
        (ZEN3, False, False),
        (XEON_AVX512, False, False),
        (ZEN5, True, False),
        (SAPPHIRE_RAPIDS, True, True),
        (["avx2", "amx_tile", "amx_bf16"], True, False),
        ([], False, False),
    ],
)
def test_half_precision_packages_are_built_only_with_native_units(flags, bf16, fp16):
    assert compile_skip_reason("float32", flags) is None
    assert (compile_skip_reason("bfloat16", flags) is None) == bf16
    assert (compile_skip_reason("float16", flags) is None) == fp16
    # 4-bit weights compute in bfloat16 but read a quarter of its bytes: a package everywhere.
    assert compile_skip_reason("q4_1", flags) is None
    if not bf16:
        reason = compile_skip_reason("bfloat16", flags)
        assert "bfloat16 is emulated" in reason and "avx512_bf16 or amx_bf16" in reason
    # A draft beside the 4-bit target runs from Q8_0 blocks where bfloat16 is native (and the kernels
    # have a vector path); else in float32, as a draft of a target computing in an emulated half
    # precision does (it would run eagerly at half the target's step). A GPU's draft always follows
    # the target.
    beside_4bit = ("q8_0" if "avx2" in flags else "bfloat16") if bf16 else "float32"
    assert draft_dtype("q4_1", "cpu", flags) == beside_4bit
    assert draft_dtype("bfloat16", "cpu", flags) == ("bfloat16" if bf16 else "float32")
    assert draft_dtype("float16", "cpu", flags) == ("float16" if fp16 else "float32")
    assert draft_dtype("float32", "cpu", flags) == "float32"
    assert draft_dtype("bfloat16", "cuda:0", flags) == "bfloat16"


def test_one_package_per_model_serves_every_shorter_context():
    # Nothing loaded or built: the bucket that holds the tokens, capped at the model's limit.
    assert choose_bucket(300, {}, [], None) == 512
    assert choose_bucket(834, {}, [], None) == 1024
    assert choose_bucket(5000, {}, [], 4096) == 4096
    # A built package that holds them is loaded rather than a shorter one built.
    assert choose_bucket(300, {}, [1024], None) == 1024
    assert choose_bucket(300, {}, [512, 1024], None) == 512
    assert choose_bucket(700, {}, [512, 2048], None) == 2048
    assert choose_bucket(3000, {}, [512, 1024], None) == static_length(3000)
    # The loaded package wins over any on disk, wherever it holds the tokens.
    assert choose_bucket(300, {1024: object()}, [512], None) == 1024
    assert choose_bucket(1500, {1024: object()}, [512], None) == 2048
    # The packages on disk are listed (a fingerprint each time) only where no loaded one fits.
    assert choose_bucket(300, {1024: object()}, lambda: pytest.fail("listed the disk"), None) == 1024
    assert choose_bucket(1500, {1024: object()}, lambda: [2048, 4096], None) == 2048
    runners, caches = {512: "a", 1024: "b"}, {512: "c", 1024: "d"}
    keep_longest(runners, caches, 2048)
    assert runners == {} and caches == {}
    runners, caches = {512: "a", 2048: "b"}, {512: "c"}
    keep_longest(runners, caches, 1024)
    assert runners == {2048: "b"} and caches == {}


def _profile(lm, compiled: bool, step_ms: float) -> None:
    """A hand-written flat profile (1-8 tokens at `step_ms`), prefill 4x a step."""
    curve = CostCurve([1, 2, 4, 8], [64, 256], [[step_ms] * 4] * 2, [16, 256], [4 * step_ms] * 2)
    save(lm, Profile(lm.fingerprint(compiled), curve, 1, 0.0, "2026-11-27T00:00:00"))


@pytest.fixture
def two_dtypes(tiny_pair, tmp_path, monkeypatch):
    """The tiny Llama in float32 and bfloat16, with cached profiles of a machine like the Zen3 of
    issue 47: eager bfloat16 faster than eager float32, compiled float32 fastest of all."""
    monkeypatch.setenv("DRAFTLAB_PROFILE_DIR", str(tmp_path / "profiles"))
    monkeypatch.setattr(common, "candidate_dtypes", lambda name, device: ["float32", "bfloat16"])
    name = str(tiny_pair["llama"][0])
    models = {d: load_model(ModelSpec(name, dtype=d)) for d in ("float32", "bfloat16")}
    _profile(models["float32"], False, 120.0)
    _profile(models["bfloat16"], False, 95.0)
    _profile(models["float32"], True, 55.0)
    return name, models


def _choose(name: str, compile_flag: bool | None) -> tuple[str, dict]:
    args = argparse.Namespace(max_new_tokens=64, compile=compile_flag)
    choice = common.choose_dtype(args, name, "cpu", None)
    return choice.dtype, choice.record()


def test_dtype_auto_prices_each_dtype_the_way_bench_would_run_it(two_dtypes):
    name, models = two_dtypes
    dtype, record = _choose(name, None)
    assert dtype == "float32" and record["ways"] == {"float32": "compiled", "bfloat16": "eager"}
    assert "in float32 compiled" in record["reason"] and "bfloat16 eager" in record["reason"]
    # --no-compile and --compile leave compilation out of it: the eager profiles decide.
    for flag in (False, True):
        dtype, record = _choose(name, flag)
        assert dtype == "bfloat16" and set(record["ways"].values()) == {"eager"}, flag
    # A compiled profile within the margin of its eager one is not counted.
    _profile(models["float32"], True, 112.0)
    dtype, record = _choose(name, None)
    assert dtype == "bfloat16" and record["ways"]["float32"] == "eager"


def test_dtype_auto_weighs_the_4_bit_storage_jointly_with_compilation(two_dtypes, monkeypatch):
    """One choice over dtype or storage × eager or compiled: a 4-bit target whose compiled passes
    are the fastest wins; where its profiles are slower than another dtype's, that one does."""
    name, models = two_dtypes
    monkeypatch.setattr(common, "candidate_dtypes", lambda name, device: ["float32", "bfloat16", "q4_1"])
    q4 = load_model(ModelSpec(name, dtype="q4_1"))
    _profile(q4, False, 100.0)
    _profile(q4, True, 40.0)
    dtype, record = _choose(name, None)
    assert dtype == "q4_1" and record["ways"]["q4_1"] == "compiled", record
    assert "in q4_1 compiled" in record["reason"] and "float32 compiled" in record["reason"]
    _profile(q4, True, 98.0)  # compiled within the margin of its eager profile: eager, and slower
    dtype, record = _choose(name, None)
    assert dtype == "float32" and record["ways"]["q4_1"] == "eager"


def _curve(step_ms: float, slope: float) -> CostCurve:
    """A profile whose 1-token pass costs step_ms and whose 5-token pass costs slope × that."""
    row = [step_ms, step_ms * (1 + (slope - 1) / 4), step_ms * slope, step_ms * slope * 1.2]
    return CostCurve([1, 2, 5, 8], [64, 256], [row, row], [16, 256], [4 * step_ms] * 2)


def test_among_tied_dtypes_the_cheapest_verification_wins():
    # The cold run of stop 53: compiled bfloat16 predicted 7% slower than the 4-bit target but a
    # little flatter. Checking 4 drafts costs less in q4_1 (25.3 × 1.15 < 27.3 × 1.09): q4_1.
    dtype, predicted = pick_dtype({"bfloat16": _curve(27.3, 1.09), "q4_1": _curve(25.3, 1.15)}, 256, 64)
    assert dtype == "q4_1" and predicted["q4_1"] < predicted["bfloat16"]
    # A tied dtype whose verification is dear loses to a slower, flat one (float16 on the Xeon).
    dtype, _ = pick_dtype({"bfloat16": _curve(27.3, 1.09), "float16": _curve(25.5, 1.48)}, 256, 64)
    assert dtype == "bfloat16"
    # Outside the tie band the fastest plain decoding wins, however steep.
    dtype, _ = pick_dtype({"bfloat16": _curve(27.3, 1.0), "q4_1": _curve(20.0, 1.6)}, 256, 64)
    assert dtype == "q4_1"


def test_dtype_auto_prices_cached_profiles_without_spot_checking_them(two_dtypes, monkeypatch, capsys):
    """Comparing dtypes reads their cached profiles as they are (a noisy host once re-profiled
    eager float32 for minutes before a run of the 4-bit package). The winner here runs compiled,
    and compiled profiles are never spot-checked, so its stale eager profile waits for a run that
    sets up eagerly."""
    name, models = two_dtypes
    monkeypatch.setenv("DRAFTLAB_SPOT_CHECK", "1")  # off for the rest of the suite (conftest.py)
    monkeypatch.setattr(profiles, "_SPOT_CHECKED", set())
    # A measured-looking eager profile (it took a second), 120 ms a step: far off the tiny model's.
    eager = load_cached(models["float32"])
    save(models["float32"], Profile(eager.fingerprint, eager.curve, 1, 1.0, "2026-11-27T00:00:00"))
    dtype, _ = _choose(name, None)
    assert dtype == "float32"
    assert load_cached(models["float32"]).measured_at == "2026-11-27T00:00:00"
    assert "profiling it again" not in capsys.readouterr().err
    # The run's own set-up still checks it, and measures it again.
    assert profiles.machine_profile(models["float32"]).measured_at != "2026-11-27T00:00:00"
    assert "profiling it again" in capsys.readouterr().err


def test_dtype_auto_spot_checks_its_winner_and_chooses_again_when_it_was_stale(
    two_dtypes, monkeypatch, capsys
):
    """The dtype `--dtype auto` picks is spot-checked inside the choice (paths such as `generate
    ar` set up no cost model that would check it), and the choice is made again where that
    measured it anew. The dtypes that lost are never checked."""
    name, models = two_dtypes
    monkeypatch.setenv("DRAFTLAB_SPOT_CHECK", "1")  # off for the rest of the suite (conftest.py)
    monkeypatch.setattr(profiles, "_SPOT_CHECKED", set())
    # bfloat16's eager profile looks measured (it took a second) and claims 0.01 ms a step, far
    # below what the tiny model takes; float32's is hand-written (never checked) at 0.5 ms.
    stale = "2026-11-27T00:00:00"
    bf16 = load_cached(models["bfloat16"])
    flat = CostCurve([1, 2, 4, 8], [64, 256], [[0.01] * 4] * 2, [16, 256], [0.04] * 2)
    save(models["bfloat16"], Profile(bf16.fingerprint, flat, 1, 1.0, stale))
    _profile(models["float32"], False, 0.5)
    dtype, record = _choose(name, False)
    assert load_cached(models["bfloat16"]).measured_at != stale  # the winner was checked: measured again
    assert "profiling it again" in capsys.readouterr().err
    measured = load_cached(models["bfloat16"]).curve.forward_ms(1, 256)
    assert measured > 0.5, measured  # a tiny model's eager step takes more than 0.5 ms in Python
    assert dtype == "float32", record  # chosen again on the new profile
    assert record["predicted_s"]["bfloat16"] > record["predicted_s"]["float32"]


def test_a_choice_spot_checks_only_its_winner_and_chooses_again_when_that_moved():
    """`--dtype auto` and `--gguf-type auto` share the rule (models/cost_curve.py `pick_checked`):
    every candidate is priced from its cached profile as it is, only the winner is checked, and a
    winner whose check measured it anew is weighed again against the others."""
    cached = {"q4_1": _curve(20.0, 1.2), "bfloat16": _curve(27.3, 1.0)}
    now = {"q4_1": _curve(35.0, 1.2), "bfloat16": _curve(27.3, 1.0)}  # q4_1 was profiled on a quiet host
    asked = []

    def price(candidate: str, check: bool) -> CostCurve:
        asked.append((candidate, check))
        return (now if check else cached)[candidate]

    pick, predicted, curves = pick_checked(["q4_1", "bfloat16"], price, 256, 64)
    assert asked == [("q4_1", False), ("bfloat16", False), ("q4_1", True)]  # the loser never checked
    assert pick == "bfloat16" and curves["q4_1"] is now["q4_1"]
    assert predicted["q4_1"] > predicted["bfloat16"]
    # A check that confirms the cached profile keeps the pick.
    now["q4_1"] = cached["q4_1"]
    asked.clear()
    pick, _, _ = pick_checked(["q4_1", "bfloat16"], price, 256, 64)
    assert pick == "q4_1" and [c for c in asked if c[1]] == [("q4_1", True)]
