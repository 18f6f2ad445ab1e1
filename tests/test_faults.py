"""Fault injection (issue 51): nothing of the user's is touched, and no file draftlab reads ends in an
internal error. Each case is one a new user hit: a one-line error with exit code 2 and every file
as it was (checksums before and after), or a correct recovery."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import QUIET, pair_args, write_suite
from test_bad_input import cli, one_line, refused

from draftlab.bench.records import RUN_FILE, RunInfo
from draftlab.cli import main
from draftlab.models.loading import shape_key
from draftlab.outputs import MARKER

ROWS = [{"id": "s1", "category": "summarization", "prompt": "the cat sat on the mat and then the dog ran"}]


def checksums(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _users_folder(folder: Path, files: dict[str, str]) -> dict[str, str]:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return checksums(folder)


def _bench(tiny_pair, tmp_path, out: Path, *extra: str) -> list[str]:
    suite = write_suite(tmp_path / "suite.jsonl", ROWS)
    run = ["--suite", str(suite), "--max-new-tokens", "4", "--methods", "ar", "--out", str(out)]
    return ["bench", *pair_args(tiny_pair), *run, *QUIET, *extra]


FOREIGN = {
    "foreign run.json": {
        RUN_FILE: '{"tool": "my-other-benchmark"}',
        "report.md": "mine",
        "summary.csv": "a,b",
    },
    "empty results.jsonl": {"results.jsonl": "", "report.md": "mine", "summary.json": "{}"},
    "foreign results.jsonl": {"results.jsonl": '{"score": 1}\n'},
}


@pytest.mark.parametrize("case", FOREIGN)
@pytest.mark.parametrize("resume", [False, True])
def test_bench_never_writes_into_a_folder_of_someone_elses_files(tiny_pair, tmp_path, capsys, case, resume):
    out = tmp_path / "theirs"
    before = _users_folder(out, FOREIGN[case])
    argv = _bench(tiny_pair, tmp_path, out, *(["--resume"] if resume else []))
    refused(capsys, argv, str(out), "did not write", "--force")
    assert checksums(out) == before, "nothing of the user's changed, nothing added"


def test_force_writes_into_such_a_folder_and_marks_it(tiny_pair, tmp_path):
    out = tmp_path / "theirs"
    _users_folder(out, {"notes.txt": "mine"})
    assert main(_bench(tiny_pair, tmp_path, out, "--force")) == 0
    assert (out / MARKER).is_file() and (out / "notes.txt").read_text() == "mine"
    # Now draftlab's: a resume needs no --force.
    assert main(_bench(tiny_pair, tmp_path, out, "--resume")) == 0


def test_a_run_folder_written_before_markers_still_resumes(tiny_pair, tmp_path):
    out = tmp_path / "old"
    assert main(_bench(tiny_pair, tmp_path, out)) == 0
    (out / MARKER).unlink()  # as an earlier draftlab left it
    assert main(_bench(tiny_pair, tmp_path, out, "--resume")) == 0


@pytest.mark.parametrize(
    ("change", "fragments"),
    [
        (lambda text: text[: len(text) // 2], ["unreadable JSON"]),
        (lambda text: json.dumps({**json.loads(text), "labels": 5}), ["field 'labels'", "5"]),
        (lambda text: json.dumps({**json.loads(text), "labels": [1, 2]}), ["field 'labels'"]),
        (
            lambda text: json.dumps({**json.loads(text), "temperature": "hot"}),
            ["field 'temperature'", "'hot'"],
        ),
        (lambda text: json.dumps({**json.loads(text), "tool": "x"}), ["unknown field 'tool'"]),
        (
            lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != "target"}),
            ["no field 'target'"],
        ),
        (lambda text: "[1, 2]", ["not a JSON object"]),
    ],
)
def test_a_torn_foreign_or_mistyped_run_json_is_one_line_in_report_and_resume(
    tiny_pair, tmp_path, capsys, change, fragments
):
    out = tmp_path / "run"
    assert main(_bench(tiny_pair, tmp_path, out)) == 0
    capsys.readouterr()
    path = out / RUN_FILE
    path.write_text(change(path.read_text()))
    before = checksums(out)
    refused(capsys, ["report", str(out)], str(path), *fragments)
    refused(capsys, _bench(tiny_pair, tmp_path, out, "--resume"), str(path), *fragments)
    assert checksums(out) == before


def test_run_info_load_checks_every_field_by_type(tmp_path):
    info = RunInfo("t", None, "float32", "cpu", 0.0, 8, labels=["ar"])
    info.save(tmp_path)
    assert RunInfo.load(tmp_path) == info and RunInfo.written_here(tmp_path)
    (tmp_path / RUN_FILE).write_text(json.dumps({"target": "t", "max_new_tokens": 8.5}))
    assert not RunInfo.written_here(tmp_path)


def test_distill_never_writes_into_a_folder_of_someone_elses_files(tmp_path, capsys):
    out = tmp_path / "mine"
    before = _users_folder(out, {"config.json": '{"mine": true}'})
    for head in ([], ["--head", "eagle3"]):
        refused(capsys, ["distill", "--target", "x", "--out", str(out), *head], str(out), "did not write")
    assert checksums(out) == before


def test_a_second_distill_on_the_same_out_is_refused(tmp_path):
    """The first holds the folder (here: a process holding its lock, as a running distill does)."""
    out = tmp_path / "draft"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from pathlib import Path\n"
            "from draftlab.files import folder_lock\n"
            "from draftlab.outputs import claim_folder\n"
            f"out = Path({str(out)!r}); out.mkdir()\n"
            "with folder_lock(out):\n"
            "    claim_folder(out, 'distill'); print('held', flush=True); time.sleep(120)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        done = cli("distill", "--target", "x", "--out", str(out))
        assert done.returncode == 2
        one_line(done.stderr, [str(out), "in use by another draftlab run", str(holder.pid)])
    finally:
        holder.kill()
        holder.wait()


def test_export_gguf_and_audit_json_never_replace_an_existing_file(tmp_path, capsys):
    mine = tmp_path / "mine.gguf"
    mine.write_bytes(b"GGUF mine")
    refused(capsys, ["models", "export-gguf", "smollm2-135m-draft", "--out", str(mine)], str(mine), "--force")
    report = tmp_path / "audit.json"
    report.write_text("{}")
    refused(capsys, ["audit", "--json", str(report)], str(report), "already exists")
    assert mine.read_bytes() == b"GGUF mine" and report.read_text() == "{}"


def test_profile_never_writes_into_a_folder_of_someone_elses_files(tiny_pair, tmp_path, capsys):
    out = tmp_path / "theirs"
    before = _users_folder(out, {"profile.png": "mine", "data.csv": "1,2"})
    refused(
        capsys,
        ["profile", "--target", str(tiny_pair["llama"][0]), "--out", str(out)],
        str(out),
        "did not write",
    )
    assert checksums(out) == before


def test_a_home_that_is_a_file_is_one_line(tmp_path):
    home = tmp_path / "home"
    home.write_text("not a folder")
    env_home = {"DRAFTLAB_HOME": str(home)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "draftlab.cli",
            "profile",
            "--target",
            "smollm2-135m-instruct",
            "--out",
            str(tmp_path / "p"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, **env_home},
    )
    assert done.returncode == 2, done.stderr
    one_line(done.stderr, [str(home), "DRAFTLAB_HOME", "is a file"])
    assert home.read_text() == "not a folder" and not (tmp_path / "p").exists()


def test_profiles_are_keyed_by_what_a_model_is_not_where_it_is(tiny_pair, tmp_path):
    source = tiny_pair["llama"][0]
    moved = Path(shutil.copytree(source, tmp_path / "elsewhere" / "model"))
    assert shape_key(str(moved)) == shape_key(str(source)) != shape_key(str(tiny_pair["llama"][1]))
    config = json.loads((moved / "config.json").read_text())
    (moved / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1}))
    assert shape_key(str(moved)) != shape_key(str(source))


def test_the_interrupt_cases_that_already_held_stay_held(tiny_pair, tmp_path):
    """kill -9 in the middle of a bench, then --resume: every row once, the same tokens."""
    out = tmp_path / "run"
    rows = [*ROWS, {"id": "q1", "category": "qa", "prompt": "the big red tree and the small blue house"}]
    suite = write_suite(tmp_path / "suite2.jsonl", rows)
    argv = [
        "bench",
        *pair_args(tiny_pair),
        "--suite",
        str(suite),
        "--max-new-tokens",
        "64",
        "--methods",
        "ar,pld",
        "--ar-dtypes",
        "none",
    ]
    argv += ["--out", str(out), *QUIET]
    child = subprocess.Popen([sys.executable, "-m", "draftlab.cli", *argv], stderr=subprocess.DEVNULL)
    results = out / "results.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and child.poll() is None:
        if results.is_file() and results.read_text().count("\n") >= 1:
            break
        time.sleep(0.05)
    child.kill()
    child.wait()
    assert main([*argv, "--resume"]) == 0
    records = [json.loads(line) for line in results.read_text().splitlines()]
    keys = [(r["label"], r["example_id"]) for r in records]
    assert len(keys) == len(set(keys)) == 4
    by_example = {}
    for r in records:
        by_example.setdefault(r["example_id"], set()).add(tuple(r["tokens"]))
    assert all(len(tokens) == 1 for tokens in by_example.values()), "pld wrote ar's tokens"


def test_report_warns_of_a_generation_recorded_twice(tiny_pair, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(_bench(tiny_pair, tmp_path, out)) == 0
    results = out / "results.jsonl"
    first = results.read_text().splitlines()[0]
    results.write_text(results.read_text() + first + "\n")
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    assert "more than once" in capsys.readouterr().out


def test_a_failed_distill_leaves_no_folder_behind(tmp_path, capsys):
    out = tmp_path / "new" / "draft"
    refused(capsys, ["distill", "--target", str(tmp_path / "no-such-target"), "--out", str(out)], "not found")
    assert not out.exists(), "the folder it made, and marked, is gone again"


def test_argument_errors_name_the_command_once(capsys):
    line = refused(capsys, ["bench", "--gamma", "x"], "'x'")
    assert line.startswith("draftlab: error: bench: argument --gamma") and line.count("draftlab") == 1
