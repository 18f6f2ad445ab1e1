"""Bad input to the real CLI: exit code 2, one line on stderr naming the value, no traceback, no file changed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import QUIET, pair_args, write_suite
from tiny import make_model

from draftlab.cli import main
from draftlab.files import LOCK_FILE, PID_FILE, atomic_path, folder_lock

ROWS = [
    {"id": "s1", "category": "summarization", "prompt": "the cat sat on the mat and then the dog ran"},
    {"id": "q1", "category": "qa", "prompt": "the big red tree and the small blue house"},
]


@pytest.fixture()
def suite(tmp_path):
    return write_suite(tmp_path / "suite.jsonl", ROWS)


def bench(tiny_pair, suite, out, *extra):
    run = ["--suite", str(suite), "--full", "--max-new-tokens", "4", "--methods", "ar,sps", "--out", str(out)]
    return ["bench", *pair_args(tiny_pair), *run, *QUIET, *extra]


def refused(capsys, argv, *fragments) -> str:
    """The in-process CLI: exit 2, exactly one line on stderr, no traceback, every fragment named."""
    assert main(argv) == 2
    return one_line(capsys.readouterr().err, fragments)


def one_line(err: str, fragments) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("draftlab: error:") and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def cli(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m draftlab.cli ...` in a child process: the real entry point, exit code and stderr."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-m", "draftlab.cli", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file's content and mtime, the lock file aside (it stays, by design, and holds nothing)."""
    return {
        p.name: (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name != LOCK_FILE
    }


# ---------------------------------------------------------------- --out


@pytest.mark.parametrize("kind", ["file", "under-file", "unwritable"])
@pytest.mark.parametrize("command", [["bench"], ["sweep", "gamma"]])
def test_an_unusable_out_is_refused_before_loading(capsys, tmp_path, command, kind):
    if kind == "unwritable" and os.geteuid() == 0:
        pytest.skip("root writes anywhere: the under-file case covers a folder that cannot be made")
    blocker = tmp_path / "f"
    blocker.write_text("x")
    out = {"file": blocker, "under-file": blocker / "sub" / "run"}.get(kind)
    if kind == "unwritable":
        locked = tmp_path / "ro"
        locked.mkdir(mode=0o500)
        out = locked / "run"
    named = {"file": "is a file", "under-file": "which is a file", "unwritable": "not writable"}[kind]
    # The target does not exist: a check that ran after loading would report that instead.
    refused(capsys, [*command, "--target", str(tmp_path / "missing"), "--out", str(out)], str(out), named)
    assert blocker.read_text() == "x"


# ---------------------------------------------------------------- --resume with other settings


@pytest.fixture(scope="module")
def finished_run(tiny_pair, tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    path = write_suite(root / "suite.jsonl", ROWS)
    out = root / "run"
    assert main(bench(tiny_pair, path, out)) == 0
    return path, out


@pytest.mark.parametrize(
    "changes, named",
    [
        (["--temperature", "0.5"], ["temperature was 0.0, now 0.5"]),
        (["--gamma", "2"], ["sps gamma was 4, now 2"]),
        (["--no-chat"], ["chat was True, now False"]),
        (
            ["--temperature", "0.5", "--gamma", "2", "--no-chat"],
            ["temperature was 0.0, now 0.5", "sps gamma was 4, now 2", "chat was True, now False"],
        ),
    ],
)
def test_resume_with_changed_settings_names_each_and_changes_no_file(
    capsys, tiny_pair, finished_run, changes, named
):
    suite, out = finished_run
    before = snapshot(out)
    refused(capsys, [*bench(tiny_pair, suite, out, "--resume"), *changes], "cannot resume", *named)
    assert snapshot(out) == before


# ---------------------------------------------------------------- one writer per folder


def test_a_second_run_into_a_held_folder_names_the_holder(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    with folder_lock(out):
        # The real command in a child process: the lock is refused before any model loads.
        done = cli("bench", "--target", str(tmp_path / "missing"), "--out", str(out))
        assert done.returncode == 2, done.stderr
        one_line(done.stderr, [str(out), f"pid {os.getpid()}", "in use"])
        done = cli("sweep", "gamma", "--target", str(tmp_path / "missing"), "--out", str(out))
        assert done.returncode == 2, done.stderr
        one_line(done.stderr, [f"pid {os.getpid()}"])
    assert not (out / PID_FILE).exists(), "the holder's pid file goes with its lock"


def test_a_lock_left_by_a_killed_run_does_not_block_resume(tiny_pair, suite, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from draftlab.files import folder_lock\n"
            "with folder_lock(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(120)",
            str(out),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert holder.stdout.readline().strip() == "held"
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    assert (out / PID_FILE).read_text().strip() == str(holder.pid), "kill -9 leaves the pid file behind"
    assert main(bench(tiny_pair, suite, out, "--resume")) == 0
    assert (out / "report.md").exists()
    assert not (out / PID_FILE).exists()


def test_a_failed_run_removes_the_folder_it_created(capsys, tmp_path):
    out = tmp_path / "new" / "run"
    refused(
        capsys,
        ["bench", "--target", str(tmp_path / "missing"), "--methods", "ar", "--out", str(out)],
        "missing",
    )
    assert not (tmp_path / "new").exists()


# ---------------------------------------------------------------- atomic writes


def test_an_interrupted_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "run.json"
    path.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(path) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed mid-write")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]
    with atomic_path(path) as tmp:
        tmp.write_text("new")
    assert path.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["run.json"]


# ---------------------------------------------------------------- models checked before generating


@pytest.fixture(scope="module")
def short_draft(tmp_path_factory):
    """A GPT-2 target with 512 positions and a GPT-2 draft of the same tokenizer with only 64."""
    root = tmp_path_factory.mktemp("short")
    target = make_model("gpt2", root / "target", seed=1, hidden=32, layers=1)
    draft = make_model("gpt2", root / "draft", seed=2, hidden=32, layers=1, context=64)
    return target, draft


LONG_PROMPT = "the cat sat on the mat and the dog ran under the tree " * 3


def test_a_draft_with_a_short_context_is_refused_before_generating(capsys, short_draft, tmp_path):
    target, draft = short_draft
    models = ["--target", str(target), "--draft", str(draft), "--dtype", "float32"]
    refused(
        capsys,
        ["generate", *models, "--max-new-tokens", "48", LONG_PROMPT],
        f"draft '{draft}' has a context of 64 tokens",
        f"target '{target}' 512",
    )
    suite = tmp_path / "suite.jsonl"
    suite.write_text(json.dumps({"id": "a", "category": "qa", "prompt": LONG_PROMPT}) + "\n")
    out = tmp_path / "run"
    argv = ["bench", *models, "--suite", str(suite), "--max-new-tokens", "48", "--out", str(out), "--quiet"]
    refused(capsys, [*argv, "--methods", "ar,sps"], "context of 64 tokens", "512")
    assert not out.exists(), "nothing is written for a run that cannot start"
    # Methods without the draft do not need its context.
    assert main([*argv, "--methods", "ar,pld", "--warmup", "0"]) == 0


def test_an_empty_folder_as_target_says_config_json_is_missing(capsys, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    line = refused(capsys, ["generate", "--target", str(empty), "--method", "ar", "x"], str(empty))
    assert "folder without a model (config.json missing)" in line and "not a local folder" not in line


# ---------------------------------------------------------------- what a newcomer's mistakes did before


def test_an_out_of_someone_elses_files_is_refused_and_left_as_it_was(capsys, tmp_path, tiny_pair, suite):
    """A folder of the user's own files (no run of ours) was overwritten, with exit 0."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "report.md").write_text("my notes\n")
    (out / "summary.csv").write_text("a,b\n1,2\n")
    before = snapshot(out)
    refused(capsys, bench(tiny_pair, suite, out), f"--out '{out}'", "report.md, summary.csv", "new or empty")
    assert snapshot(out) == before
    # An empty folder, or one a run of ours left, is fine.
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(bench(tiny_pair, suite, empty)) == 0
    capsys.readouterr()
    assert (empty / "run.json").exists()


def test_an_empty_method_list_is_refused(capsys, tmp_path, tiny_pair, suite):
    """`--methods ""` ran every default method."""
    argv = bench(tiny_pair, suite, tmp_path / "out")
    argv[argv.index("--methods") + 1] = ""
    refused(capsys, argv, "empty method list")
    assert not (tmp_path / "out").exists()


def test_a_profile_with_wrong_values_is_measured_again(tmp_path, tiny_pair, monkeypatch):
    """A cached profile whose JSON parses but whose values cannot be a cost curve made every bench
    exit 1 (TypeError, IndexError); it is measured again, as a truncated one is."""
    from draftlab.models.loading import ModelSpec, load_model
    from draftlab.models.profile import load_cached, load_or_measure, profile_path

    monkeypatch.setenv("DRAFTLAB_PROFILE_DIR", str(tmp_path / "profiles"))
    lm = load_model(ModelSpec(str(tiny_pair["llama"][0]), dtype="float32"))
    first, _ = load_or_measure(lm, repeats=1)
    path = profile_path(lm)
    good = json.loads(path.read_text())
    damages = {
        "a string for a time": lambda c: c["ms"][0].__setitem__(0, "fast"),
        "a row too short": lambda c: c["ms"][0].pop(),
        "a size too many": lambda c: c["sizes"].append(4096),
        "sizes out of order": lambda c: c["sizes"].reverse(),
        "a negative time": lambda c: c["ms"][-1].__setitem__(-1, -3.0),
        "a prefill time missing": lambda c: c["prefill_ms"].pop(),
        "no step factor": lambda c: c.__setitem__("step_factor", None),
    }
    for what, damage in damages.items():
        data = json.loads(json.dumps(good))
        damage(data["curve"])
        path.write_text(json.dumps(data))
        assert load_cached(lm) is None, what
        again, measured = load_or_measure(lm, repeats=1)
        assert measured and again.curve.sizes == first.curve.sizes, what
        assert load_cached(lm) is not None, what


def test_text_that_is_not_utf8_is_one_line_naming_its_source(capsys, tmp_path, tiny_pair, suite):
    """A Latin-1 suite file, or Latin-1 on `generate -`'s standard input, ended in "internal error"."""
    latin = tmp_path / "latin1.jsonl"
    latin.write_bytes('{"id": "a", "category": "qa", "prompt": "caf\xe9"}\n'.encode("latin-1"))
    argv = bench(tiny_pair, latin, tmp_path / "out")
    refused(capsys, argv, f"suite '{latin}' is not UTF-8 text", "byte 0xe9")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "draftlab.cli",
            "generate",
            "-",
            *pair_args(tiny_pair),
            "--max-new-tokens",
            "2",
        ],
        input="caf\xe9".encode("latin-1"),
        capture_output=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        timeout=300,
    )
    assert done.returncode == 2
    one_line(done.stderr.decode(), ["standard input is not UTF-8 text", "byte 0xe9"])


def test_sigterm_ends_a_run_as_ctrl_c_does_and_resume_finishes_it(tmp_path, tiny_pair):
    """SIGTERM exited 143 with no message; now one line, the records written so far kept."""
    rows = [
        {"id": f"p{i}", "category": "qa", "prompt": f"the cat number {i} sat on the mat"} for i in range(40)
    ]
    many = write_suite(tmp_path / "many.jsonl", rows)
    out = tmp_path / "run"
    argv = bench(tiny_pair, many, out)
    argv[argv.index("--max-new-tokens") + 1] = "32"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.Popen(
        [sys.executable, "-m", "draftlab.cli", *argv], stderr=subprocess.PIPE, text=True, env=env
    )
    results = out / "results.jsonl"
    for _ in range(600):  # until the first record is written (at most 60 s)
        if results.exists() and results.read_text().count("\n") >= 1:
            break
        run.poll()
        assert run.returncode is None, run.stderr.read()
        time.sleep(0.1)
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=120)
    assert run.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines()[-1] == (
        "draftlab: terminated; results written so far are kept (rerun with --resume)"
    ), err
    generations = len(json.loads((out / "run.json").read_text())["labels"]) * len(rows)
    kept = results.read_text().count("\n")
    assert 1 <= kept < generations
    assert main([*argv, "--resume"]) == 0
    assert results.read_text().count("\n") == generations


def test_generate_has_no_resume_to_suggest(monkeypatch, capsys, tiny_pair):
    """Ctrl-C in `generate` suggested a --resume it does not have."""
    from draftlab.cli import generate

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(generate, "run", interrupted)
    assert main(["generate", "hello", *pair_args(tiny_pair)]) == 130
    assert capsys.readouterr().err.strip() == "draftlab: interrupted"


def test_a_damaged_model_folder_is_one_line_naming_the_folder(capsys, tmp_path, tiny_pair, suite):
    """A truncated model.safetensors ended in "internal error: SafetensorError"; a corrupt
    config.json read as "not available offline"; a file that is not a folder, as a JSON error."""
    import shutil

    target = tmp_path / "cut"
    shutil.copytree(tiny_pair["llama"][0], target)
    weights = target / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    argv = ["generate", "hello", "--target", str(target), "--method", "ar", "--max-new-tokens", "2"]
    refused(capsys, argv, f"'{target}'", "could not be loaded")
    broken = tmp_path / "config"
    shutil.copytree(tiny_pair["llama"][0], broken)
    (broken / "config.json").write_text('{"model_type": "llama", ')
    refused(
        capsys,
        ["generate", "hi", "--target", str(broken), "--method", "ar"],
        f"'{broken}'",
        "could not be read",
    )
    garbage = tmp_path / "model.gguf"
    garbage.write_bytes(b"not a model at all")
    refused(
        capsys, ["generate", "hi", "--target", str(garbage), "--method", "ar"], str(garbage), "is a file, not"
    )
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"GGUF" + bytes(60))
    refused(
        capsys,
        ["generate", "hi", "--target", str(fake), "--method", "ar"],
        "is a GGUF file",
        "--engine llamacpp",
    )


def test_report_names_a_wrong_typed_value_and_a_torn_last_line(capsys, tmp_path, tiny_pair, suite):
    out = tmp_path / "run"
    assert main(bench(tiny_pair, suite, out)) == 0
    capsys.readouterr()
    results = out / "results.jsonl"
    good = results.read_text()
    rows = good.splitlines()
    bad = json.loads(rows[1])
    bad["total_s"] = "fast"
    results.write_text("\n".join([rows[0], json.dumps(bad), *rows[2:]]) + "\n")
    refused(capsys, ["report", str(out), "--quiet"], "results.jsonl:2", "'total_s' is 'fast', not a number")
    # A last line cut short by an interrupted write is left out, and the report says so.
    results.write_text(good + rows[0][:40])
    assert main(["report", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"results.jsonl:{len(rows) + 1} is cut short" in printed.replace("\n", " "), printed


def test_a_read_only_draftlab_home_keeps_the_measured_profile_and_says_so(
    capsys, tmp_path, tiny_pair, monkeypatch
):
    """A read-only home made the bench exit 1 after profiling ("internal error: OSError"); the
    profile is used as measured, with one warning, and any other refused write is one line."""
    import errno

    from draftlab.models import profile

    monkeypatch.setenv("DRAFTLAB_PROFILE_DIR", str(tmp_path / "profiles"))

    def read_only(lm, measured):
        raise OSError(errno.EROFS, "Read-only file system", str(tmp_path / "profiles" / "x.json"))

    monkeypatch.setattr(profile, "save", read_only)
    from draftlab.models.loading import ModelSpec, load_model

    lm = load_model(ModelSpec(str(tiny_pair["llama"][0]), dtype="float32"))
    measured, fresh = profile.load_or_measure(lm, repeats=1)
    assert fresh and measured.curve.ms
    assert "could not be cached" in capsys.readouterr().err
    # Elsewhere: a refused write is the machine's answer, not a bug (exit 2, one line, the path).
    from draftlab.cli import report as report_cli

    def refused_write(args):
        raise OSError(errno.EROFS, "Read-only file system", "/somewhere/summary.json")

    monkeypatch.setattr(report_cli, "run", refused_write)
    refused(capsys, ["report", str(tmp_path)], "Read-only file system: '/somewhere/summary.json'")
