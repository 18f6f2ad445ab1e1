"""A method on llama-server behind draftlab's `Decoder` interface: one request per generation, the
prompt sent as token ids (after our chat template, as every engine gets them), the response's own
timings and draft counters recorded as `GenerationStats`.

Only one server runs at a time (`ServerPool`): an idle server's threads keep spinning after a request
and would slow whatever runs beside it, so a method's server stops before another's starts, and the
pool stops its server whenever the caller says the engine is idle."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
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

    def server(self, args: list[str], slots: int = 1) -> LlamaServer:
        current = self.current
        if current is not None and (current.args, current.slots) == (list(args), slots) and current.process:
            return current
        self.close()
        self.current = LlamaServer(
            self.binary, self.model, args, self.threads, self.n_ctx, self.log, slots
        ).start()
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
    """`spec_args`: the server's speculative options for this method (none for plain decoding);
    `per_subtask`, where given, picks them for each example's subtask instead (settings chosen by
    cost per kind of task)."""

    def __init__(
        self,
        pool: ServerPool,
        spec_args: list[str],
        tokenizer,
        request: dict | None = None,
        per_subtask: Callable[[str | None], list[str]] | None = None,
    ) -> None:
        self.pool = pool
        self.spec_args = list(spec_args)
        self.tokenizer = tokenizer
        self.request = dict(request or {})  # per-request settings (speculative.n_max, ...)
        self.per_subtask = per_subtask

    def pause(self) -> None:
        self.pool.close()

    def on_example(self, example) -> None:
        """The bench tells each decoder which example comes next: the settings follow its subtask."""
        if self.per_subtask is not None:
            self.spec_args = list(self.per_subtask(example.subtask))

    def generate(self, prompt_ids: list[int], max_new_tokens: int, params: SamplingParams) -> Generation:
        server = self.pool.server(self.spec_args)
        t0 = time.perf_counter()
        answer = server.complete(self._payload(prompt_ids, max_new_tokens, params))
        return self._generation(prompt_ids, answer, time.perf_counter() - t0)

    def generate_many(
        self, prompts: Sequence[list[int]], max_new_tokens: int, params: Sequence[SamplingParams]
    ) -> list[Generation]:
        """Every prompt at once, on a server with one slot per prompt (`-np`), which batches them
        continuously as a deployment does; each request's own wall time and figures, and the
        batch's wall time (proposer_info) for the concurrency sweep."""
        server = self.pool.server(self.spec_args, slots=len(prompts))

        def one(job: tuple[list[int], SamplingParams]) -> tuple[dict, float]:
            ids, sampling = job
            t0 = time.perf_counter()
            answer = server.complete(self._payload(ids, max_new_tokens, sampling))
            return answer, time.perf_counter() - t0

        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
            answers = list(pool.map(one, zip(prompts, params, strict=True)))
        wall = time.perf_counter() - t0
        generations = []
        for ids, (answer, request_s) in zip(prompts, answers, strict=True):
            generation = self._generation(ids, answer, request_s)
            generation.stats.proposer_info.update(batch_wall_s=wall, requests=len(prompts))
            generations.append(generation)
        return generations

    def _payload(self, prompt_ids: list[int], max_new_tokens: int, params: SamplingParams) -> dict:
        return {
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

    def _generation(self, prompt_ids: list[int], answer: dict, wall: float) -> Generation:
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
                "params": {"server_args": list(self.spec_args)},  # what this generation ran with
                "server": {
                    k: timings[k]
                    for k in ("prompt_ms", "predicted_ms", "prompt_n", "predicted_n")
                    if k in timings
                },
            }
        )
        text = (
            self.tokenizer.decode(tokens, skip_special_tokens=True)
            if self.tokenizer
            else answer.get("content", "")
        )
        return Generation(tokens, text, stats)
