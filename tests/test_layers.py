"""Imports run one way (docs/architecture.md): each package of draftlab imports only packages on
lower layers, and only `engines/` and the commands know the engines' folders."""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

import draftlab
from draftlab import engines

SRC = Path(draftlab.__file__).parent

# From the ground up; a package may import any package on a lower layer, none on its own or above.
LAYERS = (
    ("errors", "quiet", "children", "progress", "hardware", "proposal"),
    ("files", "sampling", "__init__"),
    ("models", "verify", "proposers", "outputs"),
    ("decode",),
    ("bench", "distill"),
    ("audit",),
    ("drafters",),
    ("plan",),
    ("engines",),
    ("cli",),
)
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}
ENGINE_FOLDERS = {"hf", "llamacpp", "llama_server", "vllm"}


def _imports() -> dict[str, list[str]]:
    """Each module's path under draftlab/ -> the draftlab modules it imports (lazy imports too)."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in SRC.rglob("*.py"):
        name = path.relative_to(SRC).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            else:
                continue
            found[name] += [m for m in modules if m == "draftlab" or m.startswith("draftlab.")]
    return found


def _package(path_or_module: str) -> str:
    """The top-level package (or module) of draftlab a file or a dotted name belongs to."""
    parts = path_or_module.removesuffix(".py").replace("/", ".").split(".")
    if parts[0] == "draftlab":
        parts = parts[1:]
    if not parts or not ((SRC / parts[0]).is_dir() or (SRC / f"{parts[0]}.py").is_file()):
        return "__init__"  # `from draftlab import __version__`: the package's face
    return parts[0]


def test_every_package_is_on_a_layer():
    packages = {_package(p.relative_to(SRC).as_posix()) for p in SRC.rglob("*.py")}
    assert packages <= set(LAYER), f"add to LAYERS: {sorted(packages - set(LAYER))}"


def test_imports_run_down_the_layers_only():
    upward = []
    for module, imported in _imports().items():
        here = _package(module)
        for target in imported:
            there = _package(target)
            if there != here and LAYER[there] >= LAYER[here]:
                upward.append(
                    f"{module} imports {target} ({here} on layer {LAYER[here]}, {there} on {LAYER[there]})"
                )
    assert not upward, "\n".join(sorted(set(upward)))


def test_the_checks_fail_on_an_import_that_runs_up(tmp_path, monkeypatch):
    """The check above can fail: a models module importing the commands is caught."""
    for folder in ("models", "cli"):
        (tmp_path / folder).mkdir()
    (tmp_path / "cli" / "bench.py").write_text("def run(): ...\n")
    (tmp_path / "models" / "bad.py").write_text("from draftlab.cli.bench import run\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", tmp_path)
    try:
        test_imports_run_down_the_layers_only()
    except AssertionError as exc:
        assert "models/bad.py imports draftlab.cli.bench" in str(exc)
    else:
        raise AssertionError("an upward import was not caught")


def _engine_namings() -> list[str]:
    """Modules outside engines/ that import an engine's folder (also by a dotted string, as importlib
    would), or compare a value with an engine's name: they should ask the engine object instead."""
    names = set(engines.engine_names()) | {"llama_server"}
    found = []
    for path in SRC.rglob("*.py"):
        module = path.relative_to(SRC).as_posix()
        if module.startswith("engines/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                dotted = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                dotted = [a.name for a in node.names]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                dotted = [node.value]
            else:
                dotted = []
            for m in dotted:
                parts = m.split(".")
                if parts[:2] == ["draftlab", "engines"] and len(parts) > 2 and parts[2] in ENGINE_FOLDERS:
                    found.append(f"{module}:{node.lineno} names {m}")
            if isinstance(node, ast.Compare):
                for operand in [node.left, *node.comparators]:
                    values = (
                        operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
                    )
                    for v in values:
                        if isinstance(v, ast.Constant) and v.value in names:
                            found.append(f"{module}:{node.lineno} compares with engine '{v.value}'")
    return found


def test_only_engines_name_an_engine():
    assert _engine_namings() == []


def test_a_module_naming_an_engine_is_caught(tmp_path, monkeypatch):
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "bad.py").write_text(
        'from draftlab.engines.vllm.engine import VllmEngine\nok = lambda e: e.name != "llamacpp"\n'
    )
    monkeypatch.setattr(sys.modules[__name__], "SRC", tmp_path)
    assert _engine_namings() == [
        "bench/bad.py:1 names draftlab.engines.vllm.engine",
        "bench/bad.py:1 names draftlab.engines.vllm.engine.VllmEngine",
        "bench/bad.py:2 compares with engine 'llamacpp'",
    ]
