"""`draftlab audit`: does speculation change this pair's outputs, in this dtype, on this machine?

Two checks per method, against the target alone:

- **greedy**: N tokens per prompt with the method and with `ar`, token for token. A method that
  differs only in bfloat16 or float16 reruns that prompt in float32 (both `ar` and the method):
  float32 matching means the low-precision difference is a near-tie that rounds differently in a
  multi-token pass, float32 differing too means a defect. On llama.cpp the rerun is on one thread,
  where its passes of every size take the same kernels (with more, a 1-token pass over a long
  cache splits the keys over threads and rounds differently from a pass of several tokens).
- **sampling**: thousands of 2-token generations at a few prefixes, compared by a chi-square test
  with the target's exact law over its first two tokens (draftlab.audit.law). A
  deliberately wrong rule is sampled the same way: it must be rejected, or the check lacks power.

This module holds the parts without models (prompt files, method selection, the judgement and the
verdict); cli/audit.py loads the models and runs the checks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from draftlab.bench.suites import load_suite
from draftlab.decode.spec import REGISTRY, method_spec
from draftlab.errors import DraftlabError
from draftlab.files import read_text_file

# One prompt each from these subtasks of the built-in suite when no --prompts file is given: short
# questions first (they become the sampling prefixes), then two the prompt-lookup method copies from.
DEFAULT_SUBTASKS = ("qa", "translation", "summarization", "grammar correction")
WRONG_RULE = "resample from p after a rejection"
# The reruns that tell rounding from a defect: (key in the records, what the report calls it).
RECHECKS = (("float32", "float32"), ("one_thread", "1 thread"), ("q4_1_one_thread", "Q4_1 on 1 thread"))
IN_A_PASS = (
    "in a pass"  # the rerun differs too, with the token the target picks scoring the prefix in one pass
)
RERUN_ROUNDING = ("matches", IN_A_PASS)  # rerun verdicts that make a difference rounding
# What a difference that a rerun removes was, by the rerun's key.
ROUNDING = {
    "float32": "low-precision difference(s), all gone in float32: near-ties that round differently in a "
    "multi-token pass",
    "one_thread": "difference(s), all gone on one thread: near-ties where llama.cpp's 1-token and "
    "multi-token passes round differently",
    "q4_1_one_thread": "difference(s), each gone with the same file in Q4_1 on one thread (where passes of "
    "a few tokens take the same kernels as one-token steps), or where not, the token written there is "
    "the target's own choice when the prefix is scored in one pass: near-ties that passes of different "
    "sizes round differently",
}


def default_methods() -> list[str]:
    """Every speculative method our own loop runs that claims to be lossless, from the registry.

    Head methods (EAGLE-3, DFlash) are not audited yet (the audit drives one draft for every
    method); their greedy and sampling exactness is tested in tests/drafters/eagle3/ and
    tests/drafters/dflash/."""
    return [
        n for n, s in REGISTRY.items() if s.speculative and s.lossless and not s.external and not s.needs_head
    ]


def parse_methods(text: str | None) -> list[str]:
    if text is None:
        return default_methods()
    names = [m.strip() for m in text.split(",") if m.strip()]
    if not names:
        raise DraftlabError("empty method list")
    for name in names:
        if method_spec(name).needs_head:
            raise DraftlabError(
                f"audit does not cover head methods yet ('{name}'): tests/drafters/ check their exactness"
            )
    # ar is the reference every method is compared with.
    names = [n for n in dict.fromkeys(names) if n != "ar"]
    if not names:
        raise DraftlabError("--methods names only 'ar', the reference: name a speculative method")
    return names


def load_prompts(path: str | None) -> list[str]:
    """A text file with one prompt per line, or a JSONL file with a "prompt" field per line."""
    if path is None:
        examples = load_suite("builtin", list(DEFAULT_SUBTASKS), limit=1)
        order = {s: i for i, s in enumerate(DEFAULT_SUBTASKS)}
        return [e.turns[0] for e in sorted(examples, key=lambda e: order[e.subtask])]
    file = Path(path).expanduser()
    if not file.is_file():
        raise DraftlabError(f"prompts file '{path}' not found")
    text = read_text_file(file, "prompts file")
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise DraftlabError(f"prompts file '{path}' has no prompts")
    if file.suffix != ".jsonl" and not lines[0][1].lstrip().startswith("{"):
        return [line.strip() for _, line in lines]
    prompts = []
    for number, line in lines:
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DraftlabError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(row, dict) or "prompt" not in row:
            raise DraftlabError(f'{where}: needs a "prompt" field')
        if not isinstance(row["prompt"], str) or not row["prompt"].strip():
            raise DraftlabError(f"{where}: 'prompt' must be a non-empty string")
        prompts.append(row["prompt"])
    return prompts


def first_divergence(reference: list[int], tokens: list[int]) -> int | None:
    """The first position where two token lists differ (one ending early counts), or None."""
    for i, (a, b) in enumerate(zip(reference, tokens, strict=False)):
        if a != b:
            return i
    return None if len(reference) == len(tokens) else min(len(reference), len(tokens))


@dataclass
class MethodAudit:
    method: str
    lossless_claim: bool
    greedy_prompts: int = 0
    greedy_identical: int = 0
    divergences: list[dict] = field(default_factory=list)  # one per prompt that differs
    sampling: list[dict] = field(default_factory=list)  # one per prefix
    status: str = ""
    reasons: list[str] = field(default_factory=list)
    # The same greedy check in exact mode (models/exact.py), where any difference is a defect.
    exact_prompts: int = 0
    exact_identical: int = 0
    exact_divergences: list[dict] = field(default_factory=list)

    def judge(self, alpha_per_test: float) -> str:
        """lossless | lossless (float32) | lossless (1 thread) | NOT lossless | lossy by design."""
        defects, rounding, kinds = [], 0, []
        for d in self.divergences:
            key, name = _recheck_of(d)
            if key is not None and d[key] in RERUN_ROUNDING:
                rounding += 1
                kinds.append(key)
                continue
            where = f"prompt {d['prompt']} token {d['position']}: {d['ar_text']!r} vs {d['method_text']!r}"
            if key is not None and d[key] == "diverges":
                where += f", {name} too"
            defects.append(f"greedy ({where})")
        for d in self.exact_divergences:
            defects.append(
                f"exact mode (prompt {d['prompt']} token {d['position']}: {d['ar_text']!r} vs {d['method_text']!r})"
            )
        for s in self.sampling:
            if s["p_value"] >= alpha_per_test:
                continue
            again = [(key, s[f"{key}_p_value"]) for key, _ in RECHECKS if f"{key}_p_value" in s]
            if again and again[0][1] >= alpha_per_test:
                rounding += 1
                kinds.append(again[0][0])
            else:
                defects.append(f"sampling (prefix {s['prefix']}: p = {s['p_value']:.2g})")
        if not self.lossless_claim:
            self.status = "lossy by design"
            self.reasons = [f"greedy identical {self.greedy_identical}/{self.greedy_prompts}"]
        elif defects:
            self.status = "NOT lossless"
            self.reasons = defects
        elif rounding:
            key = kinds[0]
            self.status = f"lossless ({dict(RECHECKS)[key]})"
            gaps = [d["logit_gap"] for d in self.divergences if d.get("logit_gap") is not None]
            largest = f" (largest logit gap at a flipped token {max(gaps, key=abs):.3g})" if gaps else ""
            self.reasons = [f"{rounding} {ROUNDING[key]}{largest}"]
        else:
            self.status = "lossless"
            self.reasons = []
        return self.status

    def to_dict(self) -> dict:
        return {
            "method": self.method,
            "lossless_claim": self.lossless_claim,
            "greedy": {
                "prompts": self.greedy_prompts,
                "identical": self.greedy_identical,
                "divergences": self.divergences,
            },
            "exact_mode": {
                "prompts": self.exact_prompts,
                "identical": self.exact_identical,
                "divergences": self.exact_divergences,
            },
            "sampling": self.sampling,
            "status": self.status,
            "reasons": self.reasons,
        }


def _recheck_of(divergence: dict) -> tuple[str | None, str]:
    """The rerun a divergence had, if any: its key in the record and its name."""
    for key, name in RECHECKS:
        if divergence.get(key):
            return key, name
    return None, ""


def verdict(audits: list[MethodAudit], power: dict | None) -> str:
    """The one line that ends an audit."""
    bad = [a for a in audits if a.status == "NOT lossless"]
    good = [a.method for a in audits if a.status.startswith("lossless")]
    lossy = [a.method for a in audits if a.status == "lossy by design"]
    if bad:
        line = "audit: NOT lossless: " + "; ".join(f"{a.method} ({', '.join(a.reasons)})" for a in bad)
        if good:
            line += "; lossless: " + ", ".join(good)
    else:
        line = "audit: lossless: " + (", ".join(good) if good else "(no lossless-claiming method audited)")
    if lossy:
        line += "; lossy by design: " + ", ".join(lossy)
    if power is not None and not power["shown"]:
        line += f"; WARNING: the sampling check lacked power (a wrong rule, {WRONG_RULE}, was not rejected)"
    return line
