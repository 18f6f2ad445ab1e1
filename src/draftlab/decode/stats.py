"""What a generation returns and what it measured: tokens, text and per-round statistics.

No torch: engines other than our loop (vLLM, llama.cpp's own, transformers' generate) and the
reports share these types.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from draftlab.decode.details import RoundDetails

if TYPE_CHECKING:
    from draftlab.proposal import Proposal


@dataclass
class GenerationStats(RoundDetails):
    prompt_tokens: int = 0
    new_tokens: int = 0
    prefill_s: float = 0.0  # time to the first new token(s): prompt processing by every model + round 1
    first_tokens: int = 0  # tokens that the first round produced (out at prefill_s)
    decode_s: float = 0.0  # everything after the first round
    target_calls: int = 0  # target forward passes, the prefill included
    draft_calls: int = 0  # draft forward passes, its prefill included
    drafted: int = 0
    accepted: int = 0
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    rounds: int = 0  # verification rounds: one target pass each (round 1's is the prefill)
    fallbacks: int = 0  # BiLD: blocks the small model ended by handing over
    rollbacks: int = 0  # BiLD: blocks in which the large model overruled a small-model token
    draft_tokens_kept: int = 0  # tokens in the output that the proposer wrote
    propose_s: float = 0.0  # wall time inside the proposer's propose (not the sizer's choice around it)
    propose_calls: int = 0  # draft forward passes made while proposing (its prefill excluded)

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens per verification round, the target's own token included (vLLM, Spec-Bench); AR is 1."""
        return self.new_tokens / self.rounds if self.rounds else None

    @property
    def draft_share(self) -> float | None:
        return self.draft_tokens_kept / self.new_tokens if self.new_tokens else None

    @property
    def tokens_per_s(self) -> float | None:
        return self.new_tokens / self.total_s if self.total_s > 0 else None

    def record_choice(self, k: int, tokens: float, cost_ms: float, plain_ms: float, probe: bool) -> None:
        while len(self.k_counts) <= k:
            self.k_counts.append(0)
        self.k_counts[k] += 1
        self.probes += int(probe)
        self.predicted_tokens += tokens
        self.predicted_ms += cost_ms
        self.predicted_plain_ms += tokens * plain_ms

    def record_timing(self, profiled_ms: float, measured_ms: float) -> None:
        if profiled_ms > 0:
            self.timed_rounds += 1
            self.profiled_ms += profiled_ms
            self.measured_ms += measured_ms

    def to_dict(self) -> dict:
        out = asdict(self)
        for name in ("total_s", "acceptance_rate", "mean_accepted_length", "draft_share", "tokens_per_s"):
            out[name] = getattr(self, name)
        return out

    def record_tree(self, proposal: Proposal, path: list[int]) -> None:
        """Tree rounds: nodes verified, and whether the accepted path left the first-child chain.
        A round with no node (a plain step) is not a tree round; the sizing figures count it."""
        if not proposal.tokens:
            return
        self.tree_rounds += 1
        self.tree_nodes += len(proposal.tokens)
        first = proposal.top_path()
        self.branch_wins += int(path != first[: len(path)])

    def record_round(self, drafted: int, accepted: int) -> None:
        self.rounds += 1
        self.drafted += drafted
        self.accepted += accepted
        for position in range(drafted):
            if position == len(self.drafted_per_position):
                self.drafted_per_position.append(0)
                self.accepted_per_position.append(0)
            self.drafted_per_position[position] += 1
            self.accepted_per_position[position] += int(position < accepted)


@dataclass
class Generation:
    tokens: list[int]
    text: str
    stats: GenerationStats
