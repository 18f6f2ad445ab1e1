"""The distillation data: prompts and texts read from disk, and the target's answers to them (its labels)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from draftlab.distill import data as D
from draftlab.distill import magpie
from draftlab.distill.answers import Lazy, Race
from draftlab.distill.config import DataConfig, DistillConfig
from draftlab.distill.synth_prompts import synth_prompt_items
from draftlab.distill.teacher import Teacher
from draftlab.distill.teacher import generate_data as generate_teacher_data
from draftlab.hardware import native_bf16
from draftlab.models.loading import LoadedModel, ModelSpec, load_model
from draftlab.progress import maybe_progress


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
    store: dict = field(default_factory=dict)  # the answer store's manifest after this run

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
            "store_versions": self.store.get("versions", []),
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


RACE_MIN_JOBS = 128  # --answers-with auto races the engines only from this many jobs on


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


def generate_data(
    cfg: DistillConfig, target: LoadedModel, inputs: Inputs, labels_from_answers: bool = True
) -> tuple[int, float, str]:
    """The target writes its own requests if asked (--magpie-prompts), then the jobs not in the store
    yet are answered (by the target here or an engine, `cfg.answerers`); the store's manifest gets
    this run's addition as a new version.

    Returns (jobs left, seconds spent answering, the dtype the target here answered or scored in);
    the seconds spent writing requests go to `inputs.magpie_seconds`."""
    data = cfg.data
    gen_start = time.time()
    deadline = None if data.gen_minutes is None else gen_start + 60 * data.gen_minutes
    cfg.data_dir.mkdir(parents=True, exist_ok=True)
    manifest = D.open_store(cfg.data_dir, cfg.target)
    shards_before = sum(v["shards"] for v in manifest["versions"])
    dtype = generation_dtype(data.gen_dtype, cfg.target_dtype, cfg.device, native_bf16(), labels_from_answers)
    done = D.done_keys(cfg.data_dir)
    on_disk = magpie.read_prompts(cfg.data_dir)
    generating = data.gen_minutes != 0
    more_requests = generating and len(on_disk) < data.magpie_prompts
    if (
        dtype != cfg.target_dtype
        and generating
        and (more_requests or (cfg.answer_here and any(j.key not in done for j in inputs.jobs)))
    ):
        target = load_model(ModelSpec(cfg.target, dtype, cfg.device))
    else:
        dtype = cfg.target_dtype
    target.model.eval()
    with maybe_progress(not cfg.quiet) as progress:
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

        teacher = Teacher(target.model, target.tokenizer, data.top_k, data.max_new_tokens, data.max_len)
        todo = len([j for j in inputs.jobs if j.key not in done])
        engines = [Lazy(name, start, teacher) for name, start in cfg.answerers]
        if cfg.answer_here and todo < RACE_MIN_JOBS:
            engines = []  # a server start (and a conversion) would not pay back on so few answers
        race = Race(([teacher] if cfg.answer_here else []) + engines)
        task = progress.add_task("teacher data", total=max(todo, 1), info="") if progress else None
        tokens = [0]

        def on_data(n: int, new_tokens: int) -> None:
            tokens[0] += new_tokens
            if progress:
                rates = ", ".join(f"{k} {v['tokens_per_s']} tok/s" for k, v in race.summary().items())
                progress.update(task, advance=n, info=f"{tokens[0]} tokens ({rates})")

        try:
            jobs_left = generate_teacher_data(
                teacher, inputs.jobs, cfg.data_dir, data.gen_batch_size, on_data, deadline, race
            )
        finally:
            race.close()
    seconds = time.time() - gen_start - inputs.magpie_seconds
    inputs.store = D.add_version(cfg.data_dir, manifest, shards_before, seconds, race.summary())
    return jobs_left, seconds, dtype
