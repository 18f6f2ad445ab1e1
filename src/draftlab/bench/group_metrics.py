"""All figures of one group of records (a label, overall or within a subtask) against its baseline's.

Definitions of the speculative-decoding figures (per group):

* acceptance_rate = Σ accepted / Σ drafted: the share of drafted tokens that were kept.
* alpha_hat (α̂) = Σ accepted / (Σ accepted + Σ rollbacks): the per-token acceptance probability
  in Leviathan et al. (2023). Each round is a run of i.i.d. Bernoulli(α) trials that stops at the
  first rejection (a rollback) or after γ successes; successes / (successes + failures) is the
  maximum-likelihood estimate of α. accepted/drafted is biased low as an estimate of α, because
  the draft tokens after a rejection were never tried but still count as drafted.
* mean_accepted_length = Σ new tokens / Σ verification rounds: tokens per round, the target's own
  token included (1.0 for AR), as vLLM and Spec-Bench count it.
* cost_ratio c = draft step time / target step time. Draft step = Σ propose_s / Σ propose_calls
  over the group's records; target step = Σ decode_s / Σ (target_calls − 1) over the records of
  plain decoding in the same engine, dtype and passes (AR runs one target forward per decode
  token). `None` when there is no draft forward pass (prompt lookup has no draft model: c = 0
  would be wrong) or no such plain decoding.
* predicted_speedup = (1 − α̂^(γ+1)) / ((1 − α̂)(γc + 1)) (Leviathan et al. 2023, walltime
  improvement; (γ+1)/(γc+1) when α̂ = 1). The model assumes γ drafts per round; a sized method's
  rounds draft the k the sizer chose (k = 0 in most), so for it the same expectation is taken over
  the rounds as run: Σ_k n_k (1 − α̂^(k+1)) / (1 − α̂) / Σ_k n_k (kc + 1). Not computed for BiLD,
  whose blocks end dynamically, nor for token trees, whose rounds are not chains. It models decode
  steps only, so measured_over_predicted divides the decode-only speed-up by it.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence

from draftlab.bench.labels import unique_value
from draftlab.bench.rates import (
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    decode_tokens,
    ratio,
    speedup,
    throughput,
)
from draftlab.bench.records import Record
from draftlab.bench.round_split import round_split
from draftlab.decode.spec import makes_trees


def _elementwise_sum(lists: Iterable[list[int]]) -> list[int]:
    total: list[int] = []
    for values in lists:
        if len(values) > len(total):
            total.extend([0] * (len(values) - len(total)))
        for i, v in enumerate(values):
            total[i] += v
    return total


def _per_round(records: Sequence[Record]) -> bool:
    return all(r.drafted_per_position or not r.drafted for r in records)


def acceptance(records: Sequence[Record]) -> dict:
    """acceptance_rate, α̂ (Leviathan MLE), mean accepted length and per-position acceptance."""
    drafted = sum(r.drafted for r in records)
    accepted = sum(r.accepted for r in records)
    rollbacks = sum(r.rollbacks for r in records)
    target_calls = sum(r.target_calls for r in records)
    rounds = sum(r.rounds for r in records)
    new_tokens = sum(r.new_tokens for r in records)
    d_pos = _elementwise_sum(r.drafted_per_position for r in records)
    a_pos = _elementwise_sum(r.accepted_per_position for r in records)
    a_pos = (a_pos + [0] * (len(d_pos) - len(a_pos)))[: len(d_pos)]
    return {
        "drafted": drafted,
        "accepted": accepted,
        "rollbacks": rollbacks,
        "acceptance_rate": ratio(accepted, drafted),
        # Rejections are counted per round; an engine that reports totals only (llama-server, llama.cpp's
        # own lookup) gives no per-position record, and then no α̂.
        "alpha_hat": ratio(accepted, accepted + rollbacks)
        if drafted and (rollbacks or _per_round(records))
        else None,
        "target_calls": target_calls,
        "rounds": rounds,
        # Tokens per verification round, the target's own token included (vLLM, Spec-Bench): AR is 1.
        "mean_accepted_length": ratio(new_tokens, rounds),
        "drafted_per_position": d_pos,
        "accepted_per_position": a_pos,
        "acceptance_per_position": [ratio(a, d) for a, d in zip(a_pos, d_pos, strict=True)],
    }


def sizing(records: Sequence[Record]) -> dict:
    """Cost-aware sizing: the distribution of k per round, the share of plain rounds (k = 0), probes,
    and the cost curve's predicted speed-up over plain decoding for the rounds that were run
    (Σ ms plain decoding would spend on the expected tokens / Σ predicted ms)."""
    counts = _elementwise_sum(r.k_counts for r in records)
    rounds = sum(counts)
    predicted_ms = sum(r.predicted_ms for r in records)
    dtypes: dict[str, int] = {}
    for r in records:
        if r.dtype:
            dtypes[r.dtype] = dtypes.get(r.dtype, 0) + 1
    timed = sum(r.timed_rounds for r in records)
    paced = sum(r.paced_rounds for r in records)
    return {
        "dtypes": dtypes,  # generations per target dtype (a routed method may use several)
        # Σ measured round ms / Σ ms the cached profile predicted for those rounds
        "profile_fit": ratio(sum(r.measured_ms for r in records), sum(r.profiled_ms for r in records))
        if timed
        else None,
        "timed_rounds": timed,
        "k_counts": counts,
        "k0_share": ratio(counts[0], rounds) if counts else None,
        "mean_k": ratio(sum(k * n for k, n in enumerate(counts)), rounds) if counts else None,
        "probes": sum(r.probes for r in records),
        # rounds that skipped looking for a free draft (decode/pacing.py), of all rounds
        "paced_share": ratio(paced, paced + rounds) if counts else None,
        "cost_predicted_speedup": ratio(sum(r.predicted_plain_ms for r in records), predicted_ms)
        if counts
        else None,
    }


def trees(records: Sequence[Record]) -> dict:
    """Token trees: nodes verified per tree round, the share of tree rounds whose accepted path
    left the proposer's first choice, why a method fell back to chains, and the earlier outputs
    a SuffixDecoding proposer drew on (output label -> generations that used it)."""
    rounds = sum(r.tree_rounds for r in records)
    used: dict[str, int] = {}
    for r in records:
        for name in (r.proposer_info or {}).get("earlier_outputs_used", {}):
            used[name] = used.get(name, 0) + 1
    fallbacks = {r.tree_fallback for r in records if r.tree_fallback}
    return {
        "tree_rounds": rounds,
        "nodes_per_round": ratio(sum(r.tree_nodes for r in records), rounds) if rounds else None,
        "branch_win_share": ratio(sum(r.branch_wins for r in records), rounds) if rounds else None,
        "tree_fallback": "; ".join(sorted(fallbacks)) or None,
        "earlier_outputs_used": used,
    }


def draft_step_s(records: Sequence[Record]) -> float | None:
    """Seconds per draft forward pass while proposing: Σ propose_s / Σ propose_calls."""
    return ratio(sum(r.propose_s for r in records), sum(r.propose_calls for r in records))


def target_step_s(baseline_records: Sequence[Record]) -> float | None:
    """Seconds per target forward pass in decoding, from AR records: Σ decode_s / Σ(target_calls − 1)."""
    calls = sum(max(r.target_calls - 1, 0) for r in baseline_records)
    return ratio(sum(r.decode_s for r in baseline_records), calls)


def cost_ratio(records: Sequence[Record], baseline_records: Sequence[Record]) -> float | None:
    """c = draft step time / target step time; None without draft forward passes or a baseline."""
    draft, target = draft_step_s(records), target_step_s(baseline_records)
    if draft is None or target is None:
        return None
    return draft / target


def predicted_speedup(alpha: float | None, gamma: int | None, c: float | None) -> float | None:
    """Leviathan et al. (2023): (1 − α^(γ+1)) / ((1 − α)(γc + 1)); the limit (γ+1)/(γc+1) at α = 1:
    every round drafting γ tokens."""
    if gamma is None or gamma < 1:
        return None
    return predicted_over_rounds(alpha, c, [0] * gamma + [1])


def predicted_over_rounds(alpha: float | None, c: float | None, k_counts: Sequence[int]) -> float | None:
    """Leviathan et al.'s expectation over rounds that drafted k tokens n_k times each:
    Σ_k n_k (1 − α^(k+1)) / (1 − α) / Σ_k n_k (kc + 1) (a plain round: one token for one step;
    (k + 1) tokens at α = 1)."""
    if alpha is None or c is None or not sum(k_counts):
        return None
    tokens = sum(
        n * (k + 1 if alpha >= 1.0 else (1 - alpha ** (k + 1)) / (1 - alpha)) for k, n in enumerate(k_counts)
    )
    return tokens / sum(n * (k * c + 1) for k, n in enumerate(k_counts))


def greedy_match(records: Sequence[Record]) -> dict:
    """Greedy match: the same tokens as plain decoding in the same engine and dtype (losslessness,
    bench/losslessness.py); baseline match: the same tokens as the baseline's, whatever its dtype."""
    lossless = [r.plain_match for r in records if r.plain_match is not None]
    agree = [r.greedy_match for r in records if r.greedy_match is not None]
    matches, agreeing = sum(1 for m in lossless if m), sum(1 for m in agree if m)
    return {
        "greedy_compared": len(lossless),
        "greedy_matches": matches,
        "greedy_match_rate": ratio(matches, len(lossless)),
        "baseline_compared": len(agree),
        "baseline_matches": agreeing,
        "baseline_match_rate": ratio(agreeing, len(agree)),
    }


def bild_stats(records: Sequence[Record]) -> dict:
    kept = sum(r.draft_tokens_kept for r in records)
    return {
        "fallbacks": sum(r.fallbacks for r in records),
        "draft_tokens_kept": kept,
        "draft_share": ratio(kept, sum(r.new_tokens for r in records)),
    }


def prefill_stats(records: Sequence[Record]) -> dict:
    prefill = [r.prefill_s for r in records]
    dec = sum(decode_tokens(r) for r in records)
    per_token = ratio(sum(r.decode_s for r in records), dec)
    return {
        "prefill_ms_mean": sum(prefill) / len(prefill) * 1000 if prefill else None,
        "prefill_ms_median": statistics.median(prefill) * 1000 if prefill else None,
        "time_per_token_ms": per_token * 1000 if per_token is not None else None,
    }


def group_metrics(
    records: Sequence[Record],
    baseline_records: Sequence[Record],
    *,
    is_baseline: bool = False,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    plain_records: Sequence[Record] | None = None,
) -> dict:
    """All figures of one group (a label, overall or within a subtask) against its baseline's records.

    `plain_records`: plain decoding in the group's own engine, dtype and passes (compiled or eager;
    bench/losslessness.py `same_config_plain`), which c, the predicted speed-up and meas/pred are
    set against; the baseline's records where not given."""
    out: dict = {
        "method": unique_value(r.method for r in records),
        "gamma": unique_value(r.gamma for r in records),
    }
    out.update(throughput(records))
    if is_baseline:
        out.update(
            matched_keys=len({r.key for r in records}),
            speedup=1.0 if out["tokens_per_s"] is not None else None,
            speedup_ci_low=None,
            speedup_ci_high=None,
            decode_speedup=1.0 if out["decode_tokens_per_s"] is not None else None,
            decode_speedup_ci_low=None,
            decode_speedup_ci_high=None,
            measured_speedup=1.0 if out["tokens_per_s"] is not None else None,
            length_gap=0.0,
            projected_keys=0,
        )
    else:
        out.update(speedup(records, baseline_records, resamples=resamples, seed=seed))
    out["is_baseline"] = is_baseline
    out.update(acceptance(records))
    plain = baseline_records if plain_records is None else plain_records
    draft, target = draft_step_s(records), target_step_s(plain)
    c = draft / target if draft is not None and target is not None else None
    out["draft_step_ms"] = draft * 1000 if draft is not None else None
    caught_up = sum(r.catch_up_s for r in records)
    out["catch_up_ms"] = caught_up / len(records) * 1000 if caught_up and records else None
    out["target_step_ms"] = target * 1000 if target is not None else None
    out["cost_ratio"] = c
    out.update(sizing(records))
    predicted = None
    if out["method"] != "bild" and not is_baseline and not makes_trees(out["method"]):
        if out["k_counts"]:
            predicted = predicted_over_rounds(out["alpha_hat"], c, out["k_counts"])
        else:
            predicted = predicted_speedup(out["alpha_hat"], out["gamma"], c)
    out["predicted_speedup"] = predicted
    decode = out["decode_speedup"]
    if plain is not baseline_records and predicted:
        decode = speedup(records, plain, resamples=0)["decode_speedup"]
    out["measured_over_predicted"] = decode / predicted if decode is not None and predicted else None
    out.update(trees(records))
    out.update(greedy_match(records))
    out.update(bild_stats(records))
    out.update(prefill_stats(records))
    out.update(round_split(records))
    return out
