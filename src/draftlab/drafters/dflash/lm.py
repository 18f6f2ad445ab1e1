"""A loaded DFlash drafter beside its target: what the CLI, the profile and the reports read of a
loaded model, and the block passes its cost profile times."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from transformers import DynamicCache

from draftlab.drafters.dflash.head import DFlashDraft, crop_to
from draftlab.drafters.dflash.io import ARCHITECTURE, is_dflash_folder, load_dflash
from draftlab.errors import DraftlabError
from draftlab.models.loading import DTYPES, LoadedModel, ModelSpec, resolve_path


@dataclass
class DFlashLM:
    model: DFlashDraft
    embedding: torch.nn.Module  # the target's, lent
    output_head: torch.nn.Module  # the target's, lent
    tokenizer: object  # the target's
    spec: ModelSpec
    path: str
    eos_token_ids: set[int] = field(default_factory=set)
    target_context: int | None = None
    is_encoder_decoder: bool = False
    storage: str | None = None
    engine: ClassVar[str] = "hf"
    fingerprint = LoadedModel.fingerprint

    @property
    def device(self) -> torch.device:
        return self.model.fc.weight.device

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    @property
    def context_length(self) -> int | None:
        return self.target_context

    @property
    def num_parameters(self) -> int:
        """The drafter's own weights (the embedding and output head are the target's)."""
        return sum(p.numel() for p in self.model.parameters())

    def logits(self, rows: torch.Tensor) -> torch.Tensor:
        return self.model.logits(rows, self.output_head)

    def cached_model(self, use_cache: bool = True) -> BlockPasses:
        return BlockPasses(self)


class BlockPasses:
    """What `draftlab profile` times: block passes of n rows over a cached context of zeros-fed rows.
    A pass of n rows costs what a block of n rows (the anchor and n - 1 masks) costs there."""

    def __init__(self, lm: DFlashLM) -> None:
        self.lm = lm
        self.forward_calls = 0
        self._cache = DynamicCache()
        self._length = 0

    @property
    def length(self) -> int:
        return self._length

    def start(self, prompt_ids: list[int]) -> list[int]:
        self._cache, self._length = DynamicCache(), 0
        return list(prompt_ids)

    @torch.inference_mode()
    def forward(self, ids: list[int], keep: int = 1, **_) -> torch.Tensor:
        draft = self.lm.model
        block = self.lm.embedding(torch.tensor([ids], device=self.lm.device)).to(draft.fc.weight.dtype)
        empty = block[:, :0]
        positions = torch.arange(self._length, self._length + len(ids), device=self.lm.device)[None]
        out = draft(block, empty, positions, self._cache)
        self._length += len(ids)
        self.forward_calls += 1
        return self.lm.logits(out[0, -keep:]).float()

    def crop(self, length: int) -> None:
        if length < self._length:
            crop_to(self._cache, length)
            self._length = length


def load_dflash_lm(path: str, target, dtype: str | None = None) -> DFlashLM:
    """The DFlash drafter at `path` (folder or registry name) beside its loaded target, checked to fit it."""
    dtype = dtype or target.spec.dtype
    folder = resolve_path(path)
    if not is_dflash_folder(folder):
        raise DraftlabError(f"'{path}' is not a DFlash drafter folder (config.json with {ARCHITECTURE})")
    draft = load_dflash(folder, DTYPES[dtype])
    tc = target.model.config
    if draft.config.vocab_size != target.vocab_size:
        raise DraftlabError(
            f"DFlash drafter '{path}' was made for a vocabulary of {draft.config.vocab_size} tokens, "
            f"target '{target.spec.name}' has {target.vocab_size}"
        )
    if (
        max(draft.taps) >= tc.num_hidden_layers
        or draft.config.hidden_size != tc.hidden_size
        or draft.fc.in_features != len(draft.taps) * tc.hidden_size
    ):
        raise DraftlabError(
            f"DFlash drafter '{path}' reads target layers {list(draft.taps)} of width "
            f"{draft.target_hidden_size} into width {draft.config.hidden_size}; target "
            f"'{target.spec.name}' has {tc.num_hidden_layers} layers of width {tc.hidden_size}"
        )
    draft.to(target.device)
    return DFlashLM(
        draft,
        target.model.get_input_embeddings(),
        target.model.get_output_embeddings(),
        target.tokenizer,
        ModelSpec(path, dtype, target.spec.device),
        folder,
        set(target.eos_token_ids),
        target.context_length,
    )
