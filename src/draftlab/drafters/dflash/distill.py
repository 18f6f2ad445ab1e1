"""`draftlab distill --head dflash`: the target's answers, its hidden states at the taps, a trained
DFlash drafter.

The stages and their work folder are EAGLE-3's (drafters/eagle3/distill.py): the same answers, the
same feature shards (at the drafter's taps), so a head of either kind trains from data generated
once. Training and its checkpoint resume; the drafter is exported in its published layout at every
checkpoint, then evaluated on sequences it did not train on.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import asdict, dataclass, replace

import torch

from draftlab.distill import data as D
from draftlab.distill.config import DistillConfig
from draftlab.distill.inputs import generate_data, read_inputs
from draftlab.drafters.dflash import train as T
from draftlab.drafters.dflash.head import DFlashDraft, dflash_config
from draftlab.drafters.dflash.io import load_dflash, save_dflash
from draftlab.drafters.eagle3 import features as F
from draftlab.drafters.eagle3.distill import _trim_log, held_out
from draftlab.errors import DraftlabError
from draftlab.files import atomic_path, write_text
from draftlab.models.loading import ModelSpec, load_model, resolve_path
from draftlab.progress import maybe_progress

CHECKPOINT = "dflash-checkpoint.pt"
LEARNING_PNG = "accepted_vs_training_tokens.png"


@dataclass(frozen=True)
class DFlashOptions:
    block_size: int
    layers: int
    train: T.DFlashTrainConfig
    time_budget_s: float | None
    save_every: int
    draft_vocab: int | None = None  # propose from this many tokens only (None: the whole vocabulary)


def mask_token(tokenizer, eos: set[int]) -> int:
    """The token whose embedding marks a masked position: the tokenizer's mask token, else one it
    never writes in an answer (unknown, padding), else 0. Any fixed token works, as the drafter
    learns what it means; the target's embedding of it is what the drafter reads."""
    for name in ("mask_token_id", "unk_token_id", "pad_token_id"):
        token = getattr(tokenizer, name, None)
        if token is not None and token not in eos:
            return int(token)
    return 0


def distill_dflash(cfg: DistillConfig, opts: DFlashOptions) -> dict:
    started = time.time()
    deadline = None if opts.time_budget_s is None else started + opts.time_budget_s
    if cfg.out.exists() and not cfg.out.is_dir():
        raise DraftlabError(f"--out '{cfg.out}' exists and is not a folder")
    inputs = read_inputs(cfg.data, cfg.seed)
    checkpoint_path = cfg.work / CHECKPOINT
    if cfg.restart:
        checkpoint_path.unlink(missing_ok=True)
    checkpoint = torch.load(checkpoint_path, weights_only=False) if checkpoint_path.exists() else None
    if cfg.resume and checkpoint is None:
        raise DraftlabError(f"--resume: no DFlash checkpoint in '{cfg.work}'")
    target = load_model(ModelSpec(cfg.target, cfg.target_dtype, cfg.device))
    if target.is_encoder_decoder:
        raise DraftlabError("distill --head supports decoder-only targets only")
    cfg.out.mkdir(parents=True, exist_ok=True)
    cfg.work.mkdir(parents=True, exist_ok=True)

    # (1) answers, shared with every head trained in this work folder
    if cfg.data.gen_minutes is None and deadline is not None:
        cfg = replace(cfg, data=replace(cfg.data, gen_minutes=opts.time_budget_s / 120))
    jobs_left, gen_seconds, gen_dtype = generate_data(cfg, target, inputs, labels_from_answers=False)
    records = list({r["key"]: r for r in reversed(D.load_shards(cfg.data_dir)) if len(r["ids"]) > 1}.values())
    if not records:
        raise DraftlabError("no training data: give --prompts or --text files (or keep the default prompts)")

    # (2) the drafter (its taps decide which features are read)
    tc = target.model.config
    if checkpoint is not None:
        draft = load_dflash(cfg.work / "dflash-state")
        start_step, optimizer_state = int(checkpoint["step"]), checkpoint["optimizer"]
        train_seconds = float(checkpoint.get("train_seconds", 0.0))
    elif cfg.init_from:
        draft = load_dflash(resolve_path(cfg.init_from))
        start_step, optimizer_state, train_seconds = 0, None, 0.0
    else:
        config = dflash_config(
            tc, opts.layers, opts.block_size, mask_token(target.tokenizer, set(target.eos_token_ids))
        )
        with torch.random.fork_rng():
            torch.manual_seed(cfg.seed)
            draft = DFlashDraft(config)
        if opts.draft_vocab and opts.draft_vocab < target.vocab_size:
            # The answers' most frequent tokens, held-out sequences left out (as EAGLE-3's head picks).
            any_source = not any(r["source"] == "prompts" for r in records)
            prompt_of = D.prompt_keys(inputs.jobs)
            seen = [r for r in records if not held_out(r, any_source, prompt_of)]
            always = set(target.eos_token_ids)
            vocabulary = F.draft_vocabulary(seen, opts.draft_vocab, always, target.vocab_size)
            draft.prune(vocabulary, target.model.get_output_embeddings().weight.detach().float().cpu())
        start_step, optimizer_state, train_seconds = 0, None, 0.0
    draft.float()
    # float32 copies of the target's embedding and output head, frozen (the target itself stays as loaded)
    embedding = copy.deepcopy(target.model.get_input_embeddings()).float().requires_grad_(False)
    output_head = copy.deepcopy(target.model.get_output_embeddings()).float().requires_grad_(False)

    # (3) features at the taps
    layers = draft.feature_layers
    feature_dir = cfg.work / f"features-{'-'.join(map(str, layers))}-{cfg.target_dtype}"
    t0 = time.time()
    with maybe_progress(not cfg.quiet) as progress:
        done = F.done_keys(feature_dir) if feature_dir.exists() else set()
        task = (
            progress.add_task("target features", total=max(len(records) - len(done), 1), info="")
            if progress
            else None
        )

        def on_batch(n: int, tokens: int) -> None:
            if progress:
                progress.update(task, advance=n, info=f"{tokens} tokens in the last batch")

        F.extract(target.model, records, layers, feature_dir, on_batch=on_batch)
    feature_seconds = time.time() - t0
    featured = F.load(feature_dir, records)
    any_source = not any(r["source"] == "prompts" for r in featured)
    prompt_of = D.prompt_keys(inputs.jobs)
    train_records = [r for r in featured if not held_out(r, any_source, prompt_of)]
    test_records = [r for r in featured if held_out(r, any_source, prompt_of)]

    # (4) training
    log_path = cfg.out / "train_log.jsonl"
    _trim_log(log_path, start_step)
    last: dict = dict(checkpoint.get("last", {})) if checkpoint else {}
    t_train = time.time()

    def on_save(step: int, optimizer: dict) -> None:
        seconds = train_seconds + time.time() - t_train
        save_dflash(draft, cfg.work / "dflash-state", cfg.target)
        torch.save(
            {"step": step, "optimizer": optimizer, "train_seconds": seconds, "last": last}, checkpoint_path
        )
        save_dflash(draft, cfg.out, cfg.target)

    with maybe_progress(not cfg.quiet and start_step < opts.train.steps) as progress:
        task = (
            progress.add_task("train DFlash", total=opts.train.steps, completed=start_step, info="")
            if progress
            else None
        )
        with log_path.open("a", buffering=1) as log:

            def on_step(step: int, metrics: dict) -> None:
                last.clear()
                last.update(metrics)
                log.write(json.dumps({"step": step, **metrics}) + "\n")
                if progress:
                    info = f"loss {metrics['loss']:.3f} accepted {metrics['mean_accepted_length']:.2f}"
                    progress.update(task, completed=step, info=info)

            step = T.train(
                draft,
                embedding,
                output_head,
                train_records,
                opts.train,
                start_step,
                optimizer_state,
                deadline,
                on_step,
                on_save,
                opts.save_every,
                start_progress=float(last.get("progress", 0.0)),
                start_tokens=int(last.get("tokens", 0)),
            )
    train_seconds += time.time() - t_train

    # (5) evaluation on sequences never trained on
    held = T.held_out_metrics(
        draft, embedding, output_head, test_records, opts.train.max_len, opts.train.anchors
    )
    trained_tokens = sum(len(r["ids"]) for r in train_records)
    recipe = {
        "what": "DFlash drafter trained by `draftlab distill --head dflash` (random anchors, block-wise "
        "cross-entropy to the target's greedy tokens with a decay over the block)",
        "cli": cfg.cli,
        "target": {"name": cfg.target, "dtype": cfg.target_dtype, "layers": tc.num_hidden_layers},
        "drafter": {
            "parameters": sum(p.numel() for p in draft.parameters()),
            "layers": draft.config.num_hidden_layers,
            "block_size": draft.block_size,
            "taps": list(draft.taps),
            "mask_token_id": draft.mask_token_id,
            "draft_vocab_size": len(draft.d2t) if draft.pruned else None,
        },
        "data": {
            **D.data_stats(cfg.data_dir),
            "jobs_not_generated": jobs_left,
            "generation_seconds_this_run": round(gen_seconds, 1),
            "generation_dtype": gen_dtype,
            "feature_seconds_this_run": round(feature_seconds, 1),
            "train_sequences": len(train_records),
            "train_tokens": trained_tokens,
            "held_out_sequences": len(test_records),
        },
        "train_config": asdict(opts.train),
        "trained_steps": step,
        "train_seconds": round(train_seconds, 1),
        "final_metrics": dict(last),
        "held_out": held,
        "torch": torch.__version__,
    }
    write_text(cfg.out / "recipe.json", json.dumps(recipe, indent=2, default=str) + "\n")
    plot_learning(log_path, held, cfg.out / LEARNING_PNG)
    return {
        "out": str(cfg.out),
        "steps": step,
        "final": dict(last),
        "held_out": held,
        "train_tokens": trained_tokens,
        "seconds": time.time() - started,
    }


def plot_learning(log_path, held: dict, out, window: int = 25) -> None:
    """Mean accepted length (teacher-forced, on the blocks of each step) against the sequence tokens
    trained on, smoothed over `window` steps, with the held-out figure at the end: what more data
    buys, for a user deciding how long to train."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415

    rows = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "tokens" in r]
    if not rows:
        return
    fig = Figure(figsize=(7.0, 4.2), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    lengths = [r["mean_accepted_length"] for r in rows]
    smooth = [
        sum(lengths[max(0, i - window + 1) : i + 1]) / len(lengths[max(0, i - window + 1) : i + 1])
        for i in range(len(lengths))
    ]
    ax.plot([r["tokens"] for r in rows], smooth, label=f"training blocks ({window}-step mean)")
    if held.get("mean_accepted_length") is not None:
        ax.scatter(
            [rows[-1]["tokens"]],
            [held["mean_accepted_length"]],
            color="C1",
            zorder=3,
            label="held-out answers",
        )
    ax.set_xlabel("training tokens seen")
    ax.set_ylabel("mean accepted length (teacher-forced)")
    ax.set_title(
        f"DFlash drafter: accepted length against training tokens (block {held.get('block_size', '')})"
    )
    ax.grid(alpha=0.3)
    ax.legend()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png")
