"""Unit tests of distillation's choices: the answer dtype, synthesized prompts, the learning-rate
schedule under a time budget, and the held-out split, which must keep every answer to a held-out
prompt out of training."""

from __future__ import annotations

import pytest

from draftlab.distill import data as D
from draftlab.distill.inputs import generation_dtype
from draftlab.distill.synth_prompts import KINDS, synth_prompt_items
from draftlab.drafters.eagle3 import train as E
from draftlab.drafters.eagle3.distill import held_out

TEXT = "\n\n".join(
    f"Once upon a time there was a cat named Tom number {i}. He was happy. The sun was warm and the "
    f"grass is green. Tom and his friend went to the park, and they played with a ball all day long."
    for i in range(30)
)


@pytest.mark.parametrize(
    ("choice", "target", "device", "native", "labels", "want"),
    [
        ("auto", "float32", "cpu", True, False, "bfloat16"),  # a head on a native-bf16 CPU
        ("auto", "float32", "cpu", False, False, "float32"),  # AVX2-only: bf16 prefills far slower
        ("auto", "float32", "cpu", True, True, "float32"),  # a draft learns the captured log-probs
        ("auto", "float32", "cuda", True, False, "float32"),
        ("auto", "bfloat16", "cpu", True, False, "bfloat16"),
        ("float16", "float32", "cpu", False, True, "float16"),  # what the user asks for wins
    ],
)
def test_the_answer_dtype(choice, target, device, native, labels, want):
    assert generation_dtype(choice, target, device, native, labels) == want


def test_synthesized_prompts_cover_every_kind_evenly_and_repeat_with_the_seed():
    items = synth_prompt_items([TEXT], 80, seed=3)
    assert len(items) == 80
    counts = {k: sum(1 for c, _ in items if c == k) for k in KINDS}
    assert set(counts.values()) == {10}, counts
    assert items == synth_prompt_items([TEXT], 80, seed=3)
    assert items != synth_prompt_items([TEXT], 80, seed=4)
    assert all(turns and all(t.strip() for t in turns) for _, turns in items)
    assert all(len(turns) == 2 for c, turns in items if c == "multi-turn")
    assert len({tuple(t) for _, t in items}) > 70, "mostly distinct prompts"
    rag = next(t[0] for c, t in items if c == "rag")
    assert "Tom" in rag, "context questions quote the text"


def test_without_text_only_the_kinds_that_need_no_passage_are_made():
    items = synth_prompt_items([], 20, seed=0)
    assert len(items) == 20
    assert {c for c, _ in items} == {"math_reasoning", "qa", "law analytics", "multi-turn"}
    assert synth_prompt_items([TEXT], 0, seed=0) == []


def test_all_answers_to_a_held_out_prompt_are_held_out_together():
    items = [("qa", [f"Question number {i}?"]) for i in range(400)]
    jobs = D.build_jobs(items, [], [], samples_per_prompt=3, temperature=0.8, seed=0)
    prompt_of = D.prompt_keys(jobs)
    by_prompt: dict[str, set[bool]] = {}
    for job in jobs:
        record = {"key": job.key, "source": "prompts"}
        by_prompt.setdefault(job.turns[0], set()).add(held_out(record, prompt_of=prompt_of))
    assert all(len(fates) == 1 for fates in by_prompt.values()), "a prompt's answers split"
    share = sum(True in f for f in by_prompt.values()) / len(by_prompt)
    assert 0.02 < share < 0.09, share
    # By key alone (the old split) the four answers of one prompt land apart.
    split = [
        len({held_out({"key": j.key, "source": "prompts"}) for j in jobs if j.turns == t}) > 1
        for _, t in items
    ]
    assert any(split)
    # Other sources are never held out while prompt-file answers exist.
    assert not held_out({"key": jobs[0].key, "source": "synth"}, prompt_of=prompt_of)


def test_a_time_budget_runs_the_learning_rate_schedule_to_its_end():
    config = E.HeadTrainConfig(steps=2000, lr=1e-3, warmup=10)
    # Step 700 of 2,000 with the budget nearly spent: the schedule follows the clock, not the steps.
    late = E.schedule_progress(700, 2000, 0.0, elapsed=1790, span=1800)
    assert late == pytest.approx(1790 / 1800)
    assert E.learning_rate(config, 700, late) < 0.11 * config.lr
    # Without a budget, or with time to spare, the steps lead.
    assert E.schedule_progress(700, 2000, 0.0, elapsed=10, span=None) == 0.35
    assert E.schedule_progress(700, 2000, 0.0, elapsed=10, span=1800) == 0.35
    # A resumed run starts where the last one left the schedule, never earlier.
    assert E.schedule_progress(10, 2000, 0.8, elapsed=0, span=600) == 0.8
    assert E.learning_rate(config, 0, 0.0) == pytest.approx(config.lr / 10)  # warm-up
    assert E.learning_rate(config, 50, 0.0) == pytest.approx(config.lr)
    assert E.learning_rate(config, 50, 1.0) == pytest.approx(config.lr / 10)
