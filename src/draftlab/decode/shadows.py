"""What the sizer learns from rounds it did not run: the acceptance a longer (or shorter) draft would have had,
read off each round's proposal and the target's verdict."""

from __future__ import annotations


class Shadows:
    """One shadow per kind of proposal at a time: a rare kind (a long copy) is scored too while a
    frequent one (a weak 1-gram) is being watched, so the sizer learns every kind's acceptance."""

    def __init__(self) -> None:
        self._by_kind: dict[str | None, Shadow] = {}

    @property
    def active(self) -> bool:
        return any(shadow.active for shadow in self._by_kind.values())

    def begin(self, tokens: list[int], kind: str | None) -> None:
        shadow = self._by_kind.setdefault(kind, Shadow())
        if not shadow.active:
            shadow.begin(tokens, kind)

    def advance(self, written: list[int]) -> list[tuple[int, int, str | None]]:
        """Feed the target's new tokens to every shadow; returns those that ended."""
        ended = (shadow.advance(written) for shadow in self._by_kind.values() if shadow.active)
        return [e for e in ended if e is not None]

    def end(self) -> list[tuple[int, int, str | None]]:
        ended = (shadow.end() for shadow in self._by_kind.values())
        return [e for e in ended if e is not None]


class Shadow:
    """At k = 0, a free proposal is checked against the tokens the target writes instead."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.kind: str | None = None
        self.matched = 0

    @property
    def active(self) -> bool:
        return bool(self.tokens)

    def begin(self, tokens: list[int], kind: str | None) -> None:
        self.tokens, self.kind, self.matched = list(tokens), kind, 0

    def advance(self, written: list[int]) -> tuple[int, int, str | None] | None:
        """Feed the target's new tokens; returns (tried, accepted, kind) once the shadow ends."""
        for token in written:
            if self.tokens[self.matched] != token:
                return self.end(miss=True)
            self.matched += 1
            if self.matched == len(self.tokens):
                return self.end(miss=False)
        return None

    def end(self, miss: bool = False) -> tuple[int, int, str | None] | None:
        if not self.tokens:
            return None
        out = (self.matched + int(miss), self.matched, self.kind)
        self.tokens, self.matched = [], 0
        return out if out[0] > 0 else None
