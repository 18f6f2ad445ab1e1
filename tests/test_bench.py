"""`draftlab bench` end to end on tiny models: files, report equality, resume, malformed suites."""

from __future__ import annotations

import json

import pytest
from helpers import QUIET, pair_args, write_suite

from draftlab.bench.records import read_records
from draftlab.bench.suites import SUBTASKS, load_suite, parse_jsonl
from draftlab.cli import main
from draftlab.errors import DraftlabError
from draftlab.hardware import supported_dtypes

SUITE_ROWS = [
    {
        "id": "s1",
        "category": "summarization",
        "prompt": "the cat sat on the mat and then the dog ran on the mat",
    },
    {
        "id": "s2",
        "category": "summarization",
        "prompt": "law court contract clause paid month year the court",
    },
    {"id": "q1", "category": "qa", "prompt": "the big red tree and the small blue house"},
    {"id": "m1", "category": "multi-turn", "turns": ["the river ran under the tree", "and then the dog sat"]},
]


@pytest.fixture()
def suite_file(tmp_path):
    path = tmp_path / "suite.jsonl"
    return write_suite(path, SUITE_ROWS)


def bench_args(tiny_pair, suite_file, out, *extra):
    methods = "ar,sps,pld,bild,hf-greedy,hf-assisted"
    suite = ["--suite", str(suite_file), "--full", "--max-new-tokens", "12", "--out", str(out)]
    return ["bench", *pair_args(tiny_pair), *suite, "--methods", methods, *QUIET, *extra]


def test_bench_end_to_end_and_report_equals_live(tiny_pair, suite_file, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(bench_args(tiny_pair, suite_file, out)) == 0
    live = capsys.readouterr().out
    for name in (
        "results.jsonl",
        "run.json",
        "summary.json",
        "summary.csv",
        "report.md",
        "per_example.csv",
        "speedup_by_subtask.png",
        "acceptance_vs_gamma.png",
        "tokens_per_s_vs_draft_size.png",
    ):
        assert (out / name).exists(), name
    records = read_records(out / "results.jsonl")
    # 3 single-turn examples + 1 two-turn example, 6 methods plus ar in each other dtype of this CPU.
    others = [d for d in supported_dtypes("cpu") if d != "float32"]
    assert len(records) == (3 + 2) * (6 + len(others))
    assert {r.label for r in records if r.method == "ar"} == {"ar", *(f"ar {d}" for d in others)}
    assert {r.turn for r in records if r.example_id == "m1"} == {0, 1}
    for r in records:
        if r.method in ("sps", "pld", "hf-greedy", "hf-assisted"):
            assert r.greedy_match is True, (r.label, r.example_id, r.turn)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["overall"]["sps"]["greedy_match_rate"] == 1.0
    assert "Overall" in live

    (out / "summary.json").unlink()
    assert main(["report", str(out), "--quiet"]) == 0
    assert json.loads((out / "summary.json").read_text()) == summary


def test_resume_after_interruption_neither_duplicates_nor_loses(tiny_pair, suite_file, tmp_path):
    out = tmp_path / "run"
    args = bench_args(tiny_pair, suite_file, out, "--methods", "ar,sps")
    assert main(args) == 0
    full = read_records(out / "results.jsonl")
    lines = (out / "results.jsonl").read_text().splitlines(keepends=True)
    # Cut the file mid-run: 3 complete lines and half of the 4th.
    (out / "results.jsonl").write_text("".join(lines[:3]) + lines[3][: len(lines[3]) // 2])
    assert main(args) == 2  # refuses to overwrite without --resume
    assert main([*args, "--resume"]) == 0
    resumed = read_records(out / "results.jsonl")
    keys = [(r.label, r.key) for r in resumed]
    assert len(keys) == len(set(keys)) == len(full)
    assert sorted(keys) == sorted((r.label, r.key) for r in full)
    assert [r.tokens for r in resumed[:3]] == [r.tokens for r in full[:3]]


def test_resume_refuses_a_different_configuration(tiny_pair, suite_file, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(bench_args(tiny_pair, suite_file, out, "--methods", "ar")) == 0
    assert (
        main(bench_args(tiny_pair, suite_file, out, "--methods", "ar", "--max-new-tokens", "5", "--resume"))
        == 2
    )
    assert "max_new_tokens" in capsys.readouterr().err
    changed = ["--methods", "ar,pld", "--temperature", "0.5", "--no-chat", "--pld-tokens", "7", "--resume"]
    out2 = tmp_path / "run2"
    assert main(bench_args(tiny_pair, suite_file, out2, "--methods", "ar,pld")) == 0
    before = (out2 / "run.json").read_text()
    capsys.readouterr()  # that run's own status lines (a first profile prints some)
    assert main(bench_args(tiny_pair, suite_file, out2, *changed)) == 2
    err = capsys.readouterr().err
    for name in ("temperature", "chat", "pld_tokens"):
        assert name in err, (name, err)
    assert "\n" not in err.strip()
    assert (out2 / "run.json").read_text() == before, "a refused resume changes no file"


def test_malformed_jsonl_names_file_and_line(tiny_pair, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(SUITE_ROWS[0]) + "\n" + '{"id": "x", "category": "qa", "prompt": \n')
    out = tmp_path / "run"
    assert main(bench_args(tiny_pair, bad, out)) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{bad}:2" in err
    assert not (out / "results.jsonl").exists()  # nothing ran


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"id": 1, "category": "qa"}', "needs 'prompt' or 'turns'"),
        ('{"id": 1, "turns": []}', "'turns' must be"),
        ('{"id": 1, "prompt": ""}', "'prompt' must be"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_malformed_rows(line, message):
    with pytest.raises(DraftlabError, match=message):
        parse_jsonl(line + "\n", "f.jsonl")


def test_builtin_suite_shape():
    examples = load_suite("builtin", limit=None)
    by_subtask = {}
    for e in examples:
        by_subtask.setdefault(e.subtask, []).append(e)
    assert set(by_subtask) == set(SUBTASKS) and len(SUBTASKS) == 8
    assert all(len(v) >= 10 for v in by_subtask.values())
    assert all(len(e.turns) == 2 for e in by_subtask["multi-turn"])
    for name in ("summarization", "rag", "law analytics"):
        assert all(len(e.turns[0].split()) >= 200 for e in by_subtask[name])
    assert len(load_suite("builtin", ["qa", "rag"], limit=3)) == 6


def test_spec_bench_format(tmp_path):
    path = tmp_path / "question.jsonl"
    rows = [
        {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Shorter."]},
        {
            "question_id": 82,
            "category": "translation",
            "turns": ["Translate: bonjour"],
            "reference": ["hello"],
        },
    ]
    examples = load_suite(str(write_suite(path, rows)))
    assert [(e.id, e.subtask, len(e.turns)) for e in examples] == [
        ("81", "multi-turn", 2),
        ("82", "translation", 1),
    ]
    with pytest.raises(DraftlabError, match="unknown subtask 'math'"):
        load_suite(str(path), ["math"])


def test_hf_suite_offline_is_a_clear_error():
    with pytest.raises(DraftlabError, match="datasets|could not be loaded"):
        load_suite("hf:csebuetnlp/xlsum:japanese:test")


def test_seed_flag_names_are_aliases(tiny_pair, suite_file, tmp_path):
    target, draft = tiny_pair["llama"]
    out = tmp_path / "seed"
    args = [
        "bench",
        "--target_model_name",
        str(target),
        "--approx_model_name",
        str(draft),
        "--temperature",
        "0",
        "--max_tokens",
        "6",
        "--dtype",
        "float32",
        "--suite",
        str(suite_file),
        "--limit",
        "1",
        "--methods",
        "sps",
        "--out",
        str(out),
        "--quiet",
        "--warmup",
        "0",
    ]
    assert main(args) == 0
    records = read_records(out / "results.jsonl")
    assert {r.label for r in records if not r.label.startswith("ar ")} == {"ar", "sps"}
    assert all(r.new_tokens <= 6 for r in records)


def test_sweeps_and_ablation_run(tiny_pair, suite_file, tmp_path):
    target, draft = tiny_pair["llama"]
    suite = ["--suite", str(suite_file), "--subtasks", "qa", "--limit", "1", "--max-new-tokens", "6"]
    common = [*pair_args(tiny_pair), *suite, *QUIET]
    for kind, extra, labels in [
        ("gamma", ["--gammas", "1,2"], {"ar", "sps γ=1", "sps γ=2"}),
        (
            "gamma",
            ["--gammas", "2", "--drafts", f"{draft},{target}"],
            {"ar", f"sps {draft} γ=2", f"sps {target} γ=2"},
        ),
        (
            "bild",
            ["--fallbacks", "0.5", "--rollbacks", "2,inf"],
            {"ar", "bild fb=0.5 rb=2", "bild fb=0.5 rb=inf"},
        ),
        ("temperature", ["--temperatures", "0,1"], {"ar T=0", "sps T=0", "ar T=1", "sps T=1"}),
        (
            "confidence",
            ["--confidences", "0,0.5"],
            {"ar", "sps τ=0", "hf-assisted τ=0", "sps τ=0.5", "hf-assisted τ=0.5"},
        ),
        (
            "ablation",
            [],
            {f"{m} {c} {a}" for m in ("ar", "sps") for c in ("cache", "no-cache") for a in ("eager", "sdpa")},
        ),
        ("sizing", [], {"ar", "sps fixed k", "sps cost-aware", "pld fixed k", "pld cost-aware"}),
        (
            "tree",
            ["--budgets", "2,8", "--tree-methods", "pld-tree,sps-tree"],
            {"ar", "pld-tree n=2", "pld-tree n=8", "sps-tree n=2", "sps-tree n=8"},
        ),
    ]:
        out = tmp_path / f"{kind}-{len(extra)}"
        args = common
        if "--drafts" in extra:  # the drafts alone: no --draft needed
            args = [a for a in common if a not in ("--draft", str(draft))]
        assert main(["sweep", kind, *args, *extra, "--out", str(out)]) == 0, kind
        assert {r.label for r in read_records(out / "results.jsonl")} == labels
        assert (out / "report.md").exists()
        if kind == "tree":
            assert "Sweep: tree node budget" in (out / "report.md").read_text()
            assert (out / "speedup_vs_tree_budget.png").exists()


def test_every_timed_generation_runs_with_the_garbage_collector_paused(
    tiny_pair, suite_file, tmp_path, monkeypatch
):
    """A full collection (0.2-0.4 s with real models loaded) must not land inside a timed
    generation of one method and not another's: bench and generate pause the collector around each
    generation of every engine's decoder, and give it back as it was."""
    import gc

    from draftlab.decode.loop import SpeculativeDecoder

    seen: list[bool] = []
    real = SpeculativeDecoder.generate

    def generate(self, *args, **kwargs):
        seen.append(gc.isenabled())
        return real(self, *args, **kwargs)

    monkeypatch.setattr(SpeculativeDecoder, "generate", generate)
    assert gc.isenabled()
    out = tmp_path / "run"
    args = ["bench", *pair_args(tiny_pair), "--suite", str(suite_file), "--max-new-tokens", "4"]
    assert main([*args, "--methods", "ar,pld", "--limit", "1", "--out", str(out), *QUIET]) == 0
    timed = len(read_records(out / "results.jsonl"))
    # The warm-up generations before timing may run with it on; every timed one ran with it off.
    assert timed > 0 and seen[-timed:] == [False] * timed
    assert gc.isenabled()
    seen.clear()
    assert main(["generate", *pair_args(tiny_pair), "--method", "pld", "--max-new-tokens", "4", "hi"]) == 0
    assert seen == [False] and gc.isenabled()
