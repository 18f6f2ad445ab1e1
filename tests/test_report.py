"""report.render and `draftlab report` on copies of tests/fixtures/run_small (no model is loaded)."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import shutil
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
