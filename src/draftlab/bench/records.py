"""The benchmark's unit of record: one generation of one example (one turn) by one method variant.

`results.jsonl` holds one `Record` per line, appended as soon as the generation ends, so an
interrupted run keeps everything it measured. `run.json` beside it holds the `RunInfo`.
Every reported figure is computed from these two files alone (`draftlab report DIR`).
"""

from __future__ import annotations

import functools
import json
import types
import typing
from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

from draftlab.decode.details import RoundDetails
from draftlab.errors import DraftlabError
from draftlab.files import read_text_file, write_text

RESULTS_FILE = "results.jsonl"
RUN_FILE = "run.json"


@dataclass
class Record(RoundDetails):
    label: str  # the variant's name in reports: "ar", "sps", "sps γ=2", "bild fb=0.6 rb=3", ...
    method: str  # ar, sps, bild, pld, hf-greedy, hf-assisted
    example_id: str
    subtask: str
    turn: int  # 0, or 1 for the second turn of a multi-turn example
    repeat: int
    temperature: float
    gamma: int | None
    target: str
    draft: str | None
    prompt_tokens: int
    new_tokens: int
    prefill_s: float
    decode_s: float
    total_s: float
    target_calls: int
    draft_calls: int
    drafted: int
    accepted: int
    drafted_per_position: list[int]
    accepted_per_position: list[int]
    rounds: int
    fallbacks: int
    rollbacks: int  # rounds in which the target overruled a drafted token (SPS rejections too)
    draft_tokens_kept: int
    propose_s: float
    propose_calls: int
    tokens: list[int]
    first_tokens: int = 1  # tokens out at prefill_s (the first round may accept several)
    greedy_match: bool | None = None  # same tokens as the baseline's for this example/turn/repeat
    # Same tokens as plain decoding of the same engine and dtype (set by the report, from the records:
    # see bench/losslessness.py); None where no such plain decoding ran, or when sampling (but in exact mode).
    plain_match: bool | None = None
    draft_params: int | None = None
    params: dict = field(default_factory=dict)  # the variant's settings (thresholds, use_cache, attn, ...)

    @property
    def key(self) -> tuple[str, int, int]:
        """What identifies the same input across methods."""
        return (self.example_id, self.turn, self.repeat)

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    @classmethod
    def from_dict(cls, data: dict) -> Record:
        """A saved record; TypeError naming the field whose value has the wrong type."""
        hints = _field_types(cls)
        kept = {k: v for k, v in data.items() if k in hints}
        for name, value in kept.items():
            if not _has_type(value, hints[name]):
                raise TypeError(f"'{name}' is {value!r}, not {_type_name(hints[name])}")
        return cls(**kept)


@functools.cache
def _field_types(cls) -> dict:
    return {f.name: typing.get_type_hints(cls)[f.name] for f in fields(cls)}


def _has_type(value, hint) -> bool:
    """Whether a JSON value fits a field's annotation (numbers: int where an int is declared, int
    or float where a float is; containers by their outer type)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_has_type(value, arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint in (str, bool):
        return isinstance(value, hint)
    if (origin or hint) in (list, tuple):
        return isinstance(value, (list, tuple))
    if (origin or hint) is dict:
        return isinstance(value, dict)
    return True


def _type_name(hint) -> str:
    names = {int: "a whole number", float: "a number", str: "text", bool: "true or false"}
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return "null"
    return names.get(hint, getattr(typing.get_origin(hint) or hint, "__name__", str(hint)))


@dataclass
class RunInfo:
    target: str
    draft: str | None
    dtype: str
    device: str
    temperature: float
    max_new_tokens: int
    baseline: str = "ar"  # the label speed-ups are measured against
    labels: list[str] = field(default_factory=list)
    suite: str = "builtin"
    extra: dict = field(default_factory=dict)  # sweep / ablation description, versions, host

    def save(self, directory: Path) -> None:
        write_text(directory / RUN_FILE, json.dumps(asdict(self), indent=2, ensure_ascii=False))

    @classmethod
    def load(cls, directory: Path) -> RunInfo:
        """A results folder's run.json, every field checked by type: a torn, foreign or mistyped
        file is a one-line DraftlabError naming the file and the field (`report` and `--resume`
        read it through here alike)."""
        path = directory / RUN_FILE
        if not path.exists():
            raise DraftlabError(f"no {RUN_FILE} in '{directory}': not a draftlab results folder")
        try:
            data = json.loads(read_text_file(path, "run info"))
        except json.JSONDecodeError as exc:
            raise DraftlabError(f"{path}: not a draftlab {RUN_FILE} (unreadable JSON: {exc})") from None
        if not isinstance(data, dict):
            raise DraftlabError(f"{path}: not a draftlab {RUN_FILE} (not a JSON object)")
        hints = _field_types(cls)
        unknown = sorted(set(data) - set(hints))
        if unknown:
            raise DraftlabError(f"{path}: not a draftlab {RUN_FILE} (unknown field '{unknown[0]}')")
        required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
        missing = [name for name in required if name not in data]
        if missing:
            raise DraftlabError(f"{path}: not a draftlab {RUN_FILE} (no field '{missing[0]}')")
        for name, value in data.items():
            fits = _has_type(value, hints[name])
            if fits and name == "labels":
                fits = all(isinstance(label, str) for label in value)
            if not fits:
                shown = repr(value)
                shown = shown if len(shown) <= 60 else shown[:57] + "..."
                raise DraftlabError(f"{path}: field '{name}' is {shown}, not {_type_name(hints[name])}")
        return cls(**data)

    @classmethod
    def written_here(cls, directory: Path) -> bool:
        """Whether `directory` holds a run.json that draftlab wrote (before output markers existed)."""
        try:
            cls.load(directory)
        except DraftlabError:
            return False
        return True


def read_records(path: Path, on_torn: Callable[[int], None] | None = None) -> list[Record]:
    """Every complete line of a results file. A torn last line (an interrupted write: not JSON) is
    dropped, and `on_torn` told its line number; any other bad line is a one-line DraftlabError."""
    if not path.exists():
        return []
    records: list[Record] = []
    text = read_text_file(path, "results file")
    lines = text.splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines) and not text.endswith("\n"):
                if on_torn is not None:
                    on_torn(number)
                break  # the write that was interrupted; resume redoes that example
            raise DraftlabError(f"{path}:{number}: malformed record ({exc})") from None
        try:
            if not isinstance(data, dict):
                raise TypeError("not a JSON object")
            records.append(Record.from_dict(data))
        except TypeError as exc:
            raise DraftlabError(f"{path}:{number}: malformed record ({exc})") from None
    return records
