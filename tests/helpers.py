"""Small pieces the CLI tests share: a tiny pair's model options, a suite file, quiet bench options."""

from __future__ import annotations

import json
from pathlib import Path

QUIET = ["--quiet", "--warmup", "0"]  # no progress bar, no warm-up: tiny models need neither


def pair_args(tiny_pair: dict, family: str = "llama") -> list[str]:
    """--target and --draft of a tiny pair, in float32."""
    target, draft = tiny_pair[family]
    return ["--target", str(target), "--draft", str(draft), "--dtype", "float32"]


def write_suite(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
