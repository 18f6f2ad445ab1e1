"""What a generation records about how its rounds were sized and shaped (no torch: reports read it).

A benchmark record carries the same fields, so both derive from this one declaration.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass(kw_only=True)
class RoundDetails:
    # Cost-aware sizing (empty without it): rounds per chosen draft length k (trees: node budget),
    # probes made at k = 0, and the cost curve's prediction for the rounds run: Σ expected
    # tokens, Σ ms, and Σ ms that plain decoding would have spent on those expected tokens.
    dtype: str | None = None  # the target's dtype for this generation (a routed method may vary it)
    k_counts: list[int] = field(default_factory=list)
    probes: int = 0
    predicted_tokens: float = 0.0
    predicted_ms: float = 0.0
    predicted_plain_ms: float = 0.0
    # Rounds after the first, timed: Σ ms the cached profile alone predicted for them and Σ ms they
    # took. A ratio far from 1 over many rounds means the profile no longer fits this machine.
    timed_rounds: int = 0
    profiled_ms: float = 0.0
    measured_ms: float = 0.0
    # Token trees: rounds that verified a tree, Σ nodes verified in them, and rounds whose accepted
    # path went through a node that is not its parent's first child; why a tree method ran chains
    # (no 4D-mask support), and what its proposer reports (SuffixDecoding: earlier outputs used).
    tree_rounds: int = 0
    tree_nodes: int = 0
    branch_wins: int = 0
    tree_fallback: str | None = None
    proposer_info: dict = field(default_factory=dict)
    # Proposing in rounds whose draft first caught up on more tokens than a pass holds (a lazily
    # prefilled draft or head reading the prompt, or what was written while it did not draft),
    # kept out of c's step
    # (in stop 80's default run it made eagle-tree's draft step read 0.94 of a target step).
    catch_up_s: float = 0.0
    # Free drafts: rounds run without looking for one, since recent proposals went unverified
    # (decode/pacing.py); neither sized (k_counts) nor timed.
    paced_rounds: int = 0
    # Where the decode rounds' time went (every round after the first, whose pass is the prefill):
    # Σ s in the target's pass itself (its model's forward or compiled runner, the device
    # synchronized after it), in making that pass's inputs (tensors, masks, padding) and reading
    # its rows, in the proposer, and in the acceptance rule with the caches' bookkeeping (keep the
    # accepted path, crop, roll back). The rest of decode_s is the loop's own work: sizing,
    # statistics, Python (bench/round_split.py).
    pass_s: float = 0.0
    inputs_s: float = 0.0
    draft_s: float = 0.0
    accept_s: float = 0.0

    def round_details(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(RoundDetails)}
