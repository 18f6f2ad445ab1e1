"""Is a decoder's sampling law the target's? A chi-square test over the first two new tokens.

The target's exact law over the first two tokens after a prefix is computed from its logits:
p(a) from one pass over the prefix, p(b | a) from one pass over the prefix plus a, for every
first token a that is expected often enough to matter. Each (a, b) expected at least
`min_expected` times in `samples` draws is a cell of its own; the rest of row a is pooled into
"(a, any other b)", the first tokens left out into one more cell, and cells still expected
fewer than `min_expected` times into a last pooled cell, so that the chi-square approximation
holds. A vocabulary of any size costs at most `max_first` + 1 target passes.

Sampling is made cheap by `reuse_prefix`: the target and the draft compute the prefix's KV cache
once, and each of the thousands of 2-token generations then only runs its own rounds. It works
for any decoder built from `LoadedModel`s, so every method in the registry is sampled the same way.

`ResampleFromTargetRule` is the deliberately wrong rule that shows the test has power.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import torch
from scipy.stats import chisquare
from transformers import DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from draftlab.models.loading import LoadedModel
from draftlab.sampling import SamplingParams, warp_probs
from draftlab.verify.rules import SpeculativeRule

END = -1  # the "second token" of a generation whose first token ended it
OTHER = -2  # "any other token" in a pooled cell
Pair = tuple[int, int]


class ResampleFromTargetRule(SpeculativeRule):
    """A classic bug: after a rejection, sample from p instead of the residual max(0, p - q)."""

    @staticmethod
    def residual(p_row, proposal, i, token):
        return p_row


# ----------------------------------------------------------------------------- the exact law


def _start_token(lm: LoadedModel) -> int:
    config = lm.model.config
    start = config.decoder_start_token_id
    return int(config.pad_token_id if start is None else start)


@torch.inference_mode()
def next_token_logits(
    lm: LoadedModel, prompt_ids: list[int], firsts: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's logits after the prompt [V], and after prompt + a for each a in `firsts` [n, V].

    Straight through the model (transformers' own cache, batched over `firsts`), sharing no code
    with the decode loop's cache handling.
    """
    if getattr(lm, "cached_model", None) is not None:  # a model that brings its own passes (llama.cpp)
        return _own_passes_next_token_logits(lm, prompt_ids, firsts)
    model = lm.model
    device = lm.device
    keeps = "logits_to_keep" in inspect.signature(model.forward).parameters
    one = {"logits_to_keep": 1} if keeps else {}
    prompt = torch.tensor([list(prompt_ids)], device=device)
    if lm.is_encoder_decoder:
        start = _start_token(lm)
        encoder_out = model.get_encoder()(input_ids=prompt, return_dict=True)
        first = model(encoder_outputs=encoder_out, decoder_input_ids=torch.tensor([[start]], device=device))
        rows = []
        for i in range(0, len(firsts), 64):
            chunk = firsts[i : i + 64]
            hidden = encoder_out.last_hidden_state.expand(len(chunk), -1, -1)
            dec = torch.tensor([[start, a] for a in chunk], device=device)
            out = model(encoder_outputs=(hidden,), decoder_input_ids=dec, use_cache=False)
            rows.append(out.logits[:, -1].float())
        return first.logits[0, -1].float(), torch.cat(rows) if rows else torch.empty(0)
    cache = DynamicCache(config=model.config)
    first = model(input_ids=prompt, past_key_values=cache, use_cache=True, **one).logits[0, -1].float()
    kv = [(layer.keys, layer.values) for layer in cache.layers]
    batch = max(1, min(64, 4096 // len(prompt_ids)))
    rows = []
    for i in range(0, len(firsts), batch):
        chunk = firsts[i : i + batch]
        n = len(chunk)
        expanded = DynamicCache(config=model.config)
        for layer, (keys, values) in enumerate(kv):
            expanded.update(keys.expand(n, -1, -1, -1), values.expand(n, -1, -1, -1), layer)
        ids = torch.tensor([[a] for a in chunk], device=device)
        out = model(input_ids=ids, past_key_values=expanded, use_cache=True)
        rows.append(out.logits[:, -1].float())
    return first, torch.cat(rows) if rows else torch.empty(0)


def _own_passes_next_token_logits(
    lm, prompt_ids: list[int], firsts: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same for a model with its own cache-aware passes (a GGUF run by llama.cpp): one pass over
    the prompt, then one 1-token pass per first token a, each after removing the last from the cache
    (the engine's own rollback)."""
    from draftlab.models.cached import cached  # noqa: PLC0415

    runner = cached(lm)
    runner.start(list(prompt_ids))
    first = runner.forward(list(prompt_ids), keep=1)[-1]
    rows = []
    for a in firsts:
        runner.crop(len(prompt_ids))
        rows.append(runner.forward([a], keep=1)[-1])
    return first, torch.stack(rows) if rows else torch.empty(0)


@dataclass
class TwoTokenLaw:
    """The target's exact law over the first two new tokens, as the cells of a chi-square test."""

    cells: list[Pair]  # (a, b), (a, OTHER), (OTHER, OTHER) for the first tokens left out
    probs: np.ndarray  # one probability per cell, summing to 1
    pooled: list[int] = field(default_factory=list)  # indices of cells merged into the last one
    samples: int = 0  # the sample count the cells were sized for

    def __post_init__(self) -> None:
        self._index = {cell: i for i, cell in enumerate(self.cells)}

    def cell(self, pair: Pair) -> int:
        a, b = pair
        for key in ((a, b), (a, OTHER), (OTHER, OTHER)):
            if key in self._index:
                return self._index[key]
        raise KeyError(pair)

    def p_value(self, counts: Counter[Pair]) -> float:
        """Chi-square goodness of fit of the observed pairs to this law."""
        observed = np.zeros(len(self.cells))
        for pair, n in counts.items():
            observed[self.cell(pair)] += n
        expected = self.probs * observed.sum()
        if self.pooled:
            keep = np.ones(len(self.cells), dtype=bool)
            keep[self.pooled] = False
            observed = np.append(observed[keep], observed[~keep].sum())
            expected = np.append(expected[keep], expected[~keep].sum())
        impossible = (expected <= 0) & (observed > 0)
        if impossible.any():
            return 0.0  # the target never writes these tokens, the decoder did
        used = expected > 0
        observed, expected = observed[used], expected[used]
        if len(observed) < 2:
            return 1.0  # a single possible outcome: nothing can differ
        expected = expected / expected.sum() * observed.sum()
        return float(chisquare(observed, expected).pvalue)

    @property
    def degrees_of_freedom(self) -> int:
        return len(self.cells) - len(self.pooled) + (1 if self.pooled else 0) - 1


def _remainder(listed: torch.Tensor, vocab: int) -> float:
    """1 − Σ listed probabilities, with rounding noise taken as the zero it is.

    The probabilities are a float64 softmax over `vocab` logits: each carries a relative error of
    a few eps and their sum a further `vocab`·eps at most (Higham's bound for a recursive sum), so a
    remainder within 2·vocab·eps of zero cannot be told from zero and would otherwise become a
    cell that nothing can land in. Float64 keeps that bound far below any cell that matters.
    """
    rest = 1.0 - float(listed.sum()) if listed.numel() else 1.0
    return rest if rest > 2 * vocab * torch.finfo(listed.dtype).eps else 0.0


def two_token_law(
    lm: LoadedModel,
    prompt_ids: list[int],
    params: SamplingParams,
    samples: int,
    min_expected: float = 5.0,
    max_first: int = 256,
) -> TwoTokenLaw:
    """The target's exact law over its first two tokens after `prompt_ids`, cells sized for `samples`."""
    threshold = min_expected / samples
    eos = set(lm.eos_token_ids)
    first_logits, _ = next_token_logits(lm, prompt_ids, [])
    p1 = warp_probs(first_logits, params, torch.float64).cpu()
    order = torch.argsort(p1, descending=True)
    firsts = [int(a) for a in order[:max_first] if p1[a] >= threshold]
    continuing = [a for a in firsts if a not in eos]
    _, second_logits = next_token_logits(lm, prompt_ids, continuing)
    p2 = warp_probs(second_logits, params, torch.float64).cpu() if continuing else None
    cells: list[Pair] = []
    probs: list[float] = []
    row_of = {a: i for i, a in enumerate(continuing)}
    for a in firsts:
        pa = float(p1[a])
        if a in eos:
            cells.append((a, END))
            probs.append(pa)
            continue
        row = p2[row_of[a]]
        listed = torch.nonzero(pa * row >= threshold).flatten().tolist()
        listed.sort(key=lambda b: -float(row[b]))
        for b in listed:
            cells.append((a, int(b)))
            probs.append(pa * float(row[b]))
        cells.append((a, OTHER))
        probs.append(pa * _remainder(row[listed], len(row)))
    cells.append((OTHER, OTHER))
    probs.append(_remainder(p1[firsts], len(p1)))
    arr = np.array(probs)
    arr = arr / arr.sum()
    pooled = [i for i, p in enumerate(arr) if p * samples < min_expected]
    if len(pooled) == 1:
        pooled = []  # one small cell stays as it is: pooling it with nothing changes nothing
    return TwoTokenLaw(cells, arr, pooled, samples)


# ----------------------------------------------------------------------------- sampling


class _PrefixReuse:
    """Stands in for a model: a pass over `prefix + more` into an empty cache reuses the prefix's KV.

    Everything else (attributes, `generate`, the encoder) goes to the model itself.
    """

    def __init__(self, model: torch.nn.Module, prefix: list[int]) -> None:
        self._model = model
        self._prefix = list(prefix)
        with torch.inference_mode():
            cache = DynamicCache(config=model.config)
            device = model.get_input_embeddings().weight.device
            out = model(input_ids=torch.tensor([self._prefix], device=device), past_key_values=cache)
        self._kv = [(layer.keys, layer.values) for layer in cache.layers]
        self._last = out.logits[0, -1:]

    def __getattr__(self, name: str):
        return getattr(self._model, name)

    def _reusable(self, input_ids, cache) -> bool:
        if input_ids is None or cache is None or not isinstance(cache, DynamicCache):
            return False
        if cache.get_seq_length() != 0 or input_ids.shape[0] != 1:
            return False
        n = len(self._prefix)
        return input_ids.shape[1] >= n and input_ids[0, :n].tolist() == self._prefix

    def __call__(self, *args, input_ids=None, past_key_values=None, **kwargs):
        if args or not self._reusable(input_ids, past_key_values):
            # Only the keywords the caller gave: input_ids=None beside a positional input_ids is a TypeError.
            given = {"input_ids": input_ids, "past_key_values": past_key_values}
            return self._model(*args, **{k: v for k, v in given.items() if v is not None}, **kwargs)
        for i, (keys, values) in enumerate(self._kv):
            past_key_values.update(keys, values, i)
        rest = input_ids[:, len(self._prefix) :]
        if rest.shape[1] == 0:  # the prefix itself (a draft's prefill): only its last row is ever read
            return CausalLMOutputWithPast(logits=self._last[None], past_key_values=past_key_values)
        if (kwargs.get("logits_to_keep") or 0) > rest.shape[1]:
            raise ValueError("reuse_prefix: logits of prefix positions other than the last were asked for")
        return self._model(input_ids=rest, past_key_values=past_key_values, **kwargs)


def reuse_prefix(lm: LoadedModel, prompt_ids: list[int]) -> LoadedModel:
    """The same model, computing the KV cache of `prompt_ids[:-1]` once for every generation after it.

    A decoder-only model's first pass of each generation then runs only the prompt's last token and
    what follows it; a llama.cpp model keeps the prefix in its own cache instead. Encoder-decoder
    models are returned as they are (every generation then runs in full).
    """
    if lm.is_encoder_decoder or len(prompt_ids) < 2:
        return lm
    keep = getattr(lm, "keep_prefix", None)  # a model that keeps a prefix in its own cache (llama.cpp)
    if keep is not None:
        return keep(prompt_ids[:-1])
    return dataclasses.replace(lm, model=_PrefixReuse(lm.model, prompt_ids[:-1]))


@dataclass
class SampleRun:
    counts: Counter[Pair] = field(default_factory=Counter)
    samples: int = 0
    drafted: int = 0
    accepted: int = 0
    speculative_samples: int = 0  # samples whose generation drafted at least one token

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    def to_dict(self) -> dict:
        return {
            "samples": self.samples,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance": self.acceptance,
            "speculative_samples": self.speculative_samples,
        }


def sample_pairs(
    decoder,
    prompt_ids: list[int],
    params: SamplingParams,
    seeds: Iterable[int],
    on_sample: Callable[[], None] | None = None,
) -> SampleRun:
    """The first two tokens of one 2-token generation per seed."""
    run = SampleRun()
    for seed in seeds:
        out = decoder.generate(prompt_ids, 2, dataclasses.replace(params, seed=seed))
        tokens = out.tokens
        run.counts[(tokens[0], tokens[1] if len(tokens) > 1 else END)] += 1
        run.samples += 1
        run.drafted += out.stats.drafted
        run.accepted += out.stats.accepted
        run.speculative_samples += int(out.stats.drafted > 0)
        if on_sample is not None:
            on_sample()
    return run
