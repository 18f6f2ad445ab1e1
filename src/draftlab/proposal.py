"""What a proposer hands the verifier: candidate tokens, as a chain or as a token tree.

Proposers (layer 2) build it and acceptance rules (layer 3) read it, so it lives below both.

A tree is a list of nodes in topological order, each with a parent index (-1: a child of the
root, the last token already final). A chain is the tree whose node i has parent i - 1; it is
stored with `parents=None` so that the common case pays nothing for the generality. Siblings
are listed in the order the verifier tries them, most likely first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Proposal:
    tokens: list[int] = field(default_factory=list)
    # The (warped) distribution each node's token was drawn from, [n, V], given its earlier
    # siblings; None means the proposer is deterministic, i.e. q is one-hot on the token.
    probs: torch.Tensor | None = None
    # BiLD: the small model stopped because it was unsure, so the target writes the next token.
    fell_back: bool = False
    # What sort of evidence the proposal rests on (prompt lookup: the n-gram length matched), so
    # that acceptance can be estimated per sort; None where there is one sort only.
    kind: str | None = None
    # Tree proposals: each node's parent (-1 for the root's children); None for a chain.
    parents: list[int] | None = None
    # Tree proposals: the proposer's own estimate that a node is accepted once its parent is
    # (draft probability, match frequency); the round sizer calibrates it against what happens.
    scores: list[float] | None = None
    # Tree proposals: which proposer made each node ("draft", "lookup", "suffix"), for hybrids.
    sources: list[str] | None = None

    @property
    def is_tree(self) -> bool:
        return self.parents is not None and any(p != i - 1 for i, p in enumerate(self.parents))

    def parent_list(self) -> list[int]:
        return list(self.parents) if self.parents is not None else list(range(-1, len(self.tokens) - 1))

    def truncate(self, k: int) -> Proposal:
        """A chain's first k tokens (a tree's first k nodes, which stay a tree: nodes are topological)."""
        if k >= len(self.tokens):
            return self
        return self.select(list(range(k)))

    def select(self, keep: list[int]) -> Proposal:
        """The sub-tree of the nodes in `keep` (ancestor-closed, any order), re-indexed in node order."""
        keep = sorted(keep)
        index = {old: new for new, old in enumerate(keep)}
        parents = self.parent_list()
        new_parents = [index[parents[i]] if parents[i] >= 0 else -1 for i in keep]
        probs = self.probs[keep] if self.probs is not None and keep else None
        return Proposal(
            [self.tokens[i] for i in keep],
            probs,
            self.fell_back,
            self.kind,
            new_parents if self.parents is not None else None,
            [self.scores[i] for i in keep] if self.scores is not None else None,
            [self.sources[i] for i in keep] if self.sources is not None else None,
        )

    def depths(self) -> list[int]:
        """Depth of each node: 1 for the root's children."""
        out: list[int] = []
        for p in self.parent_list():
            out.append(1 if p < 0 else out[p] + 1)
        return out

    def children(self) -> dict[int, list[int]]:
        """Node -> its children in verification order; -1 is the root."""
        out: dict[int, list[int]] = {-1: []}
        for i, p in enumerate(self.parent_list()):
            out.setdefault(p, []).append(i)
            out.setdefault(i, [])
        return out

    def path_values(self, accept: list[float]) -> list[float]:
        """P(a node is reached and accepted) = the product of `accept` along its path."""
        out: list[float] = []
        for i, p in enumerate(self.parent_list()):
            out.append(accept[i] * (out[p] if p >= 0 else 1.0))
        return out

    def best(self, values: list[float], n: int) -> Proposal:
        """The n nodes of highest value, ancestor-closed (a node never outranks its parent)."""
        if n >= len(self.tokens):
            return self
        parents = self.parent_list()
        # Ties and rounding could rank a child above its parent; take ancestors along with it.
        chosen: set[int] = set()
        for i in sorted(range(len(values)), key=lambda i: (-values[i], i)):
            if len(chosen) >= n:
                break
            path = []
            node = i
            while node >= 0 and node not in chosen:
                path.append(node)
                node = parents[node]
            if len(chosen) + len(path) <= n:
                chosen.update(path)
        return self.select(sorted(chosen))

    def breadth_first(self, values: list[float]) -> Proposal:
        """The same tree with nodes ordered by depth, then by value: topological, and siblings
        in the order the verifier should try them, likeliest first."""
        depths = self.depths()
        order = sorted(range(len(self.tokens)), key=lambda i: (depths[i], -values[i], i))
        index = {old: new for new, old in enumerate(order)}
        parents = self.parent_list()
        return Proposal(
            [self.tokens[i] for i in order],
            self.probs[order] if self.probs is not None and order else None,
            self.fell_back,
            self.kind,
            [index[parents[i]] if parents[i] >= 0 else -1 for i in order],
            [self.scores[i] for i in order] if self.scores is not None else None,
            [self.sources[i] for i in order] if self.sources is not None else None,
        )

    def top_path(self) -> list[int]:
        """The chain of first children from the root: the proposer's single best guess."""
        kids = self.children()
        path, node = [], -1
        while kids.get(node):
            node = kids[node][0]
            path.append(node)
        return path
