"""Tiny models of every family the seeds used, built from configs and saved like real checkpoints."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    BloomConfig,
    BloomForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    OPTConfig,
    OPTForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    T5Config,
    T5ForConditionalGeneration,
)

PAD, EOS, BOS, UNK = 0, 1, 2, 3
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant:{% endif %}"
)
WORDS = (
    "the a cat dog sat ran on under mat house river tree big small red blue quickly slowly and then "
    "summary translate question answer because therefore law court contract clause paid month year"
).split()


def corpus(n: int = 400) -> list[str]:
    gen = torch.Generator().manual_seed(0)
    return [
        " ".join(WORDS[i] for i in torch.randint(len(WORDS), (12,), generator=gen).tolist()) + "."
        for _ in range(n)
    ]


def make_tokenizer(directory: Path, vocab_size: int = 320) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<pad>", "</s>", "<s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", bos_token="<s>", unk_token="<unk>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(directory)
    return fast


def _config(family: str, vocab: int, hidden: int, layers: int, context: int = 512):
    common = dict(vocab_size=vocab, pad_token_id=PAD, eos_token_id=EOS, bos_token_id=BOS)
    if family == "opt":
        return OPTForCausalLM, OPTConfig(
            hidden_size=hidden,
            num_hidden_layers=layers,
            ffn_dim=2 * hidden,
            num_attention_heads=4,
            max_position_embeddings=context,
            word_embed_proj_dim=hidden,
            **common,
        )
    if family in ("llama", "qwen2"):  # the same shape of config
        cls, config = {"llama": (LlamaForCausalLM, LlamaConfig), "qwen2": (Qwen2ForCausalLM, Qwen2Config)}[
            family
        ]
        return cls, config(
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=context,
            **common,
        )
    if family == "bloom":
        return BloomForCausalLM, BloomConfig(hidden_size=hidden, n_layer=layers, n_head=4, **common)
    if family == "gpt_neox":
        return GPTNeoXForCausalLM, GPTNeoXConfig(
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=4,
            intermediate_size=2 * hidden,
            max_position_embeddings=context,
            **common,
        )
    if family == "gpt2":
        return GPT2LMHeadModel, GPT2Config(
            n_embd=hidden, n_layer=layers, n_head=4, n_positions=context, **common
        )
    if family == "t5":
        return T5ForConditionalGeneration, T5Config(
            d_model=hidden,
            d_kv=hidden // 4,
            d_ff=2 * hidden,
            num_layers=layers,
            num_heads=4,
            decoder_start_token_id=PAD,
            **common,
        )
    raise ValueError(family)


FAMILIES = ("opt", "llama", "bloom", "gpt_neox", "qwen2", "gpt2", "t5")


def make_model(
    family: str,
    directory: Path,
    seed: int,
    hidden: int = 32,
    layers: int = 2,
    vocab: int = 320,
    context: int = 512,
) -> Path:
    """Random weights, spread wide enough that greedy argmaxes are not near-ties."""
    torch.manual_seed(seed)
    cls, config = _config(family, vocab, hidden, layers, context)
    model = cls(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.3)
    model.generation_config.eos_token_id = EOS
    model.generation_config.pad_token_id = PAD
    model.save_pretrained(directory)
    make_tokenizer(directory, vocab)
    return directory


def wide_llama(vocab: int, seed: int) -> LlamaForCausalLM:
    """A one-layer Llama over a handful of tokens with weights drawn wide (N(0, 0.5)), so that its
    next-token laws are far from uniform: the model of the exactness and sampling-law tests."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(wide_llama_config(vocab)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.5)
    return model


def wide_llama_config(vocab: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )


def random_head(target, draft_ids, seed=0, scale=0.3):
    """A random EAGLE-3 head for a loaded target (its embedding and output head, `draft_ids` as the
    draft vocabulary), drawn wide enough that its drafts vary."""
    from draftlab.drafters.eagle3.head import head_for_target  # noqa: PLC0415

    model = target.model
    head = head_for_target(
        model.config,
        model.get_input_embeddings().weight.detach(),
        model.get_output_embeddings().weight.detach(),
        draft_ids,
        seed=seed,
    )
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(seed)
        for name, p in head.named_parameters():
            if p.dim() > 1 and not name.startswith(("embed_tokens", "lm_head")):
                p.normal_(0.0, scale / p.shape[-1] ** 0.5 * 4)
    return head.eval()


def random_dflash(target, block_size=4, layers=1, seed=0, scale=0.3, mask_token_id=0):
    """A random DFlash drafter for a loaded target (its width, heads and rope), drawn wide enough
    that its drafts vary."""
    from draftlab.drafters.dflash.head import DFlashDraft, dflash_config  # noqa: PLC0415

    config = dflash_config(target.model.config, layers, block_size, mask_token_id)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        draft = DFlashDraft(config)
        with torch.no_grad():
            for p in draft.parameters():
                if p.dim() > 1:
                    p.normal_(0.0, scale / p.shape[-1] ** 0.5 * 4)
    return draft.eval()
