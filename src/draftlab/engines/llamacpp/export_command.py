"""`draftlab models export-gguf`: a transformers Llama model written as a GGUF for llama.cpp (the
llamacpp engine adds this command to `draftlab models`), loaded back and compared."""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

from rich.console import Console

from draftlab.engines.llamacpp.export import OUTTYPES, export_gguf
from draftlab.engines.llamacpp.load import load_llamacpp
from draftlab.errors import DraftlabError
from draftlab.models import catalogue, install
from draftlab.models.cached import cached
from draftlab.models.gguf import verification_prompts
from draftlab.models.loading import ModelSpec, load_model
from draftlab.outputs import check_new_file
from draftlab.plan.roles import DEFAULT_TARGET


def add_export_command(sub: argparse._SubParsersAction) -> None:
    export = sub.add_parser(
        "export-gguf",
        help="write a transformers Llama model (e.g. the shipped draft) as a GGUF for --engine llamacpp",
        description="The tokenizer comes from a reference GGUF with the same vocabulary (default: the "
        "default target's own). With llama-cpp-python installed, the file is loaded back by llama.cpp and "
        "its logits compared with the transformers model's.",
    )
    export.add_argument(
        "name", metavar="NAME", help="registry name, folder or hub id (a Llama-architecture model)"
    )
    export.add_argument("--out", required=True, help="the .gguf file to write")
    export.add_argument("--force", action="store_true", help="replace --out where a file already is")
    export.add_argument(
        "--outtype",
        default="f16",
        help="f32, f16 (default), bf16, q8_0 or q4_0 for the matrices (the storage "
        "picks llama.cpp's kernels, so also what a verification pass costs: see docs/engines.md)",
    )
    export.add_argument(
        "--reference", default=None, help="GGUF whose tokenizer to copy (default: the default target's)"
    )
    export.set_defaults(func=run_export)


def run_export(args: argparse.Namespace) -> int:

    if args.outtype not in OUTTYPES:
        raise DraftlabError(f"--outtype must be one of {', '.join(OUTTYPES)}, got '{args.outtype}'")
    out = Path(args.out)
    check_new_file(out, "--out", args.force)
    reference = Path(args.reference) if args.reference else install.gguf_path(catalogue.get(DEFAULT_TARGET))
    if reference is None or not reference.is_file():
        raise DraftlabError(
            f"reference GGUF '{args.reference or DEFAULT_TARGET}' not found"
            + (
                ""
                if args.reference
                else f": run `draftlab models fetch {DEFAULT_TARGET}` or pass --reference"
            )
        )
    console = Console(stderr=True, soft_wrap=True)  # paths stay whole
    lm = load_model(ModelSpec(args.name, dtype="float32"))
    t0 = time.perf_counter()
    info = export_gguf(lm, out, reference, args.outtype)
    console.print(
        f"wrote {info.path}: {info.tensors} tensors, {info.parameters / 1e6:.1f}M parameters, "
        f"{info.bytes / 2**20:.1f} MiB, {args.outtype}, in {time.perf_counter() - t0:.1f} s"
    )
    check = _check_export(lm, info.path)
    if check is None:
        console.print(
            "[yellow]not loaded back: llama-cpp-python is not installed (scripts/install-llamacpp.sh)[/]"
        )
    else:
        console.print(
            f"loaded back by llama.cpp ({check['file_type']}): top-1 agreement {check['top1']:.3f} with the "
            f"transformers model over {check['positions']} positions, largest logit difference "
            f"{check['max_abs_diff']:.3g}"
        )
    return 0


def _check_export(lm, path: str) -> dict | None:
    """llama.cpp's logits for the file against the transformers model's, on the conversion prompts."""

    if importlib.util.find_spec("llama_cpp") is None:
        return None
    import torch  # noqa: PLC0415

    gguf = load_llamacpp(path, tokenizer=lm.tokenizer)  # checks the vocabulary token by token
    runner = cached(gguf)
    agree = positions = 0
    worst = 0.0
    for ids in verification_prompts(lm.tokenizer):
        with torch.inference_mode():
            want = lm.model(input_ids=torch.tensor([ids])).logits[0].float()
        runner.start(ids)
        got = runner.forward(ids)
        agree += int((got.argmax(-1) == want.argmax(-1)).sum())
        positions += len(ids)
        worst = max(worst, float((got - want).abs().max()))
    return {
        "file_type": gguf.spec.dtype,
        "top1": agree / positions,
        "positions": positions,
        "max_abs_diff": worst,
    }
