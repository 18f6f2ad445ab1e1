"""Engines: what decodes a generation, one folder each. They sit beside `decode`, below `bench`.

`hf` is draftlab's own loop over transformers models (and transformers' own generate());
`llamacpp` runs the same loop over a GGUF model that llama.cpp evaluates, and llama.cpp's own
prompt lookup; `vllm` runs the methods through vLLM's offline `LLM` API. Each returns a
`Generation` with `GenerationStats` (decode/stats.py), so the runner and the reports never ask
which engine made a record. Each engine's `methods.py` says which methods it runs (`counterpart`).
"""

from __future__ import annotations

from draftlab.decode.spec import MethodSpec
from draftlab.engines.hf import methods as hf
from draftlab.engines.llama_server import methods as llama_server
from draftlab.engines.llamacpp import methods as llamacpp
from draftlab.engines.vllm import methods as vllm

_ENGINES = {hf.NAME: hf, vllm.NAME: vllm, llamacpp.NAME: llamacpp, llama_server.NAME: llama_server}
ENGINES = tuple(_ENGINES)


def counterpart(engine: str, spec: MethodSpec) -> str | None:
    """What `engine` runs for this method: its own name for it, "" for vLLM's plain decoding, None if nothing."""
    return _ENGINES[engine].counterpart(spec)


def engines_for(spec: MethodSpec) -> tuple[str, ...]:
    return tuple(name for name in ENGINES if counterpart(name, spec) is not None)
