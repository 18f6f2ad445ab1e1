"""vLLM's own spec-decode counters, read around each call, as draftlab's `GenerationStats`: nothing
vLLM counts is estimated here."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from draftlab.decode.stats import GenerationStats

COUNTERS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
)
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"


def delta_counters(before: dict, after: dict) -> dict:
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


def own_counters(output) -> dict:
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


def wall_of_request(output, wall: float) -> float:
    """A concurrent request's latency: from its arrival to its last token (within the batch's wall)."""
    metrics = getattr(output, "metrics", None)
    queued, last = getattr(metrics, "queued_ts", 0.0), getattr(metrics, "last_token_ts", 0.0)
    return min(last - queued, wall) if queued and last > queued else wall
