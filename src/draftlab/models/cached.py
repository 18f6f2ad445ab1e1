"""A model and its KV cache: feed new tokens, read their logits, roll back with `crop`.

The decode loop sees every model as one growing token sequence. For a decoder-only model
that sequence starts with the prompt; for an encoder-decoder model the prompt goes through
the encoder once and the sequence starts with the decoder start token.
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput

from draftlab.models.loading import LoadedModel


class CachedModel:
    def __init__(self, lm: LoadedModel, use_cache: bool = True) -> None:
        self.lm = lm
        self.model = lm.model
        self.device = lm.device
        self.use_cache = use_cache
        self.forward_calls = 0
        params = inspect.signature(self.model.forward).parameters
        self._keeps_logits = "logits_to_keep" in params
        self._cache: DynamicCache | EncoderDecoderCache | None = None
        self._encoder_out: BaseModelOutput | None = None
        self._tokens: list[int] = []  # the sequence fed so far (needed without a cache)

    @property
    def length(self) -> int:
        """How many tokens of the sequence the model has already consumed."""
        return len(self._tokens)

    @torch.inference_mode()
    def start(self, prompt_ids: list[int]) -> list[int]:
        """Reset for a new prompt and return the sequence's prefix (nothing is fed yet)."""
        self._tokens = []
        self._encoder_out = None
        config = self.model.config
        if self.lm.is_encoder_decoder:
            ids = torch.tensor([prompt_ids], device=self.device)
            # The encoder runs once per generation; forward_calls counts decoder passes only.
            self._encoder_out = self.model.get_encoder()(input_ids=ids, return_dict=True)
            self._cache = (
                EncoderDecoderCache(DynamicCache(config=config), DynamicCache(config=config))
                if self.use_cache
                else None
            )
            start = config.decoder_start_token_id
            if start is None:
                start = config.pad_token_id
            return [int(start)]
        self._cache = DynamicCache(config=config) if self.use_cache else None
        return list(prompt_ids)

    @torch.inference_mode()
    def forward(self, new_ids: list[int], keep: int | None = None) -> torch.Tensor:
        """Logits [k, V] for the k new tokens, or for only the last `keep` of them.

        Asking only for the rows that are needed skips the output layer on the others, which
        matters for a long prompt fed together with a proposal.
        """
        self._tokens.extend(new_ids)
        if self.use_cache:
            feed = torch.tensor([new_ids], device=self.device)
        else:
            feed = torch.tensor([self._tokens], device=self.device)
        kwargs: dict = {"use_cache": self.use_cache, "past_key_values": self._cache}
        keep = len(new_ids) if keep is None else min(keep, len(new_ids))
        if self._keeps_logits:
            kwargs["logits_to_keep"] = keep
        if self._encoder_out is not None:
            out = self.model(encoder_outputs=self._encoder_out, decoder_input_ids=feed, **kwargs)
        else:
            out = self.model(input_ids=feed, **kwargs)
        self.forward_calls += 1
        return out.logits[0, -keep:]

    def crop(self, length: int) -> None:
        """Forget everything after the first `length` tokens of the sequence."""
        drop = len(self._tokens) - length
        if drop <= 0:
            return
        del self._tokens[length:]
        if self._cache is not None:
            self._cache.crop(-drop)  # transformers 5 takes the number of tokens to remove
