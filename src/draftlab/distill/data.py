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
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from draftlab.errors import DraftlabError
from draftlab.files import atomic_path, write_text

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


def write_shard(data_dir: Path, records: list[dict], answered_by: str = "") -> None:
    index = len(list(data_dir.glob("shard-*.pt")))
    payload = {
        "answered_by": answered_by,
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


STORE = "store.json"
STORE_FORMAT = 1


def open_store(data_dir: Path, target: str) -> dict:
    """The store's manifest: which target answered, and one version per run that added answers.

    Answers are keyed by job, so a later run with more prompts adds only what is new; a store holds
    one target's answers, and another target's are refused rather than mixed in."""
    path = data_dir / STORE
    if not path.exists():
        earlier = sorted(data_dir.glob("shard-*.pt"))
        versions = [{"version": 0, "shards": len(earlier), "note": "before the manifest"}] if earlier else []
        return {"format": STORE_FORMAT, "target": target, "versions": versions}
    try:
        manifest = json.loads(path.read_text())
        if manifest["target"] != target:
            raise DraftlabError(
                f"the answers in '{data_dir}' are for target '{manifest['target']}', not '{target}': "
                "give another --work-dir"
            )
        return manifest
    except (OSError, ValueError, KeyError, TypeError):
        raise DraftlabError(f"'{path}' is not a draftlab answer store's manifest") from None


def add_version(
    data_dir: Path, manifest: dict, shards_before: int, seconds: float, answered_by: dict
) -> dict:
    """Record this run's addition (if any) as the store's next version."""
    shards = sorted(data_dir.glob("shard-*.pt"))[shards_before:]
    if not shards:
        return manifest
    sequences = response_tokens = 0
    for shard in shards:
        data = torch.load(shard, weights_only=True)
        sequences += len(data["keys"])
        response_tokens += sum(
            len(ids) - int(start) for ids, start in zip(data["ids"], data["start"], strict=True)
        )
    version = {
        "version": manifest["versions"][-1]["version"] + 1 if manifest["versions"] else 1,
        "shards": len(shards),
        "sequences": sequences,
        "response_tokens": response_tokens,
        "seconds": round(seconds, 1),
        "answered_by": answered_by,
        "written": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    manifest = {**manifest, "versions": [*manifest["versions"], version]}
    write_text(data_dir / STORE, json.dumps(manifest, indent=1) + "\n")
    return manifest


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
