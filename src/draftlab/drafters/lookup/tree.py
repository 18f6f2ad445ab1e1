"""Prompt-lookup trees: every earlier match of the current n-gram, merged into one tree.

Prompt lookup (`ngram.py`) copies what followed the most recent match only; when the context
holds several matches that disagree, the tree keeps them all, most frequent first, and one
target pass verifies every one of them.
"""

from __future__ import annotations

from draftlab.drafters.lookup.ngram import LookupProposer
from draftlab.drafters.lookup.trie import ContinuationTrie
from draftlab.proposal import Proposal
from draftlab.sampling import Sampler, SamplingParams

# The most nodes a lookup tree offers the sizer; it verifies fewer when the cost curve says so.
MAX_TREE_NODES = 64


class LookupTreeProposer(LookupProposer):
    """Longest n-gram with any match (down to `min_ngram`); all its matches, up to `depth` tokens each."""

    makes_trees = True

    def __init__(
        self, max_ngram: int = 3, min_ngram: int = 1, depth: int = 10, max_nodes: int = MAX_TREE_NODES
    ):
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.depth = depth
        self.max_nodes = max_nodes
        super().__init__(max_ngram)

    def propose(self, sequence: list[int], k: int, params: SamplingParams, sampler: Sampler) -> Proposal:
        if k <= 0:
            return Proposal(parents=[])
        index = self.context(sequence)
        depth = min(k, self.depth)
        match = index.longest_match(self.max_ngram, self.min_ngram)
        if match is None:
            return Proposal(parents=[])
        n, hits = match
        context = index.tokens
        trie = ContinuationTrie()
        for hit in hits:  # oldest first, so that ties go to the most recent match
            trie.add(context[hit + n : hit + n + depth])
        proposal, _ = trie.proposal(self.max_nodes, depth, kind=f"{n}-gram tree", source="lookup")
        return proposal
