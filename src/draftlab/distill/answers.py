"""Who writes the target's answers: the target in this process (batched `generate`), or an engine
that serves the same weights faster on some CPUs (llama-server's parallel slots).

An engine's answers are only token ids; the target here then scores each answered sequence in one
teacher-forced pass for its top-k labels, so every record in the store looks alike whoever wrote it.
Where both can answer, the first batches race: each answers two batches of real jobs in turn (kept,
nothing is wasted) and the faster in response tokens per second answers the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch
from rich.console import Console

from draftlab.errors import DraftlabError


class Answerer(Protocol):
    """An engine's answers to prompts given as token ids (after the target's chat template)."""

    name: str  # e.g. "llama-server Q4_1, 8 slots": recorded with every batch it writes

    def respond(self, prompts: list[list[int]], temperature: float, seed: int) -> list[list[int]]:
        """Each prompt's response tokens, the end-of-sequence token kept where it stopped there."""
        ...

    def close(self) -> None: ...


# What the command line hands the pipeline: (engine name, a function that starts its answerer).
AnswererFactory = tuple[str, Callable[[], Answerer]]


class Scored:
    """An engine's answers with the teacher's top-k labels from one teacher-forced pass each."""

    def __init__(self, answerer: Answerer, teacher) -> None:
        self.answerer, self.teacher = answerer, teacher
        self.name = answerer.name

    def respond(
        self, prompts: list[list[int]], temperature: float, seed: int
    ) -> list[tuple[list[int], torch.Tensor, torch.Tensor]]:
        responses = self.answerer.respond(prompts, temperature, seed)
        seqs = [p + r for p, r in zip(prompts, responses, strict=True)]
        out = []
        for prompt, resp, (ids, logp) in zip(prompts, responses, self.teacher.score(seqs), strict=True):
            # score's row j is the distribution of token j + 1, so resp[i] is row len(prompt) + i - 1
            first = len(prompt) - 1
            out.append((resp, ids[first : first + len(resp)], logp[first : first + len(resp)]))
        return out

    def close(self) -> None:
        self.answerer.close()


class Lazy:
    """An engine's answerer, started the first time it is asked to answer (a server starts once)."""

    def __init__(self, name: str, start: Callable[[], Answerer], teacher) -> None:
        self.name, self._start, self.teacher = name, start, teacher
        self._scored: Scored | None = None
        self._label = name
        self.failure = ""

    @property
    def label(self) -> str:
        """What answered (the engine's own description once started: its model file, its slots)."""
        return self._label

    def ready(self) -> bool:
        """Started (once); False, with the reason on stderr, where it cannot start (e.g. a model
        llama.cpp's converter does not know): the race goes on without it."""
        if self._scored is None:
            try:
                self._scored = Scored(self._start(), self.teacher)
                self._label = self._scored.name
            except DraftlabError as exc:
                self.failure = str(exc)
                Console(stderr=True).print(f"[yellow]warning:[/] {self.name} does not answer: {exc}")
                return False
        return True

    def respond(self, prompts: list[list[int]], temperature: float, seed: int):
        if not self.ready():
            raise DraftlabError(f"{self.name} cannot answer: {self.failure}")
        return self._scored.respond(prompts, temperature, seed)

    def close(self) -> None:
        if self._scored is not None:
            self._scored.close()
            self._scored = None


@dataclass
class Race:
    """Picks who answers each batch: the contestants take turns for `rounds` batches each, then the
    one with the most response tokens per second over its race batches answers the rest. Batches
    differ (prompt and answer lengths), so one batch each is a noisy sample; an engine that is not
    answering is stopped meanwhile (an idle llama-server's threads spin and slow the target here)."""

    contestants: list  # objects with `name` and `respond` (the teacher, `Lazy` engines)
    rounds: int = 2
    rates: dict[str, list[float]] = field(default_factory=dict)  # name -> [tokens, seconds, batches]
    winner: object | None = None  # once every contestant has answered its race batches
    race_rates: dict[str, float] = field(default_factory=dict)  # name -> tokens/s when decided

    def next(self):
        if self.winner is not None:
            return self.winner
        while True:
            turn = min(self.contestants, key=lambda c: self._batches(c.name))
            if len(self.contestants) > 1 and hasattr(turn, "ready") and not turn.ready():
                self.contestants.remove(turn)  # the others answer
                continue
            self._stop_all_but(turn)
            return turn

    def _batches(self, name: str) -> int:
        return int(self.rates.get(name, (0, 0.0, 0))[2])

    def _stop_all_but(self, keep) -> None:
        for c in self.contestants:
            if c is not keep and hasattr(c, "close"):
                c.close()

    def record(self, contestant, tokens: int, seconds: float) -> None:
        done = self.rates.setdefault(contestant.name, [0, 0.0, 0])
        done[0] += tokens
        done[1] += seconds
        done[2] += 1
        if self.winner is None and all(self._batches(c.name) >= self.rounds for c in self.contestants):
            self.race_rates = {c.name: self.tokens_per_s(c.name) for c in self.contestants}
            self.winner = max(self.contestants, key=lambda c: self.race_rates[c.name])
            self._stop_all_but(self.winner)

    def tokens_per_s(self, name: str) -> float:
        tokens, seconds, _ = self.rates.get(name, (0, 0.0, 0))
        return tokens / seconds if seconds > 0 else 0.0

    def close(self) -> None:
        for c in self.contestants:
            if hasattr(c, "close"):
                c.close()

    def summary(self) -> dict[str, dict]:
        labels = {c.name: getattr(c, "label", c.name) for c in self.contestants}
        return {
            name: {
                "by": labels.get(name, name),
                "tokens": int(t),
                "seconds": round(s, 1),
                "tokens_per_s": round(self.tokens_per_s(name), 1),
                "race_tokens_per_s": round(self.race_rates.get(name, 0.0), 1),
                "won": self.winner is not None and self.winner.name == name,
            }
            for name, (t, s, _) in self.rates.items()
        }
