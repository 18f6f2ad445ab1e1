from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from tiny import FAMILIES, make_model

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Tiny models' millisecond passes jitter by over the spot check's band on a loaded 2-core machine, and
# a re-profile adds a status line where tests expect one error line: only test_profile_spot.py
# turns the spot check on.
os.environ["DRAFTLAB_SPOT_CHECK"] = "0"
# max-autotune's float32 GEMM choices took 56 of a tiny package's 90 s build (2-core Zen3); the
# suite's packages are built without them, test_compile.py's autotuned build aside.
os.environ["DRAFTLAB_AUTOTUNE"] = "0"
# Tiny models gain nothing from threads, and on a busy 2-core machine threads cost a lot.
torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def _profiles_in_tmp(tmp_path_factory):
    """Cost profiles measured by tests stay out of the user's draftlab home."""
    os.environ["DRAFTLAB_PROFILE_DIR"] = str(tmp_path_factory.mktemp("profiles"))
    # And what --compile builds: compiled anew by every run of the suite, once for all its xdist
    # workers (their temporary folders share a parent; a package being built is locked).
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path_factory.mktemp("inductor"))
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    (shared / "compiled").mkdir(exist_ok=True)
    os.environ["DRAFTLAB_COMPILED_DIR"] = str(shared / "compiled")


# DRAFTLAB_SHARED moves ../shared, for runs from a copy of the tree (mutation testing).
SHARED = Path(os.environ.get("DRAFTLAB_SHARED") or Path(__file__).resolve().parents[2] / "shared")
STORIES = SHARED / "models" / "stories260K"


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """family -> (target folder, draft folder): same tokenizer, different weights."""
    root = tmp_path_factory.mktemp("tiny")
    pairs = {}
    for family in FAMILIES:
        target = make_model(family, root / f"{family}-target", seed=1, hidden=64, layers=2)
        draft = make_model(family, root / f"{family}-draft", seed=2, hidden=32, layers=1)
        pairs[family] = (target, draft)
    return pairs


@pytest.fixture(scope="session")
def stories():
    if not (STORIES / "config.json").exists():
        if os.environ.get("CI"):
            pytest.fail(f"CI must have {STORIES}: ../shared is missing beside the clone", pytrace=False)
        pytest.skip("../shared/models/stories260K is not present")
    return STORIES
