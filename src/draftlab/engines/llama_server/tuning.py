"""llama-server's speculative settings chosen by cost, per kind of task: each drafter's
length setting measured on calibration prompts (the packaged distillation prompts, none of them
in the benchmark suites, grouped by subtask) against the plain server, and for each subtask the
fastest setting kept; where no setting pays on a subtask, the choice there is not to draft.

Each drafter has its own length knob (common/speculative.cpp): a draft model's or head's chain stops
at --spec-draft-n-max; ngram-mod drafts between --spec-ngram-mod-n-min and -n-max tokens;
ngram-simple and ngram-map-k draft their m-gram (--spec-ngram-*-size-m); ngram-cache drafts a fixed
8 (no knob: on or off). Each drafter's candidates include llama-server's default.

A drafter pays on one kind of task and loses on another (n-grams on summaries versus on open
questions), so one setting for the whole suite either gives up the first or pays the second.

llama-server takes these settings at start only (this version parses no per-request speculative
fields), so each candidate is one server start, untimed; only the requests are timed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from draftlab.decode.timing import collector_paused
from draftlab.engines.llama_server.decoder import LlamaServerDecoder, ServerPool
from draftlab.sampling import SamplingParams

# Per --spec-type: candidate settings from the shortest drafts to the longest (label -> arguments).
CANDIDATES: dict[str, dict[str, list[str]]] = {
    "draft": {f"n-max {n}": ["--spec-draft-n-max", str(n)] for n in (1, 2, 3, 4, 8)},  # default 3
    "ngram-mod": {
        "n 1-4": ["--spec-ngram-mod-n-min", "1", "--spec-ngram-mod-n-max", "4"],
        "n 4-16": ["--spec-ngram-mod-n-min", "4", "--spec-ngram-mod-n-max", "16"],
        "n 48-64": ["--spec-ngram-mod-n-min", "48", "--spec-ngram-mod-n-max", "64"],  # default
    },
    "ngram-simple": {f"size-m {m}": ["--spec-ngram-simple-size-m", str(m)] for m in (4, 16, 48)},
    "ngram-map-k": {f"size-m {m}": ["--spec-ngram-map-k-size-m", str(m)] for m in (4, 16, 48)},
    "ngram-cache": {"on": []},
}


def length_args(spec_type: str, gamma: int) -> list[str] | None:
    """The arguments that cap a drafter's drafts at γ tokens; None for ngram-cache (a fixed 8)."""
    kind = spec_type.split(",")[0]
    if "draft-" in spec_type:
        return ["--spec-draft-n-max", str(gamma)]
    if kind == "ngram-mod":
        return ["--spec-ngram-mod-n-min", "1", "--spec-ngram-mod-n-max", str(gamma)]
    if kind in ("ngram-simple", "ngram-map-k"):
        return [f"--spec-{kind}-size-m", str(gamma)]
    return None


def candidates_for(spec_type: str) -> dict[str, list[str]]:
    """The candidate settings of a --spec-type (a combination is tuned by its draft model's chain)."""
    types = spec_type.split(",")
    if any(t.startswith("draft-") for t in types):
        return CANDIDATES["draft"]
    return CANDIDATES[types[0]]


# A setting must beat the plain server by this much on a subtask's calibration prompts, or the
# drafter is off there: the calibration is short, and a drafter that only ties costs its overhead.
MIN_GAIN = 1.03
ALL = "*"  # the pooled rates: the choice for a subtask the calibration prompts do not cover

Prompts = dict[str, list[list[int]]]  # subtask -> token ids of its calibration prompts


@dataclass
class Calibration:
    plain: dict[str, float]  # subtask (and ALL) -> the plain server's tokens/s
    rates: dict[str, dict[str, float]] = field(default_factory=dict)  # setting -> subtask -> tokens/s
    chosen: dict[str, str | None] = field(default_factory=dict)  # subtask -> setting, None: no drafting
    options: dict[str, list[str]] = field(default_factory=dict)  # setting -> its server arguments

    def server_args(self, spec_args: list[str], subtask: str | None) -> list[str]:
        """The server's options for a generation of this subtask ([]: plain decoding)."""
        setting = self.chosen.get(subtask or ALL, self.chosen.get(ALL))
        return [*spec_args, *self.options[setting]] if setting is not None else []

    def to_dict(self) -> dict:
        """Per subtask; the pooled figures (the choice for subtasks the calibration lacks) apart."""

        def per_subtask(values: dict) -> dict:
            return {k: round(v, 2) if isinstance(v, float) else v for k, v in values.items() if k != ALL}

        return {
            "plain_tok_s": per_subtask(self.plain),
            "tok_s_by_setting": {n: per_subtask(r) for n, r in self.rates.items()},
            "chosen": per_subtask(self.chosen),  # null: no drafting on that subtask
            "settings": self.options,
            "pooled": {
                "plain_tok_s": round(self.plain.get(ALL, 0.0), 2),
                "tok_s_by_setting": {n: round(r.get(ALL, 0.0), 2) for n, r in self.rates.items()},
                "chosen": self.chosen.get(ALL),
            },
        }

    @classmethod
    def from_dict(cls, data: dict) -> Calibration:
        pooled = data["pooled"]
        plain = {**data["plain_tok_s"], ALL: pooled["plain_tok_s"]}
        rates = {n: {**r, ALL: pooled["tok_s_by_setting"][n]} for n, r in data["tok_s_by_setting"].items()}
        chosen = {**data["chosen"], ALL: pooled["chosen"]}
        return cls(plain, rates, chosen, {k: list(v) for k, v in data["settings"].items()})


def _rates(decoder: LlamaServerDecoder, prompts: Prompts, max_new_tokens: int) -> dict[str, float]:
    """Tokens/s per subtask (Σ tokens / Σ seconds) and pooled over all of them (ALL)."""
    sums: dict[str, list[float]] = {}
    for subtask, group in prompts.items():
        for ids in group:
            with collector_paused():  # timed as the bench times (decode/timing.py)
                stats = decoder.generate(ids, max_new_tokens, SamplingParams()).stats
            for key in (subtask, ALL):
                tokens, seconds = sums.setdefault(key, [0.0, 0.0])
                sums[key] = [tokens + stats.new_tokens, seconds + stats.total_s]
    return {key: tokens / seconds if seconds > 0 else 0.0 for key, (tokens, seconds) in sums.items()}


def plain_rates(pool: ServerPool, tokenizer, prompts: Prompts, max_new_tokens: int) -> dict[str, float]:
    rates = _rates(LlamaServerDecoder(pool, [], tokenizer), prompts, max_new_tokens)
    pool.close()
    return rates


def calibrate(
    pool: ServerPool,
    spec_args: list[str],
    tokenizer,
    prompts: Prompts,
    max_new_tokens: int,
    plain: dict[str, float],
    candidates: dict[str, list[str]],
    on_candidate: Callable[[], None] | None = None,
) -> Calibration:
    """Each candidate from the shortest drafts up, until one improves on no subtask (a longer draft
    only adds verification cost once acceptance has run out), then the choice per subtask."""
    result = Calibration(dict(plain), options=dict(candidates))
    for label, extra in candidates.items():
        decoder = LlamaServerDecoder(pool, [*spec_args, *extra], tokenizer)
        rates = _rates(decoder, prompts, max_new_tokens)
        improved = not result.rates or any(
            rate > max(r.get(key, 0.0) for r in result.rates.values()) for key, rate in rates.items()
        )
        result.rates[label] = rates
        if on_candidate is not None:
            on_candidate()
        if not improved:
            break
    pool.close()
    result.chosen = choose_per_subtask(result.rates, plain)
    return result


def choose_per_subtask(rates: dict[str, dict[str, float]], plain: dict[str, float]) -> dict[str, str | None]:
    """For each subtask of the plain rates (ALL included), the setting chosen there."""
    return {
        subtask: choose_setting({n: r[subtask] for n, r in rates.items() if subtask in r}, plain[subtask])
        for subtask in plain
    }


def choose_setting(rates: dict[str, float], plain_tok_s: float) -> str | None:
    """The fastest candidate if it beats the plain server by MIN_GAIN; None: drafting does not pay."""
    if not rates:
        return None
    best = max(rates, key=lambda k: rates[k])
    return best if rates[best] > plain_tok_s * MIN_GAIN else None
