"""The text a lookup proposer searches, kept across a generation's rounds and indexed as it grows.

Searching the whole context every round (a numpy copy of it and a scan per n-gram) cost 0.1-0.15
ms a round on the built-in suite's long prompts, where a llama.cpp step takes 6-7 ms on a 2-core
AMD Zen5: 2% of a round that mostly decodes plainly. Here a round only appends the tokens the
target wrote since the last one and reads a few dict entries.
"""

from __future__ import annotations

import numpy as np


class ContextIndex:
    """A growing token list, as a numpy array too, and where each of its n-grams (n <= max_n) starts.

    Only n-grams that some token follows are indexed (a match at the very end has nothing to copy),
    so `starts` gives exactly the earlier occurrences of a pattern, oldest first.
    """

    def __init__(self, max_n: int) -> None:
        self.max_n = max_n
        self.clear()

    def clear(self) -> None:
        self.tokens: list[int] = []
        self._buffer = np.empty(256, dtype=np.int64)
        self._starts: dict[tuple[int, ...], list[int]] = {}
        self._indexed = 0  # n-grams ending before this position are indexed
        self._head = 0

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def array(self) -> np.ndarray:
        return self._buffer[: len(self.tokens)]

    def extend(self, new: list[int]) -> None:
        if not new:
            return
        start, end = len(self.tokens), len(self.tokens) + len(new)
        if end > len(self._buffer):
            grown = np.empty(max(end, 2 * len(self._buffer)), dtype=np.int64)
            grown[:start] = self._buffer[:start]
            self._buffer = grown
        self._buffer[start:end] = new
        self.tokens.extend(new)
        tokens, starts = self.tokens, self._starts
        for last in range(self._indexed, end - 1):  # every n-gram ending at `last` now has a successor
            for n in range(1, min(self.max_n, last + 1) + 1):
                starts.setdefault(tuple(tokens[last - n + 1 : last + 1]), []).append(last - n + 1)
        self._indexed = end - 1

    def reset(self, head: list[int]) -> None:
        """A new text that starts with `head` (a prompt searched beside the decoder's sequence)."""
        self.clear()
        self.extend(list(head))
        self._head = len(head)

    def follow(self, sequence: list[int], offset: int = 0) -> None:
        """Make the index hold its head + `sequence[offset:]`: appending what is new when the text
        only grew (a generation's text grows by accepted tokens), rebuilt when it did not."""
        have = len(self.tokens) - self._head  # tokens of sequence[offset:] already held
        if len(sequence) - offset < have or (have and self.tokens[-1] != sequence[offset + have - 1]):
            self.reset(self.tokens[: self._head])
            have = 0
        self.extend(sequence[offset + have :])

    def starts(self, pattern: tuple[int, ...]) -> list[int]:
        """Where `pattern` (at most max_n tokens) occurred with a token after it, oldest first."""
        return self._starts.get(pattern, [])

    def longest_match(self, max_ngram: int, min_ngram: int = 1) -> tuple[int, list[int]] | None:
        """The longest n (`max_ngram` down to `min_ngram`) whose last n tokens occurred before, with
        the start of every earlier occurrence (oldest first); None when none did."""
        tokens = self.tokens
        for n in range(min(max_ngram, self.max_n, len(tokens) - 1), min_ngram - 1, -1):
            hits = self._starts.get(tuple(tokens[-n:]))
            if hits:
                return n, hits
        return None
