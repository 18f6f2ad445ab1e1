"""Acceptance rules.

`SpeculativeRule` is speculative sampling (Leviathan et al. 2023, Chen et al. 2023):
lossless, so its output is distributed exactly as the target's. With a KeyedSampler (exact
mode, draftlab.sampling) it keeps a proposed token while it equals the target's keyed pick:
greedy verification of a sample that plain decoding draws identically. `BildRule` is BiLD's
rollback policy (Kim et al. 2023), which trades exactness for speed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from draftlab.proposal import Proposal
from draftlab.sampling import Sampler, SamplingParams, argmax_rows, warp_probs


@dataclass
class Verdict:
    accepted: int  # how many proposed tokens are kept
    next_token: int | None  # the target's token after them (correction or bonus), if it writes one
    # Tree proposals: the accepted nodes, root to leaf (a chain's are its first `accepted`).
    path: list[int] | None = None

    def kept(self) -> list[int]:
        return self.path if self.path is not None else list(range(self.accepted))


class AcceptanceRule:
    def verify(
        self,
        proposal: Proposal,
        target_logits: torch.Tensor,
        params: SamplingParams,
        sampler: Sampler,
        position: int = 0,
        argmax: list[int] | None = None,
    ) -> Verdict:
        """`target_logits` is [k+1, V]: row i is the target's distribution for position i of the block,
        whose first token sits at `position` of the sequence. `argmax`: each row's argmax where the
        target's pass made it (a compiled package's, models/compiled.py), which greedy rules read
        instead of the logits."""
        raise NotImplementedError


def _picks(
    logits: torch.Tensor,
    params: SamplingParams,
    sampler: Sampler | None,
    positions: list[int],
    argmax: list[int] | None = None,
) -> _Picks | list[int] | None:
    """The target's own token per row where it is fixed before looking at the proposal: its argmax
    (greedy; the pass's own where it made them), or its keyed sample; None for the classic rule's coins."""
    if params.greedy:
        if argmax is not None:
            return argmax
        return _Picks(logits, lambda rows, _row: argmax_rows(rows)[0])
    if getattr(sampler, "keyed", False):
        return _Picks(logits, lambda rows, row: sampler.picks(rows, params, [positions[row]])[0])
    return None


class _Picks:
    """The target's tokens made row by row as the rule reads them: a round stops at its first
    mismatch, and no row is free (a keyed sample's warp sorts the vocabulary; the argmax of 49,152
    bfloat16 logits took 10 us for one row and 53 us for 9 on the Zen5, and a pld generation of 256
    tokens read 257 rows this way instead of 384)."""

    def __init__(self, logits: torch.Tensor, pick: Callable[[torch.Tensor, int], int]) -> None:
        self.logits, self.pick = logits, pick
        self.made: dict[int, int] = {}

    def __getitem__(self, row: int) -> int:
        if row not in self.made:
            self.made[row] = self.pick(self.logits[row : row + 1], row)
        return self.made[row]


class SpeculativeRule(AcceptanceRule):
    """Chains: Leviathan et al.'s rule. Trees: the same rule applied recursively over a node's
    children (SpecInfer's multi-step speculative sampling, Miao et al. 2024, Theorem 4.2; the
    recursive rejection sampling of Jeon et al. 2024): try the children in order, each against
    the residual the rejections before it left, and sample the residual if all are rejected.

    Each try is one exact speculative step for the current residual (its candidate drawn from
    its own q, independent of the target's coins), so the token emitted at every node is
    distributed as the target's. A deterministic child has a one-hot q: it is accepted with the
    residual's probability of its token, and a rejection zeroes that token.
    """

    def verify(
        self,
        proposal: Proposal,
        target_logits: torch.Tensor,
        params: SamplingParams,
        sampler: Sampler,
        position: int = 0,
        argmax: list[int] | None = None,
    ) -> Verdict:
        if proposal.is_tree:
            return self.verify_tree(proposal, target_logits, params, sampler, position, argmax)
        k = len(proposal.tokens)
        best = _picks(target_logits, params, sampler, list(range(position, position + k + 1)), argmax)
        if best is not None:
            # Accept the longest prefix on which the draft agrees with the target's own tokens.
            n = 0
            while n < k and proposal.tokens[n] == best[n]:
                n += 1
            return Verdict(n, best[n])
        p = warp_probs(target_logits, params)
        for i, token in enumerate(proposal.tokens):
            p_tok = p[i, token].item()
            q_tok = 1.0 if proposal.probs is None else proposal.probs[i, token].item()
            if sampler.uniform(p.device) * q_tok < p_tok:  # u < p/q without dividing by q
                continue
            return Verdict(i, sampler.draw(self.residual(p[i], proposal, i, token)))
        return Verdict(k, sampler.draw(p[k]))

    def verify_tree(
        self,
        proposal: Proposal,
        target_logits: torch.Tensor,
        params: SamplingParams,
        sampler: Sampler,
        position: int = 0,
        argmax: list[int] | None = None,
    ) -> Verdict:
        """`target_logits` is [n+1, V]: row 0 scores the root's children, row i+1 node i's."""
        children = proposal.children()
        tokens = proposal.tokens
        path: list[int] = []
        node = -1
        positions = [position] + [position + depth for depth in proposal.depths()]
        best = _picks(target_logits, params, sampler, positions, argmax)
        if best is not None:
            while True:
                want = best[node + 1]
                node = next((c for c in children[node] if tokens[c] == want), None)
                if node is None:
                    return Verdict(len(path), want, path)
                path.append(node)
        while True:
            p = warp_probs(target_logits[node + 1], params)
            for child in children[node]:
                token = tokens[child]
                q_tok = 1.0 if proposal.probs is None else proposal.probs[child, token].item()
                if sampler.uniform(p.device) * q_tok < p[token].item():
                    path.append(child)
                    node = child
                    break
                p = self.residual(p, proposal, child, token)
            else:
                return Verdict(len(path), sampler.draw(p), path)

    @staticmethod
    def residual(p_row: torch.Tensor, proposal: Proposal, i: int, token: int) -> torch.Tensor:
        """The normalised max(0, p - q) that a rejected position is resampled from."""
        if proposal.probs is None:
            residual = p_row.clone()
            residual[token] = 0.0
        else:
            residual = torch.clamp(p_row - proposal.probs[i].to(p_row.device), min=0.0)
        total = residual.sum()
        # p <= q everywhere only happens when p == q up to rounding; then p itself is exact.
        return residual / total if total > 0 else p_row


class BildRule(AcceptanceRule):
    def __init__(self, rollback_threshold: float = 5.0) -> None:
        self.rollback_threshold = rollback_threshold

    def verify(
        self,
        proposal: Proposal,
        target_logits: torch.Tensor,
        params: SamplingParams,
        sampler: Sampler,
        position: int = 0,
        argmax: list[int] | None = None,
    ) -> Verdict:
        k = len(proposal.tokens)
        log_p = torch.log_softmax(target_logits.float(), dim=-1)
        if k and math.isfinite(self.rollback_threshold):
            idx = torch.arange(k, device=log_p.device)
            nll = -log_p[idx, torch.tensor(proposal.tokens, device=log_p.device)]
            bad = torch.nonzero(nll > self.rollback_threshold).flatten()
            if bad.numel():
                n = int(bad[0])
                return Verdict(n, self._large_token(target_logits, n, params, sampler, position, argmax))
        if proposal.fell_back or k == 0:
            return Verdict(k, self._large_token(target_logits, k, params, sampler, position, argmax))
        # The small model hit its step limit while confident: it keeps the pen.
        return Verdict(k, None)

    @staticmethod
    def _large_token(
        logits: torch.Tensor,
        row: int,
        params: SamplingParams,
        sampler: Sampler,
        position: int,
        argmax: list[int] | None,
    ) -> int:
        if params.greedy:
            return argmax[row] if argmax is not None else argmax_rows(logits[row])[0]
        return sampler.draw(warp_probs(logits[row], params), position + row)
