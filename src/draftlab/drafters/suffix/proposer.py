"""SuffixDecoding (Oliaro et al. 2024): speculation trees from the prompt and earlier outputs.

The longest suffix of the current text that occurred before, in the prompt, in the text written
so far or in the outputs of earlier requests of the same run, is looked up; everything that
followed its occurrences is merged into a frequency-weighted tree. How deep the tree may go
grows with the length of that match (the paper's MAX_SPEC = α·p; α = 4 here: on the built-in
multi-turn, qa and rag prompts it accepted 1.47 tokens a round against 1.41 with α = 1, and the
round sizer trims what does not pay), and branches whose estimated
probability falls below a floor are pruned. Outputs of a request with the same prompt are never
used (in a benchmark that would be the answer itself); the proposer records which earlier
outputs its proposals drew on.

A proposal's kind is its match length, in the classes prompt lookup uses for agreement
(`ngram.length_class`: 1, 2, 3, 4-7, 8-15, 16+), which the sizer calibrates
apart: replaying the built-in suite's outputs, the best path of a tree from a match of 4-7 tokens
kept 3.0 tokens on average, one from 8-15 tokens 4.1 and one from 16 or more 5.9 (on math 2.3, 3.3
and 4.7). Pooled as one "4 or more" class, the long copies of summaries paid for 4-7-token
matches on math, which lose where a verification pass of 7 tokens costs 3.7 steps (llama.cpp's
Q4_1 file on a 2-core Zen5).
"""

from __future__ import annotations

import math

import numpy as np

from draftlab.drafters.lookup.ngram import LookupProposer, length_class
from draftlab.drafters.lookup.trie import ContinuationTrie
from draftlab.proposal import Proposal
from draftlab.proposers.base import Proposer
from draftlab.sampling import Sampler, SamplingParams

MAX_TREE_NODES = 64
SEPARATOR = -1  # between joined outputs: no token id, so no match runs across two outputs


class SuffixProposer(LookupProposer):
    makes_trees = True

    def __init__(
        self,
        max_pattern: int = 32,
        depth_factor: float = 4.0,
        max_depth: int = 16,
        min_score: float = 0.1,
        max_nodes: int = MAX_TREE_NODES,
    ) -> None:
        self.max_pattern = max_pattern
        self.depth_factor = depth_factor
        self.max_depth = max_depth
        self.min_score = min_score
        self.max_nodes = max_nodes
        self._outputs: list[tuple[int, str, np.ndarray]] = []  # (prompt key, label, tokens)
        self._key = 0
        # The outputs this generation may use, end to end, each followed by SEPARATOR: one array
        # to search instead of one per output (a search per output cost 155 µs a round by the
        # 36th generation of a bench, 3% of a llama.cpp step). Rebuilt when the store changes.
        self._earlier = np.empty(0, dtype=np.int64)
        self._earlier_positions = TokenPositions(self._earlier)
        self._earlier_list: list[int] = []
        self._next_separator = np.empty(0, dtype=np.int64)
        self._starts = np.empty(0, dtype=np.int64)
        self._labels: list[str] = []
        self._built_for: tuple[int, int, int] | None = None
        super().__init__()
        self.used: dict[str, int] = {}

    def start(self, prompt_ids: list[int], prefix: list[int]) -> None:
        super().start(prompt_ids, prefix)
        self._key = hash(tuple(prompt_ids))
        self.used = {}

    def finish(self, prompt_ids: list[int], output_ids: list[int]) -> None:
        if output_ids:
            label = f"output #{len(self._outputs) + 1}"
            self._outputs.append((hash(tuple(prompt_ids)), label, np.asarray(output_ids, dtype=np.int64)))

    def share(self, other: Proposer) -> None:
        if isinstance(other, SuffixProposer):
            self._outputs = other._outputs  # one store of earlier outputs for every dtype copy

    def _earlier_outputs(self) -> np.ndarray:
        """The earlier outputs this generation may use (never one for the same prompt), joined."""
        state = (id(self._outputs), len(self._outputs), self._key)
        if state != self._built_for:
            usable = [(label, tokens) for key, label, tokens in self._outputs if key != self._key]
            sizes = [len(tokens) + 1 for _, tokens in usable]
            self._starts = (
                np.cumsum([0, *sizes[:-1]]).astype(np.int64) if usable else np.empty(0, dtype=np.int64)
            )
            self._labels = [label for label, _ in usable]
            joined = [part for _, tokens in usable for part in (tokens, np.array([SEPARATOR]))]
            self._earlier = np.concatenate(joined).astype(np.int64) if joined else np.empty(0, dtype=np.int64)
            self._earlier_positions = TokenPositions(self._earlier)
            self._earlier_list = self._earlier.tolist()
            # Per position, where the next SEPARATOR is (every output is followed by one).
            separators = np.flatnonzero(self._earlier == SEPARATOR)
            self._next_separator = separators[np.searchsorted(separators, np.arange(len(self._earlier)))]
            self._built_for = state
        return self._earlier

    def info(self) -> dict:
        return {"earlier_outputs_used": dict(self.used), "earlier_outputs_held": len(self._outputs)}

    def propose(self, sequence: list[int], k: int, params: SamplingParams, sampler: Sampler) -> Proposal:
        if k <= 0:
            return Proposal(parents=[])
        index = self.context(sequence)
        if len(index) < 2:
            return Proposal(parents=[])
        own, earlier = index.array, self._earlier_outputs()
        last = index.tokens[-1]
        # Where the last token occurred (in the own text: not at its very end), from the indexes.
        first = [np.asarray(index.starts((last,)), dtype=np.int64), self._earlier_positions[last]]
        length, (own_ends, earlier_ends) = _longest_match([own[:-1], earlier], own, first, self.max_pattern)
        if not length:
            return Proposal(parents=[])
        depth = min(k, self.max_depth, max(1, math.ceil(self.depth_factor * length)))
        trie = ContinuationTrie()
        tokens = index.tokens
        for end in own_ends.tolist():
            trie.add(tokens[end : end + depth], origin="context")
        if earlier_ends.size:
            # A continuation stops at its output's end (the next SEPARATOR).
            stops = np.minimum(earlier_ends + depth, self._next_separator[earlier_ends]).tolist()
            outputs = (np.searchsorted(self._starts, earlier_ends, side="right") - 1).tolist()
            joined = self._earlier_list
            for end, stop, output in zip(earlier_ends.tolist(), stops, outputs, strict=True):
                if stop > end:
                    trie.add(joined[end:stop], origin=self._labels[output])
        proposal, origins = trie.proposal(
            self.max_nodes,
            depth,
            kind=f"suffix {length_class(length)}",
            source="suffix",
            min_score=self.min_score,
        )
        for label in origins - {"context"}:
            self.used[label] = self.used.get(label, 0) + 1
        return proposal


def _longest_match(
    docs: list[np.ndarray], text: np.ndarray, first: list[np.ndarray], max_pattern: int
) -> tuple[int, list[np.ndarray]]:
    """The longest suffix of `text` (up to `max_pattern`) found in any doc, and per doc the
    indices just after each of its occurrences (where a continuation starts); `first` holds,
    per doc, where the last token of `text` occurs in it."""
    cap = min(max_pattern, len(text) - 1)
    if cap < 1:
        return 0, [np.empty(0, dtype=np.int64) for _ in docs]
    # All candidates at once, a few array operations per doc (a loop over lengths cost ~4 numpy
    # calls per length and doc, a third of a suffix round): how far back from each candidate the
    # doc agrees with the end of `text`.
    back = np.arange(1, cap + 1)
    wanted = text[::-1][:cap]
    agreements = []
    for doc, positions in zip(docs, first, strict=True):
        ends = positions + 1
        at = ends[:, None] - back[None, :]
        same = (doc[np.maximum(at, 0)] == wanted) & (at >= 0)
        agreements.append((ends, np.cumprod(same, axis=1).sum(axis=1)))
    best_len = max((int(agree.max()) for _, agree in agreements if agree.size), default=0)
    if not best_len:
        return 0, [np.empty(0, dtype=np.int64) for _ in docs]
    return best_len, [ends[agree == best_len] for ends, agree in agreements]


class TokenPositions:
    """Where each token occurs in a fixed array, grouped once (`positions[token]`, ascending)."""

    def __init__(self, tokens: np.ndarray) -> None:
        self._order = np.argsort(tokens, kind="stable")
        self._values, self._firsts = np.unique(tokens[self._order], return_index=True)
        self._ends = np.append(self._firsts[1:], len(tokens))

    def __getitem__(self, token: int) -> np.ndarray:
        i = int(np.searchsorted(self._values, token))
        if i == len(self._values) or self._values[i] != token:
            return np.empty(0, dtype=np.int64)
        return self._order[self._firsts[i] : self._ends[i]]
