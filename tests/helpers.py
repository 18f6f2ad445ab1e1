"""Small pieces the CLI tests share: a tiny pair's model options, a suite file, quiet bench options."""

from __future__ import annotations

import json
from pathlib import Path

from draftlab.cli import main

QUIET = ["--quiet", "--warmup", "0"]  # no progress bar, no warm-up: tiny models need neither


def pair_args(tiny_pair: dict, family: str = "llama") -> list[str]:
    """--target and --draft of a tiny pair, in float32."""
    target, draft = tiny_pair[family]
    return ["--target", str(target), "--draft", str(draft), "--dtype", "float32"]


def write_suite(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def noisy_copy(source: Path, folder: Path, scale: float = 0.2, seed: int = 0) -> Path:
    """A copy of a trained model with noise on its weight matrices, saved with its tokenizer: a
    draft that agrees with the model often but not always (stories260K's: about half the time)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(source)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.add_(torch.randn_like(p) * scale * p.std())
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(source).save_pretrained(folder)
    return folder


def check_error(capsys, argv: list[str], *fragments: str) -> None:
    """Bad input: exit code 2 and one line on stderr that names the value."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("draftlab: error:"), err
    assert "\n" not in err and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
