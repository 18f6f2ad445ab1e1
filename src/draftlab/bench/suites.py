"""Prompt suites: the built-in one, Spec-Bench's question.jsonl, generic JSONL, Hugging Face datasets."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from draftlab.errors import DraftlabError
from draftlab.files import read_text_file

SUBTASKS = (
    "multi-turn",
    "translation",
    "summarization",
    "qa",
    "math_reasoning",
    "rag",
    "law analytics",
    "grammar correction",
)
# Spec-Bench's MT-bench categories are two-turn conversations.
MT_BENCH_CATEGORIES = (
    "writing",
    "roleplay",
    "reasoning",
    "math",
    "coding",
    "extraction",
    "stem",
    "humanities",
)


@dataclass(frozen=True)
class Example:
    id: str
    subtask: str
    turns: tuple[str, ...]
    reference: str | None = None


def load_suite(
    suite: str,
    subtasks: list[str] | None = None,
    limit: int | None = None,
    hf_field: str = "text",
    hf_subtask: str = "summarization",
    hf_instruction: str = "Summarize the following article.\n\n{text}",
) -> list[Example]:
    """`suite` is "builtin", a JSONL path, or "hf:DATASET[:CONFIG]:SPLIT"."""
    if limit is not None and limit < 1:
        raise DraftlabError(f"--limit must be >= 1, got {limit}")
    if suite == "builtin":
        text = resources.files("draftlab").joinpath("data/builtin_suite.jsonl").read_text(encoding="utf-8")
        examples = parse_jsonl(text, "builtin_suite.jsonl")
    elif suite.startswith("hf:"):
        examples = _load_hf(suite[3:], hf_field, hf_subtask, hf_instruction, limit)
    else:
        path = Path(suite).expanduser()
        if not path.is_file():
            raise DraftlabError(f"suite '{suite}' not found: not 'builtin', 'hf:...' or a JSONL file")
        examples = parse_jsonl(read_text_file(path, "suite"), str(path))
    return select(examples, subtasks, limit)


def parse_jsonl(text: str, name: str) -> list[Example]:
    examples: list[Example] = []
    seen: set[str] = set()
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{name}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DraftlabError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise DraftlabError(f"{where}: expected a JSON object")
        example = _example(row, where, number)
        if example.id in seen:
            raise DraftlabError(f"{where}: duplicate id '{example.id}'")
        seen.add(example.id)
        examples.append(example)
    if not examples:
        raise DraftlabError(f"{name}: no prompts")
    return examples


def _example(row: dict, where: str, number: int) -> Example:
    if "turns" in row:
        turns = row["turns"]
        if (
            not isinstance(turns, list)
            or not turns
            or not all(isinstance(t, str) and t.strip() for t in turns)
        ):
            raise DraftlabError(f"{where}: 'turns' must be a non-empty list of non-empty strings")
    elif "prompt" in row:
        if not isinstance(row["prompt"], str) or not row["prompt"].strip():
            raise DraftlabError(f"{where}: 'prompt' must be a non-empty string")
        turns = [row["prompt"]]
    else:
        raise DraftlabError(f"{where}: needs 'prompt' or 'turns'")
    category = str(row.get("category", "default"))
    subtask = "multi-turn" if category in MT_BENCH_CATEGORIES else category
    ident = row.get("id", row.get("question_id", number))
    reference = row.get("reference")
    if isinstance(reference, list):  # Spec-Bench keeps one reference per turn
        reference = "\n".join(str(r) for r in reference)
    return Example(str(ident), subtask, tuple(turns), None if reference is None else str(reference))


def select(examples: list[Example], subtasks: list[str] | None, limit: int | None) -> list[Example]:
    present = list(dict.fromkeys(e.subtask for e in examples))
    if subtasks:
        unknown = [s for s in subtasks if s not in present]
        if unknown:
            raise DraftlabError(f"unknown subtask '{unknown[0]}' (this suite has: {', '.join(present)})")
        examples = [e for e in examples if e.subtask in subtasks]
    if limit is not None:
        taken: dict[str, int] = {}
        kept = []
        for e in examples:
            if taken.get(e.subtask, 0) < limit:
                kept.append(e)
                taken[e.subtask] = taken.get(e.subtask, 0) + 1
        examples = kept
    return examples


def _load_hf(spec: str, field: str, subtask: str, instruction: str, limit: int | None) -> list[Example]:
    parts = spec.split(":")
    if len(parts) not in (2, 3):
        raise DraftlabError(f"hf suite '{spec}' must look like hf:DATASET[:CONFIG]:SPLIT")
    name, config, split = (parts[0], None, parts[1]) if len(parts) == 2 else parts
    try:
        import datasets  # noqa: PLC0415 - optional dependency
    except ImportError:
        raise DraftlabError(
            "Hugging Face suites need the 'datasets' package: pip install 'draftlab[datasets]'"
        ) from None
    try:
        rows = datasets.load_dataset(name, config, split=split if limit is None else f"{split}[:{limit}]")
    except Exception as exc:  # datasets raises many types for "offline" and "not found"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DraftlabError(f"dataset '{spec}' could not be loaded (offline or unknown?): {first}") from None
    if field not in rows.column_names:
        raise DraftlabError(
            f"dataset '{spec}' has no field '{field}' (fields: {', '.join(rows.column_names)})"
        )
    return [
        Example(f"{subtask}-{i}", subtask, (instruction.format(text=row[field]),))
        for i, row in enumerate(rows)
    ]
