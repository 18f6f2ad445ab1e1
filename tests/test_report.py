"""report.render and `draftlab report` on copies of tests/fixtures/run_small (no model is loaded)."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import pytest
from PIL import Image
from rich.console import Console

from draftlab.bench import report
from draftlab.bench.plots import PLOT_FILES
from draftlab.bench.records import RESULTS_FILE, RunInfo, read_records
from draftlab.cli import main

FIXTURE = Path(__file__).parent / "fixtures" / "run_small"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def results(tmp_path: Path) -> Path:
    directory = tmp_path / "results"
    shutil.copytree(FIXTURE, directory)
    return directory


def _console() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, width=220, color_system=None), buffer


def _results_folder(directory: Path, records, draft: str) -> Path:
    """A results folder holding `records` and a run.json naming target 't' and `draft`."""
    directory.mkdir()
    (directory / RESULTS_FILE).write_text("".join(r.to_json() + "\n" for r in records))
    info = RunInfo(target="t", draft=draft, dtype="float32", device="cpu", temperature=0.0, max_new_tokens=10)
    info.save(directory)
    return directory


def _check_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_MAGIC, path
    with Image.open(path) as image:
        image.verify()
    pixels = matplotlib.image.imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100


def test_render_writes_every_file(results: Path):
    console, buffer = _console()
    summary = report.render(results, console)
    for name in ("summary.json", "summary.csv", "report.md", "per_example.csv", *PLOT_FILES):
        assert (results / name).is_file(), name
    for name in PLOT_FILES:
        _check_png(results / name)

    assert json.loads((results / "summary.json").read_text()) == summary

    with (results / "summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 * 3  # (overall, qa, multi-turn) × (ar, sps, pld)
    overall_sps = next(r for r in rows if r["subtask"] == "overall" and r["label"] == "sps")
    assert float(overall_sps["tokens_per_s"]) == pytest.approx(30 / 2.32)
    assert overall_sps["cost_ratio"] and not next(r for r in rows if r["label"] == "pld")["cost_ratio"]

    with (results / "per_example.csv").open() as f:
        examples = list(csv.DictReader(f))
    assert len(examples) == 13
    zero = next(r for r in examples if r["label"] == "ar" and r["example_id"] == "qa-2")
    assert zero["new_tokens"] == "0" and zero["time_per_token_ms"] == ""
    assert float(zero["tokens_per_s"]) == 0.0

    md = (results / "report.md").read_text()
    for text in (
        "## Overall",
        "## Per subtask",
        "Overall Result: AS:",
        "Subtask: qa, AS:",
        "α̂",
        "tiny-target",
    ):
        assert text in md, text
    assert "![speedup_by_subtask](speedup_by_subtask.png)" in md

    out = buffer.getvalue()
    assert "Overall" in out and "Per subtask" in out
    assert "Overall Result: AS: 8.28 tokens/sec, SPS: 12.93 tokens/sec -> 1.44 X Speedup" in out
    assert "Per example" not in out
    assert "inf" not in out.lower().replace("info", "")


def test_render_per_example_table(results: Path):
    console, buffer = _console()
    report.render(results, console, per_example=True)
    out = buffer.getvalue()
    assert "Per example" in out and "Prefill Phase (ms)" in out and "qa-3" in out


def test_cli_report_matches_render(results: Path, tmp_path: Path, capsys):
    other = tmp_path / "again"
    shutil.copytree(FIXTURE, other)
    # The command loads each engine's report sections first; so does this side, whatever ran before
    # in this process (alone, the sections were missing here and the test failed).
    from draftlab.engines import load_reports  # noqa: PLC0415

    load_reports()
    expected = report.render(results, Console(quiet=True))
    assert main(["report", str(other), "--quiet"]) == 0
    assert capsys.readouterr().out == ""
    assert json.loads((other / "summary.json").read_text()) == expected
    assert (other / "summary.json").read_text() == (results / "summary.json").read_text()


def test_cli_report_missing_folder(tmp_path: Path, capsys):
    assert main(["report", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("draftlab: error:") and err.count("\n") == 1
    assert "nowhere" in err


def test_cli_report_folder_without_results(tmp_path: Path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["report", str(empty)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    RunInfo(target="t", draft=None, dtype="float32", device="cpu", temperature=0.0, max_new_tokens=4).save(
        empty
    )
    assert main(["report", str(empty)]) == 2
    err = capsys.readouterr().err
    assert "no results" in err and err.count("\n") == 1


def test_torn_last_line_is_ignored(results: Path):
    with (results / RESULTS_FILE).open("a") as f:
        f.write('{"label": "sps", "method": "sp')
    summary = report.render(results, Console(quiet=True))
    assert summary["overall"]["sps"]["n"] == 5


def test_sweep_tables_and_plots(tmp_path: Path):
    """A run that varies draft size, γ, BiLD thresholds, temperature and cache/attention."""
    records = read_records(FIXTURE / RESULTS_FILE)
    out = []
    for r in records:
        if r.method == "ar":
            out.append(dataclasses.replace(r, params={"use_cache": True, "attn_implementation": "sdpa"}))
            slow = {"prefill_s": r.prefill_s * 2, "decode_s": r.decode_s * 2, "total_s": r.total_s * 2}
            plain = {"use_cache": False, "attn_implementation": "eager"}
            out.append(dataclasses.replace(r, label="ar plain", params=plain, **slow))
        if r.method != "sps":
            continue
        for size, draft in ((1_000_000, "d1m"), (30_000_000, "d30m")):
            for gamma in (2, 4):
                factor = 1 + size / 1e8 + gamma / 10
                out.append(
                    dataclasses.replace(
                        r,
                        label=f"sps {draft} γ={gamma}",
                        draft=draft,
                        draft_params=size,
                        gamma=gamma,
                        decode_s=r.decode_s * factor,
                        total_s=r.prefill_s + r.decode_s * factor,
                    )
                )
        out.append(dataclasses.replace(r, label="sps T=1", temperature=1.0, greedy_match=None))
        for fb in (0.5, 0.7):
            for rb in (3.0, float("inf")):
                params = {"fallback_threshold": fb, "rollback_threshold": rb}
                out.append(
                    dataclasses.replace(r, label=f"bild {fb} {rb}", method="bild", gamma=10, params=params)
                )
    directory = _results_folder(tmp_path / "sweep", out, draft="d1m")

    console, buffer = _console()
    summary = report.render(directory, console)
    assert set(summary["sweeps"]) == {"draft_gamma", "bild", "temperature", "ablation"}
    assert summary["sweeps"]["bild"][0]["rollback"] == [3.0, "inf"]
    json.loads((directory / "summary.json").read_text())  # strict JSON despite rb = inf
    md = (directory / "report.md").read_text()
    for title in (
        "Sweep: draft size × γ",
        "# of draft params",
        "BiLD",
        "Temperature",
        "Ablation",
        "plain baseline",
    ):
        assert title in md, title
    assert "Sweep: draft size × γ" in buffer.getvalue()
    for name in PLOT_FILES:
        _check_png(directory / name)


def test_single_label_run_has_no_speedups(tmp_path: Path):
    records = [r for r in read_records(FIXTURE / RESULTS_FILE) if r.label == "sps"]
    directory = _results_folder(tmp_path / "only_sps", records, draft="d")
    console, buffer = _console()
    summary = report.render(directory, console)
    assert summary["overall"]["sps"]["speedup"] is None
    assert summary["overall"]["sps"]["cost_ratio"] is None  # no AR records: no target step time
    assert "baseline 'ar' has no records" in buffer.getvalue()
    for name in PLOT_FILES:
        _check_png(directory / name)


def _header(md: str) -> str:
    """report.md up to its first section."""
    return md.split("\n## ", 1)[0]


def test_header_is_a_short_table_naming_the_winner(results: Path):
    report.render(results, Console(quiet=True))
    head = _header((results / "report.md").read_text())
    assert "| target | tiny-target |" in head and "| draft | tiny-draft |" in head
    assert "| engines | hf |" in head and "| suite | fixture: qa, multi-turn |" in head
    # sps beats the fastest plain decoding (ar, the only one) by 1.44× overall
    assert "| winner | sps: 1.44× the speed of the fastest plain decoding (ar), 95% CI [1.14, 1.68] |" in head
    assert "full settings: run.json" in head
    assert not any(line.startswith("- ") for line in head.splitlines())  # no bullet list


def test_header_gives_dtype_processor_engines_and_plan_without_json(tmp_path: Path):
    records = read_records(FIXTURE / RESULTS_FILE)
    extra = {
        "hardware": {
            "kind": "cpu",
            "name": "Xeon 8480",
            "cpu_id": "GenuineIntel 6/143",
            "isa_flags": ["avx2", "avx512f", "amx_bf16"],
            "cpu_flags": ["fpu", "sse4_2", "avx2", "avx512f", "amx_bf16"],
            "cores": 16,
        },
        "dtype_choice": {
            "dtype": "bfloat16",
            "reason": "it is predicted faster",
            "predicted_s": {"bfloat16": 1.0},
        },
        "engines": ["hf", "vllm"],
        "plan": {
            "predicted_s": 612.3,
            "budget_s": 900,
            "everything_s": 2400.0,
            "left_out": ["sps-tree: adds nothing here", "prompts: 1 per subtask instead of 2"],
        },
        "variants": {"sps": {"gamma": 4, "draft": "tiny-draft"}},
        "versions": {"torch": "2.13.0"},
        "examples": 3,
        "turns": 4,
        "repeats": 1,
    }
    directory = tmp_path / "run"
    directory.mkdir()
    (directory / RESULTS_FILE).write_text("".join(r.to_json() + "\n" for r in records))
    info = RunInfo(target="t", draft="d", dtype="bfloat16", device="cpu", temperature=0.0, max_new_tokens=10)
    dataclasses.replace(info, extra=extra).save(directory)
    console, buffer = _console()
    report.render(directory, console)
    head = _header((directory / "report.md").read_text())
    assert "| dtype | bfloat16 on cpu; dtype chosen: bfloat16, because it is predicted faster |" in head
    assert "| CPU | Xeon 8480 (GenuineIntel 6/143); ISA flags: avx2, avx512f, amx_bf16 |" in head
    assert "| engines | hf, vllm |" in head
    assert "| suite | builtin: qa, multi-turn (3 prompts, 4 turns) |" in head
    assert (
        "| plan | predicted 10 min 12 s of a 15 min 00 s budget; left out: sps-tree: adds nothing here; "
        "prompts: 1 per subtask instead of 2 (`--full` restores them, everything: 40 min 00 s) |"
    ) in head
    # settings stay in run.json: no JSON, no variant settings, no flag list, no versions
    for blob in ("{", '["', "sse4_2", "gamma", "2.13.0"):
        assert blob not in head, blob
    out = buffer.getvalue()
    assert "  plan: predicted 10 min 12 s" in out and "  full settings: run.json" in out

    gpu = {"kind": "cuda", "name": "NVIDIA H100", "capability": "9.0", "memory_gib": 79.1, "bf16": True}
    dataclasses.replace(info, device="cuda", extra={"hardware": gpu}).save(directory)
    report.render(directory, Console(quiet=True))
    head = _header((directory / "report.md").read_text())
    assert "| GPU | NVIDIA H100, compute capability 9.0 |" in head and "| plan |" not in head


def _scaled(r, factor: float):
    return dataclasses.replace(
        r, prefill_s=r.prefill_s * factor, decode_s=r.decode_s * factor, total_s=r.total_s * factor
    )


def test_header_says_when_no_method_beats_plain_decoding(tmp_path: Path):
    records = [_scaled(r, 3.0) if r.label != "ar" else r for r in read_records(FIXTURE / RESULTS_FILE)]
    directory = _results_folder(tmp_path / "slow", records, draft="d")
    summary = report.render(directory, Console(quiet=True))
    head = _header((directory / "report.md").read_text())
    sps = summary["overall"]["sps"]["vs_best_ar"]
    assert sps < 1 and sps > summary["overall"]["pld"]["vs_best_ar"]
    assert (
        f"| winner | no method beat the fastest plain decoding; the closest, sps, ran at {sps:.2f}×" in head
    )


def test_best_method_of_each_subtask_is_bold(tmp_path: Path):
    # pld three times faster on qa only: pld wins qa, sps still wins multi-turn
    records = [
        _scaled(r, 1 / 3) if r.label == "pld" and r.subtask == "qa" else r
        for r in read_records(FIXTURE / RESULTS_FILE)
    ]
    directory = _results_folder(tmp_path / "mixed", records, draft="d")
    summary = report.render(directory, Console(quiet=True))
    md = (directory / "report.md").read_text()
    best = {"qa": "pld", "multi-turn": "sps"}
    for subtask, label in best.items():
        group = summary["subtasks"][subtask]
        assert max(group, key=lambda lb: group[lb]["vs_best_ar"]) == label
        for other in group:
            bold = f"| {subtask} | **{other}** |" in md
            assert bold == (other == label), (subtask, other)
    # the grid: labels × (overall, qa, multi-turn), the best of each column in bold
    grid = md.split("## Per subtask at a glance", 1)[1].split("\n## ", 1)[0]
    rows = {line.split(" | ")[0].strip("| "): line for line in grid.splitlines() if line.startswith("| ")}
    assert rows["label"].startswith("| label | overall | qa | multi-turn |")
    cells = {label: rows[label].strip("| ").split(" | ")[1:] for label in ("ar", "sps", "pld")}
    groups = [summary["overall"], summary["subtasks"]["qa"], summary["subtasks"]["multi-turn"]]
    winners = [max(g, key=lambda lb: g[lb]["vs_best_ar"]) for g in groups]
    assert winners[1:] == ["pld", "sps"]
    for label, row in cells.items():
        assert [c.startswith("**") for c in row] == [w == label for w in winners], label


def test_tree_budget_sweep_bolds_the_fastest_budget_of_each_subtask():
    from draftlab.bench.sweep_tables import sweep_tables
    from draftlab.bench.table_data import markdown_table

    def row(label: str, budget: int) -> dict:
        figures = {
            "nodes_per_round": 3.0,
            "mean_accepted_length": 1.5,
            "branch_win_share": 0.1,
            "speedup": 1.0,
        }
        return {"label": label, "method": "pld-tree", "budget": budget, **figures}

    summary = {
        "subtask_names": ["qa", "mt"],
        "subtasks": {"qa": {"b4": {"speedup": 1.2}, "b8": {"speedup": 1.5}}, "mt": {"b4": {"speedup": 1.3}}},
        "sweeps": {"tree_budget": [row("b4", 4), row("b8", 8)]},
    }
    (table,) = sweep_tables(summary)
    lines = markdown_table(table).splitlines()
    assert lines[2].endswith("| 1.20× | **1.30×** |") and lines[3].endswith("| **1.50×** | - |")


def test_header_names_the_engine_whose_plain_decoding_was_fastest():
    from draftlab.bench.run_header import best_engine_line, engine_of

    assert [engine_of(x) for x in ("ar", "ar float32", "ar@llamacpp", "pld@vllm c=4")] == [
        "hf",
        "hf",
        "llamacpp",
        "vllm",
    ]
    overall = {
        "ar": {"method": "ar", "tokens_per_s": 25.0},
        "ar bfloat16": {"method": "ar", "tokens_per_s": 20.0},
        "pld": {"method": "pld", "tokens_per_s": 40.0},
        "ar@llamacpp": {"method": "ar", "tokens_per_s": 100.0},
        "pld@llamacpp": {"method": "pld", "tokens_per_s": 130.0},
    }
    line = best_engine_line({"overall": overall})
    assert line == "ar@llamacpp (llamacpp), 100.00 tok/s: 4.00× ar (hf)"
    # One engine only: nothing to say.
    assert best_engine_line({"overall": {k: v for k, v in overall.items() if "@" not in k}}) is None


def test_the_report_command_loads_no_torch(tmp_path: Path):
    """`draftlab report` reads records and the method table only: no torch, no transformers."""
    folder = tmp_path / "run"
    shutil.copytree(FIXTURE, folder)
    code = (
        "import sys\n"
        "from draftlab.cli import main\n"
        f"code = main(['report', {str(folder)!r}, '--quiet'])\n"
        "heavy = sorted(m for m in ('torch', 'transformers') if m in sys.modules)\n"
        "print(code, heavy)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "0 []", done.stdout
