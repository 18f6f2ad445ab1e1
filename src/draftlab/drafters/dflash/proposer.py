"""DFlash as a proposer: one block pass proposes k tokens after the last one.

The loop hands over the target's hidden states at the drafter's taps for every position that became
final (TakesFeatures). They wait here until the next block pass fuses them into context rows and
caches their keys and values; the pass then runs the anchor (the sequence's last token, whose own
hidden states the target has not computed yet) and k mask tokens, and the cache is cropped back to
the context, so that it only ever holds final positions. The pass always runs the whole block, as the
drafter was trained; only the first k rows go through the output head.
"""

from __future__ import annotations

import heapq

import torch
from transformers import DynamicCache

from draftlab.drafters.dflash.head import crop_to
from draftlab.drafters.dflash.lm import DFlashLM
from draftlab.errors import DraftlabError
from draftlab.proposers.base import Proposal, Proposer
from draftlab.sampling import Sampler, SamplingParams, argmax_rows, warp_probs


class DFlashProposer(Proposer):
    def __init__(self, lm: DFlashLM, stop_tokens: frozenset[int] = frozenset()) -> None:
        self.draft = lm  # what the loop reads of a proposer's second model (its device)
        self.model = lm.model
        self.feature_layers = self.model.feature_layers
        self.stop_tokens = stop_tokens
        self.forward_calls = 0
        self._cache = DynamicCache()
        self._cached = 0  # context rows in the cache: positions 0 .. _cached - 1
        width = len(self.model.taps) * self.model.target_hidden_size
        self._waiting = torch.zeros(0, width, device=lm.device)  # features of positions _cached ..

    @property
    def known(self) -> int:
        """Positions whose target features are here (cached or waiting): 0 .. known - 1."""
        return self._cached + len(self._waiting)

    def start(self, prompt_ids: list[int], prefix: list[int]) -> None:
        self._cache, self._cached = DynamicCache(), 0
        self._waiting = self._waiting[:0]

    def take_features(self, start: int, features: torch.Tensor) -> None:
        if start > self.known:
            raise DraftlabError(f"target features from position {start}, but only {self.known} are known")
        if start < self._cached:
            crop_to(self._cache, start)
            self._cached, self._waiting = start, self._waiting[:0]
        kept = self._waiting[: start - self._cached]
        self._waiting = torch.cat([kept, features.to(self.draft.device, kept.dtype)])

    def rollback(self, length: int) -> None:
        if length < self._cached:
            crop_to(self._cache, length)
            self._cached, self._waiting = length, self._waiting[:0]
        else:
            self._waiting = self._waiting[: length - self._cached]

    @torch.inference_mode()
    def block_logits(self, sequence: list[int], k: int) -> torch.Tensor | None:
        """The output head's logits [k, V] for the k positions after the sequence's last token, from
        one block pass; None where there is nothing to draft from yet (the first round)."""
        anchor = len(sequence) - 1
        k = min(k, self.model.block_size - 1)
        if k <= 0 or self.known < anchor:
            return None
        draft, device = self.model, self.draft.device
        context = draft.fuse(self._waiting[: anchor - self._cached])[None]
        # The whole block, as trained, whatever k is asked for: its rows see each other.
        size = draft.block_size
        ids = torch.tensor([[sequence[-1]] + [draft.mask_token_id] * (size - 1)], device=device)
        block = self.draft.embedding(ids).to(context.dtype)
        positions = torch.arange(self._cached, anchor + size, device=device)[None]
        out = draft(block, context, positions, self._cache)
        crop_to(self._cache, anchor)
        self._waiting = self._waiting[anchor - self._cached :]
        self._cached = anchor
        self.forward_calls += 1
        return self.draft.logits(out[0, 1 : k + 1])

    def propose(self, sequence: list[int], k: int, params: SamplingParams, sampler: Sampler) -> Proposal:
        logits = self.block_logits(sequence, k)
        if logits is None:
            return Proposal()
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        for i in range(len(logits)):
            if params.greedy:
                token = argmax_rows(logits[i : i + 1])[0]
            else:
                probs = warp_probs(logits[i], params)
                # A keyed sampler draws with the noise the target's token at that position will use.
                token = sampler.draw(probs, len(sequence) + i)
                rows.append(probs)
            tokens.append(token)
            if token in self.stop_tokens:
                break
        return Proposal(tokens, torch.stack(rows) if rows else None)


class DFlashTreeProposer(DFlashProposer):
    """A token tree from one block pass. The block's rows are drafted together, so row i's
    distribution does not depend on the tokens chosen before it: the children of every node at
    depth i are row i + 1's `width` likeliest tokens, and a node's value is the product of its
    path's probabilities (as Medusa's heads build their trees). Nodes are taken best first.

    Children are chosen deterministically, so verification treats them as one-hot proposals,
    which keeps sampling exact (verify/rules.py)."""

    makes_trees = True
    # SizedDrafting (proposers/capabilities.py): the sizer sets both; a block costs one pass
    # however deep its tree, so no level is too dear to grow.
    use_draft = True
    min_value = 0.0

    def __init__(
        self, lm: DFlashLM, width: int = 4, stop_tokens: frozenset[int] = frozenset(), max_nodes: int = 64
    ) -> None:
        super().__init__(lm, stop_tokens)
        self.width = width
        self.max_nodes = max_nodes

    def propose(self, sequence: list[int], k: int, params: SamplingParams, sampler: Sampler) -> Proposal:
        logits = self.block_logits(sequence, k) if self.use_draft else None
        if logits is None:
            return Proposal(parents=[])
        probs = torch.softmax(logits.float(), dim=-1) if params.greedy else warp_probs(logits, params)
        top = torch.topk(probs, min(self.width, probs.shape[-1]), dim=-1)
        choices = [
            [(int(t), float(q)) for t, q in zip(idx.tolist(), val.tolist(), strict=True) if q > 0]
            for idx, val in zip(top.indices, top.values, strict=True)
        ]
        tokens: list[int] = []
        parents: list[int] = []
        scores: list[float] = []
        frontier = [(-q, -1, 0, t, q) for t, q in choices[0]]  # (-value, parent, depth, token, q)
        heapq.heapify(frontier)
        while frontier and len(tokens) < self.max_nodes:
            negative, parent, depth, token, q = heapq.heappop(frontier)
            node = len(tokens)
            tokens.append(token), parents.append(parent), scores.append(q)
            if depth + 1 < len(choices) and token not in self.stop_tokens:
                for child, cq in choices[depth + 1]:
                    heapq.heappush(frontier, (negative * cq, node, depth + 1, child, cq))
        proposal = Proposal(tokens, parents=parents, scores=scores, sources=["dflash"] * len(tokens))
        return proposal.breadth_first(proposal.path_values(proposal.scores))
