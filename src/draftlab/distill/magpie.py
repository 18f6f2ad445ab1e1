"""User prompts the target writes itself (Magpie: Xu et al., 2024, "Alignment Data Synthesis from
Scratch by Prompting Aligned LLMs with Nothing").

An instruction-tuned target given only its chat template's header for a user turn writes a user's
request, drawn from what it was tuned on. Those requests are far more varied than templates, and
they are the target's own distribution, which is what a head drafting for it must learn. Sampling
at temperature 1 costs a fraction of answering: on a 2-core AMD Zen5, SmolLM2-135M-Instruct in
bfloat16 wrote 32 requests of up to 64 tokens in 6.2 s.

Requests are appended to `magpie_prompts.jsonl` in the data folder as each batch is written, so
an interrupted run keeps them and a resumed one asks only for the rest.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from draftlab.errors import DraftlabError

FILE = "magpie_prompts.jsonl"
SENTINEL = "\x00draftlab-user-turn\x00"
TEMPERATURE = 1.0  # Magpie samples the request at temperature 1, top-p 1
MIN_CHARS = 12  # shorter "requests" are fragments ("Hi", "?")
# A batch stops once this share of its rows has closed its turn; the rest count as cut off. At
# temperature 1 about a quarter of SmolLM2-135M's requests run past 128 tokens, and waiting for
# them tripled the cost of a batch (64 rows: 49 closed in 23 s; 70% closed after about 50 tokens).
# The price is fewer long requests.
CLOSED_SHARE = 0.7


class _MostClosed(StoppingCriteria):
    """Stops the batch once CLOSED_SHARE of its rows have written an end-of-turn token."""

    def __init__(self, ends: list[int], start: int) -> None:
        self.ends = torch.tensor(ends)
        self.start = start

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        closed = torch.isin(input_ids[:, self.start :], self.ends.to(input_ids.device)).any(dim=-1)
        done = closed.float().mean() >= CLOSED_SHARE
        return torch.full((input_ids.shape[0],), bool(done), dtype=torch.bool, device=input_ids.device)


def user_turn_prefix(tokenizer) -> tuple[list[int], list[int]]:
    """(the tokens that open a user turn, the tokens that may end it), read off the chat template.

    The template renders a one-message conversation with a sentinel as the user's text: what comes
    before the sentinel is the header (a system prompt included, if the template adds one by
    default), and the first token after it closes the turn."""
    if not getattr(tokenizer, "chat_template", None):
        raise DraftlabError(
            "--magpie-prompts needs a target with a chat template (an instruction-tuned model)"
        )
    text = tokenizer.apply_chat_template([{"role": "user", "content": SENTINEL}], tokenize=False)
    if SENTINEL not in text:
        raise DraftlabError(
            "--magpie-prompts: the target's chat template does not show the user's text as given"
        )
    head, tail = text.split(SENTINEL, 1)
    prefix = tokenizer(head, add_special_tokens=False)["input_ids"]
    closing = tokenizer(tail, add_special_tokens=False)["input_ids"][:1]
    if not prefix:
        raise DraftlabError("--magpie-prompts: the chat template has no header before the user's text")
    ends = set(closing)
    if tokenizer.eos_token_id is not None:
        ends.add(tokenizer.eos_token_id)
    return list(prefix), sorted(ends)


def read_prompts(data_dir: Path) -> list[str]:
    path = data_dir / FILE
    if not path.exists():
        return []
    prompts = []
    for line in path.read_text().splitlines():
        try:
            prompts.append(json.loads(line)["prompt"])
        except (json.JSONDecodeError, KeyError, TypeError):
            continue  # a line cut short by an interrupted write
    return prompts


@torch.inference_mode()
def write_prompts(
    model,
    tokenizer,
    data_dir: Path,
    count: int,
    seed: int,
    batch_size: int,
    max_new_tokens: int = 128,
    deadline: float | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> list[str]:
    """`count` distinct requests (fewer if the deadline passes or the target rarely ends a turn).

    A request counts only if the target closed the turn itself: one cut off at `max_new_tokens`
    would teach the head to answer half a question."""
    prompts = read_prompts(data_dir)
    seen = set(prompts)
    if len(prompts) >= count:
        return prompts[:count]
    prefix, ends = user_turn_prefix(tokenizer)
    device = model.get_input_embeddings().weight.device
    ids = torch.tensor([prefix] * batch_size, device=device)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else ends[0]
    data_dir.mkdir(parents=True, exist_ok=True)
    attempts = 0
    # Stop trying when the target closes under one turn in eight: it is not a chat model.
    while len(prompts) < count and attempts < max(8 * count, 4 * batch_size):
        if deadline is not None and time.time() >= deadline:
            break
        torch.manual_seed(seed + len(prompts) * 7919 + attempts)
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            temperature=TEMPERATURE,
            top_p=1.0,
            top_k=0,
            max_new_tokens=max_new_tokens,
            eos_token_id=ends,
            pad_token_id=pad,
            stopping_criteria=StoppingCriteriaList([_MostClosed(ends, len(prefix))]),
        )
        attempts += batch_size
        new = []
        for row in out[:, len(prefix) :].tolist():
            cut = next((i for i, t in enumerate(row) if t in ends), None)
            if cut is None:
                continue
            text = tokenizer.decode(row[:cut], skip_special_tokens=True).strip()
            if len(text) >= MIN_CHARS and text not in seen:
                seen.add(text)
                new.append(text)
        new = new[: count - len(prompts)]
        if new:
            with (data_dir / FILE).open("a") as f:
                f.writelines(json.dumps({"prompt": p}, ensure_ascii=False) + "\n" for p in new)
            prompts.extend(new)
        if on_batch:
            on_batch(len(new))
    return prompts
