"""One speculative decoding loop for every method.

Each round: the proposer suggests up to γ tokens, the target scores the last final token
plus the proposal in one forward pass, the acceptance rule keeps a prefix and (usually)
adds the target's own next token, and both caches are cropped back to what was kept.
The first round's target pass is the prefill itself: the prompt and the first proposal go
through the target together, as in HF's assisted generation, so no pass is spent on the
prompt alone (in exact mode, models/exact.py, the prompt goes alone, as plain decoding's does).
With a proposer that suggests nothing, the same loop is plain autoregressive decoding,
so the baseline and the methods share one code path.
With a `RoundSizer`, each round's draft length comes from the machine's cost curve and the
acceptance seen so far (decode/round_sizer.py); a round of k = 0 is a plain target step.
"""

from __future__ import annotations

import time

import torch

from draftlab.decode.pacing import ProposalPacer
from draftlab.decode.round_sizer import Choice, RoundSizer
from draftlab.decode.shadows import Shadows
from draftlab.decode.stats import Generation, GenerationStats
from draftlab.decode.timing import synchronized_clock
from draftlab.decode.tree_sizer import TreeSizer
from draftlab.errors import DraftlabError
from draftlab.models.cached import CachedModel
from draftlab.models.compiled import MAX_PASS
from draftlab.proposers.base import Proposal, Proposer
from draftlab.proposers.capabilities import LookupPart, SizedDrafting, TakesFeatures
from draftlab.sampling import KeyedSampler, Sampler, SamplingParams
from draftlab.verify.rules import AcceptanceRule


class SpeculativeDecoder:
    def __init__(
        self,
        target: CachedModel,
        proposer: Proposer,
        rule: AcceptanceRule,
        gamma: int = 4,
        sizer: RoundSizer | None = None,
        tree_budget: int | None = None,
        keyed: bool | None = None,
    ) -> None:
        if gamma < 1:
            raise DraftlabError(f"gamma must be >= 1, got {gamma}")
        self.target = target
        self.proposer = proposer
        self.rule = rule
        self.gamma = gamma
        self.sizer = sizer
        self.tree_budget = tree_budget
        # Keyed sampling (draftlab.sampling.KeyedSampler): what exact mode samples with, so that a
        # seed gives plain decoding's tokens; by default wherever the target runs exact.
        self.keyed = getattr(target, "exact", False) if keyed is None else keyed
        # A tree proposer on a model that cannot take a tree mask proposes its best chain, which a
        # tree sizer still cuts to the nodes worth one pass (a chain is a tree of one branch).
        self.trees = proposer.makes_trees
        # What only some proposers do (proposers/capabilities.py), checked once.
        self.sized_drafting = isinstance(proposer, SizedDrafting)
        self.lookup_part = isinstance(proposer, LookupPart)
        self.takes_features = isinstance(proposer, TakesFeatures)
        self.tree_fallback: str | None = None
        if self.trees and not target.supports_trees():
            self.trees, self.tree_budget = False, None
            self.tree_fallback = (
                "exact mode: a tree's nodes sit in other cache slots than their chain's, so its pass "
                "cannot score them bit for bit: its best chain"
                if getattr(target, "exact", False)
                else "the target cannot verify token trees (no 4D-mask support): chains"
            )
        self.tokenizer = target.lm.tokenizer
        self.eos = target.lm.eos_token_ids
        self._draft_s = 0.0  # time in the proposer this round (_draft)
        self._lookup_s = 0.0  # a hybrid's lookup tree this round, made before the sizer's choice

    def _devices(self) -> list[torch.device]:
        """The devices a clock reading must wait for: the CUDA ones (a CPU's work is done when
        its call returns, and the clock is read several times a round)."""
        devices = {torch.device(self.target.device)}
        draft = getattr(self.proposer, "draft", None)
        if draft is not None:
            devices.add(torch.device(draft.device))
        return [d for d in devices if d.type == "cuda"]

    def check_prompt(self, prompt_ids: list[int], max_new_tokens: int) -> None:
        if not prompt_ids:
            raise DraftlabError("empty prompt")
        if max_new_tokens < 1:
            raise DraftlabError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        limit = self.target.lm.context_length
        if limit is not None:
            needed = len(prompt_ids) + (0 if self.target.lm.is_encoder_decoder else max_new_tokens)
            if getattr(self.target, "exact", False):
                needed += MAX_PASS - 1  # exact mode's padding rows take positions past the last token
            if needed > limit:
                raise DraftlabError(
                    f"prompt of {len(prompt_ids)} tokens plus max_new_tokens={max_new_tokens} exceeds "
                    f"the model's context of {limit} tokens"
                )

    def generate(self, prompt_ids: list[int], max_new_tokens: int, params: SamplingParams) -> Generation:
        self.check_prompt(prompt_ids, max_new_tokens)
        sampler = KeyedSampler(params.seed) if self.keyed and not params.greedy else Sampler(params.seed)
        stats = GenerationStats(prompt_tokens=len(prompt_ids), dtype=self.target.lm.spec.dtype)
        target, proposer = self.target, self.proposer
        draft_calls_before = proposer.forward_calls
        target_calls_before = target.forward_calls
        devices = self._devices()

        t0 = synchronized_clock(devices)
        sequence = target.start(prompt_ids)
        prefix_len = len(sequence)
        proposer.start(prompt_ids, sequence)
        t_first: float | None = None

        sizer = self.sizer
        # Exact mode, or a target whose passes after the prompt score rows as alone (a 4-bit one):
        # the prompt then goes through the target alone, as plain decoding's does, so its keys and
        # its first token's logits are the same bits.
        prompt_alone = getattr(target, "exact", False) or getattr(target, "row_exact", False)
        shadow = Shadows()
        if sizer is not None:
            sizer.start()
        # Free drafts sized by cost: stop looking every round while none is worth verifying.
        pacer = ProposalPacer() if sizer is not None and sizer.free_drafts else None
        while len(sequence) - prefix_len < max_new_tokens and (
            len(sequence) == prefix_len or sequence[-1] not in self.eos
        ):
            budget = max_new_tokens - (len(sequence) - prefix_len)
            # Never draft past the budget: a token that cannot be kept is wasted work.
            calls_before, lag = proposer.forward_calls, proposer.lag(sequence)
            self._draft_s = self._lookup_s = 0.0
            t_round = sizer.clock() if sizer is not None else 0.0
            paced = pacer is not None and not pacer.wants_proposal()
            if prompt_alone and t_first is None:
                proposal, choice = Proposal(), None
            elif paced:
                proposal, choice = Proposal(), None
                stats.paced_rounds += 1
            else:
                proposal, choice = self._propose(sequence, budget, params, sampler, shadow)
                if pacer is not None:
                    verified = bool(proposal.tokens) and not (choice is not None and choice.probe)
                    pacer.proposed(verified, sizer.look_share(len(sequence)))
            proposal = self._cut_at_eos(proposal)
            # The proposer's own time (c's draft step): not the sizer's choice around it, which in a
            # round that drafts nothing would be charged to the few passes that ran (eagle's c read
            # 1.9 target steps in stop 74's default run, its head's compiled pass 0.2).
            t_proposed = sizer.clock() if sizer is not None else 0.0
            if lag > MAX_PASS:
                stats.catch_up_s += self._draft_s
            else:
                stats.propose_s += self._draft_s
                stats.propose_calls += proposer.forward_calls - calls_before
            # The target holds the sequence minus its last token (in round 1, nothing yet): feed
            # what it lacks plus the proposal, and read the rows that score the proposal.
            fed_from = target.length
            fed = sequence[fed_from:] + proposal.tokens
            tree = proposal.parents if proposal.is_tree else None
            layers = proposer.feature_layers if self.takes_features else ()
            asks = {"features": layers} if layers else {}
            t_pass, model_s = synchronized_clock(devices), getattr(target, "model_s", None)
            target_logits = target.forward(fed, keep=len(proposal.tokens) + 1, tree=tree, **asks)
            t_accept = synchronized_clock(devices)
            # The pass itself, where the target times its model's own call (another engine's: all of it).
            pass_s = t_accept - t_pass if model_s is None else target.model_s - model_s
            verdict = self.rule.verify(
                proposal,
                target_logits,
                params,
                sampler,
                position=len(sequence),
                argmax=getattr(target, "argmax", None),
            )
            kept = verdict.kept()
            if tree is not None:
                target.keep_path(len(sequence), kept)
            if layers:
                # The features of the tokens now final: those fed before the proposal, then the kept path.
                pending = len(fed) - len(proposal.tokens)
                rows = [*range(pending), *(pending + i for i in kept)]
                # A chain's rows are a prefix: a view, not a gather (the cheaper step after a pass).
                prefix = rows[-1] == len(rows) - 1 if rows else True
                proposer.take_features(
                    fed_from, target.features[: len(rows)] if prefix else target.features[rows]
                )
            accept_s = time.perf_counter() - t_accept
            new = [proposal.tokens[i] for i in kept]
            if verdict.next_token is not None:
                new.append(verdict.next_token)
            stats.record_round(len(proposal.tokens), verdict.accepted)
            if proposal.parents is not None:
                stats.record_tree(proposal, kept)
            if isinstance(self.sizer, TreeSizer):
                if proposal.parents is not None:
                    self.sizer.observe_tree(proposal, kept)
                self.sizer.written(new, plain=not proposal.tokens)
            stats.fallbacks += int(proposal.fell_back)
            stats.rollbacks += int(verdict.next_token is not None and verdict.accepted < len(proposal.tokens))
            if sizer is not None and choice is not None:
                stats.record_choice(
                    choice.k, choice.expected_tokens, choice.cost_ms, choice.plain_ms, choice.probe
                )
                self._learn(sizer, shadow, proposal, verdict.accepted, new, choice)
            elif paced and not isinstance(sizer, TreeSizer):
                for ended in shadow.advance(new):  # shadows begun before the skip go on scoring
                    sizer.observe(*ended)
            new = self._stop_at_eos(new)[:budget]
            stats.draft_tokens_kept += min(verdict.accepted, len(new))
            sequence.extend(new)
            # Invariant: both caches hold the sequence minus its last token.
            t_crop = time.perf_counter()
            target.crop(len(sequence) - 1)
            proposer.rollback(len(sequence) - 1)
            if t_first is not None:  # a decode round: where its time went
                stats.pass_s += pass_s
                stats.inputs_s += max(t_accept - t_pass - pass_s, 0.0)
                stats.draft_s += self._draft_s + self._lookup_s
                stats.accept_s += accept_s + time.perf_counter() - t_crop
            if sizer is not None and choice is not None and t_first is not None:
                # Round 1 is the prefill, whose cost the decode curve does not predict.
                measured = (sizer.clock() - t_round) * 1000
                proposed = (t_proposed - t_round) * 1000
                stats.record_timing(sizer.observe_time(choice, measured, proposed), measured)
            if t_first is None:
                t_first = synchronized_clock(devices)
                stats.prefill_s = t_first - t0
                stats.first_tokens = len(new)

        t1 = t_first if t_first is not None else synchronized_clock(devices)
        stats.decode_s = synchronized_clock(devices) - t1
        tokens = sequence[prefix_len:]
        stats.new_tokens = len(tokens)
        stats.target_calls = target.forward_calls - target_calls_before
        stats.draft_calls = proposer.forward_calls - draft_calls_before
        proposer.finish(prompt_ids, tokens)
        stats.proposer_info = proposer.info()
        stats.tree_fallback = self.tree_fallback
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        return Generation(tokens, text, stats)

    def _propose(
        self, sequence: list[int], budget: int, params: SamplingParams, sampler: Sampler, shadow: Shadows
    ) -> tuple[Proposal, Choice | None]:
        """This round's proposal, and the sizer's choice of k when rounds are sized."""
        sizer, proposer = self.sizer, self.proposer
        if proposer.makes_trees:  # on a target without tree support: its best chain (self.trees)
            return self._propose_tree(sequence, budget, params, sampler)
        if sizer is None:
            return self._draft(sequence, min(self.gamma, budget), params, sampler), None
        if not sizer.free_drafts:
            choice = sizer.choose(len(sequence), budget, pending=proposer.lag(sequence), remaining=budget)
            proposal = self._draft(sequence, choice.k, params, sampler) if choice.k else Proposal()
            return proposal, choice
        # Free drafts: propose first, then verify only the share that pays. An unused proposal
        # becomes the shadow that the target's next tokens are scored against.
        t0 = sizer.clock()
        proposal = self._draft(sequence, min(self.gamma, budget), params, sampler)
        sizer.observe_propose_time((sizer.clock() - t0) * 1000)
        choice = sizer.choose(len(sequence), len(proposal.tokens), proposal.kind)
        if choice.k == 0 and proposal.tokens:
            shadow.begin(proposal.tokens, proposal.kind)
        return proposal.truncate(choice.k), choice

    def _propose_tree(
        self, sequence: list[int], budget: int, params: SamplingParams, sampler: Sampler
    ) -> tuple[Proposal, Choice | None]:
        """A tree round: the proposer's candidate tree, cut to the nodes worth one pass here.

        Without a cost profile the tree is cut to its best chain (as long as γ), and with a fixed
        `tree_budget` to that many nodes; otherwise the sizer chooses the budget (decode/tree_sizer.py).
        """
        sizer, proposer = self.sizer, self.proposer
        depth = min(self.gamma, budget)
        if not isinstance(sizer, TreeSizer):
            proposal = self._draft(sequence, depth, params, sampler)
            if self.tree_budget is not None:
                scores = proposal.scores or [1.0] * len(proposal.tokens)
                return proposal.best(proposal.path_values(scores), self.tree_budget), None
            return proposal.select(proposal.top_path()[: self.gamma]), None
        drafted_ms = 0.0
        if self.sized_drafting:
            pending = proposer.lag(sequence)
            # A hybrid's lookup tree is free: the draft must add to it, not merely beat a plain step.
            base = (1.0, 0)
            if self.lookup_part:
                # The lookup tree is this round's free drafting (a lookup method's propose): its time
                # counts as drafting, not as the loop's overhead; not in c, the draft model's step.
                t0 = time.perf_counter()
                looked_up = proposer.lookup_tree(sequence)
                self._lookup_s += time.perf_counter() - t0
                base = sizer.preview(looked_up, len(sequence))
            plain = sizer.wants_draft(len(sequence), depth, pending, base, remaining=budget)
            proposer.use_draft = plain is None
            if plain is not None and not self.lookup_part:
                return Proposal(parents=[]), plain
            if plain is None:  # priced only where the draft runs: each step after a pass is dear
                proposer.min_value = sizer.expand_threshold(len(sequence))
                drafted_ms = sizer.tree_draft_ms(len(sequence), pending)
        t0, calls = sizer.clock(), proposer.forward_calls
        proposal = self._draft(sequence, depth, params, sampler)
        if sizer.free_drafts:
            sizer.observe_propose_time((sizer.clock() - t0) * 1000)
        if not self.trees:
            proposal = proposal.select(proposal.top_path()[:depth])
        return sizer.fit(proposal, len(sequence), drafted_ms, proposer.forward_calls - calls)

    def _draft(self, sequence: list[int], k: int, params: SamplingParams, sampler: Sampler) -> Proposal:
        """The proposer's proposal, its time counted as this round's drafting."""
        t0 = time.perf_counter()
        proposal = self.proposer.propose(sequence, k, params, sampler)
        self._draft_s += time.perf_counter() - t0
        return proposal

    @staticmethod
    def _learn(
        sizer: RoundSizer,
        shadow: Shadows,
        proposal: Proposal,
        accepted: int,
        written: list[int],
        choice: Choice,
    ) -> None:
        sizer.observe_gain(choice, accepted)
        if isinstance(sizer, TreeSizer):
            return  # trees learn node by node (observe_tree), in the round itself
        sizer.observe(len(proposal.tokens), accepted, proposal.kind, choice.probe)
        # A shadow proposal is judged by the tokens the target wrote instead (free evidence); a
        # speculative round ends it with what it has seen so far.
        for ended in shadow.advance(written) if not proposal.tokens else shadow.end():
            sizer.observe(*ended)

    def _cut_at_eos(self, proposal: Proposal) -> Proposal:
        """Nothing after an end-of-sequence token can be kept, so it is not worth verifying."""
        if proposal.parents is not None:
            parents, alive = proposal.parents, []
            ended: set[int] = set()
            for i, p in enumerate(parents):
                if p >= 0 and p in ended:
                    ended.add(i)
                    continue
                alive.append(i)
                if proposal.tokens[i] in self.eos:
                    ended.add(i)
            return proposal if len(alive) == len(parents) else proposal.select(alive)
        for i, token in enumerate(proposal.tokens):
            if token in self.eos and i + 1 < len(proposal.tokens):
                return proposal.truncate(i + 1)  # its kind kept: the sizer learns into the kind it chose
        return proposal

    def _stop_at_eos(self, tokens: list[int]) -> list[int]:
        for i, token in enumerate(tokens):
            if token in self.eos:
                return tokens[: i + 1]
        return tokens
