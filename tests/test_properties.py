"""Property tests (hypothesis): bootstrap intervals, resume merging, the suite loader.

Each property holds for every input hypothesis can build, not only for the hand-made fixtures.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from tolerance import sum_tol

from draftlab.bench.rates import speedup, throughput
from draftlab.bench.records import RESULTS_FILE, Record, RunInfo, read_records
from draftlab.bench.runner import RESUME_FIELDS, changed_settings, prepare_output
from draftlab.bench.suites import parse_jsonl, select
from draftlab.errors import DraftlabError

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def record(label: str, example: str, new: int, total: float, turn: int = 0, first: int = 1) -> Record:
    prefill = min(0.1, total / 2)
    return Record(
        label=label, method=label, example_id=example, subtask="qa", turn=turn, repeat=0,
        temperature=0.0, gamma=None, target="t", draft=None, prompt_tokens=5, new_tokens=new,
        prefill_s=prefill, decode_s=total - prefill, total_s=total, target_calls=new, draft_calls=0,
        drafted=0, accepted=0, drafted_per_position=[], accepted_per_position=[], rounds=new,
        fallbacks=0, rollbacks=0, draft_tokens_kept=0, propose_s=0.0, propose_calls=0,
        tokens=list(range(new)), first_tokens=min(first, new),
    )  # fmt: skip


# One generation: (new tokens, seconds); at least one token, so that every rate is defined.
generation = st.tuples(st.integers(1, 500), st.floats(0.05, 50.0))
paired_runs = st.lists(st.tuples(generation, generation), min_size=2, max_size=12)


def as_records(pairs: list) -> tuple[list[Record], list[Record]]:
    mine = [record("m", f"e{i}", n, s) for i, ((n, s), _) in enumerate(pairs)]
    base = [record("b", f"e{i}", n, s) for i, (_, (n, s)) in enumerate(pairs)]
    return mine, base


# ----------------------------------------------------------------------------- bootstrap intervals


@FAST
@given(paired_runs)
def test_speedup_is_the_ratio_of_summed_rates_and_its_interval_is_ordered(pairs):
    mine, base = as_records(pairs)
    out = speedup(mine, base, resamples=200)
    rate_m = sum(n for (n, _), _ in pairs) / sum(s for (_, s), _ in pairs)
    rate_b = sum(n for _, (n, _) in pairs) / sum(s for _, (_, s) in pairs)
    assert out["measured_speedup"] == pytest.approx(rate_m / rate_b)
    assert out["matched_keys"] == len(pairs)
    assert 0 < out["speedup_ci_low"] <= out["speedup_ci_high"]
    # Over equal lengths the speed-up is that ratio of summed rates: nothing is projected.
    same_length = [
        dataclasses.replace(b, new_tokens=m.new_tokens, first_tokens=m.first_tokens)
        for m, b in zip(mine, base, strict=True)
    ]
    rate_b = sum(r.new_tokens for r in same_length) / sum(s for _, (_, s) in pairs)
    equal = speedup(mine, same_length, resamples=0)
    assert equal["speedup"] == pytest.approx(rate_m / rate_b) and equal["projected_keys"] == 0


@FAST
@given(paired_runs)
def test_a_method_against_itself_is_exactly_one_with_a_zero_width_interval(pairs):
    mine, _ = as_records(pairs)
    same = [record("b", r.example_id, r.new_tokens, r.total_s) for r in mine]
    out = speedup(mine, same, resamples=100)
    assert out["speedup"] == pytest.approx(1.0)
    assert out["speedup_ci_low"] == pytest.approx(1.0)
    assert out["speedup_ci_high"] == pytest.approx(1.0)


@FAST
@given(paired_runs, st.floats(0.1, 10.0))
def test_making_the_method_k_times_faster_scales_speedup_and_interval_by_k(pairs, k):
    mine, base = as_records(pairs)
    # Every part of each generation k times faster: prefill, decoding, the whole.
    faster = [
        dataclasses.replace(r, total_s=r.total_s / k, prefill_s=r.prefill_s / k, decode_s=r.decode_s / k)
        for r in mine
    ]
    before = speedup(mine, base, resamples=100)
    after = speedup(faster, base, resamples=100)
    # Python floats (float64): each ratio of sums over the records is off by at most the sums' bound.
    tol = sum_tol(2 * len(pairs) + 2, torch.float64)
    for name in ("speedup", "speedup_ci_low", "speedup_ci_high"):
        assert after[name] == pytest.approx(before[name] * k, rel=tol)


@FAST
@given(paired_runs, st.randoms(use_true_random=False))
def test_speedup_and_interval_ignore_record_order_and_unmatched_keys(pairs, rng):
    mine, base = as_records(pairs)
    reference = speedup(mine, base, resamples=100)
    shuffled_mine, shuffled_base = list(mine), list(base)
    rng.shuffle(shuffled_mine)
    rng.shuffle(shuffled_base)
    extra = [record("b", "only-in-baseline", 7, 0.5), record("m", "only-in-method", 9, 0.1)]
    out = speedup(shuffled_mine + extra[1:], shuffled_base + extra[:1], resamples=100)
    assert out == reference


@FAST
@given(paired_runs)
def test_speedup_of_a_over_b_is_the_inverse_of_b_over_a(pairs):
    mine, base = as_records(pairs)
    forward = speedup(mine, base, resamples=100)
    backward = speedup([record("m", r.example_id, r.new_tokens, r.total_s) for r in base],
                               [record("b", r.example_id, r.new_tokens, r.total_s) for r in mine],
                               resamples=100)  # fmt: skip
    assert forward["measured_speedup"] * backward["measured_speedup"] == pytest.approx(1.0)
    # Over equal work both ways, the speed-ups are inverse too.
    same = [
        dataclasses.replace(b, new_tokens=m.new_tokens, first_tokens=m.first_tokens)
        for m, b in zip(mine, base, strict=True)
    ]
    there, back = speedup(mine, same, resamples=0), speedup(same, mine, resamples=0)
    assert there["speedup"] * back["speedup"] == pytest.approx(1.0)


@FAST
@given(st.lists(generation, min_size=1, max_size=12), st.lists(generation, min_size=1, max_size=12))
def test_throughput_is_sum_over_sum_never_a_mean_of_rates(a, b):
    records = [record("m", f"e{i}", n, s) for i, (n, s) in enumerate(a + b)]
    out = throughput(records)
    assert out["tokens_per_s"] == pytest.approx(sum(n for n, _ in a + b) / sum(s for _, s in a + b))
    assert out["n"] == len(records)


# ----------------------------------------------------------------------------- resume merging


def run_info(**changes) -> RunInfo:
    info = RunInfo(target="t", draft="d", dtype="float32", device="cpu", temperature=0.0,
                   max_new_tokens=32, labels=["ar", "sps"], suite="builtin",
                   extra={"chat": True, "repeats": 1, "sampling": {"top_p": 1.0}})  # fmt: skip
    for name, value in changes.items():
        setattr(info, name, value)
    return info


records_strategy = st.lists(
    st.tuples(st.sampled_from(["ar", "sps"]), st.integers(0, 30), st.integers(0, 1), generation),
    max_size=15,
    unique_by=lambda r: (r[0], r[1], r[2]),
)


@FAST
@given(records_strategy, st.integers(1, 200))
def test_resume_keeps_every_complete_record_and_drops_only_a_torn_tail(tmp_path_factory, rows, cut):
    folder = tmp_path_factory.mktemp("resume")
    info = run_info()
    assert prepare_output(folder, info, resume=False) == []
    written = [record(label, f"e{i}", n, s, turn=turn) for label, i, turn, (n, s) in rows]
    lines = "".join(r.to_json() + "\n" for r in written)
    torn = '{"label": "ar", "example_id": "torn", "new_tokens": 3, "tokens": [1, 2'[: max(1, cut % 60)]
    (folder / RESULTS_FILE).write_text(lines + torn, encoding="utf-8")

    done = prepare_output(folder, info, resume=True)
    assert [r.to_json() for r in done] == [r.to_json() for r in written]
    # The file now ends on a complete line, so the next append starts a fresh record.
    assert [r.to_json() for r in read_records(folder / RESULTS_FILE)] == [r.to_json() for r in written]
    again = prepare_output(folder, info, resume=True)
    assert len(again) == len(written)


@FAST
@given(st.sampled_from(RESUME_FIELDS), st.data())
def test_resume_names_any_changed_setting_and_changes_no_file(tmp_path_factory, name, data):
    folder = tmp_path_factory.mktemp("refuse")
    prepare_output(folder, run_info(), resume=False)
    with (folder / RESULTS_FILE).open("a") as out:
        out.write(record("ar", "e1", 4, 0.5).to_json() + "\n")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    old = getattr(run_info(), name)
    new = data.draw(
        {
            str: st.text(min_size=1, max_size=8),
            float: st.floats(0.0, 2.0),
            int: st.integers(1, 4096),
            list: st.lists(st.sampled_from(["ar", "sps", "pld", "bild"]), min_size=1, max_size=3),
        }[type(old)]
    )
    assume(new != old)
    changed = changed_settings(run_info(), run_info(**{name: new}))
    assert len(changed) == 1 and changed[0].startswith(f"{name} was {old!r}")
    with pytest.raises(DraftlabError, match=name):
        prepare_output(folder, run_info(**{name: new}), resume=True)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


# ----------------------------------------------------------------------------- the suite loader

text = st.text(st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=30).filter(str.strip)
row_strategy = st.fixed_dictionaries(
    {"category": st.sampled_from(["qa", "rag", "translation", "writing", "math"])},
    optional={"reference": text},
).flatmap(
    lambda base: st.one_of(
        st.builds(lambda p: {**base, "prompt": p}, text),
        st.builds(lambda t: {**base, "turns": t}, st.lists(text, min_size=1, max_size=3)),
    )
)


@FAST
@given(st.lists(row_strategy, min_size=1, max_size=20), st.booleans())
def test_any_valid_jsonl_loads_in_order_with_its_turns(rows, with_ids):
    rows = [{**row, "id": f"q{i}"} if with_ids else row for i, row in enumerate(rows)]
    examples = parse_jsonl("\n".join(json.dumps(r) for r in rows) + "\n", "suite.jsonl")
    assert len(examples) == len(rows)
    for number, (row, example) in enumerate(zip(rows, examples, strict=True), 1):
        assert example.id == (row["id"] if with_ids else str(number))
        assert example.turns == tuple(row.get("turns", [row.get("prompt")]))
        # MT-bench categories are two-turn conversations: Spec-Bench's multi-turn subtask.
        assert example.subtask == (
            "multi-turn" if row["category"] in ("writing", "math") else row["category"]
        )
        assert example.reference == row.get("reference")


@FAST
@given(st.lists(row_strategy, min_size=1, max_size=20), st.integers(1, 5), st.data())
def test_select_keeps_order_and_at_most_limit_per_subtask(rows, limit, data):
    examples = parse_jsonl("\n".join(json.dumps(r) for r in rows), "suite.jsonl")
    present = sorted({e.subtask for e in examples})
    wanted = data.draw(st.lists(st.sampled_from(present), min_size=1, unique=True))
    kept = select(examples, wanted, limit)
    assert [e for e in examples if e in kept] == kept  # a subsequence, in order
    for subtask in present:
        available = sum(e.subtask == subtask for e in examples)
        expected = min(limit, available) if subtask in wanted else 0
        assert sum(e.subtask == subtask for e in kept) == expected


@FAST
@given(st.lists(row_strategy, min_size=2, max_size=10), st.data())
def test_a_duplicate_id_is_named_with_its_line(rows, data):
    first = data.draw(st.integers(0, len(rows) - 2))
    second = data.draw(st.integers(first + 1, len(rows) - 1))
    rows = [{**row, "id": f"q{i}"} for i, row in enumerate(rows)]
    rows[second]["id"] = rows[first]["id"]
    with pytest.raises(DraftlabError, match=rf"suite.jsonl:{second + 1}: duplicate id 'q{first}'"):
        parse_jsonl("\n".join(json.dumps(r) for r in rows), "suite.jsonl")


def test_properties_run_on_real_files(tmp_path: Path):
    """The loader reads what the runner writes: one record survives a round trip bit for bit."""
    r = record("ar", "e1", 3, 0.25)
    (tmp_path / RESULTS_FILE).write_text(r.to_json() + "\n")
    (back,) = read_records(tmp_path / RESULTS_FILE)
    assert back == r


# ----------------------------------------------------------------------------- n-gram lookup


@FAST
@given(st.lists(st.integers(0, 3), max_size=40), st.lists(st.integers(0, 3), max_size=8), st.integers(1, 4))
def test_a_context_index_grown_round_by_round_finds_what_a_fresh_search_finds(tokens, head, max_ngram):
    """Rounds append a few tokens each (as accepted tokens do); every round's lookup, and the one
    after the text changed other than by growing (it is rebuilt), equals a search of the whole text."""
    from draftlab.drafters.lookup.context_index import ContextIndex

    index = ContextIndex(max_ngram)
    index.reset(head)
    step = 1
    for end in range(0, len(tokens) + 1):
        if end % step:
            continue
        step = step % 3 + 1
        index.follow(tokens[:end])
        assert index.tokens == head + tokens[:end]
        assert index.array.tolist() == index.tokens
        assert index.longest_match(max_ngram, 1) == _reference_lookup(head + tokens[:end], max_ngram)
    changed = tokens[: len(tokens) // 2] + [9]
    index.follow(changed)
    assert index.tokens == head + changed
    assert index.longest_match(max_ngram, 1) == _reference_lookup(head + changed, max_ngram)
    index.follow(tokens[1:], offset=1)  # the searched text starts later in the sequence
    assert index.longest_match(max_ngram, 1) == _reference_lookup(head + tokens[2:], max_ngram)


def _reference_lookup(context: list[int], max_ngram: int) -> tuple[int, list[int]] | None:
    """The longest n whose last n tokens occurred earlier, and every earlier start, by brute force."""
    for n in range(min(max_ngram, len(context) - 1), 0, -1):
        tail = context[-n:]
        starts = [i for i in range(len(context) - n) if context[i : i + n] == tail]
        if starts:
            return n, starts
    return None


@FAST
@given(st.lists(st.integers(0, 3), max_size=30), st.integers(1, 4), st.integers(1, 6))
def test_prompt_lookup_and_lookup_trees_share_the_longest_ngram_match(tokens, max_ngram, k):
    from draftlab.drafters.lookup.context_index import ContextIndex
    from draftlab.drafters.lookup.ngram import PromptLookupProposer, agreement_kind
    from draftlab.drafters.lookup.tree import LookupTreeProposer

    expected = _reference_lookup(tokens, max_ngram)
    index = ContextIndex(max_ngram)
    index.reset([])
    index.follow(tokens)
    assert index.longest_match(max_ngram, 1) == expected
    chain, tree = PromptLookupProposer(max_ngram=max_ngram), LookupTreeProposer(max_ngram=max_ngram)
    for proposer in (chain, tree):
        proposer.start(tokens, tokens)
    proposal = chain.propose(tokens, k, None, None)
    branches = tree.propose(tokens, k, None, None)
    if expected is None:
        assert proposal.tokens == [] and branches.tokens == []
        return
    n, starts = expected
    weak = n == 1 and len(starts) >= 3
    # the chain copies what followed the most recent match; the tree holds every match's first token
    assert proposal.tokens == tokens[starts[-1] + n :][: min(k, 3) if weak else k]
    # the kind tells how far the hit agrees with the text before it, when the n-gram is the longest allowed
    agreed = n
    while n == max_ngram and agreed < 16 and starts[-1] + n - agreed - 1 >= 0:
        if tokens[starts[-1] + n - agreed - 1] != tokens[len(tokens) - agreed - 1]:
            break
        agreed += 1
    kind = f"{n}-gram" + (" weak" if weak else "")
    assert proposal.kind == (f"{kind}/{agreement_kind(agreed)}" if n == max_ngram else kind)
    roots = {t for t, p in zip(branches.tokens, branches.parent_list(), strict=True) if p < 0}
    assert roots == {tokens[s + n] for s in starts} and branches.kind == f"{n}-gram tree"
