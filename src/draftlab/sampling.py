"""Sampling parameters and the logits -> probabilities warp shared by target and draft.

Speculative sampling is lossless with respect to the *warped* target distribution, so
the draft and the target must be warped by exactly the same function.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from draftlab.errors import DraftlabError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy
    top_k: int = 0  # 0 disables
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise DraftlabError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise DraftlabError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise DraftlabError(f"top_k must be >= 0, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


_WIDENED = (torch.float32, torch.bfloat16, torch.float16)


def argmax_rows(logits: torch.Tensor) -> list[int]:
    """The argmax of each row ([k, V] -> k ids; [V] -> one), the first of equal maxima as torch's.

    On CPU float32 logits (llama.cpp's, float32 transformers') numpy's argmax is about 10x faster than
    torch's (2.7 against 34 us for one 49,152-logit row on the Zen5): every greedy round pays it, and
    a greedy draft every token. Half-precision logits (a bfloat16 or 4-bit model's) are widened to
    float32 first, exactly: torch's argmax over bfloat16 took 178 us for one such row on a Zen4, the
    widening and numpy's argmax 13 (8 rows: 760 against 72)."""
    if logits.device.type == "cpu" and logits.dtype in _WIDENED and not logits.requires_grad:
        rows = logits.float().numpy().argmax(axis=-1)
    else:
        rows = torch.argmax(logits, dim=-1)
    return rows.tolist() if rows.ndim else [int(rows)]


def warp_probs(
    logits: torch.Tensor, params: SamplingParams, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Probabilities after temperature, top-k and top-p, row-wise over [..., V].

    Float32 while decoding; the exactness law asks for float64, so that a cell that is zero in
    exact arithmetic stays within float64's rounding of zero on every CPU.
    """
    logits = logits.to(dtype) / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        drop_sorted = (torch.cumsum(sorted_probs, dim=-1) - sorted_probs) >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


class Sampler:
    """Draws tokens with one seeded generator per device, so runs are reproducible."""

    keyed = False  # see KeyedSampler

    def __init__(self, seed: int | None) -> None:
        self.seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}

    def generator(self, device: torch.device) -> torch.Generator:
        gen = self._generators.get(device)
        if gen is None:
            gen = torch.Generator(device=device)
            if self.seed is None:
                gen.seed()
            else:
                gen.manual_seed(self.seed)
            self._generators[device] = gen
        return gen

    def uniform(self, device: torch.device) -> float:
        return torch.rand((), generator=self.generator(device), device=device).item()

    def draw(self, probs: torch.Tensor, position: int | None = None) -> int:
        """One token from a probability vector [V] (`position`, the token's place in the sequence,
        only matters to a KeyedSampler)."""
        return int(torch.multinomial(probs, 1, generator=self.generator(probs.device)).item())


class KeyedSampler(Sampler):
    """Sampling that plain decoding and every lossless method repeat token for token (exact mode).

    The token at position n is argmax_i p_i / E_i, with E_i ~ Exp(1) drawn from a generator keyed by
    (seed, n) alone: the exponential race (Gumbel-max), so it is distributed as p, and given p it
    depends on nothing but n. A round keeps a proposed token while it equals the target's pick there
    (verify/rules.py), and a draft picks its tokens with the same noise, so draft and target agree
    whenever their races are won by the same token. Given the same logits (exact mode), plain
    decoding and every method write the same tokens for a seed, each distributed as the target's.
    For a deterministic draft a token is kept with probability p(token), as by the classic rule; a
    sampled draft's is kept less often than by the classic rule, which keeps it with probability
    1 - TV(p, q).
    """

    keyed = True
    KEPT = 32  # positions whose noise is kept: a round's drafts and its verification reuse it

    def __init__(self, seed: int | None) -> None:
        super().__init__(seed)
        # Without a seed, one drawn now: the run is then its own, as any unseeded run.
        # SeedSequence takes non-negative integers; a negative seed (torch takes one) maps to one.
        self.key = int(np.random.SeedSequence().entropy) if seed is None else seed % 2**64
        self._noise: dict[int, np.ndarray] = {}

    def noise(self, position: int, width: int) -> np.ndarray:
        """E_0..E_width-1 at `position`. numpy fills an array value by value, so a wider draw of the
        same key starts with the narrower one: a draft and a target whose vocabularies are padded to
        other sizes see the same noise on every id they share."""
        have = self._noise.get(position)
        if have is None or len(have) < width:
            rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.key, position])))
            have = rng.standard_exponential(width)
            self._noise[position] = have
            if len(self._noise) > self.KEPT:
                for old in sorted(self._noise)[: -self.KEPT]:
                    del self._noise[old]
        return have[:width]

    def draw(self, probs: torch.Tensor, position: int | None = None) -> int:
        if position is None:
            return super().draw(probs)
        row = probs.detach().to("cpu", torch.float64).numpy()
        # A token of probability 0 (top-k, top-p) scores 0, even against a noise of exactly 0.
        with np.errstate(divide="ignore"):  # p > 0 over a noise of 0 wins: an event of probability 0
            race = np.divide(row, self.noise(position, row.shape[-1]), out=np.zeros_like(row), where=row > 0)
        return int(np.argmax(race))

    def picks(self, logits: torch.Tensor, params: SamplingParams, positions: list[int]) -> list[int]:
        """The token at each row's position: each row warped alone, as plain decoding's one row is,
        so equal logits give equal probabilities bit for bit."""
        return [self.draw(warp_probs(logits[i : i + 1], params)[0], n) for i, n in enumerate(positions)]
