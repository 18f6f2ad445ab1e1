"""llama-server writing `draftlab distill`'s answers: the target's GGUF behind parallel slots, every
prompt of a batch sent at once (the server batches them continuously), the prompts as token ids
after our chat template, as in every engine.

The GGUF is the target's own file where the catalogue ships one (the default target's Q4_1, whose
exact dequantization is our checkpoint), else the target's folder converted once by llama.cpp's
converter in the dtype the target is trained against."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from draftlab.engines.llama_server.convert import model_gguf
from draftlab.engines.llama_server.server import LlamaServer
from draftlab.engines.llamacpp.load import locate
from draftlab.errors import DraftlabError
from draftlab.models.catalogue import ENTRIES
from draftlab.models.loading import resolve_path

# Requests decoded at once. Measured on a 2-core Xeon (AMX) with the default target's Q4_1 file and
# 192-token answers: 60 tokens/s on 1 slot, 102 on 4, 107 on 8, 102 on 16.
ANSWER_SLOTS = 8
OUTTYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def answer_gguf(target: str, dtype: str, server: Path) -> Path:
    """The GGUF llama-server answers with for `target` (a catalogue name or a transformers folder)."""
    entry = ENTRIES.get(target)
    if entry is not None and entry.kind == "gguf-wheel":
        return locate(target)[0]
    folder = Path(resolve_path(target))
    if not folder.is_dir():
        raise DraftlabError(f"llama-server cannot answer for '{target}': not a catalogue GGUF or a folder")
    return model_gguf(folder, OUTTYPES[dtype], server)


class ServerAnswers:
    def __init__(
        self, binary: Path, gguf: Path, max_new_tokens: int, n_ctx: int, log: Path, slots: int = ANSWER_SLOTS
    ) -> None:
        threads = torch.get_num_threads()
        self.server = LlamaServer(binary, gguf, [], threads, n_ctx, log, slots).start()
        self.max_new_tokens, self.slots = max_new_tokens, slots
        self.name = f"llama-server {gguf.name}, {slots} slots"

    def respond(self, prompts: list[list[int]], temperature: float, seed: int) -> list[list[int]]:
        def one(job: tuple[int, list[int]]) -> list[int]:
            row, prompt = job
            answer = self.server.complete(
                {
                    "prompt": list(prompt),
                    "n_predict": self.max_new_tokens,
                    # As the teacher samples: the temperature alone, nothing truncated.
                    "temperature": temperature,
                    "top_k": 0,
                    "top_p": 1.0,
                    "min_p": 0.0,
                    "seed": seed * 1_000_003 + row,
                    "cache_prompt": False,
                    "return_tokens": True,
                }
            )
            return [int(t) for t in answer.get("tokens") or []]  # ends with the EOS where it stopped

        with ThreadPoolExecutor(max_workers=max(len(prompts), 1)) as pool:
            return list(pool.map(one, enumerate(prompts)))

    def close(self) -> None:
        self.server.stop()
