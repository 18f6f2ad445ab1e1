"""The benchmark's unit of record: one generation of one example (one turn) by one method variant.

`results.jsonl` holds one `Record` per line, appended as soon as the generation ends, so an
interrupted run keeps everything it measured. `run.json` beside it holds the `RunInfo`.
Every reported figure is computed from these two files alone (`draftlab report DIR`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from draftlab.decode.details import RoundDetails
from draftlab.errors import DraftlabError
from draftlab.files import write_text

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
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


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
        path = directory / RUN_FILE
        if not path.exists():
            raise DraftlabError(f"no {RUN_FILE} in '{directory}': not a draftlab results folder")
        return cls(**json.loads(path.read_text()))


def read_records(path: Path) -> list[Record]:
    """Every complete line of a results file. A torn last line (an interrupted write) is dropped."""
    if not path.exists():
        return []
    records: list[Record] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(Record.from_dict(json.loads(line)))
        except (json.JSONDecodeError, TypeError) as exc:
            if number == len(lines):
                break  # the write that was interrupted; resume redoes that example
            raise DraftlabError(f"{path}:{number}: malformed record ({exc})") from None
    return records
