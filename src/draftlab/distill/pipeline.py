"""`draftlab distill` end to end: data from the target, a distilled draft, its recipe and evaluation."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import torch

from draftlab.distill import data as D
from draftlab.distill import magpie
from draftlab.distill import train as T
from draftlab.distill.synth_prompts import synth_prompt_items
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


@dataclass(frozen=True)
class DataConfig:
    """Where the training data comes from and how the target answers (the CLI's data group)."""

    prompt_paths: tuple[Path, ...]  # resolved: the packaged prompts unless --prompts/--no-default-prompts
    text_paths: tuple[Path, ...]
    corpus_prompts: int
    synth_prompts: int
    raw_chunks: int
    raw_chars: int
    samples_per_prompt: int
    sample_temperature: float
    max_new_tokens: int
    top_k: int
    gen_batch_size: int
    gen_minutes: float | None
    gen_dtype: str  # the dtype the target answers in ("auto": see generation_dtype)
    max_len: int
    magpie_prompts: int = 0  # requests the target writes itself (distill/magpie.py)


@dataclass(frozen=True)
class EvalConfig:
    prompts: Path | None  # held-out prompts; None: no evaluation
    per_category: int
    gamma: int
    max_new_tokens: int


@dataclass(frozen=True)
class DistillConfig:
    """Everything `draftlab distill` needs, built once from the command line."""

    target: str
    target_dtype: str
    device: str
    out: Path
    work: Path
    resume: bool
    restart: bool
    quiet: bool
    init_from: str | None
    shape: T.DraftShape
    train: T.TrainConfig
    data: DataConfig
    eval: EvalConfig
    seed: int
    cli: dict = field(default_factory=dict)  # the command line as given, for recipe.json

    @property
    def data_dir(self) -> Path:
        return self.work / "data"


def autocast_enabled(choice: str, device: torch.device) -> bool:
    if choice != "auto":
        return choice == "on"
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return cpu_has_native_bf16()  # bf16 autocast pays off there (AVX512-BF16 / AMX), not elsewhere


@contextmanager
def _progress(enabled: bool) -> Iterator:
    if not enabled:
        yield None
        return
    from draftlab.progress import progress_bar  # noqa: PLC0415 - only the CLI path draws bars

    with progress_bar(info=True, transient=False) as progress:
        yield progress


@dataclass
class Inputs:
    """The prompts and texts read from disk, and the generation jobs built from them."""

    prompt_items: list
    corpus_items: list
    raw_chunks: list
    jobs: list
    synth_items: list = field(default_factory=list)
    magpie_items: list = field(default_factory=list)
    magpie_seconds: float = 0.0  # writing new requests this run (not counted as answering)

    def add_magpie(self, prompts: list[str], data: DataConfig, seed: int) -> None:
        """Jobs for the target's own requests, answered like every other prompt."""
        self.magpie_items = [("magpie", [p]) for p in prompts]
        self.jobs.extend(
            D.build_jobs(
                [],
                [],
                [],
                data.samples_per_prompt,
                data.sample_temperature,
                seed,
                magpie_items=self.magpie_items,
            )
        )

    def summary(self, data: DataConfig, data_dir: Path) -> dict:
        def described(paths):
            return [{"name": p.name, "bytes": p.stat().st_size, "sha256": D.file_digest(p)} for p in paths]

        return {
            "prompt_files": described(data.prompt_paths),
            "prompts": len(self.prompt_items),
            "multi_turn_prompts": sum(1 for _, turns in self.prompt_items if len(turns) > 1),
            "text_files": described(data.text_paths),
            "corpus_instructions": len(self.corpus_items),
            "synthesized_prompts": len(self.synth_items),
            "magpie_prompts": len(self.magpie_items),
            "magpie_seconds_this_run": round(self.magpie_seconds, 1),
            "raw_chunks": len(self.raw_chunks),
            "shards": D.data_stats(data_dir) if data_dir.exists() else {},
        }


def read_inputs(data: DataConfig, seed: int) -> Inputs:
    """Read every prompt and text file (bad files fail here, before the target loads)."""
    prompt_items = [item for p in data.prompt_paths for item in D.read_prompt_file(p)]
    texts = [D.read_text_file(p) for p in data.text_paths]
    corpus_items = D.corpus_instruction_items(texts, data.corpus_prompts, seed)
    synth_items = synth_prompt_items(texts, data.synth_prompts, seed)
    raw_chunks = D.raw_text_chunks(texts, data.raw_chunks, data.raw_chars, seed)
    jobs = D.build_jobs(
        prompt_items,
        corpus_items,
        raw_chunks,
        data.samples_per_prompt,
        data.sample_temperature,
        seed,
        synth_items,
    )
    return Inputs(prompt_items, corpus_items, raw_chunks, jobs, synth_items)


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


def generation_dtype(
    choice: str, target_dtype: str, device: str, native_bf16: bool, labels_from_answers: bool
) -> str:
    """The dtype the target answers in.

    "auto" answers in bfloat16 on a CPU with native bfloat16, where batched generation runs
    2.3-2.8x faster than in float32 (226 against 526-727 tokens/s at 32-128 sequences on a Zen5),
    unless the labels are the log-probs captured while answering (draft distillation): a head's
    answers are only text to teacher-force, so its labels and features still come from the target
    in `target_dtype`."""
    if choice != "auto":
        return choice
    if device == "cpu" and target_dtype == "float32" and native_bf16 and not labels_from_answers:
        return "bfloat16"
    return target_dtype


def cpu_has_native_bf16() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def generate_data(
    cfg: DistillConfig, target: LoadedModel, inputs: Inputs, labels_from_answers: bool = True
) -> tuple[int, float, str]:
    """The target writes its own requests if asked (--magpie-prompts), then answers every prompt;
    requests and shards already on disk are kept.

    Returns (jobs left, seconds spent answering, the dtype it answered in); the seconds spent
    writing requests go to `inputs.magpie_seconds`."""
    data = cfg.data
    gen_start = time.time()
    deadline = None if data.gen_minutes is None else gen_start + 60 * data.gen_minutes
    dtype = generation_dtype(
        data.gen_dtype, cfg.target_dtype, cfg.device, cpu_has_native_bf16(), labels_from_answers
    )
    done = D.done_keys(cfg.data_dir) if cfg.data_dir.exists() else set()
    on_disk = magpie.read_prompts(cfg.data_dir)
    generating = data.gen_minutes != 0
    more_requests = generating and len(on_disk) < data.magpie_prompts
    if (
        dtype != cfg.target_dtype
        and generating
        and (more_requests or any(j.key not in done for j in inputs.jobs))
    ):
        target = load_model(ModelSpec(cfg.target, dtype, cfg.device))
    target.model.eval()
    with _progress(not cfg.quiet) as progress:
        if more_requests:
            task = (
                progress.add_task(
                    "magpie prompts", total=data.magpie_prompts, completed=len(on_disk), info=""
                )
                if progress
                else None
            )

            def on_requests(n: int) -> None:
                if progress:
                    progress.update(task, advance=n)

            t0 = time.time()
            on_disk = magpie.write_prompts(
                target.model,
                target.tokenizer,
                cfg.data_dir,
                data.magpie_prompts,
                cfg.seed,
                data.gen_batch_size,
                deadline=deadline,
                on_batch=on_requests,
            )
            inputs.magpie_seconds = time.time() - t0
        if data.magpie_prompts:
            inputs.add_magpie(on_disk[: data.magpie_prompts], data, cfg.seed)

        teacher = D.Teacher(target.model, target.tokenizer, data.top_k, data.max_new_tokens, data.max_len)
        todo = len([j for j in inputs.jobs if j.key not in done])
        task = progress.add_task("teacher data", total=max(todo, 1), info="") if progress else None
        tokens = [0]

        def on_data(n: int, new_tokens: int) -> None:
            tokens[0] += new_tokens
            if progress:
                progress.update(task, advance=n, info=f"{tokens[0]} tokens")

        jobs_left = D.generate_data(
            teacher, inputs.jobs, cfg.data_dir, data.gen_batch_size, on_data, deadline
        )
    return jobs_left, time.time() - gen_start - inputs.magpie_seconds, dtype


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

    with _progress(not cfg.quiet and state.start_step < steps) as progress:
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
    from draftlab.distill.evaluate import eval_prompts, evaluate_pair  # noqa: PLC0415

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
