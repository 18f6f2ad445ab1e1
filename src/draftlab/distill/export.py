"""The distilled draft written as a model folder: weights, the target's tokenizer, its recipe and model card."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from draftlab.distill.config import DistillConfig
from draftlab.files import readable_as_usual, write_text
from draftlab.models.loading import LoadedModel

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "added_tokens.json",
)


def export(draft, target: LoadedModel, out: Path) -> None:
    """The draft in bfloat16 with the target's own tokenizer files, ready for `--draft out`."""
    out.mkdir(parents=True, exist_ok=True)
    was_training = draft.training
    state = {k: v.detach().to(torch.bfloat16).cpu().clone() for k, v in draft.state_dict().items()}
    from transformers import LlamaForCausalLM  # noqa: PLC0415

    shipped = LlamaForCausalLM(draft.config)
    shipped.load_state_dict(state)
    shipped.to(torch.bfloat16)
    shipped.config.dtype = "bfloat16"
    shipped.generation_config = target.model.generation_config
    shipped.save_pretrained(out)
    source = Path(target.path)
    copied = False
    if source.is_dir():
        for name in TOKENIZER_FILES:
            if (source / name).exists():
                shutil.copyfile(source / name, out / name)
                copied = True
    if not copied:
        target.tokenizer.save_pretrained(out)
    readable_as_usual(out)  # save_pretrained left model.safetensors 0600
    draft.train(was_training)


@dataclass
class Recipe:
    """recipe.json and README.md beside the draft: how it was made, rewritten at every checkpoint."""

    cfg: DistillConfig
    data_summary: dict
    gen_seconds: float
    draft_config: object = None  # the draft's LlamaConfig, once the draft exists

    def write(self, step: int, extra: dict, evaluation: dict | None) -> None:
        config, cfg = self.draft_config, self.cfg
        params = sum(
            p
            for p in [
                config.vocab_size * config.hidden_size,
                config.num_hidden_layers
                * (
                    config.hidden_size * config.hidden_size * 2
                    + 2 * config.hidden_size * config.num_key_value_heads * config.head_dim
                    + 3 * config.hidden_size * config.intermediate_size
                    + 2 * config.hidden_size
                ),
                config.hidden_size,
            ]
        )
        recipe = {
            "what": "draft model distilled from the target by `draftlab distill` (KL to the target's top-k "
            "next-token distributions on its own responses, DistillSpec-style)",
            "cli": cfg.cli,
            "draft_config": {
                "architecture": "LlamaForCausalLM",
                "vocab_size": config.vocab_size,
                "hidden_size": config.hidden_size,
                "num_hidden_layers": config.num_hidden_layers,
                "intermediate_size": config.intermediate_size,
                "num_attention_heads": config.num_attention_heads,
                "num_key_value_heads": config.num_key_value_heads,
                "tie_word_embeddings": True,
                "parameters": params,
                "init": f"the weights of {cfg.init_from} (--init-from)"
                if cfg.init_from
                else "embedding = target embedding projected onto its top singular directions; rest random",
            },
            "train_config": {k: v for k, v in vars(cfg.train).items()},
            "data": self.data_summary,
            "generation_seconds_this_run": round(self.gen_seconds, 1),
            "trained_steps": step,
            "train_seconds": round(extra.get("train_seconds", 0.0), 1),
            "final_metrics": extra.get("last"),
            "evaluation": evaluation,
            "torch": torch.__version__,
        }
        write_text(cfg.out / "recipe.json", json.dumps(recipe, indent=2, default=str) + "\n")
        write_text(cfg.out / "README.md", _readme(recipe))


def _readme(recipe: dict) -> str:
    c, d, t = recipe["draft_config"], recipe["data"], recipe["train_config"]
    shards = d.get("shards") or {}
    lines = [
        "# Distilled draft model",
        "",
        "Made by `draftlab distill`; the full recipe (command line, configs, data hashes) is in",
        "`recipe.json` and the training curve in `train_log.jsonl`.",
        "",
        f"- target: `{recipe['cli'].get('target')}`; tokenizer files are the target's own",
        f"- draft: Llama, hidden {c['hidden_size']}, {c['num_hidden_layers']} layers, intermediate "
        f"{c['intermediate_size']}, {c['num_attention_heads']} heads / {c['num_key_value_heads']} kv heads, "
        f"tied embeddings, {c['parameters'] / 1e6:.1f}M parameters, stored in bfloat16",
        f"- init: {c['init']}",
        f"- data: {d['prompts']} prompt-file prompts ({d['multi_turn_prompts']} multi-turn), "
        f"{d['corpus_instructions']} instructions built on passages of {len(d['text_files'])} text file(s), "
        f"{d['raw_chunks']} raw text chunks; the target answered greedily and sampled "
        f"(temperature {recipe['cli'].get('sample_temperature')}) through its chat template",
        f"- sequences per source: {shards.get('sequences')}; tokens: {shards.get('tokens')}; "
        f"response tokens: {shards.get('response_tokens')}",
        f"- loss: {t['kl_weight']} × KL(teacher top-{recipe['cli'].get('top_k')} ‖ draft) + "
        f"{t['ce_weight']} × CE(next token); prompt positions weigh {t['prompt_weight']}, raw text "
        f"{t['raw_weight']}",
        f"- training: {recipe['trained_steps']} steps of ~{t['batch_tokens']} tokens, AdamW lr {t['lr']} "
        f"(cosine), bf16 autocast {t['autocast']}, {recipe['train_seconds']:.0f} s",
    ]
    final = recipe.get("final_metrics") or {}
    if final:
        lines.append(
            f"- final: loss {final.get('loss', float('nan')):.3f}, KL {final.get('kl', float('nan')):.3f}, "
            f"top-1 agreement {final.get('top1', float('nan')):.3f}"
        )
    ev = recipe.get("evaluation")
    if ev and ev.get("mean_acceptance_rate") is not None:
        lines.append(
            f"- evaluation ({ev['prompts']} held-out prompts of {ev['prompt_file']}, greedy, γ={ev['gamma']}, "
            f"{ev['max_new_tokens']} new tokens): mean acceptance {ev['mean_acceptance_rate']:.3f}, "
            f"AR {ev['ar_tokens_per_s']:.1f} tok/s vs SPS {ev['sps_tokens_per_s']:.1f} tok/s "
            f"({ev['speedup']:.2f}×)"
        )
    return "\n".join(lines) + "\n"
