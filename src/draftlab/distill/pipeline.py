"""`draftlab distill` end to end: data from the target, a distilled draft, its recipe and evaluation."""

from __future__ import annotations

import argparse
import json
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

import torch

from draftlab.distill import data as D
from draftlab.distill import train as T
from draftlab.errors import DraftlabError
from draftlab.files import write_text
from draftlab.models.loading import LoadedModel, ModelSpec, check_compatible, load_model, resolve_path

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


def package_data(name: str) -> Path | None:
    path = Path(str(resources.files("draftlab") / "data" / name))
    return path if path.exists() else None


def work_dir_for(args: argparse.Namespace) -> Path:
    if args.work_dir:
        return Path(args.work_dir).expanduser()
    out = Path(args.out).expanduser()
    return out.parent / f"{out.name}.work"


def autocast_enabled(choice: str, device: torch.device) -> bool:
    if choice != "auto":
        return choice == "on"
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    try:  # bf16 autocast pays off on CPUs with native bf16 (AVX512-BF16 / AMX), not elsewhere
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


@contextmanager
def _progress(enabled: bool) -> Iterator:
    if not enabled:
        yield None
        return
    from rich.progress import (  # noqa: PLC0415 - only the CLI path draws bars
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[info]}"),
    )
    with Progress(*columns, transient=False) as progress:
        yield progress


def run(args: argparse.Namespace) -> dict:
    started = time.time()
    out = Path(args.out).expanduser()
    work = work_dir_for(args)
    data_dir = work / "data"
    device = torch.device(args.device)
    if out.exists() and not out.is_dir():
        raise DraftlabError(f"--out '{out}' exists and is not a folder")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise DraftlabError(f"device '{args.device}' requested but CUDA is not available")

    # Inputs first, so that bad files fail before the target loads.
    prompt_paths = [Path(p).expanduser() for p in (args.prompts or [])]
    if not prompt_paths and not args.no_default_prompts and package_data("distill_prompts.jsonl"):
        prompt_paths = [package_data("distill_prompts.jsonl")]
    prompt_items = [item for p in prompt_paths for item in D.read_prompt_file(p)]
    text_paths = [Path(p).expanduser() for p in (args.text or [])]
    texts = [D.read_text_file(p) for p in text_paths]
    corpus_items = D.corpus_instruction_items(texts, args.corpus_prompts, args.seed)
    raw_chunks = D.raw_text_chunks(texts, args.raw_chunks, args.raw_chars, args.seed)
    jobs = D.build_jobs(
        prompt_items, corpus_items, raw_chunks, args.samples_per_prompt, args.sample_temperature, args.seed
    )
    checkpoint = T.load_checkpoint(work) if not args.restart else None
    if args.resume and checkpoint is None:
        raise DraftlabError(f"--resume: no checkpoint in '{work}'")
    if not jobs and not list(data_dir.glob("shard-*.pt")):
        raise DraftlabError("no training data: give --prompts or --text files (or keep the default prompts)")

    target = load_model(ModelSpec(args.target, args.target_dtype, args.device))
    if target.is_encoder_decoder:
        raise DraftlabError("distill supports decoder-only targets only")
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    if args.restart:
        for stale in [work / T.CHECKPOINT, out / "train_log.jsonl"]:
            stale.unlink(missing_ok=True)

    show = not args.quiet
    # 1. Data: the target answers the prompts; shards already on disk are kept.
    gen_start = time.time()
    teacher = D.Teacher(target.model, target.tokenizer, args.top_k, args.max_new_tokens, args.max_len)
    done = D.done_keys(data_dir) if data_dir.exists() else set()
    todo = len([j for j in jobs if j.key not in done])
    with _progress(show) as progress:
        task = progress.add_task("teacher data", total=max(todo, 1), info="") if progress else None
        tokens = [0]

        def on_data(n: int, new_tokens: int) -> None:
            tokens[0] += new_tokens
            if progress:
                progress.update(task, advance=n, info=f"{tokens[0]} tokens")

        target.model.eval()
        deadline = None if args.gen_minutes is None else gen_start + 60 * args.gen_minutes
        jobs_left = D.generate_data(teacher, jobs, data_dir, args.gen_batch_size, on_data, deadline)
    gen_seconds = time.time() - gen_start
    records = D.load_shards(data_dir)
    if not records:
        raise DraftlabError("no training data was produced")

    # 2. The draft: resume from the checkpoint, or start from the target's projected embedding.
    shape = T.DraftShape(args.hidden_size, args.layers, args.intermediate_size, args.heads, args.kv_heads)
    try:
        config = T.draft_config(target.model.config, shape, target.vocab_size)
    except ValueError as exc:
        raise DraftlabError(str(exc)) from None
    cfg = T.TrainConfig(
        steps=args.steps,
        batch_tokens=args.batch_tokens,
        max_len=args.max_len,
        lr=args.lr,
        warmup=min(args.warmup, max(1, args.steps // 5)),
        weight_decay=args.weight_decay,
        kl_weight=args.kl_weight,
        ce_weight=args.ce_weight,
        prompt_weight=args.prompt_weight,
        raw_weight=args.raw_weight,
        save_every=args.save_every,
        log_every=args.log_every,
        seed=args.seed,
        autocast=autocast_enabled(args.autocast, device),
    )
    from transformers import LlamaForCausalLM  # noqa: PLC0415

    start_step, optimizer_state, train_seconds_before = 0, None, 0.0
    if checkpoint is not None:
        if (
            checkpoint["draft_config"].get("hidden_size") != config.hidden_size
            or checkpoint["draft_config"].get("num_hidden_layers") != config.num_hidden_layers
        ):
            raise DraftlabError(
                f"the checkpoint in '{work}' has a different draft shape; pass --restart to start over"
            )
        draft = LlamaForCausalLM(config)
        draft.load_state_dict(checkpoint["model"])
        start_step = int(checkpoint["step"])
        optimizer_state = checkpoint["optimizer"]
        train_seconds_before = float(checkpoint.get("train_seconds", 0.0))
    elif args.init_from:
        # Continue from an existing draft (e.g. the shipped one) when the work folder is gone.
        draft = LlamaForCausalLM.from_pretrained(resolve_path(args.init_from), dtype=torch.float32)
        check_compatible(
            target, LoadedModel(draft, target.tokenizer, ModelSpec(args.init_from), args.init_from)
        )
        config = draft.config
    else:
        draft = T.init_draft(config, target.model.get_input_embeddings().weight, args.seed)
    draft.generation_config = target.model.generation_config

    log_path = out / "train_log.jsonl"
    train_start = time.time()
    extra = {"train_seconds": train_seconds_before}
    data_summary = _data_summary(prompt_paths, prompt_items, text_paths, corpus_items, raw_chunks, data_dir)
    data_summary["jobs"] = len(jobs)
    data_summary["jobs_not_generated"] = jobs_left

    def on_save(step: int) -> None:
        extra["train_seconds"] = train_seconds_before + time.time() - train_start
        export(draft, target, out)
        _write_recipe(out, args, config, cfg, data_summary, step, extra, None, gen_seconds)

    tc = target.model.config
    data_summary["teacher"] = {
        "name": args.target,
        "model_type": tc.model_type,
        "num_hidden_layers": getattr(tc, "num_hidden_layers", None),
        "hidden_size": getattr(tc, "hidden_size", None),
        "vocab_size": target.vocab_size,
        "parameters": target.num_parameters,
        "dtype": args.target_dtype,
    }

    with _progress(show and start_step < cfg.steps) as progress:
        task = (
            progress.add_task("distill", total=cfg.steps, completed=start_step, info="") if progress else None
        )

        def on_step(step: int, metrics: dict) -> None:
            extra["last"] = metrics
            extra["train_seconds"] = train_seconds_before + time.time() - train_start
            if progress:
                info = f"loss {metrics['loss']:.3f} kl {metrics['kl']:.3f} top1 {metrics['top1']:.3f}"
                progress.update(task, completed=step, info=info)

        if start_step < cfg.steps:
            T.train(
                draft,
                records,
                cfg,
                work,
                device,
                log_path,
                start_step,
                optimizer_state,
                on_step=on_step,
                on_save=on_save,
                extra_state=extra,
            )
    if start_step >= cfg.steps:
        on_save(start_step)
    if "last" not in extra and checkpoint is not None:
        extra["last"] = checkpoint.get("last")

    # 3. Evaluation on held-out prompts through draftlab's own decoding engine.
    evaluation = None
    eval_path = (
        Path(args.eval_prompts).expanduser() if args.eval_prompts else package_data("builtin_suite.jsonl")
    )
    if args.eval_per_category > 0 and eval_path is not None:
        from draftlab.distill.evaluate import eval_prompts, evaluate_pair  # noqa: PLC0415

        shipped = load_model(ModelSpec(str(out), args.target_dtype, args.device))
        check_compatible(target, shipped)
        prompts = eval_prompts(eval_path, args.eval_per_category)
        evaluation = evaluate_pair(target, shipped, prompts, args.eval_gamma, args.eval_max_new_tokens)
        evaluation["prompt_file"] = eval_path.name
    _write_recipe(out, args, config, cfg, data_summary, cfg.steps, extra, evaluation, gen_seconds)
    result = {
        "out": str(out),
        "steps": cfg.steps,
        "final": extra.get("last"),
        "evaluation": evaluation,
        "seconds": time.time() - started,
    }
    return result


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
    draft.train(was_training)


def _data_summary(prompt_paths, prompt_items, text_paths, corpus_items, raw_chunks, data_dir: Path) -> dict:
    return {
        "prompt_files": [
            {"name": p.name, "bytes": p.stat().st_size, "sha256": D.file_digest(p)} for p in prompt_paths
        ],
        "prompts": len(prompt_items),
        "multi_turn_prompts": sum(1 for _, turns in prompt_items if len(turns) > 1),
        "text_files": [
            {"name": p.name, "bytes": p.stat().st_size, "sha256": D.file_digest(p)} for p in text_paths
        ],
        "corpus_instructions": len(corpus_items),
        "raw_chunks": len(raw_chunks),
        "shards": D.data_stats(data_dir) if data_dir.exists() else {},
    }


def _write_recipe(out, args, config, cfg, data_summary, step, extra, evaluation, gen_seconds) -> None:
    cli = {k: v for k, v in vars(args).items() if k not in ("func",) and not callable(v)}
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
        "cli": cli,
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
            "init": f"the weights of {args.init_from} (--init-from)"
            if args.init_from
            else "embedding = target embedding projected onto its top singular directions; rest random",
        },
        "train_config": {k: v for k, v in vars(cfg).items()},
        "data": data_summary,
        "generation_seconds_this_run": round(gen_seconds, 1),
        "trained_steps": step,
        "train_seconds": round(extra.get("train_seconds", 0.0), 1),
        "final_metrics": extra.get("last"),
        "evaluation": evaluation,
        "torch": torch.__version__,
    }
    write_text(out / "recipe.json", json.dumps(recipe, indent=2, default=str) + "\n")
    write_text(out / "README.md", _readme(recipe))


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
