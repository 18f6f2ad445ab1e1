"""report.md: a short table of the run and its winner, warnings, definitions, the seed-format lines,
every table and the plots."""

from __future__ import annotations

from pathlib import Path

from draftlab.bench.report_warnings import warnings
from draftlab.bench.result_lines import result_lines
from draftlab.bench.run_header import header_table
from draftlab.bench.table_data import TableData, markdown_table

DEFINITIONS = """\
- **tokens/s** = Σ new tokens / Σ generation seconds (prefill included) over the group; **decode tokens/s** =
  Σ (new tokens − tokens of the first round) / Σ decode seconds (the first round belongs to the prefill). Ratios of sums, never a
  mean of per-example rates; generations with 0 new tokens count (their time stays in the denominator).
- **speed-up** = (Σ tokens / Σ s of the method) / (Σ tokens / Σ s of the baseline) on the generations
  (example, turn, repeat) both have; **[95% CI]**: percentile bootstrap over those generations
  ({resamples} resamples, seed {seed}).
- **α** = Σ accepted / Σ drafted. **α̂** = Σ accepted / (Σ accepted + Σ rejections): the maximum-likelihood
  per-token acceptance probability under Leviathan et al.'s i.i.d. model (α is biased low as its estimate,
  since drafts after a rejection are never tried).
- **mean acc. len** = Σ new tokens / Σ verification rounds (one target pass each; the target's own token included; AR = 1).
- **c** = draft step time / target step time = (Σ propose s / Σ draft calls) / (plain decoding's Σ decode s /
  Σ decode target calls), plain decoding in the method's own engine, dtype and passes (a compiled method's
  against `ar compiled`, on the same inputs); "-" without a draft model (prompt lookup) or that plain run.
  Rounds in which the draft first caught up on more than a pass's 8 tokens (a lazily prefilled draft
  reading the prompt, or the tokens written while it did not draft) are left out of the draft step:
  their time is shown as **draft catch-up ms** (mean per generation).
- **predicted** = (1 − α̂^(γ+1)) / ((1 − α̂)(γc + 1)) (Leviathan et al. 2023); for a method whose rounds
  are sized, the same expectation over the rounds as run, n_k rounds drafting k tokens: Σ n_k (1 −
  α̂^(k+1)) / (1 − α̂) / Σ n_k (kc + 1); not for BiLD, whose blocks end dynamically, nor token trees;
  **meas/pred** = decode-only speed-up over that same plain decoding / predicted.
- "-" marks a figure that cannot be computed (no time measured, nothing drafted, no baseline).
"""


def markdown_report(summary: dict, tables: list[TableData], plots: list[Path]) -> str:
    boot = summary["bootstrap"]
    header = header_table(summary)
    parts = ["# draftlab benchmark report", "", markdown_table(header), "", header.note, ""]
    notes = warnings(summary)
    if notes:
        parts += ["## Warnings", "", *(f"- {n}" for n in notes), ""]
    parts += ["## Definitions", "", DEFINITIONS.format(resamples=boot["resamples"], seed=boot["seed"])]
    parts += ["## Summary (seed format)", "", "```", *result_lines(summary), "```", ""]
    for table in tables:
        parts += [f"## {table.title}", ""]
        if table.note:
            parts += [f"_{table.note}_", ""]
        parts += [markdown_table(table), ""]
    if plots:
        parts += ["## Plots", ""]
        parts += [f"![{p.stem}]({p.name})" for p in plots]
        parts.append("")
    return "\n".join(parts)
