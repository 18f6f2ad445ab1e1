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
from helpers import QUIET, check_error

from draftlab.cli import main
from draftlab.engines.llama_server import binary
from draftlab.engines.llama_server.decoder import LlamaServerDecoder, ServerPool
from draftlab.engines.llamacpp.load import load_llamacpp
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
    _fake_server(tmp_path / "llama-server-0.3.36-other", "model name\t: Another CPU\nflags\t\t: sse2")
    assert binary.find_server() is None
    with pytest.raises(DraftlabError, match="install-llamacpp.sh"):
        binary.server_binary()
    mine = _fake_server(tmp_path / "llama-server-0.3.36-mine", binary.cpu_identity())
    assert binary.find_server() == mine
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
        ngram = LlamaServerDecoder(
            pool, ["--spec-type", "ngram-simple", "--spec-draft-n-max", "8"], own.tokenizer
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
def test_bench_runs_llama_servers_drafters_beside_its_ar(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    argv = ["bench", "--engines", "llama-server", "--methods", "ar,ngram-mod,ngram-simple", "--limit", "1"]
    argv += [
        "--subtasks",
        "summarization,grammar correction",
        "--max-new-tokens",
        "32",
        "--out",
        str(out),
        *QUIET,
    ]
    assert main(argv) == 0
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    labels = {r["label"] for r in records}
    drafters = {"ngram-mod@llama-server", "ngram-simple@llama-server"}
    assert labels == {"ar@llama-server", *drafters, *(d + " default" for d in drafters)}
    assert all(r["params"]["engine"] == "llama-server" for r in records)
    assert sum(r["drafted"] for r in records if r["label"].endswith(" default")) > 0
    run = json.loads((out / "run.json").read_text())
    settings = json.dumps(run)
    assert "draft-dflash" in settings  # listed as available, not run
    for record in records:
        if record["label"] in drafters:  # chosen by cost: an n_max measured to pay, or no drafting
            chosen = record["params"]["server_args"]
            assert chosen == [] or "--spec-draft-n-max" in chosen
            assert record["params"]["server_settings"].startswith("chosen by cost")
            assert (chosen == []) == (record["drafted"] == 0)
    assert '"tok_s_by_n_max"' in settings and '"plain_tok_s"' in settings
    # One server at a time, each stopped: none is left.
    assert (out / "llama-server.log").read_text().count("\n$ ") >= len(records)
    assert not [p for p in psutil.process_iter(["name"]) if p.info["name"] == "llama-server"]


def test_a_drafter_of_llama_server_elsewhere_is_a_one_line_error(capsys, tiny_pair):
    target, _ = tiny_pair["llama"]
    check_error(capsys, ["generate", "--target", str(target), "--method", "ngram-mod", "hi"], "ngram-mod")


def test_a_drafter_is_kept_only_where_its_measured_gain_clears_the_margin():
    """The choice from calibration rates alone (any CPU's figures): the fastest n-max if it beats the
    plain server by MIN_GAIN, else no drafting."""
    from draftlab.engines.llama_server.tuning import MIN_GAIN, choose_n_max

    plain = 100.0
    assert choose_n_max({"1": 104.0, "2": 110.0, "4": 90.0}, plain) == "2"
    assert choose_n_max({"1": 100.0 * MIN_GAIN - 0.01, "8": 99.0}, plain) is None  # a tie is not a gain
    assert choose_n_max({}, plain) is None
