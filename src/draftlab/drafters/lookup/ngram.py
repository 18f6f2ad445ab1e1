"""Prompt-lookup drafting: copy what followed the last earlier occurrence of the current n-gram.

The n-gram search (`ContextIndex.longest_match`) is shared with the prompt-lookup trees
(`lookup_tree.py`).
"""

from __future__ import annotations

from draftlab.drafters.lookup.context_index import ContextIndex
from draftlab.proposers.base import Proposal, Proposer
from draftlab.sampling import Sampler, SamplingParams

# A lookup whose hit agrees with the current text well beyond the n-gram is a copy in progress,
# and its continuation is accepted far more often: on the built-in suite with llama.cpp, every
# round drafting what it found (up to 10 tokens), 3-gram hits that agreed on 3-5 tokens brought
# 0.6-2.0 accepted tokens a round and those agreeing on 12 or more 5.4-10. So the round sizer
# learns acceptance per class of agreement length (the proposal's kind), from these edges.
AGREEMENT_EDGES = (4, 8, 16)


class LookupProposer(Proposer):
    """Proposes from the text itself: the prompt and what the target wrote after it."""

    def __init__(self, index_ngrams: int = 1) -> None:
        self._prompt: list[int] = []
        self._prefix_len = 0
        self.index = ContextIndex(index_ngrams)  # starts of n-grams up to `index_ngrams` tokens

    def start(self, prompt_ids: list[int], prefix: list[int]) -> None:
        # For an encoder-decoder model the prompt is not part of the decoder sequence,
        # yet it is where summaries and answers copy from: search it too.
        self._prompt = [] if prefix == list(prompt_ids) else list(prompt_ids)
        self._prefix_len = len(prefix) if self._prompt else 0
        self.index.reset(self._prompt)

    def context(self, sequence: list[int]) -> ContextIndex:
        """The searched text (the prompt, when apart, then what follows it in `sequence`), indexed."""
        self.index.follow(sequence, self._prefix_len)
        return self.index


class PromptLookupProposer(LookupProposer):
    """Longest n-gram first (down to `min_ngram`), most recent match, up to k tokens copied.

    A single token that occurs three or more times in the context ("the", "\\n", a comma) is
    weak evidence: what followed its latest occurrence is rarely what comes next. Such a
    match proposes at most `weak_tokens` tokens, so a likely miss costs no more than a
    short verification pass instead of a long one.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, weak_tokens: int = 3) -> None:
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.weak_tokens = weak_tokens
        super().__init__(max_ngram)

    def propose(self, sequence: list[int], k: int, params: SamplingParams, sampler: Sampler) -> Proposal:
        if k <= 0:
            return Proposal()
        index = self.context(sequence)
        match = index.longest_match(self.max_ngram, self.min_ngram)
        if match is None:
            return Proposal()
        n, hits = match
        context = index.tokens
        weak = n == 1 and len(hits) >= 3
        length = min(k, self.weak_tokens) if weak else k
        hit = hits[-1]  # the most recent match; at least one token follows it
        kind = f"{n}-gram" + (" weak" if weak else "")
        if n == self.max_ngram:
            # Classed by agreement within the n-gram's record (round_sizer.parent_kind). A shorter
            # n-gram means that no longer one matched anywhere: only the longest can agree further.
            kind += "/" + agreement_kind(agreement(context, hit, n, AGREEMENT_EDGES[-1]))
        return Proposal(context[hit + n : hit + n + length], kind=kind)


def agreement(context: list[int], hit: int, n: int, cap: int) -> int:
    """How many tokens before the end of `context` equal those before the end of the n-gram that
    starts at `hit` (at least n, since the n-gram matched), counted up to `cap`."""
    end, here = hit + n, len(context)
    length = n
    while length < cap and end - length - 1 >= 0 and context[end - length - 1] == context[here - length - 1]:
        length += 1
    return length


def length_class(length: int) -> str:
    """A match length in the classes both lookups calibrate apart (AGREEMENT_EDGES): "3", "4-7",
    "8-15", "16+"."""
    if length < AGREEMENT_EDGES[0]:
        return str(length)
    below = [edge for edge in AGREEMENT_EDGES if edge <= length]
    if len(below) == len(AGREEMENT_EDGES):
        return f"{AGREEMENT_EDGES[-1]}+"
    return f"{below[-1]}-{AGREEMENT_EDGES[len(below)] - 1}"


def agreement_kind(length: int) -> str:
    """The class of a match by how far it agrees (AGREEMENT_EDGES), e.g. "agrees on 8-15"."""
    return f"agrees on {length_class(length)}"
