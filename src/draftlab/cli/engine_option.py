"""The one `--engine` option: each command offers the engines it can run."""

from __future__ import annotations

ENGINE_HELP = {
    "hf": "draftlab's own decode loop over transformers models (default)",
    "vllm": "the same methods through vLLM's offline LLM API",
    "llamacpp": "our loop over the GGUF target run by llama.cpp (default: the default target's own Q4_1 "
    "GGUF), with a .gguf or transformers draft (scripts/install-llamacpp.sh)",
    "llama-server": "llama.cpp's server, started and stopped by draftlab, one at a time, with its own "
    "drafters (ngram-mod, ngram-simple, ngram-map-k, ngram-cache; sps: draft-simple with our draft, "
    "eagle: draft-eagle3 with our head) on the target's BF16 copy (scripts/install-llamacpp.sh builds it)",
}


def add_engine_option(group, engines: tuple[str, ...]) -> None:
    group.add_argument(
        "--engine",
        choices=engines,
        default="hf",
        help="; ".join(f"{name}: {ENGINE_HELP[name]}" for name in engines),
    )
