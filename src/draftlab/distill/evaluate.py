"""How well a draft serves its target: greedy SPS acceptance and tokens/s against plain AR decoding."""

from __future__ import annotations

import json
from pathlib import Path

from draftlab.decode.build import build_decoder
from draftlab.decode.spec import DecoderConfig
from draftlab.errors import DraftlabError
from draftlab.models.loading import LoadedModel
from draftlab.models.prompting import encode_prompt
from draftlab.sampling import SamplingParams


def eval_prompts(path: Path, per_category: int) -> list[tuple[str, str]]:
    """(category, first user turn) for the first `per_category` prompts of each category."""
    picked: list[tuple[str, str]] = []
    counts: dict[str, int] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise DraftlabError(f"cannot read evaluation prompts '{path}': {exc.strerror or exc}") from None
    for line in lines:
        if not line.strip():
            continue
        record = json.loads(line)
        category = str(record.get("category", "general"))
        text = record["turns"][0] if record.get("turns") else record.get("prompt")
        if not text or counts.get(category, 0) >= per_category:
            continue
        counts[category] = counts.get(category, 0) + 1
        picked.append((category, text))
    return picked


def evaluate_pair(
    target: LoadedModel,
    draft: LoadedModel,
    prompts: list[tuple[str, str]],
    gamma: int = 4,
    max_new_tokens: int = 64,
    chat: bool = True,
    method: str = "sps",
) -> dict:
    """Greedy AR and `method` (sps, or eagle with a head as the draft) on every prompt, interleaved
    in one process so both see the same machine. The `sps_*` keys are the method's."""
    params = SamplingParams()
    ar = build_decoder(DecoderConfig(method="ar"), target)
    sps = build_decoder(DecoderConfig(method=method, gamma=gamma), target, draft)
    encoded = [encode_prompt(target, text, chat=chat) for _, text in prompts]
    if encoded:  # warm-up: first calls pay for allocations and kernel selection
        ar.generate(encoded[0], 4, params)
        sps.generate(encoded[0], 4, params)
    per_prompt = []
    totals = {
        "ar_tokens": 0,
        "ar_s": 0.0,
        "sps_tokens": 0,
        "sps_s": 0.0,
        "drafted": 0,
        "accepted": 0,
        "rounds": 0,
    }
    for i, ((category, _), ids) in enumerate(zip(prompts, encoded, strict=True)):
        order = (ar, sps) if i % 2 == 0 else (sps, ar)
        results = {}
        for decoder in order:
            results[decoder is sps] = decoder.generate(ids, max_new_tokens, params)
        a, s = results[False], results[True]
        totals["ar_tokens"] += a.stats.new_tokens
        totals["ar_s"] += a.stats.total_s
        totals["sps_tokens"] += s.stats.new_tokens
        totals["sps_s"] += s.stats.total_s
        totals["drafted"] += s.stats.drafted
        totals["accepted"] += s.stats.accepted
        totals["rounds"] += s.stats.rounds
        per_prompt.append(
            {
                "category": category,
                "acceptance_rate": s.stats.acceptance_rate,
                "same_tokens": a.tokens == s.tokens,
                "ar_tokens_per_s": a.stats.tokens_per_s,
                "sps_tokens_per_s": s.stats.tokens_per_s,
            }
        )
    rates = [p["acceptance_rate"] for p in per_prompt if p["acceptance_rate"] is not None]
    ar_tps = totals["ar_tokens"] / totals["ar_s"] if totals["ar_s"] else None
    sps_tps = totals["sps_tokens"] / totals["sps_s"] if totals["sps_s"] else None
    return {
        "prompts": len(prompts),
        "method": method,
        "gamma": gamma,
        "max_new_tokens": max_new_tokens,
        "chat": chat,
        "mean_acceptance_rate": sum(rates) / len(rates) if rates else None,
        "pooled_acceptance_rate": totals["accepted"] / totals["drafted"] if totals["drafted"] else None,
        # Tokens per verification round, the target's own included (the prefill round counts too).
        "mean_accepted_length": totals["sps_tokens"] / totals["rounds"] if totals["rounds"] else None,
        "ar_tokens_per_s": ar_tps,
        "sps_tokens_per_s": sps_tps,
        "speedup": sps_tps / ar_tps if ar_tps and sps_tps else None,
        "all_outputs_match": all(p["same_tokens"] for p in per_prompt),
        "per_prompt": per_prompt,
    }
