"""The one `--engine` option: each command offers the engines it can run."""

from __future__ import annotations

ENGINE_HELP = {
    "hf": "draftlab's own decode loop over transformers models (default)",
    "vllm": "the same methods through vLLM's offline LLM API",
    "llamacpp": "our loop over the GGUF target run by llama.cpp (default: the default target's own Q4_1 "
    "GGUF), with a .gguf or transformers draft (scripts/install-llamacpp.sh)",
}


def add_engine_option(group, engines: tuple[str, ...]) -> None:
    group.add_argument(
        "--engine",
        choices=engines,
        default="hf",
        help="; ".join(f"{name}: {ENGINE_HELP[name]}" for name in engines),
    )
