"""What an EAGLE-3 head learns from: the target's hidden states over its own answers and plain text.

Each sequence of the distillation data (distill/data.py: the target's answers to chat prompts, and
raw text) goes through the target once, teacher-forced, keeping per position the aux layers the
head reads and the final (normed) hidden state, from which the target's next-token distribution
over the draft vocabulary is rebuilt at training time. Stored in bfloat16 in feature shards that a
rerun skips, so this stage resumes like the generation stage before it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch

from draftlab.files import atomic_path

FEATURE_GLOB = "features-*.pt"


def done_keys(folder: Path) -> set[str]:
    keys: set[str] = set()
    for shard in sorted(folder.glob(FEATURE_GLOB)):
        keys.update(torch.load(shard, weights_only=True)["keys"])
    return keys


@torch.inference_mode()
def extract(
    model,
    records: list[dict],
    aux_layers: tuple[int, ...],
    folder: Path,
    batch_tokens: int = 4096,
    on_batch: Callable[[int, int], None] | None = None,
) -> None:
    """Features of every record whose key has no feature shard yet, one shard per batch."""
    folder.mkdir(parents=True, exist_ok=True)
    done = done_keys(folder)
    todo = sorted((r for r in records if r["key"] not in done), key=lambda r: len(r["ids"]))
    device = next(model.parameters()).device
    final = model.config.num_hidden_layers
    index = len(list(folder.glob(FEATURE_GLOB)))
    batch: list[dict] = []

    def flush() -> None:
        nonlocal index, batch
        if not batch:
            return
        width = max(len(r["ids"]) for r in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for i, r in enumerate(batch):
            ids[i, : len(r["ids"])] = torch.as_tensor(r["ids"])
            mask[i, : len(r["ids"])] = 1
        out = model(input_ids=ids.to(device), attention_mask=mask.to(device), output_hidden_states=True)
        states = out.hidden_states
        top = out.logits.argmax(-1)
        payload: dict = {"keys": [], "aux": [], "final": [], "top": []}
        for i, r in enumerate(batch):
            n = len(r["ids"])
            payload["keys"].append(r["key"])
            payload["aux"].append(
                torch.cat([states[j][i, :n] for j in aux_layers], -1).to(torch.bfloat16).cpu()
            )
            payload["final"].append(states[final][i, :n].to(torch.bfloat16).cpu())
            payload["top"].append(top[i, :n].to(torch.int32).cpu())  # the target's greedy next token
        with atomic_path(folder / f"features-{index:05d}.pt") as tmp:
            torch.save(payload, tmp)
        index += 1
        if on_batch:
            on_batch(len(batch), sum(len(r["ids"]) for r in batch))
        batch = []

    for record in todo:
        if batch and (len(batch) + 1) * max(len(record["ids"]), 1) > batch_tokens:
            flush()
        batch.append(record)
    flush()


def load(folder: Path, records: list[dict]) -> list[dict]:
    """The records that have features, each with `aux` [T, n·H], `final` [T, H] and `top` [T] (the
    target's argmax, None in shards written without it) attached."""
    by_key = {r["key"]: r for r in records}
    out, seen = [], set()
    for shard in sorted(folder.glob(FEATURE_GLOB)):
        data = torch.load(shard, weights_only=True)
        tops = data.get("top") or [None] * len(data["keys"])
        for key, aux, final, top in zip(data["keys"], data["aux"], data["final"], tops, strict=True):
            # A key names its job; should a job's sequence have been generated twice (the same
            # instruction drawn twice), only the features that belong to the record kept are used.
            if key in by_key and key not in seen and len(aux) == len(by_key[key]["ids"]):
                seen.add(key)
                out.append({**by_key[key], "aux": aux, "final": final, "top": top})
    return out


def draft_vocabulary(records: list[dict], size: int, always: set[int], vocab_size: int) -> torch.Tensor:
    """The `size` target ids the head may propose: the most frequent next tokens of the data (answer
    tokens count twice, as they are what the head drafts), plus `always` (end of sequence), ascending."""
    counts: Counter[int] = Counter()
    for r in records:
        ids = [int(t) for t in r["ids"]]
        counts.update(ids[1:])
        counts.update(ids[max(r["start"], 1) :])
    size = min(size, vocab_size)
    chosen = [t for t in always if 0 <= t < vocab_size]
    for token, _ in counts.most_common():
        if len(chosen) >= size:
            break
        if token not in chosen and 0 <= token < vocab_size:
            chosen.append(token)
    for token in range(vocab_size):  # a tiny corpus may not fill the vocabulary
        if len(chosen) >= size:
            break
        if token not in counts and token not in chosen:
            chosen.append(token)
    return torch.sort(torch.tensor(chosen[:size], dtype=torch.long)).values
