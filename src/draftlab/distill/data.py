"""Distillation data: prompts, the target's own responses, and its top-k next-token log-probs.

Every training sequence is a token list plus, for each position, the target's top-k log-probs of
the next token (teacher-forced over the whole sequence once it is complete), so training never
needs to run the target again. Sequences are written in shards under the work folder; a rerun
skips the jobs whose keys are already in a shard, so generation resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from draftlab.errors import DraftlabError
from draftlab.files import atomic_path

Message = dict[str, str]


@dataclass
class Job:
    """One sequence to produce: a conversation the target answers, or raw text it only scores."""

    key: str
    source: str  # prompts, corpus, synth, magpie or raw
    category: str
    turns: list[str] = field(default_factory=list)  # user turns; the target answers each in turn
    temperature: float = 0.0  # 0: greedy
    seed: int = 0
    text: str = ""  # raw text jobs only


def prompt_keys(jobs: list[Job]) -> dict[str, str]:
    """Each job's key -> a name of its prompt alone, shared by its greedy and sampled answers."""
    return {j.key: _hash(j.source, j.turns) if j.turns else j.key for j in jobs}


def _hash(*parts: object) -> str:
    h = hashlib.sha1()
    for part in parts:
        h.update(json.dumps(part, ensure_ascii=False, sort_keys=True).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_prompt_file(path: Path) -> list[tuple[str, list[str]]]:
    """(category, user turns) for each line: {"prompt": ...} or {"turns": [...]}, optional "category"."""
    items: list[tuple[str, list[str]]] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise DraftlabError(f"cannot read prompt file '{path}': {exc.strerror or exc}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise DraftlabError(f"{path}:{number}: not a JSON object") from None
        if not isinstance(record, dict):
            raise DraftlabError(f"{path}:{number}: not a JSON object")
        if isinstance(record.get("turns"), list) and record["turns"]:
            turns = [str(t) for t in record["turns"]]
        elif isinstance(record.get("prompt"), str):
            turns = [record["prompt"]]
        else:
            raise DraftlabError(f"{path}:{number}: needs a 'prompt' string or a 'turns' list")
        if not all(t.strip() for t in turns):
            raise DraftlabError(f"{path}:{number}: empty prompt")
        items.append((str(record.get("category", "general")), turns))
    return items


def read_text_file(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise DraftlabError(f"cannot read text file '{path}': {exc.strerror or exc}") from None
    if not text.strip():
        raise DraftlabError(f"text file '{path}' is empty")
    return text


def passages(text: str) -> list[str]:
    """Paragraph-like passages: blank-line separated blocks, long ones cut near 900 characters."""
    blocks = [b.strip() for b in re.split(r"\n\s*\n", text) if b.strip()]
    out: list[str] = []
    current = ""
    for block in blocks:
        current = f"{current}\n\n{block}" if current else block
        if len(current) >= 300:
            out.append(current[:900])
            current = ""
    if current:
        out.append(current[:900])
    return out


_INSTRUCTIONS = [
    "Summarize the following passage in two or three sentences:\n\n{p}",
    "Continue this story:\n\n{p}",
    "What is the main idea of this text?\n\n{p}",
    "Rewrite the following passage in simple modern English:\n\n{p}",
    "Read the passage and answer: who are the main characters and what do they want?\n\n{p}",
    "Write three questions about this passage, then answer them.\n\n{p}",
    "Explain the following passage to a child:\n\n{p}",
    "List the key events of this passage as bullet points.\n\n{p}",
    "Translate the first sentence of this passage into French, then summarize the rest in English.\n\n{p}",
    "Fix any grammar mistakes in the following text and return the corrected version:\n\n{p}",
]


def corpus_instruction_items(texts: list[str], count: int, seed: int) -> list[tuple[str, list[str]]]:
    """Instructions a user might write about passages of the given texts."""
    if count <= 0 or not texts:
        return []
    rng = random.Random(seed)
    pools = [passages(t) for t in texts]
    pools = [p for p in pools if p]
    items = []
    for i in range(count):
        pool = pools[i % len(pools)]
        passage = rng.choice(pool)
        template = rng.choice(_INSTRUCTIONS)
        if template.startswith("Continue"):
            passage = passage[: rng.randint(150, 400)].rsplit(" ", 1)[0]
        items.append(("corpus", [template.format(p=passage)]))
    return items


def raw_text_chunks(texts: list[str], count: int, chars: int, seed: int) -> list[str]:
    if count <= 0 or not texts:
        return []
    rng = random.Random(seed + 1)
    chunks = []
    for i in range(count):
        text = texts[i % len(texts)]
        start = rng.randrange(0, max(1, len(text) - chars))
        chunks.append(text[start : start + chars])
    return chunks


def build_jobs(
    prompt_items: list[tuple[str, list[str]]],
    corpus_items: list[tuple[str, list[str]]],
    raw_chunks: list[str],
    samples_per_prompt: int,
    temperature: float,
    seed: int,
    synth_items: list[tuple[str, list[str]]] | None = None,
    magpie_items: list[tuple[str, list[str]]] | None = None,
) -> list[Job]:
    """One greedy response per prompt plus `samples_per_prompt` sampled ones, and the raw chunks."""
    jobs: list[Job] = []
    sources = (
        ("prompts", prompt_items),
        ("corpus", corpus_items),
        ("synth", synth_items or []),
        ("magpie", magpie_items or []),
    )
    for source, items in sources:
        for category, turns in items:
            jobs.append(Job(_hash(source, turns, 0.0, 0), source, category, turns, 0.0, 0))
            for s in range(samples_per_prompt):
                jobs.append(
                    Job(
                        _hash(source, turns, temperature, seed + s),
                        source,
                        category,
                        turns,
                        temperature,
                        seed + s,
                    )
                )
    for chunk in raw_chunks:
        jobs.append(Job(_hash("raw", chunk), "raw", "raw", text=chunk))
    random.Random(seed).shuffle(jobs)
    return jobs


# ---------------------------------------------------------------------------------------------
# Shards


def done_keys(data_dir: Path) -> set[str]:
    keys: set[str] = set()
    for shard in sorted(data_dir.glob("shard-*.pt")):
        keys.update(torch.load(shard, weights_only=True)["keys"])
    return keys


def load_shards(data_dir: Path) -> list[dict]:
    """All sequences: ids, topk_ids/topk_logp from position `offset`, start (first response token), source."""
    records: list[dict] = []
    for shard in sorted(data_dir.glob("shard-*.pt")):
        data = torch.load(shard, weights_only=True)
        for i in range(len(data["keys"])):
            records.append(
                {
                    "key": data["keys"][i],
                    "ids": data["ids"][i],
                    "topk_ids": data["topk_ids"][i],
                    "topk_logp": data["topk_logp"][i],
                    "start": int(data["start"][i]),
                    "offset": int(data["offset"][i]) if "offset" in data else 0,
                    "source": data["sources"][i],
                }
            )
    return records


def _write_shard(data_dir: Path, records: list[dict]) -> None:
    index = len(list(data_dir.glob("shard-*.pt")))
    payload = {
        "keys": [r["key"] for r in records],
        "sources": [r["source"] for r in records],
        "ids": [r["ids"] for r in records],
        "topk_ids": [r["topk_ids"] for r in records],
        "topk_logp": [r["topk_logp"] for r in records],
        "start": [r["start"] for r in records],
        "offset": [r["offset"] for r in records],
        "new_tokens": [r["new_tokens"] for r in records],
    }
    with atomic_path(data_dir / f"shard-{index:05d}.pt") as tmp:
        torch.save(payload, tmp)


def data_stats(data_dir: Path) -> dict:
    stats: dict = {"shards": 0, "sequences": {}, "tokens": {}, "response_tokens": {}}
    for shard in sorted(data_dir.glob("shard-*.pt")):
        data = torch.load(shard, weights_only=True)
        stats["shards"] += 1
        for source, ids, start in zip(data["sources"], data["ids"], data["start"], strict=True):
            stats["sequences"][source] = stats["sequences"].get(source, 0) + 1
            stats["tokens"][source] = stats["tokens"].get(source, 0) + len(ids)
            stats["response_tokens"][source] = stats["response_tokens"].get(source, 0) + len(ids) - int(start)
    return stats


# ---------------------------------------------------------------------------------------------
# The target: generate, then score


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
) -> int:
    """Produce the jobs not yet in a shard; one shard per batch, so an interrupt loses one batch.

    With a `deadline` (time.time()), no batch starts after it. Returns the number of jobs left.
    """
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
            _write_shard(data_dir, records)
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
        conversations: list[list[Message]] = [[] for _ in batch]
        final: list[tuple[list[int], int, torch.Tensor, torch.Tensor]] = []
        new_tokens = [0] * len(batch)
        for turn in range(len(batch[0].turns)):
            for conv, job in zip(conversations, batch, strict=True):
                conv.append({"role": "user", "content": job.turns[turn]})
            prompts = [teacher.encode(conv)[-(teacher.max_len - 16) :] for conv in conversations]
            temperature, seed = batch[0].temperature, batch[0].seed
            responses = teacher.respond(prompts, temperature, seed + turn)
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
        records = [
            _record(job, seq, start, n, (t_ids, t_logp), start - 1)
            for job, (seq, start, t_ids, t_logp), n in zip(batch, final, new_tokens, strict=True)
            if len(seq) > start
        ]
        if records:
            _write_shard(data_dir, records)
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
