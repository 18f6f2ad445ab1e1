"""`draftlab distill`'s configuration: where the data comes from, how it is evaluated, and the whole run."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import torch

from draftlab.distill import train as T
from draftlab.distill.answers import AnswererFactory
from draftlab.hardware import native_bf16


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
    # Engines that may write the answers instead of the target here (`--answers-with`), and whether
    # the target here answers too; where both may, the first batches race (distill/answers.py).
    answerers: tuple[AnswererFactory, ...] = ()
    answer_here: bool = True

    @property
    def data_dir(self) -> Path:
        return self.work / "data"


def autocast_enabled(choice: str, device: torch.device) -> bool:
    if choice != "auto":
        return choice == "on"
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return native_bf16()  # bf16 autocast pays off there (AVX512-BF16 / AMX), not elsewhere
