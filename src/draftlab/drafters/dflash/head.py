"""A DFlash block drafter (Chen et al. 2026, "DFlash: Block Diffusion for Flash Speculative
Decoding"): a few decoder layers that fill a whole block of masked positions in one pass.

The block is the last final token (the anchor) followed by block_size - 1 mask tokens, embedded with
the target's own embedding. The target's hidden states at a few layers (the taps) are placed side
by side and fused by `fc` and `hidden_norm` into one context row per position. Every layer's
queries come from the block; its keys and values from the context rows and the block together,
with no causal mask inside the block. The target's own output head turns the block's rows into
tokens: row i predicts the token at the anchor's position + i.

Context rows go through each layer's k/v projections only, so they are cached once (a transformers
DynamicCache, cropped after every pass so that it holds final positions only).

The weights follow the published checkpoints' layout (z-lab's `DFlashDraftModel`, which vLLM,
SGLang and llama.cpp's converter read): `layers.N.{input_layernorm, self_attn.{q,k,v,o}_proj,
self_attn.{q,k}_norm, post_attention_layernorm, mlp.{gate,up,down}_proj}`, `fc`, `hidden_norm`,
`norm`; a Qwen3 config with `block_size`, `num_target_layers` and `dflash_config` holding
`target_layer_ids` and `mask_token_id`.

A drafter may propose from a pruned vocabulary (`draft_vocab_size` in its config): its own output
head over those tokens (the target's rows, kept frozen) and `d2t`, each draft token's offset to its
target id, as the speculators format has for EAGLE-3. At a block of 8 on the default target the
target's full output head is most of a drafter's pass (49,152 rows against two layers), so a pruned
head makes drafting several times cheaper; tokens outside it are never proposed, which costs
acceptance, never exactness (the target verifies every token).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm, Qwen3RotaryEmbedding, rotate_half


def default_taps(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """The target layers DFlash reads by default (its reference code's rule): the middle one for a
    one-layer drafter, else one per draft layer evenly spaced from layer 1 to L - 3. A tap i is the
    output of target layer i, `output_hidden_states` index i + 1."""
    if num_draft_layers == 1:
        return (num_target_layers // 2,)
    first, last = 1, max(num_target_layers - 3, 1)
    step = (last - first) / (num_draft_layers - 1)
    return tuple(int(round(first + i * step)) for i in range(num_draft_layers))


def dflash_config(
    target_config,
    layers: int = 1,
    block_size: int = 8,
    mask_token_id: int = 0,
    taps: tuple[int, ...] | None = None,
    intermediate_size: int | None = None,
) -> Qwen3Config:
    """A drafter's config beside its target: the target's width, heads and rope (its embedding and
    output head are the target's), `layers` decoder layers."""
    hidden = target_config.hidden_size
    heads = target_config.num_attention_heads
    n_target = target_config.num_hidden_layers
    rope = getattr(target_config, "rope_parameters", None) or {"rope_type": "default", "rope_theta": 10000.0}
    config = Qwen3Config(
        hidden_size=hidden,
        intermediate_size=intermediate_size or target_config.intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=getattr(target_config, "num_key_value_heads", None) or heads,
        head_dim=getattr(target_config, "head_dim", None) or hidden // heads,
        rms_norm_eps=getattr(target_config, "rms_norm_eps", 1e-6),
        vocab_size=target_config.vocab_size,
        max_position_embeddings=getattr(target_config, "max_position_embeddings", 2048),
        rope_parameters=dict(rope),
        tie_word_embeddings=False,
    )
    config.architectures = ["DFlashDraftModel"]
    config.block_size = block_size
    config.num_target_layers = n_target
    config.dflash_config = {
        "mask_token_id": int(mask_token_id),
        "target_layer_ids": list(taps if taps is not None else default_taps(n_target, layers)),
    }
    return config


class DFlashLayer(nn.Module):
    def __init__(self, config: Qwen3Config) -> None:
        super().__init__()
        h = config.hidden_size
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.input_layernorm = Qwen3RMSNorm(h, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(h, eps=config.rms_norm_eps)
        attn = self.self_attn = nn.Module()
        attn.q_proj = nn.Linear(h, self.heads * self.head_dim, bias=False)
        attn.k_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        attn.v_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        attn.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=False)
        attn.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        attn.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.mlp = Qwen3MLP(config)

    def forward(
        self,
        block: torch.Tensor,
        context: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache=None,
        index: int = 0,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`block` [B, b, H], `context` [B, c, H] (rows not cached yet; c may be 0); cos and sin for
        the c + b positions. `mask` (training: which keys each block row sees) or None: all."""
        attn = self.self_attn
        x = self.input_layernorm(block)
        c = context.shape[1]
        q = attn.q_norm(attn.q_proj(x).unflatten(-1, (self.heads, self.head_dim))).transpose(1, 2)
        rows = torch.cat([context, x], dim=1)
        k = attn.k_norm(attn.k_proj(rows).unflatten(-1, (self.kv_heads, self.head_dim))).transpose(1, 2)
        v = attn.v_proj(rows).unflatten(-1, (self.kv_heads, self.head_dim)).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * cos[..., c:, :] + rotate_half(q) * sin[..., c:, :]
        k = k * cos + rotate_half(k) * sin
        if cache is not None:
            k, v = cache.update(k, v, index)
        out = nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, enable_gqa=self.heads != self.kv_heads
        )
        hidden = block + attn.o_proj(out.transpose(1, 2).flatten(2))
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class DFlashDraft(nn.Module):
    """The drafter's own weights; the target lends the embedding and the output head."""

    def __init__(self, config: Qwen3Config, target_hidden_size: int | None = None) -> None:
        super().__init__()
        h = config.hidden_size
        self.config = config
        self.block_size = int(config.block_size)
        self.taps = tuple(int(i) for i in config.dflash_config["target_layer_ids"])
        self.mask_token_id = int(config.dflash_config["mask_token_id"])
        self.target_hidden_size = target_hidden_size or h
        self.layers = nn.ModuleList([DFlashLayer(config) for _ in range(config.num_hidden_layers)])
        self.fc = nn.Linear(len(self.taps) * self.target_hidden_size, h, bias=False)
        self.hidden_norm = Qwen3RMSNorm(h, eps=config.rms_norm_eps)
        self.norm = Qwen3RMSNorm(h, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)
        draft_vocab = getattr(config, "draft_vocab_size", None)
        if draft_vocab and draft_vocab < config.vocab_size:
            self.lm_head = nn.Linear(h, draft_vocab, bias=False).requires_grad_(False)
            self.register_buffer("d2t", torch.zeros(draft_vocab, dtype=torch.long))

    @property
    def pruned(self) -> bool:
        return hasattr(self, "d2t")

    def target_ids(self) -> torch.Tensor:
        """The target id of each draft token (pruned drafters only)."""
        return torch.arange(len(self.d2t), device=self.d2t.device) + self.d2t

    def prune(self, vocabulary: torch.Tensor, output_head: torch.Tensor) -> None:
        """Propose from `vocabulary` (target ids, ascending) only, with `output_head`'s rows for them."""
        vocabulary = vocabulary.to(torch.long).cpu()
        self.config.draft_vocab_size = len(vocabulary)
        self.lm_head = nn.Linear(self.config.hidden_size, len(vocabulary), bias=False).requires_grad_(False)
        with torch.no_grad():
            self.lm_head.weight.copy_(output_head[vocabulary])
        self.register_buffer("d2t", vocabulary - torch.arange(len(vocabulary)))
        self.to(self.fc.weight.device)

    def logits(self, rows: torch.Tensor, output_head: nn.Module) -> torch.Tensor:
        """Target-vocabulary logits of output rows: the lent head's, or the pruned head's with -inf
        for the tokens it cannot propose."""
        if not self.pruned:
            return output_head(rows)
        own = self.lm_head(rows.to(self.lm_head.weight.dtype))
        full = own.new_full((*own.shape[:-1], self.config.vocab_size), float("-inf"))
        full[..., self.target_ids()] = own
        return full

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """The taps as `output_hidden_states` indices (index 0 is the embedding's output)."""
        return tuple(i + 1 for i in self.taps)

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """[..., taps·Ht] target hidden states side by side -> [..., H] context rows."""
        return self.hidden_norm(self.fc(features.to(self.fc.weight.dtype)))

    def forward(
        self,
        block: torch.Tensor,
        context: torch.Tensor,
        positions: torch.Tensor,
        cache=None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Normed output rows [B, b, H] for the block's embeddings `block` [B, b, H] after the fused
        `context` rows [B, c, H]; `positions` [B, c + b] are theirs, in that order."""
        cos, sin = self.rotary_emb(block, positions)
        hidden = block
        for index, layer in enumerate(self.layers):
            hidden = layer(hidden, context, cos, sin, cache, index, mask)
        return self.norm(hidden)


def crop_to(cache, length: int) -> None:
    """Keep a DynamicCache's first `length` positions (transformers 5's `crop` takes how many to drop)."""
    drop = cache.get_seq_length() - length
    if drop > 0:
        cache.crop(-drop)
