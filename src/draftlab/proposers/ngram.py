"""Prompt-lookup drafting: copy what followed the last earlier occurrence of the current n-gram."""

from __future__ import annotations

import torch

from draftlab.proposers.base import Proposal, Proposer
from draftlab.sampling import Sampler, SamplingParams


class LookupProposer(Proposer):
    """Proposes from the text itself: the prompt and what the target wrote after it."""

    def __init__(self) -> None:
        self._prompt: list[int] = []
        self._prefix_len = 0

    def start(self, prompt_ids: list[int], prefix: list[int]) -> None:
        # For an encoder-decoder model the prompt is not part of the decoder sequence,
        # yet it is where summaries and answers copy from: search it too.
        self._prompt = [] if prefix == list(prompt_ids) else list(prompt_ids)
        self._prefix_len = len(prefix)

    def context(self, sequence: list[int]) -> list[int]:
        return self._prompt + sequence[self._prefix_len :] if self._prompt else sequence


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
        super().__init__()

    def propose(self, sequence: list[int], k: int, params: SamplingParams, sampler: Sampler) -> Proposal:
        if k <= 0:
            return Proposal()
        context = torch.tensor(self.context(sequence))
        n_ctx = context.numel()
        for n in range(min(self.max_ngram, n_ctx - 1), self.min_ngram - 1, -1):
            tail = context[-n:]
            windows = context[:-1].unfold(0, n, 1)  # every earlier n-gram, excluding the tail itself
            hits = torch.nonzero((windows == tail).all(dim=1)).flatten()
            if hits.numel() == 0:
                continue
            weak = n == 1 and hits.numel() >= 3
            length = min(k, self.weak_tokens) if weak else k
            start = int(hits[-1]) + n  # the most recent match
            continuation = context[start : start + length].tolist()
            if continuation:
                return Proposal(continuation, kind=f"{n}-gram" + (" weak" if weak else ""))
        return Proposal()
