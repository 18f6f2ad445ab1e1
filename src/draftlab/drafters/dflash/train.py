"""Training a DFlash drafter as its paper does: many random anchors per sequence, each a block of
the anchor's token and block_size - 1 masks that sees the target's context rows before the anchor
only; every mask row is scored against the target's own greedy token at its position (the token a
verification pass would accept), with a weight that decays over the block, since a later row only
counts when every earlier one was accepted.

All anchors of a sequence share one pass: the keys are the sequence's context rows followed by
every block, and a mask lets each block see its own rows and the context before its anchor.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from draftlab.drafters.dflash.head import DFlashDraft
from draftlab.drafters.eagle3.train import learning_rate, schedule_progress


@dataclass(frozen=True)
class DFlashTrainConfig:
    steps: int = 600
    batch_tokens: int = 4096  # sequence tokens per optimizer step
    max_len: int = 768
    anchors: int = 16  # blocks drawn per sequence
    decay: float | None = None  # weight of row i is exp(-(i - 1) / decay); None: block_size / 2
    lr: float = 1e-3
    warmup: int = 30
    weight_decay: float = 0.0
    prompt_weight: float = 0.2  # weight of blocks anchored in a prompt (answers and raw text weigh 1)
    seed: int = 0
    autocast: bool = False


def block_mask(anchors: torch.Tensor, length: int, block: int) -> torch.Tensor:
    """[n·block, length + n·block] bool: block j's rows see context positions < anchors[j] and their
    own block's rows, nothing else."""
    n = len(anchors)
    context = torch.arange(length)[None, :] < anchors.repeat_interleave(block)[:, None]
    own = torch.block_diag(*[torch.ones(block, block, dtype=torch.bool)] * n)
    return torch.cat([context, own], dim=1)


def draw_anchors(record: dict, count: int, block: int, rng: random.Random, max_len: int) -> list[int]:
    """Anchors with at least one scored row (a target token after them); answers first where the
    record has a prompt."""
    n = min(len(record["ids"]), max_len)
    first = max(record.get("start", 1) - 1, 0) if record.get("source") != "raw" else 0
    pool = list(range(first, n - 1)) or list(range(0, n - 1))
    return sorted(rng.sample(pool, min(count, len(pool))))


def block_loss(
    draft: DFlashDraft,
    embedding: torch.nn.Module,
    output_head: torch.nn.Module,
    record: dict,
    anchors: list[int],
    decay: float,
    prompt_weight: float,
    max_len: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(Σ weighted cross-entropy, Σ weights, hits [n, block - 1]) of one sequence's blocks."""
    b = draft.block_size
    n = min(len(record["ids"]), max_len)
    ids = torch.as_tensor(record["ids"][:n])
    top = record["top"][:n].long()  # the target's greedy token after each position
    context = draft.fuse(record["aux"][:n].float())[None]
    a = torch.tensor(anchors)
    block_ids = torch.full((len(anchors), b), draft.mask_token_id, dtype=torch.long)
    block_ids[:, 0] = ids[a]
    block = embedding(block_ids.flatten()[None]).to(context.dtype)
    positions = torch.cat([torch.arange(n), (a[:, None] + torch.arange(b)).flatten()])[None]
    mask = block_mask(a, n, b)[None, None]
    out = draft(block, context, positions, mask=mask).view(len(anchors), b, -1)[:, 1:]
    # Row i of a block predicts the token at anchor + i: the target's greedy token after anchor + i - 1.
    where = a[:, None] + torch.arange(b - 1)[None, :]
    valid = where < n
    labels = top[where.clamp(max=n - 1)]
    if draft.pruned:
        # Over the draft vocabulary; a label it lacks cannot be drafted and is left out of the loss.
        t2d = torch.full((draft.config.vocab_size,), -1, dtype=torch.long)
        t2d[draft.target_ids()] = torch.arange(len(draft.d2t))
        labels = t2d[labels]
        valid = valid & (labels >= 0)
        labels = labels.clamp(min=0)
        logits = draft.lm_head(out).float()
    else:
        logits = output_head(out).float()
    ce = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view_as(labels)
    weight = torch.exp(-torch.arange(b - 1, dtype=torch.float32) / decay)[None, :] * valid
    if record.get("source") != "raw":
        in_prompt = a < max(record.get("start", 1) - 1, 0)
        weight = weight * torch.where(in_prompt, prompt_weight, 1.0)[:, None]
    hits = (logits.argmax(-1) == labels) & valid
    return (ce * weight).sum(), weight.sum(), hits


def accepted_lengths(hits: torch.Tensor) -> torch.Tensor:
    """Per block, 1 + the run of agreeing rows from the first: what a verification pass would keep."""
    return 1 + hits.long().cumprod(dim=1).sum(dim=1)


def train(
    draft: DFlashDraft,
    embedding: torch.nn.Module,
    output_head: torch.nn.Module,
    records: list[dict],
    config: DFlashTrainConfig,
    start_step: int = 0,
    optimizer_state: dict | None = None,
    deadline: float | None = None,
    on_step: Callable[[int, dict], None] | None = None,
    on_save: Callable[[int, dict], None] | None = None,
    save_every: int = 50,
    start_progress: float = 0.0,
    start_tokens: int = 0,
) -> int:
    """Train from `start_step` until config.steps or the deadline; returns the last step done. The
    target's embedding and output head stay frozen. Each step's metrics carry the sequence tokens
    trained on so far (`tokens`, from `start_tokens`)."""
    draft.train()
    params = list(draft.parameters())
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    if optimizer_state is not None:
        optimizer.load_state_dict(optimizer_state)
    decay = config.decay or draft.block_size / 2
    rng = random.Random(config.seed + start_step)
    step, t0 = start_step, time.time()
    span = deadline - t0 if deadline is not None else None
    queue: list[dict] = []
    seen = start_tokens
    while step < config.steps and (deadline is None or time.time() < deadline):
        group, tokens = [], 0
        while tokens < config.batch_tokens:
            if not queue:
                queue = records[:]
                rng.shuffle(queue)
            record = queue.pop()
            group.append(record)
            tokens += min(len(record["ids"]), config.max_len)
        progress = schedule_progress(step, config.steps, start_progress, time.time() - t0, span)
        lr = learning_rate(config, step, progress)
        for g in optimizer.param_groups:
            g["lr"] = lr
        total, weights, blocks, accepted, hit_sum = torch.zeros(()), 0.0, 0, 0.0, 0.0
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.autocast):
            for record in group:
                anchors = draw_anchors(record, config.anchors, draft.block_size, rng, config.max_len)
                if not anchors:
                    continue
                loss, weight, hits = block_loss(
                    draft,
                    embedding,
                    output_head,
                    record,
                    anchors,
                    decay,
                    config.prompt_weight,
                    config.max_len,
                )
                total, weights = total + loss, weights + float(weight)
                blocks += len(anchors)
                accepted += float(accepted_lengths(hits).sum())
                hit_sum += float(hits[:, 0].sum())
        loss = total / max(weights, 1e-6)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        step += 1
        seen += tokens
        metrics = {
            "loss": float(loss.detach()),
            "tokens": seen,
            "top1_0": hit_sum / max(blocks, 1),
            "mean_accepted_length": accepted / max(blocks, 1),
            "lr": lr,
            "progress": progress,
        }
        if on_step:
            on_step(step, metrics)
        if on_save and (step % save_every == 0 or step == config.steps):
            on_save(step, optimizer.state_dict())
    if on_save and step % save_every != 0 and step != config.steps:
        on_save(step, optimizer.state_dict())
    draft.eval()
    return step


@torch.no_grad()
def held_out_metrics(
    draft: DFlashDraft, embedding, output_head, records: list[dict], max_len: int = 768, anchors: int = 16
) -> dict:
    """Teacher-forced on sequences it did not train on: first-row top-1 agreement with the target's
    greedy token, and the mean accepted length of a full block (1 + the agreeing run)."""
    if not records:
        return {}
    was = draft.training
    draft.eval()
    rng = random.Random(0)
    lengths, first = [], []
    for record in records:
        chosen = draw_anchors(record, anchors, draft.block_size, rng, max_len)
        if not chosen:
            continue
        _, _, hits = block_loss(draft, embedding, output_head, record, chosen, 1.0, 1.0, max_len)
        lengths.append(accepted_lengths(hits).float())
        first.append(hits[:, 0].float())
    draft.train(was)
    if not lengths:
        return {}
    all_lengths, all_first = torch.cat(lengths), torch.cat(first)
    return {
        "blocks": len(all_lengths),
        "first_token_top1": float(all_first.mean()),
        "mean_accepted_length": float(all_lengths.mean()),
        "block_size": draft.block_size,
    }
