"""Imports run one way (docs/architecture.md): each package of draftlab imports only packages on
lower layers, and only `engines/` and the commands know the engines' folders."""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

import draftlab

SRC = Path(draftlab.__file__).parent

# From the ground up; a package may import any package on a lower layer, none on its own or above.
LAYERS = (
    ("errors", "quiet", "children", "progress", "hardware", "proposal"),
    ("files", "sampling", "__init__"),
    ("models", "verify", "proposers", "outputs"),
    ("decode",),
    ("bench", "distill"),
    ("drafters",),
    ("plan",),
    ("engines",),
    ("audit",),
    ("cli",),
)
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}
ENGINE_FOLDERS = {"hf", "llamacpp", "llama_server", "vllm"}
# Modules outside engines/ that still import an engine's folder directly (issue 48: the commands
# go through the engine objects); this list only shrinks.
STILL_NAMING_ENGINE_FOLDERS = {
    "audit/law.py",
    "audit/runner.py",
    "cli/audit.py",
    "cli/audit_server.py",
    "cli/models.py",
}


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


def test_only_engines_and_the_listed_modules_import_an_engines_folder():
    naming = {
        module
        for module, imported in _imports().items()
        if not module.startswith("engines/")
        and any(
            m.split(".")[:3][-1] in ENGINE_FOLDERS and m.startswith("draftlab.engines.") for m in imported
        )
    }
    assert naming <= STILL_NAMING_ENGINE_FOLDERS, f"new: {sorted(naming - STILL_NAMING_ENGINE_FOLDERS)}"
    assert naming == STILL_NAMING_ENGINE_FOLDERS, (
        f"moved, take off the list: {sorted(STILL_NAMING_ENGINE_FOLDERS - naming)}"
    )
