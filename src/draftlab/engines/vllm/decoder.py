"""The vLLM engine: our methods through vLLM's offline `LLM` API, measured as our own loop is.

vLLM fixes the speculative config when an `LLM` is built, so each method gets its own `LLM`
(`EnginePool`), built on first use and kept alive while memory allows. A generation is one
`LLM.generate` call on the prompt's token ids (the same ids our loop gets), timed as a whole.
Acceptance figures are vLLM's own counters, read before and after each call
(`vllm:spec_decode_*` from `LLM.get_metrics()`), with the per-step detail of its per-request
spec-decode metrics where the version has them; nothing vLLM counts is estimated here.

vLLM is imported only when this engine runs: `draftlab` itself never needs it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from draftlab.decode.spec import DecoderConfig
from draftlab.decode.stats import Generation, GenerationStats
from draftlab.engines.vllm.config import EngineArgs, import_vllm, speculative_config
from draftlab.engines.vllm.counters import (
    delta_counters,
    fill_stats,
    own_counters,
    read_counters,
    wall_of_request,
)
from draftlab.errors import DraftlabError, first_line
from draftlab.sampling import SamplingParams


def _reason(exc: BaseException) -> str:
    """One line naming the bad argument: pydantic's first error (vLLM's configs are pydantic), else
    the exception's first line."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
            where = ".".join(str(part) for part in first.get("loc", ()))
            where = f"{where}: " if where else ""
            got = repr(first.get("input"))
            # A check over the whole config (e.g. heads divisible by the tensor parallel size) gets
            # the whole config as its input: the message alone names the bad value then.
            return f"{where}{first.get('msg', '')}" + (f" (got {got})" if len(got) <= 80 else "")
        except (TypeError, IndexError, AttributeError):
            pass
    return first_line(exc)


def run_generate(llm, inputs: list, sampling, key: str) -> list:
    """`LLM.generate`, with a dead engine as one line."""
    from vllm.v1.engine.exceptions import EngineDeadError  # noqa: PLC0415

    try:
        return llm.generate(inputs, sampling, use_tqdm=False)
    except EngineDeadError:
        # Its engine process wrote the cause to stderr (on a CPU, e.g. an attention head size its
        # kernels lack: stories260K's head_dim of 8).
        raise DraftlabError(
            f"vllm's engine for '{key}' died while generating (the lines above say why; "
            "VLLM_LOGGING_LEVEL=INFO shows more)"
        ) from None


class EnginePool:
    """One `vllm.LLM` per method, built on first use; at most `max_alive` at once (oldest shut down)."""

    def __init__(
        self,
        model: str,
        tokenizer: str,
        dtype: str,
        seed: int,
        args: EngineArgs,
        max_alive: int = 0,
        warmup_ids: Sequence[int] = (),
    ):
        self.model, self.tokenizer, self.dtype, self.seed, self.args = model, tokenizer, dtype, seed, args
        self.max_alive = max_alive  # 0: no limit
        self.warmup_ids = list(warmup_ids)  # a first generate after every build, untimed
        self.alive: dict[str, Any] = {}
        self.load_s: dict[str, float] = {}
        self.resolved: dict[str, dict] = {}
        self.at_once = 1  # LLMs alive together (set by whoever knows how many methods run)

    def get(self, key: str, speculative: dict | None):
        if key in self.alive:
            return self.alive[key]
        vllm = import_vllm()
        from vllm.platforms import current_platform  # noqa: PLC0415 - vLLM is optional

        if current_platform.is_cpu():
            self.args.bind_cpu_threads()
        while self.max_alive and len(self.alive) >= self.max_alive:
            self.shutdown(next(iter(self.alive)))
        kwargs = self.args.kwargs(self.dtype, self.seed)
        if self.at_once > 1:
            # Each LLM would otherwise claim 90% of a GPU for itself (vLLM's default); they share it.
            kwargs.setdefault("gpu_memory_utilization", round(0.85 / self.at_once, 3))
        if speculative is not None:
            kwargs["speculative_config"] = speculative
            kwargs.setdefault("per_request_spec_decode_metrics", "detailed")
        t0 = time.perf_counter()
        try:
            llm = vllm.LLM(model=self.model, tokenizer=self.tokenizer, **kwargs)
        except (TypeError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
            raise DraftlabError(f"vllm refused the engine arguments for '{key}': {_reason(exc)}") from None
        except (OSError, RuntimeError) as exc:  # a model it cannot find, an engine that cannot start
            raise DraftlabError(f"vllm could not start the engine for '{key}': {_reason(exc)}") from None
        self.load_s[key] = time.perf_counter() - t0
        self.alive[key] = llm
        parallel = llm.llm_engine.vllm_config.parallel_config
        # What vLLM actually runs with, recorded with every generation.
        self.resolved[key] = {
            "tensor_parallel_size": parallel.tensor_parallel_size,
            "pipeline_parallel_size": parallel.pipeline_parallel_size,
            "distributed_executor_backend": str(parallel.distributed_executor_backend),
            "load_s": round(self.load_s[key], 2),
        }
        if self.dtype == "auto":  # record what vLLM chose
            self.dtype = str(llm.llm_engine.model_config.dtype).removeprefix("torch.")
        if self.warmup_ids:
            warm = vllm.SamplingParams(temperature=0.0, max_tokens=8, detokenize=False)
            run_generate(llm, [{"prompt_token_ids": self.warmup_ids}], warm, key)
        return llm

    def shutdown(self, key: str) -> None:
        """Stop one LLM's engine processes now (a later one may need the memory)."""
        llm = self.alive.pop(key, None)
        if llm is None:
            return
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None and callable(getattr(core, "shutdown", None)):
            core.shutdown()
        del llm
        import gc  # noqa: PLC0415

        gc.collect()

    def close(self) -> None:
        for key in list(self.alive):
            self.shutdown(key)


class VllmDecoder:
    """A `Decoder` (decode/spec.py) that runs one method through vLLM."""

    def __init__(
        self,
        pool: EnginePool,
        config: DecoderConfig,
        tokenizer,
        eos_token_ids: Sequence[int],
        draft_path: str | None = None,
        speculator: str | None = None,
    ) -> None:
        self.pool, self.config, self.tokenizer = pool, config, tokenizer
        self.eos = sorted(eos_token_ids)
        overrides = pool.args.extra.get("speculative_config")
        if overrides is not None and not isinstance(overrides, dict):
            raise DraftlabError(f"--vllm-arg speculative_config must be a JSON object, got {overrides!r}")
        self.speculative = speculative_config(config, draft_path, speculator, overrides)
        self.key = config.method

    @property
    def llm(self):
        return self.pool.get(self.key, self.speculative)

    def sampling_params(self, max_new_tokens: int, params: SamplingParams):
        vllm = import_vllm()
        return vllm.SamplingParams(
            temperature=params.temperature,
            top_k=params.top_k,
            top_p=params.top_p,
            seed=params.seed if not params.greedy else None,
            max_tokens=max_new_tokens,
            stop_token_ids=self.eos,  # the same end tokens as our loop: the target's generation config
            detokenize=False,
        )

    def generate(self, prompt_ids: list[int], max_new_tokens: int, params: SamplingParams) -> Generation:
        return self.generate_many([prompt_ids], max_new_tokens, [params])[0]

    def generate_many(
        self, prompts: Sequence[list[int]], max_new_tokens: int, params: Sequence[SamplingParams]
    ) -> list[Generation]:
        """Submit every prompt at once (concurrency = len(prompts)); each gets its own figures.

        The counters are per call; with one prompt they are that request's, with several they are
        split by each request's own per-step detail (vLLM's per-request spec-decode metrics).
        """
        llm = self.llm
        inputs = [{"prompt_token_ids": list(ids)} for ids in prompts]
        sampling = [self.sampling_params(max_new_tokens, p) for p in params]
        before = read_counters(llm) if self.speculative else {}
        t0 = time.perf_counter()
        outputs = run_generate(llm, inputs, sampling, self.key)
        wall = time.perf_counter() - t0
        counters = delta_counters(before, read_counters(llm)) if self.speculative else {}
        results = []
        for ids, output in zip(prompts, outputs, strict=True):
            tokens = list(output.outputs[0].token_ids)
            stats = GenerationStats(prompt_tokens=len(ids), dtype=self.pool.dtype)
            # Per-request detail where the version has it: with several LLMs in one process only the
            # newest one's counters stay registered, and with several requests they are shared.
            own = own_counters(output)
            mine = own if own else (counters if len(prompts) == 1 else {})
            request_s = wall if len(prompts) == 1 else wall_of_request(output, wall)
            fill_stats(stats, len(tokens), request_s, output, mine)
            stats.proposer_info.update(
                batch_wall_s=wall, requests=len(prompts), **self.pool.resolved.get(self.key, {})
            )
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            results.append(Generation(tokens, text, stats))
        return results
