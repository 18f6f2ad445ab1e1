"""A prefix tree of candidate continuations, weighted by how often each was seen.

Lookup proposers (all prompt-lookup matches, SuffixDecoding) collect the continuations that
followed earlier occurrences of the current context and merge them here; the tree they propose
is the most frequent part of it. A node's score is its frequency given its parent's, the
estimate SuffixDecoding uses (Oliaro et al. 2024, §3.2); the round sizer calibrates it against
what the target accepts.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from draftlab.proposal import Proposal


@dataclass
class _Node:
    token: int
    weight: float = 0.0
    order: int = 0  # tie-break: later insertions (more recent matches) first
    children: dict[int, _Node] = field(default_factory=dict)
    origins: set[str] = field(default_factory=set)


class ContinuationTrie:
    def __init__(self) -> None:
        self.root = _Node(-1)
        self._count = 0

    def add(self, tokens: list[int], weight: float = 1.0, origin: str | None = None) -> None:
        self._count += 1
        node = self.root
        node.weight += weight
        for token in tokens:
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = _Node(token)
            child.weight += weight
            child.order = self._count
            if origin is not None:
                child.origins.add(origin)
            node = child

    def __bool__(self) -> bool:
        return bool(self.root.children)

    def proposal(
        self, max_nodes: int, max_depth: int, kind: str | None, source: str, min_score: float = 0.0
    ) -> tuple[Proposal, set[str]]:
        """The `max_nodes` most frequent nodes (best-first), up to `max_depth` deep, and the
        origins of the continuations they came from. Nodes whose path frequency falls below
        `min_score` are left out, as SuffixDecoding prunes unlikely branches."""
        tokens: list[int] = []
        parents: list[int] = []
        scores: list[float] = []
        origins: set[str] = set()
        # (-path value, -recency, tie, node, parent index, depth, score)
        heap: list = []
        tie = 0

        def push(parent_node: _Node, parent_index: int, parent_value: float, depth: int) -> None:
            nonlocal tie
            if depth > max_depth:
                return
            for child in parent_node.children.values():
                score = child.weight / parent_node.weight if parent_node.weight else 0.0
                value = parent_value * score
                if value >= min_score:
                    tie += 1
                    heapq.heappush(heap, (-value, -child.order, tie, child, parent_index, depth, score))

        push(self.root, -1, 1.0, 1)
        while heap and len(tokens) < max_nodes:
            neg_value, _, _, node, parent_index, depth, score = heapq.heappop(heap)
            tokens.append(node.token)
            parents.append(parent_index)
            scores.append(score)
            origins |= node.origins
            push(node, len(tokens) - 1, -neg_value, depth + 1)
        proposal = Proposal(tokens, kind=kind, parents=parents, scores=scores, sources=[source] * len(tokens))
        # Best-first order is topological and lists a parent's likelier children first.
        return proposal, origins
