"""llama-server as an engine: found for this CPU only, started on 127.0.0.1 and always stopped, its
drafters run as methods with their own counters, greedy output checked against its own `ar`.

The server is the real one that scripts/install-llamacpp.sh builds. Without it these tests skip,
unless DRAFTLAB_REQUIRE_LLAMACPP is set (the test command sets it after building)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from helpers import QUIET, check_error, seed_profile, synthetic

from draftlab.cli import main
from draftlab.engines.llama_server import binary
from draftlab.engines.llama_server.decoder import LlamaServerDecoder, ServerPool
from draftlab.engines.llama_server.server_args import DEFAULT_STORAGE
from draftlab.engines.llamacpp.load import _gguf_tokenizer, load_llamacpp, locate
from draftlab.errors import DraftlabError
from draftlab.models.prompting import encode_prompt
from draftlab.sampling import SamplingParams

TARGET = "smollm2-135m-instruct"
SERVER = binary.find_server()
if SERVER is None and os.environ.get("DRAFTLAB_REQUIRE_LLAMACPP"):
    pytest.fail(
        "DRAFTLAB_REQUIRE_LLAMACPP is set but llama-server is not built (scripts/install-llamacpp.sh)",
        pytrace=False,
    )
needs_server = pytest.mark.skipif(
    SERVER is None, reason="llama-server is not built (scripts/install-llamacpp.sh)"
)
PROMPTS = [
    "Summarize: The cat sat on the mat. The cat was happy on the mat, and the mat was warm.",
    "Correct the grammar: she go to school every days and she like it very much.",
]


def _our_servers() -> list[psutil.Process]:
    """llama-servers this test process started and left running (the other test worker's own
    servers, started in their own sessions, are none of this test's business)."""
    return [p for p in psutil.Process().children(recursive=True) if p.name() == "llama-server"]


def _fake_server(folder: Path, cpu: str) -> Path:
    exe = folder / "bin" / "llama-server"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    (folder / "cpu.txt").write_text(cpu + "\n")
    return exe


def test_only_a_server_built_for_this_cpu_is_used(tmp_path, monkeypatch):
    monkeypatch.delenv(binary.ENV, raising=False)
    monkeypatch.setenv("DRAFTLAB_BUILD_CACHE", str(tmp_path))
    _fake_server(tmp_path / "llama.cpp-0.3.36-other", "model name\t: Another CPU\nflags\t\t: sse2")
    assert binary.find_server() is None
    with pytest.raises(DraftlabError, match="install-llamacpp.sh"):
        binary.server_binary()
    mine = _fake_server(tmp_path / "llama.cpp-0.3.36-mine", binary.cpu_identity())
    assert binary.find_server() == mine
    # Two builds for this CPU (native and AVX2-only): the one this environment installed from wins,
    # whichever is newer.
    older = _fake_server(tmp_path / "llama.cpp-0.3.36-avx2", binary.cpu_identity())
    os.utime(older.parent.parent, (0, 0))
    pointer = tmp_path / "prefix" / binary.BUILD_POINTER
    pointer.parent.mkdir()
    monkeypatch.setattr(binary.sys, "prefix", str(pointer.parent))
    assert binary.find_server() == mine, "no pointer: the newest build"
    pointer.write_text(f"{older.parent.parent}\n")
    assert binary.find_server() == older
    monkeypatch.setenv(binary.ENV, str(tmp_path / "missing"))
    with pytest.raises(DraftlabError, match="not an executable llama-server"):
        binary.server_binary()


@pytest.fixture(scope="module")
def own():
    return load_llamacpp(TARGET)  # the target's own Q4_1 file: its passes are batch-invariant


def _pool(lm, tmp_path) -> ServerPool:
    # One thread: the other test worker holds the second core, and llama.cpp's threads spin-wait.
    return ServerPool(SERVER, Path(lm.path), 1, 1024, tmp_path / "llama-server.log")


@needs_server
def test_ngram_drafters_write_the_servers_own_ar_tokens_and_count_their_drafts(own, tmp_path):
    pool = _pool(own, tmp_path)
    greedy = SamplingParams()
    try:
        ar = LlamaServerDecoder(pool, [], own.tokenizer)
        # ngram-simple drafts only after its lookup n-gram recurs, 12 tokens by default: whether a
        # 48-token answer repeats 12 tokens in a row depends on the CPU's rounding (on a Zen3 no
        # answer did, and it drafted nothing). A 3-gram recurs in any answer that copies its prompt.
        size = ["--spec-ngram-simple-size-n", "3"]
        ngram = LlamaServerDecoder(
            pool, ["--spec-type", "ngram-simple", "--spec-draft-n-max", "8", *size], own.tokenizer
        )
        drafted = 0
        for text in PROMPTS:
            ids = encode_prompt(own, text, chat=True)
            plain = ar.generate(ids, 48, greedy)
            assert plain.stats.drafted == 0 and plain.stats.rounds == plain.stats.new_tokens > 0
            fast = ngram.generate(ids, 48, greedy)
            assert fast.tokens == plain.tokens  # Q4_1: every pass size takes the same kernels
            assert fast.stats.rounds == fast.stats.new_tokens - fast.stats.accepted
            drafted += fast.stats.drafted
            assert 0 < fast.stats.prefill_s < fast.stats.total_s
        assert drafted > 0, "the copying prompts gave ngram-simple something to draft"
        assert len(pool.starts) >= 2  # the plain server stopped before the drafting one started
    finally:
        pool.close()


@needs_server
def test_the_server_is_stopped_on_success_on_error_and_on_ctrl_c(own, tmp_path):
    pool = _pool(own, tmp_path)
    server = pool.server([])
    pid = server.process.pid
    assert psutil.pid_exists(pid) and server.port > 0
    pool.close()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    # Ctrl-C in a process that holds a server: the server goes with it.
    code = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from draftlab.engines.llama_server.server import LlamaServer\n"
        f"s = LlamaServer(Path({str(SERVER)!r}), Path({own.path!r}), [], 1, 512, Path({str(tmp_path / 'l.log')!r})).start()\n"
        "print(s.process.pid, flush=True)\n"
        "raise KeyboardInterrupt\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    child = int(done.stdout.split()[0])
    assert "KeyboardInterrupt" in done.stderr
    assert not psutil.pid_exists(child), "llama-server outlived the process that started it"


@needs_server
def test_a_neighbour_on_the_chosen_port_is_never_taken_for_the_server(own, tmp_path, monkeypatch):
    """The free port is chosen before llama-server binds it. Here another process (a healthy fake
    server of another name) holds it: ours fails to bind and starts again on another port, and
    only a server answering to its own name counts as started."""
    import http.server  # noqa: PLC0415
    import threading  # noqa: PLC0415

    from draftlab.engines.llama_server import server as server_module  # noqa: PLC0415

    class Neighbour(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = json.dumps({"status": "ok", "model_alias": "someone-else"}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    neighbour = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Neighbour)
    threading.Thread(target=neighbour.serve_forever, daemon=True).start()
    taken = neighbour.server_address[1]
    ports = iter([taken])
    free = server_module.free_port
    monkeypatch.setattr(server_module, "free_port", lambda: next(ports, None) or free())
    try:
        with server_module.LlamaServer(SERVER, Path(own.path), [], 1, 512, tmp_path / "l.log") as s:
            assert s.port != taken and s._who_answers() == s.alias
            answer = s.complete({"prompt": "Once upon a time", "n_predict": 2})
            assert "content" in answer
    finally:
        neighbour.shutdown()


@needs_server
def test_no_server_outlives_a_kill_9_of_the_process_that_started_it(own, tmp_path):
    """`kill -9` runs no handler of ours: the kernel's parent-death signal stops the server."""
    code = (
        "import time\n"
        "from pathlib import Path\n"
        "from draftlab.engines.llama_server.server import LlamaServer\n"
        f"s = LlamaServer(Path({str(SERVER)!r}), Path({own.path!r}), [], 1, 512, Path({str(tmp_path / 'l.log')!r})).start()\n"
        "print(s.process.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert psutil.pid_exists(child)
        parent.kill()  # SIGKILL
        parent.wait(timeout=30)
        gone = psutil.wait_procs([psutil.Process(child)], timeout=5)[0] if psutil.pid_exists(child) else [1]
        assert gone, "llama-server outlived a kill -9 of its parent by 5 s"
    finally:
        parent.kill()


@pytest.fixture
def priced(tmp_path, monkeypatch):
    """Gives the server's file a flat llama.cpp cost curve, in a profile cache of the test's own.
    The report prices the server's rounds with that file's curve; measuring a real one took 45-63 s
    on a 2-core AMD EPYC Zen3, and test_llamacpp.py measures real ones."""
    monkeypatch.setenv("DRAFTLAB_PROFILE_DIR", str(tmp_path / "profiles"))

    def seed(name: str, **load) -> None:
        seed_profile(load_llamacpp(name, **load), synthetic(10.0))

    return seed


@needs_server
def test_bench_runs_llama_servers_drafters_beside_its_ar(tmp_path, capsys, monkeypatch, priced):
    priced(TARGET, storage=DEFAULT_STORAGE)  # the server runs the catalogue target's BF16 export
    out = tmp_path / "run"
    # One drafter (its calibration restarts the server per candidate setting, the suite's slowest
    # part), two subtasks: each gets its own choice.
    argv = ["bench", "--engines", "llama-server", "--methods", "ar,ngram-simple", "--limit", "1"]
    argv += [
        "--subtasks",
        "summarization,grammar correction",
        "--max-new-tokens",
        "24",
        "--out",
        str(out),
        *QUIET,
    ]
    assert main(argv) == 0
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    labels = {r["label"] for r in records}
    drafters = {"ngram-simple@llama-server"}
    assert labels == {"ar@llama-server", *drafters, *(d + " default" for d in drafters)}
    assert all(r["params"]["engine"] == "llama-server" for r in records)
    assert sum(r["drafted"] for r in records if r["label"].endswith(" default")) > 0
    run = json.loads((out / "run.json").read_text())
    assert "draft-mtp" in run["extra"]["llama_server"]["not_run"]  # listed as available, not run
    settings = run["extra"]["llama_server"]["settings"]
    # Calibrated for the run's subtasks only, each with its own choice (None: no drafting there).
    assert set(settings) == {"ngram-simple"}
    for method, data in settings.items():
        assert set(data["chosen"]) == {"summarization", "grammar correction"}
        assert set(data["plain_tok_s"]) == set(data["chosen"])
        for record in records:
            if record["label"] != method + "@llama-server":
                continue
            setting = data["chosen"][record["subtask"]]
            used = record["params"]["server_args"]  # what this generation ran with
            assert used == ([] if setting is None else ["--spec-type", method, *data["settings"][setting]])
            assert record["params"]["server_settings"] == "chosen by cost per subtask"
            if setting is None:
                assert record["drafted"] == 0
    # The report says what was chosen and why each drafter wins or loses (its round cost split).
    report = (out / "report.md").read_text()
    assert "settings chosen by cost" in report and "cost per round" in report
    summary = json.loads((out / "summary.json").read_text())
    rounds = summary["llama_server"]["rounds"]
    assert rounds["ar@llama-server"]["round_steps"] == pytest.approx(1.0)
    assert rounds["ngram-simple@llama-server default"]["verify_ms"] > 0
    # One server at a time, each stopped: none is left.
    assert (out / "llama-server.log").read_text().count("\n$ ") >= len(records)
    assert not _our_servers()
    # A resumed run keeps the choices it made rather than calibrate again.
    (out / "results.jsonl").write_text(
        "".join(line + "\n" for line in (out / "results.jsonl").read_text().splitlines()[:-1])
    )
    assert main([*argv, "--resume"]) == 0
    assert json.loads((out / "run.json").read_text())["extra"]["llama_server"]["settings"] == settings


@needs_server
def test_bench_on_llama_server_takes_a_users_gguf_target_and_draft(tmp_path, capsys, priced):
    """A GGUF is what a llama-server user has: the shipped Q4_1 file given as a path (as a user's
    own file) runs the server's drafters, with a GGUF draft as it is (here the same file: every
    drafted token is the target's own)."""
    gguf = str(locate(TARGET)[0])
    priced(gguf)
    out = tmp_path / "run"
    argv = ["bench", "--engines", "llama-server", "--target", gguf, "--draft", gguf, "--limit", "1"]
    argv += ["--methods", "ar,ngram-mod,sps", "--server-settings", "default", "--subtasks", "summarization"]
    before = _gguf_tokenizer.cache_info()
    assert main([*argv, "--max-new-tokens", "24", "--out", str(out), *QUIET]) == 0
    after = _gguf_tokenizer.cache_info()
    # The file's vocabulary is rebuilt into a tokenizer once (10 s), not once per role and engine.
    assert after.misses - before.misses <= 1 and after.hits > before.hits
    capsys.readouterr()
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    tokens = {r["label"]: r["tokens"] for r in records}
    assert set(tokens) == {"ar@llama-server", "ngram-mod@llama-server", "sps@llama-server"}
    sps = next(r for r in records if r["label"] == "sps@llama-server")
    assert ["-md", gguf] == sps["params"]["server_args"][2:4]  # the user's file, not a copy
    assert sps["accepted"] > 0 and sps["accepted"] >= 0.9 * sps["drafted"]
    run = json.loads((out / "run.json").read_text())
    assert run["target"] == gguf and run["extra"]["llama_server"]["model"] == gguf
    assert not _our_servers()
    # A speculators head cannot be converted without the target's transformers folder: one line.
    head = ["--head", "smollm2-135m-eagle3", "--methods", "eagle", "--out", str(tmp_path / "no")]
    check_error(capsys, [*argv[:5], *head], "--head", "GGUF")


@needs_server
def test_concurrency_sweep_on_llama_server_with_one_slot_per_request(tmp_path, priced):
    priced(TARGET, storage=DEFAULT_STORAGE)
    out = tmp_path / "sweep"
    argv = ["sweep", "concurrency", "--engine", "llama-server", "--methods", "ar,ngram-simple"]
    argv += ["--concurrency", "1,2", "--limit", "1", "--subtasks", "summarization"]
    argv += ["--max-new-tokens", "16", "--out", str(out), *QUIET]
    assert main(argv) == 0
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    by_label: dict[str, list[dict]] = {}
    for r in records:
        by_label.setdefault(r["label"], []).append(r)
    assert {k: len(v) for k, v in by_label.items()} == {
        "ar@llama-server c=1": 1,
        "ngram-simple@llama-server c=1": 1,
        "ar@llama-server c=2": 2,
        "ngram-simple@llama-server c=2": 2,
    }
    for group in by_label.values():
        # A batch's requests share its wall time; each keeps its own latency.
        assert len({r["params"]["batch_wall_s"] for r in group}) == 1
        assert all(0 < r["params"]["latency_s"] <= r["params"]["batch_wall_s"] + 1e-6 for r in group)
    log = (out / "llama-server.log").read_text()
    assert "-np 2" in log and "-np 1" in log
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["concurrency"]["levels"]["ngram-simple@llama-server"]) == {"1", "2"}
    assert not _our_servers()


@needs_server
def test_audit_on_llama_server_compares_its_drafters_with_its_own_ar(tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    result = tmp_path / "audit.json"
    argv = ["audit", "--engine", "llama-server", "--methods", "ngram-simple,ngram-mod"]
    argv += ["--prompts", str(prompts), "--max-new-tokens", "24", "--json", str(result), "--quiet"]
    code = main(argv)
    data = json.loads(result.read_text())
    assert data["engine"] == "llama-server" and data["recheck"] == "q4_1_one_thread"
    for method in ("ngram-simple", "ngram-mod"):
        greedy = data["methods"][method]["greedy"]
        assert greedy["prompts"] == len(PROMPTS)
        # Every difference was rerun on the Q4_1 copy on one thread, which decides.
        assert all(d["q4_1_one_thread"] in ("matches", "diverges") for d in greedy["divergences"])
    assert code == (1 if data["not_lossless"] else 0)
    assert data["not_lossless"] == [], data["verdict"]
    assert "lossless" in capsys.readouterr().out
    assert not _our_servers()


def test_a_drafter_of_llama_server_elsewhere_is_a_one_line_error(capsys, tiny_pair):
    target, _ = tiny_pair["llama"]
    check_error(capsys, ["generate", "--target", str(target), "--method", "ngram-mod", "hi"], "ngram-mod")


def test_a_drafter_is_kept_only_where_its_measured_gain_clears_the_margin():
    """The choice from calibration rates alone (any CPU's figures): the fastest n-max if it beats the
    plain server by MIN_GAIN, else no drafting."""
    from draftlab.engines.llama_server.tuning import MIN_GAIN, choose_setting

    plain = 100.0
    assert choose_setting({"1": 104.0, "2": 110.0, "4": 90.0}, plain) == "2"
    assert choose_setting({"1": 100.0 * MIN_GAIN - 0.01, "8": 99.0}, plain) is None  # a tie is not a gain
    assert choose_setting({}, plain) is None
