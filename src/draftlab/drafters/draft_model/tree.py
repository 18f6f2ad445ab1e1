"""Draft-model trees, expanded as EAGLE-2 does (Li et al. 2024, "dynamic draft trees").

Each level feeds the `width` most promising leaves to the draft in one batched pass (a tree
pass over its own cache) and takes each one's `width` likeliest next tokens. A node's value is
the product of draft probabilities along its path, which EAGLE-2 found tracks the chance that
the target accepts it; the best nodes of the whole tree, not just of the last level, form the
proposal. A weak draft whose top token is right a quarter of the time still has the right token
among its top four far more often: branching is what rescues it.

Children are chosen deterministically from the draft's (warped) distribution, so verification
treats them as one-hot proposals, which keeps sampling exact (verify/rules.py).
"""

from __future__ import annotations

import torch

from draftlab.drafters.draft_model.proposer import DraftModelBase
from draftlab.models.cached import CachedModel
from draftlab.proposal import Proposal
from draftlab.sampling import Sampler, SamplingParams, warp_probs

MAX_TREE_NODES = 64


class DraftTreeProposer(DraftModelBase):
    makes_trees = True
    # SizedDrafting (proposers/capabilities.py): the sizer sets both before each round.
    use_draft = True
    min_value = 0.0  # grow a level only while the best leaf is this likely

    def __init__(
        self,
        draft: CachedModel,
        width: int = 4,
        stop_tokens: frozenset[int] = frozenset(),
        lazy_prefill: bool = False,
        max_nodes: int = MAX_TREE_NODES,
        depth: int | None = None,
    ) -> None:
        super().__init__(draft, stop_tokens, lazy_prefill)
        self.depth = depth  # None: as deep as the loop asks (γ)
        # A draft that cannot take a tree mask still drafts, one chain deep (width 1).
        self.chains_only = not draft.supports_trees()
        self.width = 1 if self.chains_only else width
        self.max_nodes = max_nodes

    def _children(self, logits: torch.Tensor, params: SamplingParams) -> tuple[list[int], list[float]]:
        probs = torch.softmax(logits.float(), dim=-1) if params.greedy else warp_probs(logits, params)
        top = torch.topk(probs, min(self.width, probs.shape[-1]))
        keep = top.values > 0
        return top.indices[keep].tolist(), top.values[keep].tolist()

    def propose(self, sequence: list[int], k: int, params: SamplingParams, sampler: Sampler) -> Proposal:
        if k <= 0:
            return Proposal(parents=[])
        k = min(k, self.depth or k)
        base = len(sequence)
        pending = sequence[self.draft.length :]
        root_logits = self.draft.forward(pending, keep=1)[-1]
        tokens: list[int] = []
        parents: list[int] = []
        scores: list[float] = []
        values: list[float] = []
        area_of: dict[int, int] = {}  # node -> its slot in the draft's tree area, once fed
        level: list[int] = []
        for token, q in zip(*self._children(root_logits, params), strict=True):
            level.append(len(tokens))
            tokens.append(token), parents.append(-1), scores.append(q), values.append(q)
        for _level in range(2, k + 1):
            expand = [i for i in level if tokens[i] not in self.stop_tokens]
            expand = sorted(expand, key=lambda i: -values[i])[: self.width]
            if not expand or values[expand[0]] < self.min_value:
                break  # another level would cost a pass for leaves too unlikely to be reached
            feed_parents = [area_of[parents[i]] if parents[i] >= 0 else -1 for i in expand]
            for i in expand:
                area_of[i] = len(area_of)
            tree = None if self.chains_only else feed_parents
            logits = self.draft.forward([tokens[i] for i in expand], tree=tree)
            level = []
            for row, i in enumerate(expand):
                for token, q in zip(*self._children(logits[row], params), strict=True):
                    level.append(len(tokens))
                    tokens.append(token), parents.append(i), scores.append(q)
                    values.append(values[i] * q)
        self.draft.crop(base)  # the tree leaves the draft's cache; the accepted path is fed next round
        proposal = Proposal(tokens, parents=parents, scores=scores, sources=["draft"] * len(tokens))
        proposal = proposal.best(values, self.max_nodes)
        return proposal.breadth_first(proposal.path_values(proposal.scores))
