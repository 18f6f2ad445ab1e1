"""Engine choice, engine arguments and refusals: all before anything loads (no vLLM needed).

The vllm engine itself runs in test_vllm.py, against a real vLLM.
"""

from __future__ import annotations

import importlib.util

import pytest

from draftlab.cli import main
from draftlab.decode.spec import REGISTRY, DecoderConfig
from draftlab.engines import counterpart, engines_for
from draftlab.engines.vllm.config import (
    VLLM_METHODS,
    EngineArgs,
    cpu_thread_binding,
    parse_engine_arg,
    speculative_config,
)
from draftlab.errors import DraftlabError

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def run_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_our_methods_map_onto_vllms_speculative_config():
    config = DecoderConfig.of(method="pld", pld_tokens=7, max_ngram=5)
    assert speculative_config(config, None, None) == {
        "method": "ngram",
        "num_speculative_tokens": 7,
        "prompt_lookup_max": 5,
        "prompt_lookup_min": 1,
    }
    sps = speculative_config(DecoderConfig(method="sps", gamma=3), "/drafts/d", None)
    assert sps == {"method": "draft_model", "model": "/drafts/d", "num_speculative_tokens": 3}
    assert speculative_config(DecoderConfig(method="ar"), None, None) is None
    eagle = speculative_config(DecoderConfig(method="eagle3", gamma=5), None, "/heads/e3")
    assert eagle == {"method": "eagle3", "num_speculative_tokens": 5, "model": "/heads/e3"}
    dflash = speculative_config(DecoderConfig(method="dflash", gamma=7), None, "/heads/df")
    assert dflash == {"method": "dflash", "num_speculative_tokens": 7, "model": "/heads/df"}
    merged = speculative_config(config, None, None, {"prompt_lookup_min": 2})
    assert merged["prompt_lookup_min"] == 2 and merged["prompt_lookup_max"] == 5
    with pytest.raises(DraftlabError, match="--speculator"):
        speculative_config(DecoderConfig(method="eagle"), None, None)
    with pytest.raises(DraftlabError, match="--draft"):
        speculative_config(DecoderConfig(method="sps"), None, None)
    with pytest.raises(DraftlabError, match="no vllm counterpart"):
        speculative_config(DecoderConfig(method="bild"), None, None)


def test_the_registry_says_which_engine_runs_what():
    assert set(VLLM_METHODS) == {"ar", "sps", "pld", "suffix", "eagle", "eagle1", "eagle3", "mtp", "dflash"}
    assert set(engines_for(REGISTRY["eagle1"])) == {"vllm"}
    # Our EAGLE-3 head on our loop, on vLLM as its eagle3 and on llama-server as its draft-eagle3;
    # llama-cpp-python hands our loop no hidden states.
    assert set(engines_for(REGISTRY["eagle"])) == {"hf", "vllm", "llama-server"}
    assert set(engines_for(REGISTRY["eagle-tree"])) == {"hf"}
    # Our DFlash drafter: our loop, vLLM's dflash, llama-server's draft-dflash; its tree is ours only.
    assert set(engines_for(REGISTRY["dflash"])) == {"hf", "vllm", "llama-server"}
    assert set(engines_for(REGISTRY["dflash-tree"])) == {"hf"}
    assert set(engines_for(REGISTRY["bild"])) == {"hf", "llamacpp"}
    assert set(engines_for(REGISTRY["sps"])) == {"hf", "llamacpp", "vllm", "llama-server"}
    # llama-server's own drafters run there only; pld has no llama-server counterpart of its own.
    assert set(engines_for(REGISTRY["ngram-mod"])) == {"llama-server"}
    assert "llama-server" not in engines_for(REGISTRY["pld"])
    # A combination, as llama-server combines drafters: our head and its n-gram hash in one server.
    combined = REGISTRY["eagle+ngram-mod"]
    assert combined.needs_head and engines_for(combined) == ("llama-server",)
    assert counterpart("llama-server", combined) == "draft-eagle3,ngram-mod"
    assert counterpart("llama-server", REGISTRY["eagle"]) == "draft-eagle3"
    # transformers' own generate() decodes these: no other engine's model can stand in.
    assert set(engines_for(REGISTRY["hf-assisted"])) == {"hf"}


def test_engine_arguments_parse_as_json_and_are_checked():
    assert parse_engine_arg("max_model_len=2048") == ("max_model_len", 2048)
    assert parse_engine_arg("enforce_eager=true") == ("enforce_eager", True)
    assert parse_engine_arg('speculative_config={"prompt_lookup_min": 2}') == (
        "speculative_config",
        {"prompt_lookup_min": 2},
    )
    assert parse_engine_arg("quantization=fp8") == ("quantization", "fp8")  # a bare word stays text
    for bad in ("max_model_len", "=3", "a b=1"):
        with pytest.raises(DraftlabError, match="KEY=VALUE"):
            parse_engine_arg(bad)
    kwargs = EngineArgs(2, 3, "ray", {"max_model_len": 512}).kwargs("bfloat16", 7)
    assert kwargs["tensor_parallel_size"] == 2 and kwargs["pipeline_parallel_size"] == 3
    assert kwargs["distributed_executor_backend"] == "ray" and kwargs["max_model_len"] == 512
    assert kwargs["enable_prefix_caching"] is False and kwargs["disable_log_stats"] is False
    with pytest.raises(DraftlabError, match="--tensor-parallel-size must be >= 1, got 0"):
        EngineArgs(tensor_parallel_size=0)
    with pytest.raises(DraftlabError, match="'slurm'"):
        EngineArgs(distributed_executor_backend="slurm")


def test_several_cpu_ranks_get_cores_of_their_own(monkeypatch):
    """vLLM's CPU workers (tensor x pipeline parallel ranks) each bind their OpenMP threads to an
    equal share of the cores, unless the user's VLLM_CPU_OMP_THREADS_BIND says where."""
    assert cpu_thread_binding(2, [0, 1]) == "0|1"
    assert cpu_thread_binding(2, list(range(8))) == "0-3|4-7"
    assert cpu_thread_binding(2, [0, 2, 4, 6]) == "0,2|4,6"  # an affinity mask with gaps
    assert cpu_thread_binding(4, [0, 1, 2, 3, 4]) == "0|1|2|3"  # the odd core left over
    assert cpu_thread_binding(3, [0, 1]) is None  # fewer cores than ranks: vLLM's own choice
    assert cpu_thread_binding(1, [0, 1]) is None  # one rank: vLLM's own choice
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3})
    args = EngineArgs(tensor_parallel_size=2)
    assert args.cpu_binding() == "0-1|2-3" and args.record()["cpu_threads_bind"] == "0-1|2-3"
    args.bind_cpu_threads()
    import os

    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0-1|2-3"
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "1|0")  # the user's binding stands
    assert args.cpu_binding() == "1|0"
    assert EngineArgs().cpu_binding() == "1|0"  # and is what vLLM reads with one rank too


BENCH = ["bench", "--subtasks", "qa", "--limit", "1", "--quiet"]


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--engine", "vllm", "--methods", "bild"], "method 'bild' is not available on engine vllm"),
        (
            ["--engines", "hf,vllm", "--methods", "pld-tree"],
            "method 'pld-tree' is not available on engine vllm",
        ),
        (["--methods", "eagle1"], "method 'eagle1' is not available on engine hf"),
        (
            ["--engines", "hf,llamacpp", "--methods", "eagle"],
            "method 'eagle' is not available on engine llamacpp",
        ),
        (["--engines", "hf,tgi"], "unknown engine 'tgi'"),
        (["--engine", "vllm", "--tensor-parallel-size", "0"], "--tensor-parallel-size must be >= 1, got 0"),
        (["--engine", "vllm", "--distributed-executor-backend", "slurm"], "'slurm'"),
        (["--engine", "vllm", "--vllm-arg", "max_model_len"], "'max_model_len' is not KEY=VALUE"),
        (["--engine", "vllm", "--vllm-alive", "-1"], "--vllm-alive must be >= 0, got -1"),
        (["--engines", "llamacpp", "--gguf-type", "q4"], "--gguf-type must be own, auto or one of"),
    ],
)
def test_engine_refusals_come_before_anything_loads(tmp_path, capsys, extra, named):
    out = tmp_path / "out"
    err = run_error(capsys, [*BENCH, *extra, "--target", str(tmp_path / "no-such-model"), "--out", str(out)])
    assert named in err  # and not the missing model: nothing was loaded
    assert not out.exists()


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_without_vllm_the_engine_names_its_install_command(tmp_path, capsys):
    err = run_error(capsys, [*BENCH, "--engine", "vllm", "--out", str(tmp_path / "out")])
    assert "pip install" in err and "install-vllm-cpu.sh" in err


def test_concurrency_needs_a_batching_engine_and_other_sweeps_need_hf(tmp_path, capsys):
    err = run_error(capsys, ["sweep", "concurrency", "--quiet", "--out", str(tmp_path / "a")])
    assert "needs --engine vllm" in err
    err = run_error(capsys, ["sweep", "gamma", "--engine", "vllm", "--quiet", "--out", str(tmp_path / "b")])
    assert "hf engine only" in err


def test_concurrency_levels_are_batch_throughput_and_say_where_speculation_stops():
    from test_properties import record

    from draftlab.bench.concurrency_summary import level_label, level_summary, predicted_concurrency_speedup

    rows = []
    # ar: 1 request of 10 tokens in 1 s; 4 requests of 10 tokens in a 2 s batch (shares of 0.5 s).
    # pld: 10 tokens in 0.5 s alone; at 4 its batch takes 4 s: it stops paying there.
    for label, level, share, accepted in (
        ("ar", 1, 1.0, 0),
        ("ar", 4, 0.5, 0),
        ("pld", 1, 0.5, 5),
        ("pld", 4, 1.0, 5),
    ):
        for i in range(level):
            r = record(level_label(label, level), f"e{i}", 10, share)
            r.drafted, r.accepted, r.rounds = 8 * (label == "pld"), accepted, 10 - accepted
            r.params = {"tpot_s": 0.01 * (i + 1)}
            r.greedy_match = True if label == "pld" else None
            rows.append(r)
    out = level_summary(rows, "ar")
    assert out["levels"]["ar"][1]["tokens_per_s"] == pytest.approx(10.0)
    assert out["levels"]["ar"][4]["tokens_per_s"] == pytest.approx(20.0)  # 40 tokens / 2 s
    assert out["levels"]["pld"][1]["speedup"] == pytest.approx(2.0)
    assert out["levels"]["pld"][4]["speedup"] == pytest.approx(0.5)
    assert out["levels"]["pld"][4]["tpot_ms_median"] == pytest.approx(25.0)
    assert out["levels"]["pld"][4]["tpot_ms_p90"] == pytest.approx(37.0)
    assert out["levels"]["pld"][4]["greedy_match"] == [4, 4]
    assert out["levels"]["pld"][1]["mean_accepted_length"] == pytest.approx(2.0)  # 10 tokens, 5 steps
    assert out["pays"]["pld"] == {"beats_up_to": 1, "stops_at": 4}
    # A flat cost curve up to 4 tokens, linear beyond: verification is free at c = 1 and not at 4.
    curve = {"sizes": [1, 4, 64], "contexts": [0, 512], "ms": [[10, 10, 160], [10, 10, 160]]}
    predicted_concurrency_speedup(out, curve, None, 100, {"pld": False})
    verified = out["levels"]["pld"][1]["verified_per_step"]  # 1 + 8 drafted / 5 steps = 2.6
    assert verified == pytest.approx(2.6)
    assert out["levels"]["pld"][1]["predicted_speedup"] == pytest.approx(2.0)  # 2 tokens a step, same cost
    assert out["levels"]["pld"][4]["predicted_speedup"] == pytest.approx(2.0 * 10 / (10 + 150 * 6 / 60))
