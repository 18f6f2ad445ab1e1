"""Hybrid trees: the prompt-lookup tree and the draft model's tree merged into one.

Where both propose the same path, the node is shared and keeps the higher of the two values;
a copy from the prompt and the draft's guesses are then verified in the same target pass.
"""

from __future__ import annotations

from draftlab.drafters.draft_model.tree import MAX_TREE_NODES, DraftTreeProposer
from draftlab.drafters.lookup.tree import LookupTreeProposer
from draftlab.proposal import Proposal
from draftlab.proposers.base import Proposer
from draftlab.sampling import Sampler, SamplingParams


class HybridTreeProposer(Proposer):
    makes_trees = True
    # SizedDrafting and LookupPart (proposers/capabilities.py): the sizer may skip drafting, and then
    # the lookup tree is the round's proposal.
    use_draft = True
    min_value = 0.0

    def __init__(
        self, draft: DraftTreeProposer, lookup: LookupTreeProposer, max_nodes: int = MAX_TREE_NODES
    ) -> None:
        self.draft_tree = draft
        self.lookup = lookup
        self.max_nodes = max_nodes
        self.draft = draft.draft  # the loop synchronises the draft's device like any draft model's
        self._looked_up: tuple[int, Proposal] | None = None  # (sequence length, lookup tree)

    @property
    def forward_calls(self) -> int:  # type: ignore[override]
        return self.draft_tree.forward_calls

    def start(self, prompt_ids: list[int], prefix: list[int]) -> None:
        self._looked_up = None
        self.draft_tree.start(prompt_ids, prefix)
        self.lookup.start(prompt_ids, prefix)

    def rollback(self, length: int) -> None:
        self.draft_tree.rollback(length)

    def lag(self, sequence: list[int]) -> int:
        return self.draft_tree.lag(sequence)

    def lookup_tree(self, sequence: list[int]) -> Proposal:
        if self._looked_up is None or self._looked_up[0] != len(sequence):
            self._looked_up = (len(sequence), self.lookup.propose(sequence, self.lookup.depth, None, None))
        return self._looked_up[1]

    def propose(self, sequence: list[int], k: int, params: SamplingParams, sampler: Sampler) -> Proposal:
        looked_up = self.lookup_tree(sequence)
        self._looked_up = None
        if not self.use_draft:  # drafting does not pay here: the lookup tree alone
            return looked_up
        self.draft_tree.min_value = self.min_value
        drafted = self.draft_tree.propose(sequence, k, params, sampler)
        return merge_trees([drafted, looked_up], self.max_nodes)


def merge_trees(trees: list[Proposal], max_nodes: int) -> Proposal:
    """One tree holding every path of `trees`; a shared node keeps the best score and value."""
    tokens: list[int] = []
    parents: list[int] = []
    scores: list[float] = []
    sources: list[str] = []
    values: list[float] = []
    index: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
    kinds = [t.kind for t in trees if t.tokens and t.kind]
    for tree in trees:
        tree_scores = tree.scores or [1.0] * len(tree.tokens)
        tree_values = tree.path_values(tree_scores)
        mapped: list[int] = []
        for i, p in enumerate(tree.parent_list()):
            parent = mapped[p] if p >= 0 else -1
            key = (parent, tree.tokens[i])
            source = tree.sources[i] if tree.sources else "tree"
            node = index.get(key)
            if node is None:
                node = index[key] = len(tokens)
                tokens.append(tree.tokens[i]), parents.append(parent), scores.append(tree_scores[i])
                sources.append(source), values.append(tree_values[i])
            else:
                if source not in sources[node].split("+"):
                    sources[node] += "+" + source
                if tree_values[i] > values[node]:
                    scores[node], values[node] = tree_scores[i], tree_values[i]
            mapped.append(node)
    merged = Proposal(
        tokens, kind=kinds[-1] if kinds else None, parents=parents, scores=scores, sources=sources
    )
    merged = merged.best(values, max_nodes)
    kept_values = merged.path_values(merged.scores)
    return merged.breadth_first(kept_values)
