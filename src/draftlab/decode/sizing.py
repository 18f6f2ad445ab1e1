"""Cost-aware round sizing: how many draft tokens to verify next, from what a pass costs here.

Before each round the decoder picks the draft length k that maximises expected tokens per second,

    E[tokens | k] / (draft cost(k) + verify cost(k + 1)),   E[tokens | k] = 1 + Σ_{i<k} Π_{j<=i} α_j,

with costs from the machine's profile at the current context length and α_j the estimated
probability that draft position j is accepted given that the positions before it were. k = 0 is a
plain target step, so when drafting cannot pay the method decodes as plain autoregression does.

Why this stays lossless: k depends only on what happened before the round (the prefix, past
acceptances and, for prompt lookup, the proposal itself, a function of the prefix), never on the
round's own random draws. Speculative sampling is exact for every fixed k (Leviathan et al. 2023,
Theorem 1; Chen et al. 2023), so conditioned on the history each round emits tokens distributed as
the target's; adaptive draft lengths rest on the same argument (SpecDec++, Huang et al. 2024).
Greedy rounds emit the target's argmax tokens for any k.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from draftlab.models.profile import CostCurve

# How much the run's history weighs against the current example, in rounds.
PRIOR_WEIGHT = 4.0
# Per round, older evidence of the current example fades by this factor (acceptance drifts).
EXAMPLE_DECAY = 0.9
# A draft model at k = 0 probes with k = 1 now and then: at most this share of the time goes to
# probing, the gap between probes doubles after each rejected probe, up to 8 times the first gap.
PROBE_BUDGET, PROBE_MIN_GAP, PROBE_BACKOFF = 0.02, 8, 8
# Measured round time / predicted round time is tracked (separately for plain and speculative
# rounds) with this smoothing, so a profile that is off on this run is corrected as it goes.
CALIBRATION_SMOOTHING = 0.1


@dataclass
class CostModel:
    """ms per pass, from the profiles of the target and (for a draft-model method) the draft."""

    target: CostCurve
    draft: CostCurve | None = None

    def verify_ms(self, n: int, context: int) -> float:
        return self.target.forward_ms(n, context)

    def draft_ms(self, k: int, context: int, pending: int = 2) -> float:
        """k draft passes: the first catches up `pending` tokens the draft has not seen yet."""
        if k <= 0 or self.draft is None:
            return 0.0
        # A long lag (the prompt, with a lazy prefill) costs what a prefill of that length costs.
        first = (
            self.draft.prefill(pending)
            if pending > max(self.draft.sizes)
            else self.draft.forward_ms(max(pending, 1), context)
        )
        return first + (k - 1) * self.draft.forward_ms(1, context)


class AcceptanceStats:
    """Per draft position j: rounds that reached j (all earlier positions accepted) and accepted j."""

    def __init__(self) -> None:
        self.reached: list[float] = []
        self.accepted: list[float] = []

    def add(self, drafted: int, accepted: int, weight: float = 1.0) -> None:
        tried = min(drafted, accepted + 1)  # positions after the first rejection were never tried
        while len(self.reached) < tried:
            self.reached.append(0.0)
            self.accepted.append(0.0)
        for j in range(tried):
            self.reached[j] += weight
            self.accepted[j] += weight * (j < accepted)

    def decay(self, factor: float) -> None:
        self.reached = [x * factor for x in self.reached]
        self.accepted = [x * factor for x in self.accepted]

    def rate(self, j: int, prior: float, weight: float) -> float:
        """Posterior mean of α_j with `prior` counted as `weight` pseudo-rounds."""
        reached = self.reached[j] if j < len(self.reached) else 0.0
        accepted = self.accepted[j] if j < len(self.accepted) else 0.0
        return (accepted + weight * prior) / (reached + weight)


@dataclass
class Choice:
    k: int
    expected_tokens: float
    cost_ms: float
    plain_ms: float  # one plain target step at this context
    probe: bool = False


def expected_tokens(alphas: list[float], k: int) -> float:
    """1 (the target's own token) + Σ over draft positions of P(accepted up to there)."""
    total, survive = 1.0, 1.0
    for j in range(k):
        survive *= alphas[j]
        total += survive
    return total


def choose_k(verify_ms, draft_ms, alphas: list[float], k_max: int, context: int) -> tuple[int, float, float]:
    """The k in 0..k_max maximising expected tokens per ms; returns (k, E[tokens], cost ms).

    `verify_ms(n, context)` and `draft_ms(k, context)` give costs; `alphas` has k_max entries.
    Ties go to the smaller k: speculation must earn its place.
    """
    best = (0, 1.0, verify_ms(1, context))
    best_rate = best[1] / best[2]
    for k in range(1, k_max + 1):
        tokens = expected_tokens(alphas, k)
        cost = draft_ms(k, context) + verify_ms(k + 1, context)
        if tokens / cost > best_rate * (1 + 1e-9):
            best, best_rate = (k, tokens, cost), tokens / cost
    return best


@dataclass
class _KindState:
    run: AcceptanceStats = field(default_factory=AcceptanceStats)
    example: AcceptanceStats = field(default_factory=AcceptanceStats)
    proposals: int = 0  # rounds that had a proposal of this kind


@dataclass
class Evidence:
    """What a method has learned about acceptance; sizers of one method in several dtypes share it."""

    kinds: dict[str | None, _KindState] = field(default_factory=dict)
    rounds: int = 0  # rounds sized
    rounds_with_proposal: int = 0
    # Measured / predicted round time, for plain (k = 0) and speculative rounds. Shared by the
    # copies of a routed method: it captures this run's conditions (load, Python overhead), which
    # they have in common, and a copy that was never chosen must not look cheaper for lack of it.
    calibration: dict[bool, float] = field(default_factory=lambda: {False: 1.0, True: 1.0})
    # Tree methods: node-score calibration per source, and the running (E[tokens], nodes) that
    # recent tree rounds were expected to bring.
    tree_scores: dict = field(default_factory=dict)
    tree_gain: list[float] = field(default_factory=list)
    # Recent drafted tree rounds: tokens only the draft proposed and the target accepted, draft
    # nodes verified, draft passes taken (moving averages).
    tree_draft_gain: list[float] = field(default_factory=list)


class RoundSizer:
    """Chooses each round's k for one decoder; keeps a prior across the run's generations.

    `free_drafts` is True for proposers whose drafts cost nothing to make (prompt lookup): they
    propose first and the sizer trims, and at k = 0 the loop compares the unused proposal with
    the tokens the target then writes, so acceptance keeps being learned for free. A draft model
    instead probes with k = 1 now and then, at a bounded cost, so that one bad stretch does not
    switch speculation off for good.
    """

    def __init__(
        self,
        cost: CostModel,
        k_max: int,
        free_drafts: bool,
        prior: float = 0.5,
        evidence: Evidence | None = None,
        calibrate: bool = True,
    ) -> None:
        self.cost = cost
        self.k_max = k_max
        self.free_drafts = free_drafts
        self.initial_prior = prior
        self.evidence = evidence if evidence is not None else Evidence()
        self.kinds = self.evidence.kinds
        self.calibration = self.evidence.calibration
        self.calibrate = calibrate  # False: trust the profile as it is (reproducible choices)
        self.propose_ms = 0.0  # running mean of a free proposer's own time per round
        self._since_probe = 0
        self._misses = 0  # rejected probes in a row

    def share(self, evidence: Evidence) -> None:
        """Learn into (and from) another sizer's evidence: the same method with another dtype."""
        self.evidence = evidence
        self.kinds = evidence.kinds
        self.calibration = evidence.calibration

    def start(self) -> None:
        """A new generation: the example's own evidence starts empty, the run's prior stays."""
        for state in self.kinds.values():
            state.example = AcceptanceStats()

    def _probe_gap(self, context: int, plain: float) -> int:
        """Plain steps between probes, so that probing costs at most PROBE_BUDGET of the time."""
        extra = self.cost.draft_ms(1, context) + self.cost.verify_ms(2, context) - plain
        gap = max(PROBE_MIN_GAP, math.ceil(extra / (PROBE_BUDGET * plain)))
        return gap * min(2**self._misses, PROBE_BACKOFF)

    def _state(self, kind: str | None) -> _KindState:
        return self.kinds.setdefault(kind, _KindState())

    def alphas(self, kind: str | None, n: int) -> list[float]:
        state = self._state(kind)
        out: list[float] = []
        prior = self.initial_prior
        for j in range(n):
            # Where the run has no evidence at depth j, carry the estimate of depth j - 1.
            run_prior = state.run.rate(j, prior, 1.0) if j < len(state.run.reached) else prior
            rate = state.example.rate(j, run_prior, PRIOR_WEIGHT)
            out.append(rate)
            prior = rate
        return out

    def _costs(self, pending: int = 2):
        calibrated = self.calibration

        def draft_ms(k: int, ctx: int) -> float:
            return self.propose_ms if self.free_drafts else self.cost.draft_ms(k, ctx, pending)

        def verify_ms(n: int, ctx: int) -> float:
            # A round's measured cost includes the drafts; the factor applies to the round as a
            # whole, so it is folded into the verify term relative to the draft term.
            return self.cost.verify_ms(n, ctx) * calibrated[n > 1] + (
                (calibrated[True] - 1) * draft_ms(n - 1, ctx) if n > 1 else 0.0
            )

        return verify_ms, draft_ms

    def tokens_per_ms(self, context: int) -> float:
        """Expected decoding rate at this context from the run's evidence (no side effects).

        Rounds without a proposal (no n-gram match) are plain steps; the others take the best k
        for their kind of proposal, weighted by how often each kind came up.
        """
        verify_ms, draft_ms = self._costs()
        plain = 1.0 / verify_ms(1, context)
        evidence = self.evidence
        if self.free_drafts:
            share = evidence.rounds_with_proposal / evidence.rounds if evidence.rounds else 1.0
            weights = {kind: state.proposals for kind, state in self.kinds.items() if state.proposals}
        else:
            share, weights = 1.0, {None: 1}
        if not weights:
            return plain
        total = sum(weights.values())
        speculative = 0.0
        for kind, weight in weights.items():
            alphas = self._run_alphas(kind, self.k_max)
            _, tokens, cost = choose_k(verify_ms, draft_ms, alphas, self.k_max, context)
            speculative += weight / total * tokens / cost
        return share * speculative + (1 - share) * plain

    def _run_alphas(self, kind: str | None, n: int) -> list[float]:
        state = self._state(kind)
        out, prior = [], self.initial_prior
        for j in range(n):
            prior = state.run.rate(j, prior, 1.0) if j < len(state.run.reached) else prior
            out.append(prior)
        return out

    def choose(self, context: int, limit: int, kind: str | None = None, pending: int = 2) -> Choice:
        limit = min(limit, self.k_max)
        plain = self.cost.verify_ms(1, context)
        alphas = self.alphas(kind, limit)
        verify_ms, draft_ms = self._costs(pending)
        self.evidence.rounds += 1
        if limit > 0:
            self.evidence.rounds_with_proposal += 1
            self._state(kind).proposals += 1

        k, tokens, cost = choose_k(verify_ms, draft_ms, alphas, limit, context)
        if k == 0 and not self.free_drafts and limit > 0:
            self._since_probe += 1
            if self._since_probe >= self._probe_gap(context, plain):
                self._since_probe = 0
                tokens = expected_tokens(alphas, 1)
                return Choice(1, tokens, draft_ms(1, context) + verify_ms(2, context), plain, True)
        return Choice(k, tokens, cost, plain)

    def observe_time(self, choice: Choice, measured_ms: float) -> float:
        """Correct the profile by what rounds of this kind really took in this run; returns what the
        profile alone predicted for the round (ms), so that a run can tell a stale profile."""
        if choice.cost_ms <= 0:
            return 0.0
        speculative = choice.k > 0
        profiled = choice.cost_ms / self.calibration[speculative]
        if not self.calibrate:
            return profiled
        ratio = measured_ms / profiled
        ratio = min(max(ratio, 0.25), 4.0)  # one stalled round (a page fault, a GC pause) must not steer
        old = self.calibration[speculative]
        self.calibration[speculative] = old + CALIBRATION_SMOOTHING * (ratio - old)
        return profiled

    def observe(self, drafted: int, accepted: int, kind: str | None = None, probe: bool = False) -> None:
        if drafted <= 0:
            return
        state = self._state(kind)
        state.example.decay(EXAMPLE_DECAY)
        state.example.add(drafted, accepted)
        state.run.add(drafted, accepted)
        if probe:
            self._misses = 0 if accepted else self._misses + 1

    def observe_propose_time(self, ms: float) -> None:
        self.propose_ms = 0.9 * self.propose_ms + 0.1 * ms if self.propose_ms else ms


class Shadow:
    """At k = 0, a free proposal is checked against the tokens the target writes instead."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.kind: str | None = None
        self.matched = 0

    @property
    def active(self) -> bool:
        return bool(self.tokens)

    def begin(self, tokens: list[int], kind: str | None) -> None:
        self.tokens, self.kind, self.matched = list(tokens), kind, 0

    def advance(self, written: list[int]) -> tuple[int, int, str | None] | None:
        """Feed the target's new tokens; returns (tried, accepted, kind) once the shadow ends."""
        for token in written:
            if self.tokens[self.matched] != token:
                return self.end(miss=True)
            self.matched += 1
            if self.matched == len(self.tokens):
                return self.end(miss=False)
        return None

    def end(self, miss: bool = False) -> tuple[int, int, str | None] | None:
        if not self.tokens:
            return None
        out = (self.matched + int(miss), self.matched, self.kind)
        self.tokens, self.matched = [], 0
        return out if out[0] > 0 else None


def break_even_alpha(cost: CostModel, k: int, context: int) -> float | None:
    """The i.i.d. acceptance α above which drafting k tokens a round beats plain decoding (None: never).

    Solves (1 − α^(k+1)) / (1 − α) = (draft cost(k) + verify cost(k + 1)) / verify cost(1) by
    bisection; the left side grows with α, from 1 at α = 0 to k + 1 at α = 1.
    """
    need = (cost.draft_ms(k, context) + cost.verify_ms(k + 1, context)) / cost.verify_ms(1, context)
    if need <= 1.0:
        return 0.0
    if need >= k + 1:
        return None
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        if expected_tokens([mid] * k, k) < need:
            low = mid
        else:
            high = mid
    return high


# Tree rounds: node scores (draft probability, match frequency) are calibrated against what the
# target accepted, per source and score bucket, with the score itself as the prior (EAGLE-2
# observed that draft confidence tracks acceptance); the score counts as this many rounds.
SCORE_BUCKETS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.45, 0.6, 0.75, 0.9)
SCORE_PRIOR_WEIGHT = 2.0
# The node budgets a tree round chooses among (0 is a plain target step).
TREE_BUDGETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
TREE_SMOOTHING = 0.1  # how fast the expected gain of a tree round follows recent rounds


@dataclass
class _Calibration:
    reached: list[float] = field(default_factory=lambda: [0.0] * (len(SCORE_BUCKETS) + 1))
    accepted: list[float] = field(default_factory=lambda: [0.0] * (len(SCORE_BUCKETS) + 1))


def _bucket(score: float) -> int:
    for i, edge in enumerate(SCORE_BUCKETS):
        if score < edge:
            return i
    return len(SCORE_BUCKETS)


class TreeSizer(RoundSizer):
    """Chooses each round's node budget N from the cost curve and the calibrated node scores.

    The proposer builds a candidate tree; each node's chance of being accepted is estimated as
    the calibrated score of every node on its path, and the N most likely nodes are verified,
    with N maximising E[tokens | N] / cost(N), where E = 1 + Σ of those chances and the cost is
    a verification pass over N + 1 tokens (plus, for a free proposer, its own time). N = 0 is a
    plain step. For a draft-model tree, whose drafting costs passes, the decision to draft at all
    is made before drafting, from the gain recent tree rounds were expected to bring, with rare
    probe rounds when drafting does not pay. As for chains, every choice depends only on the
    history, never on the round's own draws, so the rule's exactness holds for each round.
    """

    def __init__(self, cost: CostModel, depth: int, width: int, free_drafts: bool, **kwargs) -> None:
        super().__init__(cost, k_max=depth, free_drafts=free_drafts, **kwargs)
        self.width = width
        self._drafted: tuple[float, float] | None = None  # (draft nodes verified, passes) this round

    @property
    def scores(self) -> dict[str, _Calibration]:
        return self.evidence.tree_scores

    @property
    def gain(self) -> tuple[float, float] | None:
        """The running (E[tokens], nodes) of fitted trees; None before the first."""
        g = self.evidence.tree_gain
        return (g[0], g[1]) if g else None

    def _costs(self, pending: int = 2):
        """A tree's verify cost, calibrated by this run's measured round times; its drafting is
        costed separately (`tree_draft_ms`), never as one draft pass per node."""
        calibrated = self.calibration

        def verify_ms(n: int, ctx: int) -> float:
            return self.cost.verify_ms(n, ctx) * calibrated[n > 1]

        def draft_ms(k: int, ctx: int) -> float:
            return 0.0

        return verify_ms, draft_ms

    # -- calibration -------------------------------------------------------------------------
    def _key(self, proposal, i: int) -> str:
        source = proposal.sources[i] if proposal.sources else "tree"
        return source if source == "draft" or not proposal.kind else f"{source}|{proposal.kind}"

    def accept_chance(self, key: str, score: float) -> float:
        cal = self.scores.get(key)
        b = _bucket(score)
        if cal is None:
            return score
        return (cal.accepted[b] + SCORE_PRIOR_WEIGHT * score) / (cal.reached[b] + SCORE_PRIOR_WEIGHT)

    def observe_tree(self, proposal, path: list[int]) -> None:
        """Every node whose parent was accepted was reached; those on the path were accepted.

        After a drafted round, the tokens that only the draft proposed and the target accepted
        are what drafting really added: the next decision to draft follows that, not the
        calibrated guess, so an over-confident draft stops being trusted after a round or two.
        """
        if self._drafted is not None:
            nodes, passes = self._drafted
            self._drafted = None
            sources = proposal.sources or ["draft"] * len(proposal.tokens)
            added = float(sum(sources[i] == "draft" for i in path))
            _follow(self.evidence.tree_draft_gain, (added, nodes, passes))
        if not proposal.tokens:
            return
        on_path = set(path)
        scores = proposal.scores or [1.0] * len(proposal.tokens)
        for i, p in enumerate(proposal.parent_list()):
            if p >= 0 and p not in on_path:
                continue
            cal = self.scores.setdefault(self._key(proposal, i), _Calibration())
            b = _bucket(scores[i])
            cal.reached[b] += 1
            cal.accepted[b] += float(i in on_path)

    # -- choices -----------------------------------------------------------------------------
    def tree_draft_ms(self, context: int, pending: int) -> float:
        """A draft tree: one catch-up pass, then a pass over `width` leaves per further level, as
        many levels as recent trees grew (they stop early where leaves get unlikely)."""
        if self.cost.draft is None:
            return 0.0
        first = self.cost.draft_ms(1, context, pending)
        drafted = self.evidence.tree_draft_gain
        levels = drafted[2] if drafted else float(self.k_max)
        return first + max(levels - 1.0, 0.0) * self.cost.draft.forward_ms(self.width, context)

    def _round_rate(self, tokens: float, nodes: float, context: int, pending: int) -> float:
        verify_ms, _ = self._costs()
        n = max(1, round(nodes))
        cost = verify_ms(n + 1, context) + (0.0 if self.free_drafts else self.tree_draft_ms(context, pending))
        return tokens / cost

    def expand_threshold(self, context: int) -> float:
        """A draft tree grows one more level only while its best leaf is at least this likely:
        a level costs one draft pass, which must buy at least what that time buys plainly."""
        if self.cost.draft is None:
            return 0.0
        return self.cost.draft.forward_ms(self.width, context) / self.cost.verify_ms(1, context)

    def wants_draft(
        self, context: int, limit: int, pending: int = 2, base: tuple[float, int] = (1.0, 0)
    ) -> Choice | None:
        """Before a draft-model tree: None to draft, or the plain step to take instead.

        `base` is (expected tokens, nodes) of the round without the draft: a plain step, or for a
        hybrid the prompt-lookup tree already found for free. Drafting must add more than it costs,
        judged by what draft nodes brought in recent drafted rounds, with rare probes otherwise.
        """
        verify_ms, _ = self._costs()
        plain = self.cost.verify_ms(1, context)
        self.evidence.rounds += 1
        if limit <= 0:
            return Choice(0, 1.0, verify_ms(1, context), plain)
        drafted = self.evidence.tree_draft_gain
        base_tokens, base_n = base
        without = base_tokens / verify_ms(base_n + 1, context)
        if not drafted:
            return None  # nothing known yet: find out
        gain, nodes, _ = drafted
        draft_ms = self.tree_draft_ms(context, pending)
        with_draft = (base_tokens + gain) / (verify_ms(base_n + round(nodes) + 1, context) + draft_ms)
        if with_draft > without:
            return None
        self._since_probe += 1
        extra = draft_ms + verify_ms(base_n + round(nodes) + 1, context) - verify_ms(base_n + 1, context)
        gap = max(PROBE_MIN_GAP, math.ceil(extra / (PROBE_BUDGET * plain))) * min(
            2**self._misses, PROBE_BACKOFF
        )
        if self._since_probe >= gap:
            self._since_probe = 0
            return None
        return Choice(0, 1.0, verify_ms(1, context), plain)

    def _budget(self, proposal, context: int) -> tuple[list[float], int, float, float]:
        """(node values, best budget N, E[tokens | N], predicted ms of verifying N + 1 tokens)."""
        verify_ms, _ = self._costs()
        scores = proposal.scores or [1.0] * len(proposal.tokens)
        chances = [self.accept_chance(self._key(proposal, i), s) for i, s in enumerate(scores)]
        values = proposal.path_values(chances)
        ranked = sorted(values, reverse=True)
        overhead = self.propose_ms if self.free_drafts else 0.0
        best = (0, 1.0, verify_ms(1, context) + overhead)
        sizes = [n for n in TREE_BUDGETS[1:] if n < len(ranked)] + [len(ranked)] if ranked else []
        for n in sizes:
            tokens, cost = 1.0 + sum(ranked[:n]), verify_ms(n + 1, context) + overhead
            if tokens / cost > best[1] / best[2] * (1 + 1e-9):
                best = (n, tokens, cost)
        return values, *best

    def preview(self, proposal, context: int) -> tuple[float, int]:
        """(E[tokens], nodes) of the best sub-tree of `proposal`, without learning anything."""
        if not proposal.tokens:
            return 1.0, 0
        _, n, tokens, _ = self._budget(proposal, context)
        return tokens, n

    def fit(self, proposal, context: int, drafted_ms: float = 0.0, draft_passes: int = 0):
        """The sub-tree worth verifying now, and the choice made (drafting is already paid)."""
        verify_ms, _ = self._costs()
        plain = self.cost.verify_ms(1, context)
        if self.free_drafts:
            self.evidence.rounds += 1
        if not proposal.tokens:
            return proposal, Choice(0, 1.0, verify_ms(1, context), plain)
        self.evidence.rounds_with_proposal += 1
        values, best_n, best_tokens, best_cost = self._budget(proposal, context)
        chosen = proposal.best(values, best_n) if best_n else proposal.select([])
        _follow(self.evidence.tree_gain, (best_tokens, float(best_n)))
        if drafted_ms > 0:
            # The draft's share of the chosen tree; what it really adds is known after verification.
            sources = chosen.sources or ["draft"] * len(chosen.tokens)
            self._drafted = (float(sum("draft" in x for x in sources)), float(max(draft_passes, 1)))
        return chosen, Choice(best_n, best_tokens, best_cost + drafted_ms, plain)

    def tokens_per_ms(self, context: int) -> float:
        verify_ms, _ = self._costs()
        plain = 1.0 / verify_ms(1, context)
        if self.gain is None:
            return plain
        return max(plain, self._round_rate(*self.gain, context, 2))


def _follow(running: list[float], value: tuple[float, float]) -> None:
    """An exponential moving average kept in place (it is shared by a method's dtype copies)."""
    if not running:
        running.extend(value)
    else:
        running[:] = [r + TREE_SMOOTHING * (v - r) for r, v in zip(running, value, strict=True)]
