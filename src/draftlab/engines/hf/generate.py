"""Hugging Face's own `generate` (plain and assisted) behind draftlab's interface, as a reference peer."""

from __future__ import annotations

import torch
from transformers.generation.streamers import BaseStreamer

from draftlab.decode.stats import Generation, GenerationStats
from draftlab.decode.timing import synchronized_clock
from draftlab.models.loading import LoadedModel
from draftlab.sampling import SamplingParams


class _FirstTokenClock(BaseStreamer):
    """generate() hands the streamer the prompt first, then each accepted chunk: time the first chunk."""

    def __init__(self, devices: list[torch.device]) -> None:
        self.devices = devices
        self.calls = 0
        self.first_token_at: float | None = None
        self.first_chunk = 0

    def put(self, value: torch.Tensor) -> None:
        self.calls += 1
        if self.calls == 2:
            self.first_token_at = synchronized_clock(self.devices)
            self.first_chunk = int(value.numel())

    def end(self) -> None:
        pass


class _CallCounter:
    def __init__(self, model: torch.nn.Module) -> None:
        self.calls = 0
        self._handle = model.register_forward_hook(self._hook)

    def _hook(self, *_: object) -> None:
        self.calls += 1

    def remove(self) -> None:
        self._handle.remove()


class HFGenerateDecoder:
    def __init__(
        self,
        target: LoadedModel,
        draft: LoadedModel | None = None,
        gamma: int = 4,
        assistant_confidence: float = 0.0,
    ) -> None:
        self.target = target
        self.draft = draft
        self.gamma = gamma
        self.assistant_confidence = assistant_confidence

    def _configure_assistant(self) -> None:
        # AssistedCandidateGenerator reads these from the assistant's own generation config,
        # which every decoder sharing this draft also writes: set them for each call.
        assert self.draft is not None
        gen_cfg = self.draft.model.generation_config
        gen_cfg.num_assistant_tokens = self.gamma
        gen_cfg.num_assistant_tokens_schedule = "constant"
        gen_cfg.assistant_confidence_threshold = self.assistant_confidence

    def generate(self, prompt_ids: list[int], max_new_tokens: int, params: SamplingParams) -> Generation:
        lm = self.target
        devices = [lm.device] + ([self.draft.device] if self.draft else [])
        ids = torch.tensor([prompt_ids], device=lm.device)
        eos = sorted(lm.eos_token_ids)
        kwargs: dict = {
            "max_new_tokens": max_new_tokens,
            "eos_token_id": eos or None,
            "pad_token_id": lm.tokenizer.pad_token_id
            if lm.tokenizer.pad_token_id is not None
            else (eos[0] if eos else 0),
            "attention_mask": torch.ones_like(ids),
            "do_sample": not params.greedy,
        }
        if not params.greedy:
            kwargs.update(temperature=params.temperature, top_k=params.top_k or None, top_p=params.top_p)
            if params.seed is not None:
                torch.manual_seed(params.seed)
        else:
            kwargs.update(temperature=None, top_k=None, top_p=None)
        if self.draft is not None:
            self._configure_assistant()
            kwargs["assistant_model"] = self.draft.model
        clock = _FirstTokenClock(devices)
        target_counter = _CallCounter(lm.model.get_decoder() if lm.is_encoder_decoder else lm.model)
        draft_counter = _CallCounter(self.draft.model) if self.draft else None
        try:
            t0 = synchronized_clock(devices)
            with torch.inference_mode():
                out = lm.model.generate(ids, streamer=clock, **kwargs)
            t_end = synchronized_clock(devices)
        finally:
            target_counter.remove()
            if draft_counter:
                draft_counter.remove()
        start = 0 if lm.is_encoder_decoder else ids.shape[1]
        tokens = out[0, start:].tolist()
        if lm.is_encoder_decoder and tokens and tokens[0] == lm.model.config.decoder_start_token_id:
            tokens = tokens[1:]
        first = clock.first_token_at if clock.first_token_at is not None else t_end
        stats = GenerationStats(
            prompt_tokens=len(prompt_ids),
            dtype=lm.spec.dtype,
            new_tokens=len(tokens),
            prefill_s=first - t0,
            first_tokens=min(clock.first_chunk, len(tokens)),
            decode_s=t_end - first,
            target_calls=target_counter.calls,
            rounds=target_counter.calls,  # every target pass of generate() yields at least one token
            draft_calls=draft_counter.calls if draft_counter else 0,
        )
        text = lm.tokenizer.decode(tokens, skip_special_tokens=True)
        return Generation(tokens, text, stats)
