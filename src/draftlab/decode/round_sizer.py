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

from draftlab.decode.cost import CostModel, choose_k, expected_tokens

# How much the run's history weighs against the current example, in rounds; also how much a kind's
# parent (see `parent_kind`) weighs against the kind's own record in the run.
PRIOR_WEIGHT = 4.0
# Per round, older evidence of the current example fades by this factor (acceptance drifts).
EXAMPLE_DECAY = 0.9
# A draft model at k = 0 probes with k = 1 now and then: at most this share of the time goes to
# probing, the gap between probes doubles after each rejected probe, up to 8 times the first gap.
# Each generation also probes at once, and a probe that paid for itself is followed by another at
# once: a head's α differs by task far more than the run's average shows (0.06 to 0.84 measured),
# so what earlier generations taught must not keep a generation from finding out for itself. Such
# a probe at once may cost at most this many plain steps more than the plain step it replaces.
PROBE_BUDGET, PROBE_MIN_GAP, PROBE_BACKOFF, PROBE_AT_ONCE_MAX = 0.02, 8, 8, 1.0
# A draft that has not seen the prompt (a lazy prefill) catches up in its first pass: a cost paid
# once, which drafting repays over the rest of the generation, if at all. Probes are priced with
# it; and a probe, or a first draft where the run knows nothing yet, pays it only where it is at
# most this share of the plain time left. Priced as a 2-token catch-up, `sps compiled` probed on a
# 585-token prompt with an 18-token answer and took 15.5 ms a token against plain decoding's 8.0
# (AMD Zen4).
CATCH_UP_SHARE = 0.1
# Measured / predicted time is tracked for the target's one-token passes, its passes of several
# tokens and the draft model's passes, each with this smoothing (recent rounds weigh most), so a
# profile that is off on this run, or a machine that became busy, is corrected as it goes: on a
# 2-core machine sharing its cores with a download, draft-tree rounds ran 2-3x slower than the
# profile said and lost (0.55-0.66x) while the uncalibrated draft passes still looked cheap. While
# rounds are plain, the factor of passes of several tokens relaxes toward the plain one by
# CALIBRATION_RELAX a round: what made them dear (another process) may have gone, and only a drafted
# round can tell.
CALIBRATION_SMOOTHING = 0.2
CALIBRATION_RELAX = 0.02
# Realised / expected gain of drafted rounds (tokens beyond the target's own one). The sizer drafts
# when its estimate is high, so when it drafts the estimate is high more often than not: on the
# llama.cpp Q4_1 target (AMD Zen5) prompt-lookup rounds of the class "3-gram agreeing on 4-7"
# were drafted at an expected 4.4 tokens and brought 3.4, and lost where a draft of 6-7 tokens
# costs 4 plain steps, while "agreeing on 16+" brought what it expected. So per kind of proposal,
# drafted rounds' expected gains are scaled by that kind's ratio over its recent drafted rounds
# (sums decayed by GAIN_DECAY a round, GAIN_PRIOR tokens of pseudo-evidence at ratio 1), and only
# ever down: drafting beyond what the evidence says is how rounds lose, the opposite only forgoes.
GAIN_DECAY, GAIN_PRIOR, GAIN_FLOOR = 0.97, 4.0, 0.25


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
    gain: float = 1.0  # the factor on expected gain that the choice applied (`RoundSizer.gain_factor`)
    kind: str | None = None  # the kind of proposal it was made for
    # What the profile alone predicts for the round's target pass and for its draft-model passes
    # (uncalibrated; 0: no draft model), against which the measured times calibrate.
    verify_raw: float = 0.0
    draft_raw: float = 0.0


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
    # Measured / predicted time of the target's one-token passes (False), of its passes of several
    # tokens (True) and of the draft model's passes ("draft"). Shared by the copies of a routed
    # method: it captures this run's conditions (load, Python overhead), which they have in common,
    # and a copy that was never chosen must not look cheaper for lack of it.
    calibration: dict = field(default_factory=lambda: {False: 1.0, True: 1.0, "draft": 1.0})
    # Per kind of proposal, drafted rounds' realised and expected gains (decayed sums), for
    # `RoundSizer.gain_factor`.
    gains: dict[str | None, list[float]] = field(default_factory=dict)
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
        self.clock = cost.clock  # what the loop times rounds and proposals with, for this sizer
        self.k_max = k_max
        self.free_drafts = free_drafts
        self.initial_prior = prior
        self.evidence = evidence if evidence is not None else Evidence()
        self.kinds = self.evidence.kinds
        self.calibration = self.evidence.calibration
        self.calibrate = calibrate  # False: trust the profile as it is (reproducible choices)
        self.propose_ms = 0.0  # running mean of a free proposer's own time per round
        self._since_probe = 0
        self._misses = 0  # rejected probes in a row, this generation
        self._probe_next = True  # the next round that would be plain probes instead
        self._probe_extra = 0.0  # what the probe in flight costs over a plain step, in plain steps

    def share(self, evidence: Evidence) -> None:
        """Learn into (and from) another sizer's evidence: the same method with another dtype."""
        self.evidence = evidence
        self.kinds = evidence.kinds
        self.calibration = evidence.calibration

    def start(self) -> None:
        """A new generation: the example's own evidence starts empty, the run's prior stays, and a
        draft model probes in its first plain round whatever the run so far says."""
        for state in self.kinds.values():
            state.example = AcceptanceStats()
        self._misses = 0
        self._probe_next = True

    def _due_probe(self, extra: float, plain: float, at_once_extra: float | None = None) -> bool:
        """Whether this round, which would be plain, probes instead (costing `extra` ms more, the
        draft's catch-up included; judged as `at_once_extra` for probing at once, where given)."""
        self._since_probe += 1
        at_once_extra = extra if at_once_extra is None else at_once_extra
        at_once = self._probe_next and at_once_extra <= PROBE_AT_ONCE_MAX * plain
        if not (at_once or self._since_probe >= self._probe_gap(extra, plain)):
            return False
        self._since_probe, self._probe_next = 0, False
        self._probe_extra = extra / plain
        return True

    def catch_up_ms(self, context: int, pending: int) -> float:
        """What the draft's catching up on `pending` tokens costs beyond a round's usual 2."""
        if self.cost.draft is None:
            return 0.0
        return max(self.cost.draft_ms(1, context, pending) - self.cost.draft_ms(1, context), 0.0)

    @staticmethod
    def catch_up_pays(catch_up: float, remaining: int | None, plain: float) -> bool:
        """Whether a catch-up of `catch_up` ms is cheap enough for the `remaining` tokens of the
        generation, each a plain step of `plain` ms (None: unknown, taken as enough)."""
        return remaining is None or catch_up <= CATCH_UP_SHARE * remaining * plain

    def _probe_outcome(self, gained: float) -> None:
        """A probe brought `gained` tokens beyond the plain step's one: if that paid for its extra
        cost, probe again at once; otherwise back off."""
        paid = gained > 0 and gained >= self._probe_extra
        self._misses = 0 if paid else self._misses + 1
        self._probe_next = paid

    def _probe_gap(self, extra: float, plain: float) -> int:
        """Plain steps between probes that each cost `extra` ms over a plain step of `plain` ms, so
        that probing costs at most PROBE_BUDGET of the time."""
        gap = max(PROBE_MIN_GAP, math.ceil(extra / (PROBE_BUDGET * plain)))
        return gap * min(2**self._misses, PROBE_BACKOFF)

    def _state(self, kind: str | None) -> _KindState:
        return self.kinds.setdefault(kind, _KindState())

    def alphas(self, kind: str | None, n: int) -> list[float]:
        state = self._state(kind)
        parent = parent_kind(kind)
        # A kind with a parent starts from the parent's estimate, which pools all its children.
        base = self.alphas(parent, n) if parent is not None else None
        out: list[float] = []
        prior = self.initial_prior
        for j in range(n):
            rate = state.example.rate(j, _run_rate(state, j, base, prior), PRIOR_WEIGHT)
            out.append(rate)
            prior = rate
        return out

    def _costs(self, pending: int = 2):
        calibrated = self.calibration

        def draft_ms(k: int, ctx: int) -> float:
            if self.free_drafts:
                return self.propose_ms  # measured as it is, every round
            return self.cost.draft_ms(k, ctx, pending) * calibrated["draft"]

        def verify_ms(n: int, ctx: int) -> float:
            return self.cost.verify_ms(n, ctx) * calibrated[n > 1]

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
            _, tokens, cost = choose_k(
                verify_ms, draft_ms, alphas, self.k_max, context, self.gain_factor(kind)
            )
            speculative += weight / total * tokens / cost
        return share * speculative + (1 - share) * plain

    def _run_alphas(self, kind: str | None, n: int) -> list[float]:
        state = self._state(kind)
        parent = parent_kind(kind)
        base = self._run_alphas(parent, n) if parent is not None else None
        out, prior = [], self.initial_prior
        for j in range(n):
            prior = _run_rate(state, j, base, prior)
            out.append(prior)
        return out

    def choose(
        self,
        context: int,
        limit: int,
        kind: str | None = None,
        pending: int = 2,
        remaining: int | None = None,
    ) -> Choice:
        """This round's k for up to `limit` drafts; `pending`: tokens the draft has yet to see;
        `remaining`: tokens the generation may still write."""
        limit = min(limit, self.k_max)
        plain = self.cost.verify_ms(1, context)
        alphas = self.alphas(kind, limit)
        verify_ms, draft_ms = self._costs(pending)
        self.evidence.rounds += 1
        if limit > 0:
            self.evidence.rounds_with_proposal += 1
            self._state(kind).proposals += 1

        gain = self.gain_factor(kind)
        k, tokens, cost = choose_k(verify_ms, draft_ms, alphas, limit, context, gain)
        if k > 0:
            self._probe_next = False  # drafting on its own evidence: no probe owed
        elif not self.free_drafts and limit > 0:
            # Priced with the draft's catch-up, as a tree's probe is; but where the run has learned
            # nothing yet, the catch-up does not count against probing at once (else a lazily
            # prefilled draft, lagging by the prompt, would never start).
            catch_up = self.catch_up_ms(context, pending)
            steady = self.cost.draft_ms(1, context) + self.cost.verify_ms(2, context) - plain
            at_once = steady if not self._state(kind).run.reached else None
            if self.catch_up_pays(catch_up, remaining, plain) and self._due_probe(
                steady + catch_up, plain, at_once
            ):
                tokens = expected_tokens(alphas, 1)
                cost = draft_ms(1, context) + verify_ms(2, context)
                return Choice(1, tokens, cost, plain, True, **self._raw(1, context, pending))
        return Choice(k, tokens, cost, plain, gain=gain, kind=kind, **self._raw(k, context, pending))

    def _raw(self, k: int, context: int, pending: int) -> dict[str, float]:
        """The profile's own prediction for a round of k drafts: its target pass and draft passes."""
        draft = 0.0 if self.free_drafts or k == 0 else self.cost.draft_ms(k, context, pending)
        return {"verify_raw": self.cost.verify_ms(k + 1, context), "draft_raw": draft}

    def gain_factor(self, kind: str | None) -> float:
        """The factor on a kind's expected gains: realised / expected over its recent drafted
        rounds, at most 1."""
        realised, expected = self.evidence.gains.get(kind, (0.0, 0.0))
        return min(1.0, max(GAIN_FLOOR, (realised + GAIN_PRIOR) / (expected + GAIN_PRIOR)))

    def observe_gain(self, choice: Choice, accepted: int) -> None:
        """A drafted round (not a probe) brought `accepted` drafts where its choice expected
        choice.expected_tokens - 1, after the correction it applied."""
        if choice.k <= 0 or choice.probe or not self.calibrate:
            return
        gains = self.evidence.gains.setdefault(choice.kind, [0.0, 0.0])
        gains[0] = GAIN_DECAY * gains[0] + accepted
        gains[1] = GAIN_DECAY * gains[1] + (choice.expected_tokens - 1.0) / choice.gain

    def observe_time(self, choice: Choice, measured_ms: float, proposed_ms: float = 0.0) -> float:
        """Correct the profile by what this run's rounds really took: `measured_ms` the whole round,
        `proposed_ms` its proposal (a draft model's passes, or a lookup). Returns what the profile
        predicted for the round (ms; a lookup counted as measured), so a run can tell a stale profile."""
        if choice.verify_raw <= 0:
            return 0.0
        profiled = choice.verify_raw + (choice.draft_raw or proposed_ms)
        if not self.calibrate:
            return profiled
        speculative = choice.k > 0
        self._calibrate_time(speculative, (measured_ms - proposed_ms) / choice.verify_raw)
        if choice.draft_raw > 0 and proposed_ms > 0:
            self._calibrate_time("draft", proposed_ms / choice.draft_raw)
        if not speculative:
            cal = self.calibration
            cal[True] += CALIBRATION_RELAX * (cal[False] - cal[True])
        return profiled

    def _calibrate_time(self, which, ratio: float) -> None:
        ratio = min(max(ratio, 0.25), 4.0)  # one stalled round (a page fault, a GC pause) must not steer
        old = self.calibration[which]
        self.calibration[which] = old + CALIBRATION_SMOOTHING * (ratio - old)

    def observe(self, drafted: int, accepted: int, kind: str | None = None, probe: bool = False) -> None:
        if drafted <= 0:
            return
        while True:  # the kind, and every parent that pools it
            state = self._state(kind)
            state.example.decay(EXAMPLE_DECAY)
            state.example.add(drafted, accepted)
            state.run.add(drafted, accepted)
            kind = parent_kind(kind)
            if kind is None:
                break
        if probe:
            self._probe_outcome(float(accepted))

    def look_share(self, context: int) -> float:
        """A free proposer's own time per round as a share of a plain target step here."""
        step_ms = self.cost.verify_ms(1, context)
        return self.propose_ms / step_ms if step_ms > 0 else 0.0

    def observe_propose_time(self, ms: float) -> None:
        self.propose_ms = 0.9 * self.propose_ms + 0.1 * ms if self.propose_ms else ms


def _run_rate(state: _KindState, j: int, base: list[float] | None, carry: float) -> float:
    """α_j from the run's record of a kind: with the parent's estimate `base` as prior (weighing
    PRIOR_WEIGHT rounds), or else with `carry`, the estimate of depth j - 1, as a prior of one
    round. Where the run has no evidence at depth j, that prior itself."""
    prior, weight = (base[j], PRIOR_WEIGHT) if base is not None else (carry, 1.0)
    return state.run.rate(j, prior, weight) if j < len(state.run.reached) else prior


def parent_kind(kind: str | None) -> str | None:
    """Kinds of proposal nest: "3-gram/agrees on 16+" is a 3-gram lookup whose hit agrees with the
    text on 16 tokens or more. Its parent ("3-gram") pools the record of all its children, and a
    child is estimated from its own record with the parent's as the prior: a fine class seen
    rarely starts where the coarse one stands instead of at the sizer's initial prior."""
    return kind.rsplit("/", 1)[0] if kind and "/" in kind else None
