"""A cached cost profile is spot-checked once per process against a short real plain decode, and
measured again when the machine no longer runs as profiled (another load than when it was taken)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from draftlab.models.loading import ModelSpec, load_model
from draftlab.models.profile import (
    SPOT_BAND,
    load_cached,
    load_or_measure,
    off_band,
    profile_path,
    save,
    spot_ratio,
)
from draftlab.plan import profiles as common


@pytest.fixture
def story(stories, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTLAB_PROFILE_DIR", str(tmp_path / "profiles"))
    monkeypatch.setenv("DRAFTLAB_SPOT_CHECK", "1")  # off for the rest of the suite (conftest.py)
    monkeypatch.setattr(common, "_SPOT_CHECKED", set())
    return load_model(ModelSpec(str(stories), dtype="float32"))


def test_the_band_is_symmetric_in_ratio():
    assert not off_band(1.0) and not off_band(SPOT_BAND) and not off_band(1 / SPOT_BAND)
    assert off_band(SPOT_BAND * 1.01) and off_band(1 / (SPOT_BAND * 1.01))


def test_a_profile_from_another_load_is_measured_again(story, capsys):
    profile, _ = load_or_measure(story, repeats=1)
    # The same profile as if taken while the CPU ran 50x slower.
    slow = dataclasses.replace(profile.curve, ms=[[50 * v for v in row] for row in profile.curve.ms])
    assert off_band(spot_ratio(story, slow))
    save(story, dataclasses.replace(profile, curve=slow, measured_at="2026-01-01T00:00:00"))
    got = common.machine_profile(story)
    assert got.measured_at != "2026-01-01T00:00:00"
    assert load_cached(story).measured_at == got.measured_at, "the new profile replaces the old on disk"
    assert "profiling it again" in capsys.readouterr().err
    # Checked once per process: the next call reads the cache as it is.
    save(story, dataclasses.replace(got, curve=slow, measured_at="2026-01-02T00:00:00"))
    assert common.machine_profile(story).measured_at == "2026-01-02T00:00:00"


def test_spot_checks_can_be_turned_off(story, monkeypatch):
    profile, _ = load_or_measure(story, repeats=1)
    slow = dataclasses.replace(profile.curve, ms=[[50 * v for v in row] for row in profile.curve.ms])
    save(story, dataclasses.replace(profile, curve=slow, measured_at="2026-01-01T00:00:00"))
    monkeypatch.setenv("DRAFTLAB_SPOT_CHECK", "0")
    assert common.machine_profile(story).measured_at == "2026-01-01T00:00:00"


def test_a_hand_written_profile_is_used_as_it_is(story):
    profile, _ = load_or_measure(story, repeats=1)
    slow = dataclasses.replace(profile.curve, ms=[[50 * v for v in row] for row in profile.curve.ms])
    save(story, dataclasses.replace(profile, curve=slow, seconds=0.0))  # written, not measured
    got = common.machine_profile(story)
    assert got.curve.ms == slow.ms
    assert json.loads(profile_path(story).read_text())["seconds"] == 0.0
