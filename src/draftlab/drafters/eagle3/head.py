"""An EAGLE-3 draft head (Li et al. 2025): one decoder layer that drafts from the target's features.

The target's hidden states at a low, a middle and a high layer are concatenated and fused by `fc`
into one feature per position. The head's single layer reads that feature beside the embedding of
the token that followed it (the two side by side, 2H wide, into q/k/v) and writes a new feature,
from which a small LM head over a reduced draft vocabulary predicts the next token. Drafting the
token after that feeds the head's own output feature back in, with no target pass.

The layout follows what vLLM's `llama_eagle3` and the `speculators` package load: `fc`,
`layers.0.{input_layernorm, hidden_norm, self_attn, post_attention_layernorm, mlp}`, `norm`,
`lm_head` over `draft_vocab_size` tokens, and `d2t` (target id = draft id + d2t[draft id]).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from draftlab.models import kernels
from draftlab.models.attention import attend


def default_aux_layers(num_layers: int) -> tuple[int, ...]:
    """The target layers EAGLE-3 reads, as vLLM and speculators default them: the inputs of layers
    2, L/2 and L-3, which are `output_hidden_states` indices 2, L//2 and L-3 in transformers."""
    return tuple(sorted((min(2, num_layers - 1), num_layers // 2, max(num_layers - 3, 0))))


class Eagle3Layer(nn.Module):
    def __init__(self, config: LlamaConfig, norm_before_residual: bool = False) -> None:
        super().__init__()
        h = config.hidden_size
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or h // self.heads
        self.norm_before_residual = norm_before_residual
        self.input_layernorm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(2 * h, self.heads * self.head_dim, bias=False)
        self.self_attn.k_proj = nn.Linear(2 * h, self.kv_heads * self.head_dim, bias=False)
        self.self_attn.v_proj = nn.Linear(2 * h, self.kv_heads * self.head_dim, bias=False)
        self.self_attn.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=False)
        self.mlp = LlamaMLP(config)

    def project(
        self, embeds: torch.Tensor, feature: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [B, heads, T, d], k and v [B, kv_heads, T, d] (rotated), and the residual [B, T, H]."""
        e = self.input_layernorm(embeds)
        if self.norm_before_residual:
            h = self.hidden_norm(feature)
            residual = h
        else:
            residual, h = feature, self.hidden_norm(feature)
        x = torch.cat([e, h], dim=-1)
        b, t, _ = x.shape
        attn = self.self_attn
        q = attn.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, k, v, residual

    def finish(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask,
        residual: torch.Tensor,
        slots=None,
        causal: int | None = None,
    ):
        """Attention of q over (k, v) under `mask` (bool: True attends, or additive), then the MLP.
        `slots`: a compiled pass's window, the cache's first slots it attends over (models/attention.py).
        `causal`: instead of the mask, the pass's rows are the last of the first `causal` slots and
        each sees the slots up to its own, through draftlab's CPU kernel (an eager catch-up)."""
        b, _, t, _ = q.shape
        if causal is not None:
            # [b, t, heads, d] already: 2x faster than sdpa over a masked window for a prompt's
            # catch-up (256 / 585 rows: 1.02 / 5.19 ms against 1.89 / 10.2, Zen4, stop 80).
            out = kernels.attend(q, k[:, :, :causal], v[:, :, :causal], None, self.head_dim**-0.5)
        else:
            out = attend(q, k, v, mask, slots, gqa=self.heads != self.kv_heads).transpose(1, 2)
        hidden = residual + self.self_attn.o_proj(out.reshape(b, t, -1))
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class Eagle3Head(nn.Module):
    """The head's weights and its two halves: `fuse` (target features in) and `layer` + `logits`."""

    def __init__(
        self,
        config: LlamaConfig,
        draft_vocab_size: int,
        aux_layers: tuple[int, ...],
        target_hidden_size: int | None = None,
        norm_before_residual: bool = False,
    ) -> None:
        super().__init__()
        h = config.hidden_size
        self.config = config
        self.draft_vocab_size = draft_vocab_size
        self.aux_layers = tuple(aux_layers)
        self.target_hidden_size = target_hidden_size or h
        self.norm_before_residual = norm_before_residual
        self.embed_tokens = nn.Embedding(config.vocab_size, h)
        self.embed_tokens.weight.requires_grad_(False)  # the target's own embedding, never trained
        self.fc = nn.Linear(len(self.aux_layers) * self.target_hidden_size, h, bias=False)
        self.layers = nn.ModuleList([Eagle3Layer(config, norm_before_residual)])
        self.norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(h, draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        self.rotary = LlamaRotaryEmbedding(config)

    @property
    def layer(self) -> Eagle3Layer:
        return self.layers[0]

    @property
    def dtype(self) -> torch.dtype:
        """What the head computes in (its norm's weight: its matrices may run from Q8_0 blocks)."""
        return self.norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.norm.weight.device

    def set_vocab(self, target_ids: torch.Tensor) -> None:
        """The draft vocabulary: the target ids the head can propose, ascending."""
        ids = torch.sort(target_ids.to(torch.long)).values
        if len(ids) != self.draft_vocab_size:
            raise ValueError(f"{len(ids)} draft ids for a draft vocabulary of {self.draft_vocab_size}")
        self.d2t.copy_(ids - torch.arange(len(ids)))
        self.t2d.zero_()
        self.t2d[ids] = True

    @property
    def draft_to_target(self) -> torch.Tensor:
        return torch.arange(self.draft_vocab_size, device=self.d2t.device) + self.d2t

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """[..., n·Ht] target features (the aux layers side by side) -> [..., H]."""
        return self.fc(aux.to(self.dtype))

    def rope(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rotary(x, positions)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., H] pre-norm outputs -> [..., draft V] logits."""
        return self.lm_head(self.norm(hidden))

    def full_logits(self, hidden: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """Logits over the target's vocabulary: -inf outside the draft vocabulary."""
        return self.to_target(self.logits(hidden), vocab_size)

    def to_target(self, small: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """Draft-vocabulary logits spread over the target's vocabulary (-inf elsewhere)."""
        out = small.new_full((*small.shape[:-1], vocab_size), float("-inf"))
        out[..., self.draft_to_target] = small
        return out


def head_for_target(
    target_config,
    embedding: torch.Tensor,
    lm_head: torch.Tensor,
    draft_ids: torch.Tensor,
    aux_layers: tuple[int, ...] | None = None,
    seed: int = 0,
) -> Eagle3Head:
    """A new head shaped like one of the target's layers: its embedding is the target's, its LM head
    the target's rows for the draft vocabulary, the rest random (as EAGLE starts training)."""
    layers = target_config.num_hidden_layers
    config = LlamaConfig(
        vocab_size=embedding.shape[0],
        hidden_size=target_config.hidden_size,
        intermediate_size=target_config.intermediate_size,
        num_attention_heads=target_config.num_attention_heads,
        num_key_value_heads=getattr(target_config, "num_key_value_heads", None)
        or target_config.num_attention_heads,
        head_dim=getattr(target_config, "head_dim", None)
        or target_config.hidden_size // target_config.num_attention_heads,
        rms_norm_eps=getattr(target_config, "rms_norm_eps", 1e-6),
        max_position_embeddings=getattr(target_config, "max_position_embeddings", 2048),
        rope_parameters=getattr(target_config, "rope_parameters", None)
        or {"rope_type": "default", "rope_theta": 10000.0},
        hidden_act="silu",
        num_hidden_layers=1,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        head = Eagle3Head(config, len(draft_ids), aux_layers or default_aux_layers(layers))
    ids = torch.sort(draft_ids.to(torch.long)).values
    head.set_vocab(ids)
    with torch.no_grad():
        head.embed_tokens.weight.copy_(embedding.float())
        head.lm_head.weight.copy_(lm_head.float()[ids])
    return head
