"""`draftlab distill`: read the inputs, let the target answer, train the draft on its answers, evaluate, export.

Each stage resumes from what the previous run left in the work folder."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from draftlab.distill import data as D
from draftlab.distill import train as T
from draftlab.distill.config import DistillConfig
from draftlab.distill.evaluate import eval_prompts, evaluate_pair
from draftlab.distill.export import Recipe, export
from draftlab.distill.inputs import generate_data, read_inputs
from draftlab.errors import DraftlabError
from draftlab.models.loading import LoadedModel, ModelSpec, check_compatible, load_model, resolve_path
from draftlab.progress import maybe_progress


def distill(cfg: DistillConfig) -> dict:
    """Data from the target, then the draft trained on it, exported, and evaluated."""
    started = time.time()
    if cfg.out.exists() and not cfg.out.is_dir():
        raise DraftlabError(f"--out '{cfg.out}' exists and is not a folder")
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise DraftlabError(f"device '{cfg.device}' requested but CUDA is not available")
    inputs = read_inputs(cfg.data, cfg.seed)
    checkpoint = T.load_checkpoint(cfg.work) if not cfg.restart else None
    if cfg.resume and checkpoint is None:
        raise DraftlabError(f"--resume: no checkpoint in '{cfg.work}'")
    if not inputs.jobs and not cfg.data.magpie_prompts and not list(cfg.data_dir.glob("shard-*.pt")):
        raise DraftlabError("no training data: give --prompts or --text files (or keep the default prompts)")

    target = load_model(ModelSpec(cfg.target, cfg.target_dtype, cfg.device))
    if target.is_encoder_decoder:
        raise DraftlabError("distill supports decoder-only targets only")
    cfg.out.mkdir(parents=True, exist_ok=True)
    cfg.work.mkdir(parents=True, exist_ok=True)
    if cfg.restart:
        for stale in [cfg.work / T.CHECKPOINT, cfg.out / "train_log.jsonl"]:
            stale.unlink(missing_ok=True)

    jobs_left, gen_seconds, gen_dtype = generate_data(cfg, target, inputs)
    records = D.load_shards(cfg.data_dir)
    if not records:
        raise DraftlabError("no training data was produced")
    summary = inputs.summary(cfg.data, cfg.data_dir)
    summary["jobs"] = len(inputs.jobs)
    summary["jobs_not_generated"] = jobs_left
    summary["generation_dtype"] = gen_dtype
    summary["teacher"] = _teacher(cfg, target)
    recipe = Recipe(cfg, summary, gen_seconds)
    draft, state = build_draft(cfg, target, checkpoint)
    recipe.draft_config = draft.config
    train_draft(cfg, target, draft, records, state, recipe)
    evaluation = evaluate(cfg, target)
    recipe.write(cfg.train.steps, state.extra, evaluation)
    return {
        "out": str(cfg.out),
        "steps": cfg.train.steps,
        "final": state.extra.get("last"),
        "evaluation": evaluation,
        "seconds": time.time() - started,
    }


@dataclass
class TrainState:
    """Where training starts: a checkpoint's step and optimizer, or nothing; `extra` goes into checkpoints."""

    start_step: int = 0
    optimizer_state: dict | None = None
    train_seconds_before: float = 0.0
    extra: dict = field(default_factory=dict)
    last: dict | None = None  # the checkpoint's last metrics, for a run that trains no further step


def build_draft(cfg: DistillConfig, target: LoadedModel, checkpoint: dict | None):
    """Resume from the checkpoint, start from --init-from, or from the target's projected embedding."""
    from transformers import LlamaForCausalLM  # noqa: PLC0415

    try:
        config = T.draft_config(target.model.config, cfg.shape, target.vocab_size)
    except ValueError as exc:
        raise DraftlabError(str(exc)) from None
    state = TrainState()
    if checkpoint is not None:
        if (
            checkpoint["draft_config"].get("hidden_size") != config.hidden_size
            or checkpoint["draft_config"].get("num_hidden_layers") != config.num_hidden_layers
        ):
            raise DraftlabError(
                f"the checkpoint in '{cfg.work}' has a different draft shape; pass --restart to start over"
            )
        draft = LlamaForCausalLM(config)
        draft.load_state_dict(checkpoint["model"])
        state = TrainState(
            int(checkpoint["step"]),
            checkpoint["optimizer"],
            float(checkpoint.get("train_seconds", 0.0)),
            last=checkpoint.get("last"),
        )
    elif cfg.init_from:
        # Continue from an existing draft (e.g. the shipped one) when the work folder is gone.
        draft = LlamaForCausalLM.from_pretrained(resolve_path(cfg.init_from), dtype=torch.float32)
        check_compatible(
            target, LoadedModel(draft, target.tokenizer, ModelSpec(cfg.init_from), cfg.init_from)
        )
    else:
        draft = T.init_draft(config, target.model.get_input_embeddings().weight, cfg.seed)
    draft.generation_config = target.model.generation_config
    state.extra["train_seconds"] = state.train_seconds_before
    return draft, state


def train_draft(cfg: DistillConfig, target: LoadedModel, draft, records, state: TrainState, recipe) -> None:
    """Train up to cfg.train.steps, exporting the draft and its recipe at every checkpoint."""
    steps = cfg.train.steps
    train_start = time.time()
    extra = state.extra

    def on_save(step: int) -> None:
        extra["train_seconds"] = state.train_seconds_before + time.time() - train_start
        export(draft, target, cfg.out)
        recipe.write(step, extra, None)

    with maybe_progress(not cfg.quiet and state.start_step < steps) as progress:
        task = (
            progress.add_task("distill", total=steps, completed=state.start_step, info="")
            if progress
            else None
        )

        def on_step(step: int, metrics: dict) -> None:
            extra["last"] = metrics
            extra["train_seconds"] = state.train_seconds_before + time.time() - train_start
            if progress:
                info = f"loss {metrics['loss']:.3f} kl {metrics['kl']:.3f} top1 {metrics['top1']:.3f}"
                progress.update(task, completed=step, info=info)

        if state.start_step < steps:
            T.train(
                draft,
                records,
                cfg.train,
                cfg.work,
                torch.device(cfg.device),
                cfg.out / "train_log.jsonl",
                state.start_step,
                state.optimizer_state,
                on_step=on_step,
                on_save=on_save,
                extra_state=extra,
            )
    if state.start_step >= steps:
        on_save(state.start_step)
    if "last" not in extra and state.last is not None:
        extra["last"] = state.last


def evaluate(cfg: DistillConfig, target: LoadedModel) -> dict | None:
    """Acceptance and speed-up on held-out prompts through draftlab's own decoding engine."""
    ev = cfg.eval
    if ev.prompts is None:
        return None

    shipped = load_model(ModelSpec(str(cfg.out), cfg.target_dtype, cfg.device))
    check_compatible(target, shipped)
    prompts = eval_prompts(ev.prompts, ev.per_category)
    evaluation = evaluate_pair(target, shipped, prompts, ev.gamma, ev.max_new_tokens)
    evaluation["prompt_file"] = ev.prompts.name
    return evaluation


def _teacher(cfg: DistillConfig, target: LoadedModel) -> dict:
    tc = target.model.config
    return {
        "name": cfg.target,
        "model_type": tc.model_type,
        "num_hidden_layers": getattr(tc, "num_hidden_layers", None),
        "hidden_size": getattr(tc, "hidden_size", None),
        "vocab_size": target.vocab_size,
        "parameters": target.num_parameters,
        "dtype": cfg.target_dtype,
    }
