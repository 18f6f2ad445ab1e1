"""scripts/project_speedup.py: a run's acceptance priced on another cost curve (docs/engines.md)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "project_speedup.py"
spec = importlib.util.spec_from_file_location("project_speedup", SCRIPT)
project_speedup = importlib.util.module_from_spec(spec)
spec.loader.exec_module(project_speedup)

# 10 rounds: 4 drafted 4 tokens; of those, 2 accepted the first draft, 1 also the second.
RECORD = {"rounds": 10, "drafted_per_position": [4, 4, 4, 4], "accepted_per_position": [2, 1, 0, 0]}


def test_a_flat_curve_gains_the_accepted_tokens():
    flat = project_speedup.curve_from_ratios([1, 1, 1, 1, 1])
    speedup, length = project_speedup.project([RECORD], flat, cap=4)
    assert length == pytest.approx(13 / 10) and speedup == pytest.approx(1.3)


def test_a_linear_curve_prices_every_drafted_token_and_the_bound_only_accepted_ones():
    linear = project_speedup.curve_from_ratios([1, 2, 3, 4, 5])
    # 6 plain rounds + 4 passes of 5 tokens = 26 against 13 plain steps
    assert project_speedup.project([RECORD], linear, cap=4)[0] == pytest.approx(13 / 26)
    # the bound: 8 plain rounds, one pass of 2 and one of 3 tokens = 13
    assert project_speedup.project_oracle([RECORD], linear, cap=4) == pytest.approx(1.0)
    # capped at 1 draft: 4 passes of 2 tokens, 12 tokens
    assert project_speedup.project([RECORD], linear, cap=1)[0] == pytest.approx(12 / (6 + 4 * 2))
    assert project_speedup.cost(linear, 7) == pytest.approx(7)  # the last slope continues
