"""Engines: what decodes a generation, one folder each, one `Engine` object each (engines/base.py).

`hf` is draftlab's own loop over transformers models (and transformers' own generate());
`llamacpp` runs the same loop over a GGUF model that llama.cpp evaluates, and llama.cpp's own
prompt lookup; `llama-server` runs llama.cpp's server and its drafters; `vllm` runs the methods
through vLLM's offline `LLM` API. Each returns a `Generation` with `GenerationStats`
(decode/stats.py), so the runner and the reports never ask which engine made a record.

`ENGINE_OBJECTS` is the one list: a new engine is its folder and one line here (or `register` from
anywhere, as a test's toy engine does). The objects load on first use; each engine's `methods.py`
(its rows of the method table, decode/spec.py) loads with this package, and `report.py` (its report
sections, bench/sections.py) when a report is made: reports read both, so neither may pull torch or
the commands' layers in.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING

from draftlab.bench.labels import OWN_LOOP
from draftlab.errors import DraftlabError

if TYPE_CHECKING:
    from draftlab.decode.spec import MethodSpec
    from draftlab.engines.base import Engine

ENGINE_OBJECTS = (
    "draftlab.engines.hf.engine:HfEngine",
    "draftlab.engines.vllm.engine:VllmEngine",
    "draftlab.engines.llamacpp.engine:LlamaCppEngine",
    "draftlab.engines.llama_server.engine:LlamaServerEngine",
)
DEFAULT = OWN_LOOP  # draftlab's own loop: what --engine means when not given
_REGISTRY: dict[str, Engine] = {}


def _load_parts(part: str) -> None:
    """Each listed engine's module `part` (methods.py, report.py), where it has one."""
    for entry in ENGINE_OBJECTS:
        module = entry.split(":")[0].rsplit(".", 1)[0] + "." + part
        if importlib.util.find_spec(module) is not None:
            importlib.import_module(module)


def load_reports() -> None:
    """Each engine's report sections (its report.py, bench/sections.py): the commands call this
    before a report is made (bench sits below the engines and does not)."""
    _load_parts("report")


_load_parts("methods")  # each engine's rows of the method table, with the table (no torch there)


def _load() -> dict[str, Engine]:
    if not _REGISTRY:
        for entry in ENGINE_OBJECTS:
            module, cls = entry.split(":")
            engine = getattr(importlib.import_module(module), cls)()
            _REGISTRY.setdefault(engine.name, engine)
    return _REGISTRY


def register(engine: Engine) -> None:
    """Add an engine (an object with the `Engine` protocol's members) to every command that takes one."""
    _load()[engine.name] = engine


def unregister(name: str) -> None:
    _load().pop(name, None)


def engine_names() -> tuple[str, ...]:
    return tuple(_load())


def get(name: str) -> Engine:
    engines = _load()
    if name not in engines:
        raise DraftlabError(f"unknown engine '{name}' (choose from {', '.join(engines)})")
    return engines[name]


def counterpart(engine: str, spec: MethodSpec) -> str | None:
    """What `engine` runs for this method: its own name for it, "" for plain decoding where it has
    none, None if nothing."""
    return get(engine).counterpart(spec)


def engines_for(spec: MethodSpec) -> tuple[str, ...]:
    return tuple(name for name, engine in _load().items() if engine.counterpart(spec) is not None)
