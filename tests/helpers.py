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


def synthetic(step_ms: float, verify4: float = 1.1, prefill_per_token: float | None = None):
    """A cost curve: a 1-token pass costs `step_ms`, a 5-token pass `verify4` times that, a prompt
    token of prefill `prefill_per_token` (an eighth of a step unless given)."""
    from draftlab.models.cost_curve import CostCurve  # noqa: PLC0415

    sizes = [1, 2, 4, 8, 16]
    row = [step_ms * (1 + (verify4 - 1) * (n - 1) / 4) for n in sizes]
    per_token = step_ms / 8 if prefill_per_token is None else prefill_per_token
    return CostCurve(sizes, [64, 1024], [row, row], [16, 1024], [16 * per_token, 1024 * per_token])


def seed_profile(lm, curve) -> None:
    """`curve` as the machine's cached profile of `lm` (a written one: it is never spot-checked)."""
    from draftlab.models.cost_curve import Profile  # noqa: PLC0415
    from draftlab.models.profile import save  # noqa: PLC0415

    save(lm, Profile(lm.fingerprint(), curve, 1, 0.0, "2026-11-25T00:00:00"))


def check_error(capsys, argv: list[str], *fragments: str) -> None:
    """Bad input: exit code 2 and one line on stderr that names the value."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("draftlab: error:"), err
    assert "\n" not in err and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


def server_round_trip(stories: Path, head: Path, spec_type: str, folder: Path, max_new_tokens: int):
    """A trained head's round trip to llama.cpp users: stories260K converted to a float32 GGUF,
    then llama-server's plain and drafting (`--spec-type spec_type -md head`) generations of one
    prompt; None where llama-server is not built (a failure where DRAFTLAB_REQUIRE_LLAMACPP)."""
    import os  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    import pytest  # noqa: PLC0415

    from draftlab.engines.llama_server.binary import find_server  # noqa: PLC0415
    from draftlab.engines.llama_server.convert import converter  # noqa: PLC0415
    from draftlab.engines.llama_server.decoder import LlamaServerDecoder, ServerPool  # noqa: PLC0415
    from draftlab.engines.llamacpp.load import load_llamacpp  # noqa: PLC0415
    from draftlab.models.prompting import encode_prompt  # noqa: PLC0415
    from draftlab.sampling import SamplingParams  # noqa: PLC0415

    server = find_server()
    if server is None:
        if os.environ.get("DRAFTLAB_REQUIRE_LLAMACPP"):
            pytest.fail("llama-server is not built (scripts/install-llamacpp.sh)", pytrace=False)
        return None
    target = folder / "stories-f32.gguf"
    convert = [
        sys.executable,
        str(converter(server)),
        str(stories),
        "--outtype",
        "f32",
        "--outfile",
        str(target),
    ]
    subprocess.run(convert, check=True, capture_output=True, timeout=300)
    lm = load_llamacpp(str(target), tokenizer=str(stories))
    pool = ServerPool(server, target, 1, 512, folder / "llama-server.log")
    try:
        ids = encode_prompt(lm, "Once upon a time, there was a little", chat=False)
        plain = LlamaServerDecoder(pool, [], lm.tokenizer).generate(ids, max_new_tokens, SamplingParams())
        args = ["--spec-type", spec_type, "-md", str(head)]
        drafted = LlamaServerDecoder(pool, args, lm.tokenizer).generate(ids, max_new_tokens, SamplingParams())
    finally:
        pool.close()
    return plain, drafted
