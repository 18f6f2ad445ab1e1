"""The teacher: the target answering the distillation prompts in batches, its top-k log-probs captured as labels,
written in shards as it goes (a stopped run resumes from the shards)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from draftlab.distill.answers import Race
from draftlab.distill.data import Job, Message, done_keys, write_shard


class _TopKCapture(LogitsProcessor):
    """Records top-k log-probs of the raw scores at every generation step; changes nothing."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.ids: list[torch.Tensor] = []
        self.logp: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        values, indices = torch.log_softmax(scores.float(), dim=-1).topk(self.k, dim=-1)
        self.ids.append(indices.to(torch.int32).cpu())
        self.logp.append(values.to(torch.float16).cpu())
        return scores


class Teacher:
    def __init__(self, model, tokenizer, top_k: int, max_new_tokens: int, max_len: int) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.top_k = top_k
        self.max_new_tokens = max_new_tokens
        self.max_len = max_len
        self.device = model.get_input_embeddings().weight.device
        self.pad_id = tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
        eos = model.generation_config.eos_token_id
        self.eos = eos if eos is not None else tokenizer.eos_token_id
        self.chat = bool(getattr(tokenizer, "chat_template", None))
        self.name = f"draftlab {str(model.dtype).removeprefix('torch.')}"  # who answered, in the store

    def encode(self, messages: list[Message]) -> list[int]:
        if self.chat:
            ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            if not isinstance(ids, list):
                ids = ids["input_ids"]
            return [int(i) for i in ids]
        text = "\n\n".join(m["content"] for m in messages)
        return list(self.tokenizer(text)["input_ids"])

    def _left_pad(self, seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for row, seq in enumerate(seqs):
            ids[row, width - len(seq) :] = torch.tensor(seq)
            mask[row, width - len(seq) :] = 1
        return ids.to(self.device), mask.to(self.device)

    @torch.inference_mode()
    def respond(
        self, prompts: list[list[int]], temperature: float, seed: int
    ) -> list[tuple[list[int], torch.Tensor, torch.Tensor]]:
        """The target's responses, each with the top-k log-probs it drew every token from.

        The top-k come from the raw logits of the very forward passes that generate (captured
        before temperature), so recording them costs no extra target pass.
        """
        ids, mask = self._left_pad(prompts)
        kwargs: dict = {"do_sample": False}
        if temperature > 0:
            torch.manual_seed(seed)
            kwargs = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
        capture = _TopKCapture(self.top_k)
        out = self.model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=self.max_new_tokens,
            pad_token_id=self.pad_id,
            eos_token_id=self.eos,
            logits_processor=LogitsProcessorList([capture]),
            **kwargs,
        )
        eos = set(self.eos) if isinstance(self.eos, list) else {self.eos}
        topk_ids = torch.stack(capture.ids, dim=1)  # [B, steps, k]
        topk_logp = torch.stack(capture.logp, dim=1)
        responses = []
        for row, tokens in enumerate(out[:, ids.shape[1] :].tolist()):
            cut = next((i + 1 for i, t in enumerate(tokens) if t in eos), len(tokens))
            responses.append((tokens[:cut], topk_ids[row, :cut], topk_logp[row, :cut]))
        return responses

    @torch.inference_mode()
    def score(self, seqs: list[list[int]], micro_batch: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Top-k next-token log-probs at every position but the last: ([L-1, k] int32, [L-1, k] fp16)."""
        results = []
        for i in range(0, len(seqs), micro_batch):
            chunk = seqs[i : i + micro_batch]
            ids, mask = self._left_pad(chunk)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
            width = ids.shape[1]
            for row, seq in enumerate(chunk):
                seq_logits = logits[row, width - len(seq) : width - 1].float()
                logp = torch.log_softmax(seq_logits, dim=-1)
                values, indices = logp.topk(self.top_k, dim=-1)
                results.append((indices.to(torch.int32).cpu(), values.to(torch.float16).cpu()))
        return results


def generate_data(
    teacher: Teacher,
    jobs: list[Job],
    data_dir: Path,
    batch_size: int,
    on_progress: Callable[[int, int], None] | None = None,
    deadline: float | None = None,
    race: Race | None = None,
) -> int:
    """Produce the jobs not yet in a shard; one shard per batch, so an interrupt loses one batch.

    With a `deadline` (time.time()), no batch starts after it. `race` picks who answers each batch
    (the teacher alone by default). Returns the number of jobs left.
    """
    race = race or Race([teacher])
    data_dir.mkdir(parents=True, exist_ok=True)
    done = done_keys(data_dir)
    todo = [j for j in jobs if j.key not in done]
    raw = [j for j in todo if j.source == "raw"]
    chat = [j for j in todo if j.source != "raw"]
    left = len(todo)
    for batch in _batches(raw, batch_size):
        if deadline is not None and time.time() >= deadline:
            return left
        left -= len(batch)
        seqs = [teacher.tokenizer(j.text)["input_ids"][: teacher.max_len] for j in batch]
        scored = teacher.score(seqs)
        records = [
            _record(j, seq, 0, 0, s, 0) for j, seq, s in zip(batch, seqs, scored, strict=True) if len(seq) > 1
        ]
        if records:
            write_shard(data_dir, records, teacher.name)
        if on_progress:
            on_progress(len(batch), sum(len(s) for s in seqs))
    # Group by temperature and turn count, and batch prompts of similar length (less padding).
    groups: dict[tuple[float, int], list[Job]] = {}
    for job in chat:
        groups.setdefault((job.temperature, len(job.turns)), []).append(job)
    batches: list[list[Job]] = []
    for group in groups.values():
        group.sort(key=lambda j: len(j.turns[0]))
        batches.extend(_batches(group, batch_size))
    random.Random(len(todo)).shuffle(batches)
    for batch in batches:
        if deadline is not None and time.time() >= deadline:
            return left
        left -= len(batch)
        answerer = race.next()
        started = time.perf_counter()
        conversations: list[list[Message]] = [[] for _ in batch]
        final: list[tuple[list[int], int, torch.Tensor, torch.Tensor]] = []
        new_tokens = [0] * len(batch)
        for turn in range(len(batch[0].turns)):
            for conv, job in zip(conversations, batch, strict=True):
                conv.append({"role": "user", "content": job.turns[turn]})
            prompts = [teacher.encode(conv)[-(teacher.max_len - 16) :] for conv in conversations]
            temperature, seed = batch[0].temperature, batch[0].seed
            responses = answerer.respond(prompts, temperature, seed + turn)
            final = []
            for row, (conv, prompt, (resp, t_ids, t_logp)) in enumerate(
                zip(conversations, prompts, responses, strict=True)
            ):
                text = teacher.tokenizer.decode(resp, skip_special_tokens=True)
                conv.append({"role": "assistant", "content": text})
                seq = (prompt + resp)[: teacher.max_len]
                n_teacher = len(seq) - len(prompt)
                final.append((seq, len(prompt), t_ids[:n_teacher], t_logp[:n_teacher]))
                new_tokens[row] += len(resp)
        by = getattr(answerer, "label", answerer.name)  # before the race may stop a loser
        race.record(answerer, sum(new_tokens), time.perf_counter() - started)
        records = [
            _record(job, seq, start, n, (t_ids, t_logp), start - 1)
            for job, (seq, start, t_ids, t_logp), n in zip(batch, final, new_tokens, strict=True)
            if len(seq) > start
        ]
        if records:
            write_shard(data_dir, records, by)
        if on_progress:
            on_progress(len(batch), sum(new_tokens))
    return left


def _record(job: Job, seq: list[int], start: int, new_tokens: int, scored, offset: int) -> dict:
    """`topk_*[j]` is the teacher's distribution for token offset + j + 1 of `ids`."""
    topk_ids, topk_logp = scored
    return {
        "offset": offset,
        "key": job.key,
        "source": job.source,
        "ids": torch.tensor(seq, dtype=torch.int32),
        "topk_ids": topk_ids,
        "topk_logp": topk_logp,
        "start": start,
        "new_tokens": new_tokens,
    }


def _batches(items: list, size: int) -> Iterable[list]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
