"""How often to look for free drafts (lookups) when the sizer keeps verifying none of them.

A lookup costs no model pass, but its Python work runs every round: on llama.cpp's Q4_1 target
on a 2-core AMD Zen5, SuffixDecoding's lookup and tree fitting took 0.3 ms of a 6.6 ms step, and
on a subtask where the steep cost curve let no lookup pay (grammar correction, none verified in
143 rounds) that alone made it 8% slower than plain decoding. So after `IDLE_ROUNDS` proposals in
a row that the sizer left unverified, the loop skips proposing for 1 round, then, while the next
proposal is left unverified too, for 2, 4 and at most `MAX_SKIP` rounds; a verified proposal
brings it back to every round. A copy that starts during a skip is found at most `MAX_SKIP`
rounds late, and the shadows keep scoring what was proposed before. Where looking costs under
`MIN_LOOK_SHARE` of a target step (a lookup's 0.05 ms against transformers' 25-40 ms steps), that
delay is not worth it, and every round looks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

IDLE_ROUNDS = 4
MAX_SKIP = 8
MIN_LOOK_SHARE = 0.005


@dataclass
class ProposalPacer:
    idle_rounds: int = IDLE_ROUNDS
    max_skip: int = MAX_SKIP
    min_look_share: float = MIN_LOOK_SHARE
    _idle: int = field(default=0, init=False)  # proposals in a row left unverified
    _skip: int = field(default=0, init=False)  # the last skip's length (0: proposing every round)
    _left: int = field(default=0, init=False)  # rounds of the current skip still to go

    def wants_proposal(self) -> bool:
        """False for a round to run plainly, without a proposal."""
        if self._left:
            self._left -= 1
            return False
        return True

    def proposed(self, verified: bool, look_share: float) -> None:
        """After a proposal: whether the sizer verified any of it (a probe does not count), and
        what looking costs as a share of a target step."""
        if verified or look_share < self.min_look_share:
            self._idle = self._skip = 0
            return
        self._idle += 1
        if self._skip or self._idle >= self.idle_rounds:
            self._skip = min(max(1, 2 * self._skip), self.max_skip)
            self._left = self._skip
            self._idle = 0
