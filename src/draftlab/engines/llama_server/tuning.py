"""llama-server's speculative settings chosen by cost: each drafter's `--spec-draft-n-max` measured on
calibration prompts (the packaged distillation prompts, none of them in the benchmark suites) against
the plain server, and the fastest kept; where no setting pays, the choice is not to draft.

llama-server takes these settings at start only (this version parses no per-request speculative
fields), so each candidate is one server start, untimed; only the requests are timed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from draftlab.engines.llama_server.decoder import LlamaServerDecoder, ServerPool
from draftlab.sampling import SamplingParams

N_MAX_CANDIDATES = (1, 2, 4, 8)
# A setting must beat the plain server by this much on the calibration prompts, or the drafter is off:
# the calibration is short, and a drafter that only ties costs its overhead everywhere else.
MIN_GAIN = 1.03


@dataclass
class Calibration:
    plain_tok_s: float
    rates: dict[str, float] = field(default_factory=dict)  # candidate (n_max, as text) -> tokens/s
    chosen: list[str] = field(default_factory=list)  # the extra server arguments chosen ([]: no drafting)

    def to_dict(self) -> dict:
        best = max(self.rates.values(), default=0.0)
        return {
            "plain_tok_s": round(self.plain_tok_s, 2),
            "tok_s_by_n_max": {k: round(v, 2) for k, v in self.rates.items()},
            "chosen": self.chosen,
            "drafting": bool(self.chosen),
            "best_vs_plain": round(best / self.plain_tok_s, 3) if self.plain_tok_s else None,
        }


def _rate(decoder: LlamaServerDecoder, prompts: list[list[int]], max_new_tokens: int) -> float:
    tokens, seconds = 0, 0.0
    for ids in prompts:
        stats = decoder.generate(ids, max_new_tokens, SamplingParams()).stats
        tokens, seconds = tokens + stats.new_tokens, seconds + stats.total_s
    return tokens / seconds if seconds > 0 else 0.0


def plain_rate(pool: ServerPool, tokenizer, prompts: list[list[int]], max_new_tokens: int) -> float:
    rate = _rate(LlamaServerDecoder(pool, [], tokenizer), prompts, max_new_tokens)
    pool.close()
    return rate


def calibrate(
    pool: ServerPool,
    spec_args: list[str],
    tokenizer,
    prompts: list[list[int]],
    max_new_tokens: int,
    plain_tok_s: float,
    candidates: tuple[int, ...] = N_MAX_CANDIDATES,
    on_candidate: Callable[[], None] | None = None,
) -> Calibration:
    """The n_max whose drafting writes the calibration prompts' greedy answers fastest, or none."""
    result = Calibration(plain_tok_s)
    for n_max in candidates:
        extra = ["--spec-draft-n-max", str(n_max)]
        rate = _rate(LlamaServerDecoder(pool, [*spec_args, *extra], tokenizer), prompts, max_new_tokens)
        result.rates[str(n_max)] = rate
        if on_candidate is not None:
            on_candidate()
    pool.close()
    best = choose_n_max(result.rates, plain_tok_s)
    result.chosen = [*spec_args, "--spec-draft-n-max", best] if best is not None else []
    return result


def choose_n_max(rates: dict[str, float], plain_tok_s: float) -> str | None:
    """The fastest candidate if it beats the plain server by MIN_GAIN; None: drafting does not pay."""
    if not rates:
        return None
    best = max(rates, key=lambda k: rates[k])
    return best if rates[best] > plain_tok_s * MIN_GAIN else None
