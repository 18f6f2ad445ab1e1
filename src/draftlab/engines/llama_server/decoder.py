"""A method on llama-server behind draftlab's `Decoder` interface: one request per generation, the
prompt sent as token ids (after our chat template, as every engine gets them), the response's own
timings and draft counters recorded as `GenerationStats`.

Only one server runs at a time (`ServerPool`): an idle server's threads keep spinning after a request
and would slow whatever runs beside it, so a method's server stops before another's starts, and the
pool stops its server whenever the caller says the engine is idle."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from draftlab.decode.stats import Generation, GenerationStats
from draftlab.engines.llama_server.server import LlamaServer
from draftlab.sampling import SamplingParams


@dataclass
class ServerPool:
    binary: Path
    model: Path
    threads: int
    n_ctx: int
    log: Path
    current: LlamaServer | None = None
    starts: list[float] = field(default_factory=list)  # seconds each start took (untimed in results)

    def server(self, args: list[str]) -> LlamaServer:
        if self.current is not None and self.current.args == list(args) and self.current.process is not None:
            return self.current
        self.close()
        self.current = LlamaServer(self.binary, self.model, args, self.threads, self.n_ctx, self.log).start()
        # Untimed: a fresh server's first request pays for its threads' and buffers' first use.
        self.current.complete(
            {"prompt": [1, 2, 3, 4], "n_predict": 4, "temperature": 0, "cache_prompt": False}
        )
        self.starts.append(self.current.start_s)
        return self.current

    def close(self) -> None:
        if self.current is not None:
            self.current.stop()
            self.current = None


class LlamaServerDecoder:
    """`spec_args`: the server's speculative options for this method (none for plain decoding)."""

    def __init__(
        self, pool: ServerPool, spec_args: list[str], tokenizer, request: dict | None = None
    ) -> None:
        self.pool = pool
        self.spec_args = list(spec_args)
        self.tokenizer = tokenizer
        self.request = dict(request or {})  # per-request settings (speculative.n_max, ...)

    def pause(self) -> None:
        self.pool.close()

    def generate(self, prompt_ids: list[int], max_new_tokens: int, params: SamplingParams) -> Generation:
        server = self.pool.server(self.spec_args)
        payload = {
            "prompt": list(prompt_ids),
            "n_predict": max_new_tokens,
            "temperature": params.temperature,
            "top_k": params.top_k,
            "top_p": params.top_p,
            "min_p": 0.0,
            "seed": params.seed if params.seed is not None else 0,
            "cache_prompt": False,  # every generation pays its prefill, as in every other engine
            "return_tokens": True,
            **self.request,
        }
        t0 = time.perf_counter()
        answer = server.complete(payload)
        wall = time.perf_counter() - t0
        tokens = [int(t) for t in answer.get("tokens") or []]
        timings = answer.get("timings") or {}
        drafted = int(timings.get("draft_n") or 0)
        accepted = int(timings.get("draft_n_accepted") or 0)
        prefill = min(wall, float(timings.get("prompt_ms") or 0.0) / 1000)
        stats = GenerationStats(
            prompt_tokens=len(prompt_ids),
            new_tokens=len(tokens),
            prefill_s=prefill,
            first_tokens=1 if tokens else 0,
            decode_s=wall - prefill,
            drafted=drafted,
            accepted=accepted,
            # One target pass a round: the prompt's (which writes the first token), then one per
            # verified draft or plain step; each round keeps its accepted drafts plus one token.
            rounds=len(tokens) - accepted,
            target_calls=max(len(tokens) - accepted, 1),
        )
        stats.proposer_info.update(
            {
                "server": {
                    k: timings[k]
                    for k in ("prompt_ms", "predicted_ms", "prompt_n", "predicted_n")
                    if k in timings
                }
            }
        )
        text = (
            self.tokenizer.decode(tokens, skip_special_tokens=True)
            if self.tokenizer
            else answer.get("content", "")
        )
        return Generation(tokens, text, stats)
