"""Train a small draft on the target's top-k next-token distributions (DistillSpec-style KD).

The loss at every position is KL(teacher top-k renormalised ‖ draft) plus cross-entropy on the
token that follows; response positions weigh 1, prompt positions and raw text less. The draft's
embedding (tied to its output layer) starts as the target's embedding projected onto its top
singular directions, so the draft starts with the target's token geometry.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel

from draftlab.files import atomic_path

CHECKPOINT = "checkpoint.pt"


@dataclass
class DraftShape:
    hidden_size: int = 192
    num_layers: int = 4
    intermediate_size: int = 512
    num_heads: int = 3
    num_kv_heads: int = 1


@dataclass
class TrainConfig:
    steps: int = 1000
    batch_tokens: int = 4096  # tokens per optimizer step (sequences are packed up to this many)
    max_len: int = 512
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup: int = 30
    weight_decay: float = 0.01
    kl_weight: float = 1.0
    ce_weight: float = 0.5
    prompt_weight: float = 0.2
    raw_weight: float = 0.3
    grad_clip: float = 1.0
    save_every: int = 100
    log_every: int = 10
    seed: int = 0
    autocast: bool = False


def draft_config(target_config, shape: DraftShape, vocab_size: int) -> LlamaConfig:
    if shape.hidden_size % shape.num_heads:
        raise ValueError("hidden size must be a multiple of the number of heads")
    rope_theta = 10000.0
    rope = getattr(target_config, "rope_parameters", None)
    if isinstance(rope, dict) and rope.get("rope_theta"):
        rope_theta = float(rope["rope_theta"])
    elif getattr(target_config, "rope_theta", None):
        rope_theta = float(target_config.rope_theta)
    max_pos = getattr(target_config, "max_position_embeddings", None) or 2048
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        head_dim=shape.hidden_size // shape.num_heads,
        max_position_embeddings=int(max_pos),
        rope_theta=rope_theta,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=getattr(target_config, "bos_token_id", None),
        eos_token_id=getattr(target_config, "eos_token_id", None),
        pad_token_id=getattr(target_config, "pad_token_id", None),
        initializer_range=0.02,
    )


def init_draft(config: LlamaConfig, target_embedding: torch.Tensor, seed: int) -> LlamaForCausalLM:
    """A fresh draft whose embedding is the target's, projected onto its top singular directions."""
    torch.manual_seed(seed)
    draft = LlamaForCausalLM(config)
    emb = target_embedding.detach().float().cpu()
    hidden = config.hidden_size
    if emb.shape[1] >= hidden:
        _, _, vh = torch.linalg.svd(emb, full_matrices=False)
        projected = emb @ vh[:hidden].T
    else:  # a target narrower than the draft: keep its embedding and pad with small noise
        projected = torch.cat([emb, 0.01 * torch.randn(emb.shape[0], hidden - emb.shape[1])], dim=1)
    rows = min(projected.shape[0], config.vocab_size)
    with torch.no_grad():
        weight = draft.get_input_embeddings().weight
        weight[:rows] = projected[:rows].to(weight.dtype)
    draft.tie_weights()
    return draft


def _lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cosine)


def _sample_batch(records: list[dict], cfg: TrainConfig, rng: random.Random) -> list[dict]:
    batch, tokens = [], 0
    while tokens < cfg.batch_tokens:
        record = records[rng.randrange(len(records))]
        length = min(len(record["ids"]), cfg.max_len)
        batch.append(record)
        tokens += length
    return batch


def _collate(batch: list[dict], cfg: TrainConfig, device: torch.device):
    """Right-padded ids; per predicted position: next token, CE weight, teacher top-k and its mask.

    Position i predicts token i + 1. Response positions weigh 1, prompt positions
    `prompt_weight` and raw text `raw_weight`; the KL term applies where the teacher's
    top-k were recorded (the response for generated data, everything for raw text).
    """
    width = max(min(len(r["ids"]), cfg.max_len) for r in batch)
    k = batch[0]["topk_ids"].shape[1]
    rows, cols = len(batch), width - 1
    ids = torch.zeros((rows, width), dtype=torch.long)
    mask = torch.zeros((rows, width), dtype=torch.long)
    topk_ids = torch.zeros((rows, cols, k), dtype=torch.long)
    topk_logp = torch.full((rows, cols, k), -30.0)
    has_teacher = torch.zeros((rows, cols), dtype=torch.bool)
    target = torch.zeros((rows, cols), dtype=torch.long)
    weight = torch.zeros((rows, cols))
    for row, r in enumerate(batch):
        n = min(len(r["ids"]), cfg.max_len)
        ids[row, :n] = r["ids"][:n].long()
        mask[row, :n] = 1
        target[row, : n - 1] = r["ids"][1:n].long()
        offset = r.get("offset", 0)
        m = max(0, min(len(r["topk_ids"]), n - 1 - offset))
        if m:
            topk_ids[row, offset : offset + m] = r["topk_ids"][:m].long()
            topk_logp[row, offset : offset + m] = r["topk_logp"][:m].float()
            has_teacher[row, offset : offset + m] = True
        if r["source"] == "raw":
            weight[row, : n - 1] = cfg.raw_weight
        else:
            weight[row, : n - 1] = cfg.prompt_weight
            weight[row, max(0, r["start"] - 1) : n - 1] = 1.0  # start - 1 predicts the first response token
    tensors = (ids, mask, topk_ids, topk_logp, has_teacher, target, weight)
    return tuple(t.to(device) for t in tensors)


def distill_loss(draft: PreTrainedModel, tensors, cfg: TrainConfig) -> tuple[torch.Tensor, dict]:
    ids, mask, topk_ids, topk_logp, has_teacher, target, weight = tensors
    hidden = draft.model(input_ids=ids, attention_mask=mask).last_hidden_state[:, :-1]
    keep = weight > 0
    h = hidden[keep]
    logits = draft.lm_head(h).float()
    lse = torch.logsumexp(logits, dim=-1)
    w = weight[keep]
    ce = lse - logits.gather(-1, target[keep][:, None]).squeeze(-1)
    teach = has_teacher[keep]
    t_ids = topk_ids[keep][teach]
    q = logits[teach].gather(-1, t_ids) - lse[teach][:, None]
    p_log = torch.log_softmax(topk_logp[keep][teach], dim=-1)
    kl = (p_log.exp() * (p_log - q)).sum(-1)
    w_t = w[teach]
    kl_term = (w_t * kl).sum() / w_t.sum().clamp(min=1e-6)
    ce_term = (w * ce).sum() / w.sum()
    loss = cfg.kl_weight * kl_term + cfg.ce_weight * ce_term
    with torch.no_grad():
        resp = w_t >= 1.0
        agree = (logits[teach].argmax(-1) == t_ids[:, 0]).float()
        metrics = {
            "kl": float(kl_term),
            "ce": float(ce_term),
            "top1": float(agree[resp].mean()) if resp.any() else float("nan"),
            "tokens": int(keep.sum()),
        }
    return loss, metrics


def train(
    draft: PreTrainedModel,
    records: list[dict],
    cfg: TrainConfig,
    work_dir: Path,
    device: torch.device,
    log_path: Path,
    start_step: int = 0,
    optimizer_state: dict | None = None,
    on_step: Callable[[int, dict], None] | None = None,
    on_save: Callable[[int], None] | None = None,
    extra_state: dict | None = None,
) -> dict:
    """Run steps start_step..cfg.steps; checkpoint every save_every steps and at the end."""
    draft.to(device)
    draft.train()
    decay = [p for n, p in draft.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in draft.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.98),
    )
    if optimizer_state is not None:
        optimizer.load_state_dict(optimizer_state)
    last: dict = {}
    window_tokens, window_start = 0, time.perf_counter()
    for step in range(start_step, cfg.steps):
        lr = _lr_at(step, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        rng = random.Random(cfg.seed * 1_000_003 + step)
        tensors = _collate(_sample_batch(records, cfg, rng), cfg, device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.autocast):
            loss, metrics = distill_loss(draft, tensors, cfg)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), cfg.grad_clip)
        optimizer.step()
        window_tokens += metrics["tokens"]
        last = {"step": step + 1, "loss": float(loss.detach()), "lr": lr, **metrics}
        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
            elapsed = time.perf_counter() - window_start
            last["tokens_per_s"] = round(window_tokens / elapsed, 1) if elapsed > 0 else None
            last["time"] = time.time()
            with log_path.open("a") as f:
                f.write(json.dumps(last) + "\n")
            window_tokens, window_start = 0, time.perf_counter()
        if on_step:
            on_step(step + 1, last)
        if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
            save_checkpoint(work_dir, draft, optimizer, step + 1, cfg, extra_state or {})
            if on_save:
                on_save(step + 1)
    draft.eval()
    return last


def save_checkpoint(work_dir: Path, draft, optimizer, step: int, cfg: TrainConfig, extra: dict) -> None:
    work_dir.mkdir(parents=True, exist_ok=True)
    payload = {
        "step": step,
        "model": draft.state_dict(),
        "optimizer": optimizer.state_dict(),
        "train_config": asdict(cfg),
        "draft_config": draft.config.to_dict(),
        **extra,
    }
    with atomic_path(work_dir / CHECKPOINT) as tmp:
        torch.save(payload, tmp)


def load_checkpoint(work_dir: Path) -> dict | None:
    path = work_dir / CHECKPOINT
    if not path.exists():
        return None
    return torch.load(path, weights_only=False, map_location="cpu")
