"""Cost-aware token trees: how many nodes of a proposed tree to verify next, with node scores
calibrated against what the target accepted (see TreeSizer)."""

from __future__ import annotations

from dataclasses import dataclass, field

from draftlab.decode.cost import CostModel
from draftlab.decode.round_sizer import Choice, RoundSizer
from draftlab.decode.shadows import Shadow
from draftlab.proposal import Proposal

# Tree rounds: node scores (draft probability, match frequency) are calibrated against what the
# target accepted, per source and score bucket, with the score itself as the prior (EAGLE-2
# observed that draft confidence tracks acceptance); the score counts as this many rounds.
SCORE_BUCKETS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.45, 0.6, 0.75, 0.9)
SCORE_PRIOR_WEIGHT = 2.0
# The node budgets a tree round chooses among (0 is a plain target step).
TREE_BUDGETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
TREE_SMOOTHING = 0.1  # how fast the expected gain of a tree round follows recent rounds
# Lookup trees: within one generation, what the calibrated chances promised is set against what the
# target accepted, counting this many nodes as kept promises. A task whose lookups fail more than
# the run's do (math after summarization) then stops drafting within a few rounds: the run's record
# alone kept llama.cpp's `suffix` drafting at α 0.3 through math, 0.85x its plain decoding.
EXAMPLE_PRIOR_NODES = 2.0


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

    def __init__(
        self,
        cost: CostModel,
        depth: int,
        width: int,
        free_drafts: bool,
        max_nodes: int | None = None,
        **kwargs,
    ) -> None:
        super().__init__(cost, k_max=depth, free_drafts=free_drafts, **kwargs)
        self.width = width
        # The most nodes one verification may take (compiled passes are at most 8 tokens long).
        self.max_nodes = max_nodes
        self._drafted: tuple[float, float] | None = None  # (draft nodes verified, passes) this round
        self._probing = False  # this round drafts only as a probe
        self._promised = 0.0  # this generation: Σ calibrated chance of the lookup nodes reached
        self._kept = 0.0  # and how many of them the target accepted
        # A lookup tree left unverified: its best chain, scored by `_watch` against what the target
        # writes since (free evidence, as the chain sizer's shadow; see `written`).
        self._shadow: Proposal | None = None
        self._watch = Shadow()
        self._previewed: tuple | None = None  # (proposal, context, its budget) from `preview`

    def start(self) -> None:
        super().start()
        self._promised = self._kept = 0.0
        self._shadow, self._watch = None, Shadow()
        self._previewed = None

    def written(self, tokens: list[int], plain: bool) -> None:
        """After each round, the tokens the target wrote. A lookup tree that was not verified is
        scored for free: its best chain against these tokens, node by node, until the first miss.
        Without this a lookup tree that stopped drafting would never learn that its lookups match
        again (the per-generation factor, once low, would stay low). A speculative round ends the
        shadow with what it matched so far."""
        if self._shadow is None:
            return
        ended = self._watch.advance(tokens) if plain else self._watch.end()
        if self._watch.active:
            return
        chain, self._shadow = self._shadow, None
        if ended is not None:
            reached, accepted, _ = ended
            self._calibrate(chain.select(list(range(reached))), list(range(accepted)))

    def example_factor(self) -> float:
        """Lookup trees: accepted / promised in this generation, shrunk towards 1; at most 1 (a
        generation doing better than its record needs no boost: the record follows it)."""
        if not self.free_drafts:
            return 1.0  # draft trees follow recent rounds through `tree_draft_gain` instead
        return min(1.0, (self._kept + EXAMPLE_PRIOR_NODES) / (self._promised + EXAMPLE_PRIOR_NODES))

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
        return score if cal is None else _calibrated(cal, _bucket(score), score)

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
            if self._probing:
                self._probe_outcome(added)
        self._probing = False
        self._calibrate(proposal, path)

    def _calibrate(self, proposal: Proposal, path: list[int]) -> None:
        if not proposal.tokens:
            return
        on_path = set(path)
        scores = proposal.scores or [1.0] * len(proposal.tokens)
        for i, p in enumerate(proposal.parent_list()):
            if p >= 0 and p not in on_path:
                continue
            key = self._key(proposal, i)
            b = _bucket(scores[i])
            if self.free_drafts:  # only lookup trees weigh their generation (`example_factor`)
                self._promised += self.accept_chance(key, scores[i])
                self._kept += float(i in on_path)
            cal = self.scores.setdefault(key, _Calibration())
            cal.reached[b] += 1
            cal.accepted[b] += float(i in on_path)

    # -- choices -----------------------------------------------------------------------------
    def tree_draft_ms(self, context: int, pending: int) -> float:
        """A draft tree: one catch-up pass, then a pass over `width` leaves per further level, as
        many levels as recent trees grew (they stop early where leaves get unlikely)."""
        if self.cost.draft is None:
            return 0.0
        if self.cost.block:  # a block drafter's tree comes from its one pass, however deep
            return self.cost.draft_ms(1, context, pending) * self.calibration["draft"]
        first = self.cost.draft_ms(1, context, pending)
        drafted = self.evidence.tree_draft_gain
        levels = drafted[2] if drafted else float(self.k_max)
        raw = first + max(levels - 1.0, 0.0) * self.cost.draft.forward_ms(self.width, context)
        return raw * self.calibration["draft"]

    def _round_rate(self, tokens: float, nodes: float, context: int, pending: int) -> float:
        verify_ms, _ = self._costs()
        n = max(1, round(nodes))
        cost = verify_ms(n + 1, context) + (0.0 if self.free_drafts else self.tree_draft_ms(context, pending))
        return tokens / cost

    def expand_threshold(self, context: int) -> float:
        """A draft tree grows one more level only while its best leaf is at least this likely:
        a level costs one draft pass, which must buy at least what that time buys plainly (nothing
        for a block drafter, whose levels all come from one pass)."""
        if self.cost.draft is None or self.cost.block:
            return 0.0
        verify_ms, _ = self._costs()
        level = self.cost.draft.forward_ms(self.width, context) * self.calibration["draft"]
        return level / verify_ms(1, context)

    def wants_draft(
        self,
        context: int,
        limit: int,
        pending: int = 2,
        base: tuple[float, int] = (1.0, 0),
        remaining: int | None = None,
    ) -> Choice | None:
        """Before a draft-model tree: None to draft, or the plain step to take instead.

        `base` is (expected tokens, nodes) of the round without the draft: a plain step, or for a
        hybrid the prompt-lookup tree already found for free. Drafting must add more than it costs,
        judged by what draft nodes brought in recent drafted rounds, with rare probes otherwise.
        """
        verify_ms, _ = self._costs()
        plain = self.cost.verify_ms(1, context)
        self.evidence.rounds += 1
        plain_step = Choice(0, 1.0, verify_ms(1, context), plain, verify_raw=plain)
        if limit <= 0:
            return plain_step
        drafted = self.evidence.tree_draft_gain
        base_tokens, base_n = base
        without = base_tokens / verify_ms(base_n + 1, context)
        catch_up = self.catch_up_ms(context, pending) * self.calibration["draft"]
        if not drafted:  # nothing known yet: find out, where the draft's catch-up is cheap enough
            return None if self.catch_up_pays(catch_up, remaining, plain) else plain_step
        gain, nodes, _ = drafted
        draft_ms = self.tree_draft_ms(context, pending)
        with_draft = (base_tokens + gain) / (verify_ms(base_n + round(nodes) + 1, context) + draft_ms)
        if with_draft > without:
            self._probe_next = False
            return None
        extra = draft_ms + verify_ms(base_n + round(nodes) + 1, context) - verify_ms(base_n + 1, context)
        if self.catch_up_pays(catch_up, remaining, plain) and self._due_probe(extra, plain):
            self._probing = True
            return None
        return plain_step

    def _budget(self, proposal, context: int) -> tuple[list[float], int, float, float]:
        """(node values, best budget N, E[tokens | N], predicted ms of verifying N + 1 tokens)."""
        verify_ms, _ = self._costs()
        gain = self.gain_factor(proposal.kind)
        scores = proposal.scores or [1.0] * len(proposal.tokens)
        factor = self.example_factor()
        chances = [factor * self.accept_chance(self._key(proposal, i), s) for i, s in enumerate(scores)]
        values = proposal.path_values(chances)
        ranked = sorted(values, reverse=True)
        overhead = self.propose_ms if self.free_drafts else 0.0
        best = (0, 1.0, verify_ms(1, context) + overhead)
        most = len(ranked) if self.max_nodes is None else min(len(ranked), self.max_nodes)
        sizes = [n for n in TREE_BUDGETS[1:] if n < most] + [most] if most else []
        for n in sizes:
            tokens, cost = 1.0 + gain * sum(ranked[:n]), verify_ms(n + 1, context) + overhead
            if tokens / cost > best[1] / best[2] * (1 + 1e-9):
                best = (n, tokens, cost)
        return values, *best

    def preview(self, proposal, context: int) -> tuple[float, int]:
        """(E[tokens], nodes) of the best sub-tree of `proposal`, without learning anything."""
        if not proposal.tokens:
            return 1.0, 0
        budget = self._budget(proposal, context)
        # A hybrid previews its lookup tree, then (not drafting) fits that same tree: nothing a
        # budget reads (scores, gains, calibration) changes in between, so `fit` reuses it.
        self._previewed = (proposal, context, budget)
        return budget[2], budget[1]

    def fit(self, proposal, context: int, drafted_ms: float = 0.0, draft_passes: int = 0):
        """The sub-tree worth verifying now, and the choice made (drafting is already paid)."""
        verify_ms, _ = self._costs()
        plain = self.cost.verify_ms(1, context)
        if self.free_drafts:
            self.evidence.rounds += 1
        if not proposal.tokens:
            return proposal, Choice(0, 1.0, verify_ms(1, context), plain, verify_raw=plain)
        self.evidence.rounds_with_proposal += 1
        previewed, self._previewed = self._previewed, None
        if previewed is not None and previewed[0] is proposal and previewed[1] == context:
            values, best_n, best_tokens, best_cost = previewed[2]
        else:
            values, best_n, best_tokens, best_cost = self._budget(proposal, context)
        chosen = proposal.best(values, best_n) if best_n else proposal.select([])
        if not best_n and self.free_drafts and self._shadow is None:
            self._shadow = proposal.select(proposal.top_path())
            self._watch.begin(self._shadow.tokens, proposal.kind)
        _follow(self.evidence.tree_gain, (best_tokens, float(best_n)))
        if drafted_ms > 0:
            # The draft's share of the chosen tree; what it really adds is known after verification.
            sources = chosen.sources or ["draft"] * len(chosen.tokens)
            self._drafted = (float(sum("draft" in x for x in sources)), float(max(draft_passes, 1)))
        gain = self.gain_factor(proposal.kind)
        return chosen, Choice(
            best_n,
            best_tokens,
            best_cost + drafted_ms,
            plain,
            gain=gain,
            kind=proposal.kind,
            verify_raw=self.cost.verify_ms(best_n + 1, context),
            draft_raw=drafted_ms / self.calibration["draft"],
        )

    def tokens_per_ms(self, context: int) -> float:
        verify_ms, _ = self._costs()
        plain = 1.0 / verify_ms(1, context)
        if self.gain is None:
            return plain
        return max(plain, self._round_rate(*self.gain, context, 2))


def _calibrated(cal: _Calibration, bucket: int, prior: float) -> float:
    return (cal.accepted[bucket] + SCORE_PRIOR_WEIGHT * prior) / (cal.reached[bucket] + SCORE_PRIOR_WEIGHT)


def _follow(running: list[float], value: tuple[float, float]) -> None:
    """An exponential moving average kept in place (it is shared by a method's dtype copies)."""
    if not running:
        running.extend(value)
    else:
        running[:] = [r + TREE_SMOOTHING * (v - r) for r, v in zip(running, value, strict=True)]
