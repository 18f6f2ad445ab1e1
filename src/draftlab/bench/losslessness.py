"""Greedy losslessness from the records: each generation against plain decoding of the same engine
and dtype on the same input.

A routed method decodes each prompt in the dtype predicted fastest for it, and bfloat16's passes of
several tokens round unlike its one-token passes, so its tokens set against `ar` in another dtype
tell rounding apart from a bug no better than chance. The reference is a plain decoding in the
record's own dtype, compiled or eager, exact or not as the record (`ar`, `ar bfloat16`, `ar
compiled`, or `ar routed` where it chose that dtype); where none ran, nothing is claimed. The agreement with the baseline, whatever its dtype, stays in
`Record.greedy_match` and is reported as its own column.

A sampled generation is compared only in exact mode, where keyed sampling (draftlab.sampling) makes
plain decoding's sample for the generation's seed (the same for every variant) the one to write.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from draftlab.bench.labels import OWN_LOOP
from draftlab.bench.records import Record


def _where(r: Record) -> tuple:
    """What makes two generations comparable token for token: engine, storage, dtype, how the
    passes ran (compiled packages round unlike eager kernels; exact mode unlike either) and input."""
    how = (bool(r.params.get("compile")), bool(r.params.get("exact")))
    return (r.params.get("engine", OWN_LOOP), r.dtype, *how, r.example_id, r.turn, r.repeat)


def _comparable(r: Record) -> bool:
    return r.temperature == 0 or bool(r.params.get("exact"))


def with_plain_matches(records: Sequence[Record]) -> list[Record]:
    """The records, each greedy (or exact) speculative one with `plain_match` set where a reference exists."""
    plain: dict[tuple, list[int]] = {}
    for r in records:
        if r.method == "ar" and _comparable(r):
            plain.setdefault(_where(r), r.tokens)
    out = []
    for r in records:
        reference = plain.get(_where(r)) if r.method != "ar" and _comparable(r) else None
        match = None if reference is None else r.tokens == reference
        out.append(r if match == r.plain_match else dataclasses.replace(r, plain_match=match))
    return out


def same_config_plain(records: Sequence[Record], everything: Sequence[Record]) -> list[Record]:
    """The plain (`ar`) generations of `everything` made in the same engine, dtype and passes as
    `records`, on the same inputs: what a method's draft cost c and its predicted speed-up are set
    against (a compiled method's against compiled plain decoding, not the seeds' eager `ar`)."""
    wanted = {_where(r) for r in records}
    return [r for r in everything if r.method == "ar" and _where(r) in wanted]
