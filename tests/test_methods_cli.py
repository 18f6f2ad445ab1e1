"""The method registry, `draftlab profile`, `--dtype auto` and "vs best ar", end to end from the CLI."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from helpers import QUIET, pair_args, write_suite

from draftlab.bench.records import RunInfo, read_records
from draftlab.bench.summary import summarize
from draftlab.cli import build_parser, main
from draftlab.decode.spec import DEFAULTS, REGISTRY, DecoderConfig, declared_settings, is_speculative

FIXTURE = Path(__file__).parent / "fixtures" / "run_small"


def test_every_cli_default_is_the_config_default():
    args = build_parser().parse_args(["generate", "x"])
    for name in (
        "gamma",
        "draft_confidence",
        "pld_tokens",
        "max_ngram",
        "fixed_k",
    ):
        assert getattr(args, name) == getattr(DEFAULTS, name), name
    # Drafters' own settings (BiLD's thresholds): the option's default is the declared one.
    for setting in declared_settings():
        assert getattr(args, setting.name) == DEFAULTS.option(setting.name) == setting.default, setting.name


def test_each_method_records_only_its_own_settings_and_draft_length():
    for name, spec in REGISTRY.items():
        config = DecoderConfig(method=name)
        settings = config.settings()
        assert set(settings) - {"use_cache", "fixed_k", "tree_budget"} == set(spec.params), name
        assert ("fixed_k" in settings) == spec.cost_aware
        assert ("tree_budget" in settings) == spec.tree
        assert spec.gamma(config) == (config.value(spec.draft_length) if spec.draft_length else None)
    assert (
        DecoderConfig.of(method="pld", pld_tokens=7).spec.gamma(DecoderConfig.of(method="pld", pld_tokens=7))
        == 7
    )
    assert not is_speculative("ar") and not is_speculative("hf-greedy") and is_speculative("pld")


@pytest.mark.parametrize(
    ("method", "expected"), [("ar", None), ("pld", 7), ("bild", 5), ("sps", 3), ("hf-greedy", None)]
)
def test_generate_json_reports_each_methods_own_draft_length(tiny_pair, capsys, method, expected):
    lengths = ["--gamma", "3", "--pld-tokens", "7", "--max-small-steps", "5", "--max-new-tokens", "4"]
    argv = ["generate", *pair_args(tiny_pair), "--method", method, *lengths, "--json", "the cat sat"]
    assert main(argv) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["gamma"] == expected
    assert record["sizing"] == ("cost-aware" if method in ("sps", "pld") else "fixed k")
    assert sum(record["stats"]["k_counts"]) == (record["stats"]["rounds"] if method in ("sps", "pld") else 0)


def test_profile_command_writes_tables_json_and_plot(tiny_pair, tmp_path, capsys):
    target, draft = tiny_pair["llama"]
    out = tmp_path / "prof"
    argv = ["profile", "--target", str(target), "--draft", str(draft), "--repeats", "1", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "Break-even acceptance" in printed and "--dtype auto picks" in printed
    data = json.loads((out / "profile.json").read_text())
    assert {"target/float32", "draft/float32", "target/bfloat16"} <= set(data["profiles"])
    assert data["dtype_choice"]["dtype"] in data["dtype_choice"]["predicted_plain_s"]
    assert data["hardware"]["kind"] == "cpu"
    assert (out / "profile.png").stat().st_size > 0
    # The second run reads the cache: nothing is measured again.
    assert main([*argv[:-1], str(tmp_path / "again")]) == 0
    assert "cached" in capsys.readouterr().out


def test_profile_bad_input_is_one_line(tiny_pair, tmp_path, capsys):
    target, _ = tiny_pair["llama"]
    assert main(["profile", "--target", str(target), "--repeats", "0"]) == 2
    assert "--repeats must be >= 1, got 0" in capsys.readouterr().err
    file = tmp_path / "f"
    file.write_text("x")
    assert main(["profile", "--target", str(target), "--out", str(file)]) == 2
    assert "is a file" in capsys.readouterr().err


def test_bench_with_dtype_auto_records_its_choice(tiny_pair, tmp_path, capsys):
    target, draft = tiny_pair["llama"]
    suite = write_suite(
        tmp_path / "suite.jsonl", [{"id": "a", "category": "qa", "prompt": "the cat sat on the mat the cat"}]
    )
    out = tmp_path / "run"
    models = ["--target", str(target), "--draft", str(draft)]  # --dtype auto, the default
    run = ["--suite", str(suite), "--methods", "ar,sps,pld", "--max-new-tokens", "8", "--out", str(out)]
    argv = ["bench", *models, *run, *QUIET]
    assert main(argv) == 0
    run = json.loads((out / "run.json").read_text())
    choice = run["extra"]["dtype_choice"]
    assert choice["dtype"] in ("float32", "bfloat16", "float16") and "predicted" in choice["reason"]
    assert run["extra"]["sizing"] == "cost-aware"
    hw = run["extra"]["hardware"]
    assert hw["kind"] == "cpu" and hw["cpu_id"] and set(hw["isa_flags"]) <= set(hw["cpu_flags"])
    report = (out / "report.md").read_text()
    assert "dtype chosen:" in report and f"({hw['cpu_id']})" in report
    records = read_records(out / "results.jsonl")
    sized = [r for r in records if r.method in ("sps", "pld")]
    assert all(sum(r.k_counts) + r.paced_rounds == r.rounds for r in sized)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["overall"]["sps"]["vs_best_ar"] is not None
    assert summary["overall"][summary["overall"]["sps"]["best_plain"]]["vs_best_ar"] == 1.0


def test_vs_best_ar_compares_with_the_fastest_plain_decoding():
    records = read_records(FIXTURE / "results.jsonl")
    run = RunInfo.load(FIXTURE)
    # A second plain decoder that is twice as fast as ar on every generation (say, another dtype).
    fast = [
        dataclasses.replace(
            r, label="ar float32", total_s=r.total_s / 2, decode_s=r.decode_s / 2, prefill_s=r.prefill_s / 2
        )
        for r in records
        if r.label == "ar"
    ]
    before = summarize(records, run)
    after = summarize(records + fast, dataclasses.replace(run, labels=[*run.labels, "ar float32"]))
    for label in ("sps", "pld"):
        assert before["overall"][label]["best_plain"] == "ar"
        assert before["overall"][label]["vs_best_ar"] == pytest.approx(before["overall"][label]["speedup"])
        assert after["overall"][label]["best_plain"] == "ar float32"
        assert after["overall"][label]["vs_best_ar"] == pytest.approx(before["overall"][label]["speedup"] / 2)
        # the speed-up over the same-dtype ar is unchanged
        assert after["overall"][label]["speedup"] == pytest.approx(before["overall"][label]["speedup"])
    assert after["overall"]["ar"]["vs_best_ar"] == pytest.approx(0.5)


@pytest.mark.parametrize("method", ["pld-tree", "sps-tree", "hybrid", "suffix"])
def test_generate_runs_tree_methods_and_reports_their_trees(tiny_pair, capsys, method):
    argv = ["generate", *pair_args(tiny_pair), "--method", method, "--tree-budget", "8", "--json"]
    assert main([*argv, "--max-new-tokens", "12", "the cat sat on the mat and the cat sat on the"]) == 0
    record = json.loads(capsys.readouterr().out)
    stats = record["stats"]
    assert stats["new_tokens"] > 0 and stats["tree_fallback"] is None
    if method in ("sps-tree", "hybrid"):
        assert stats["tree_rounds"] > 0 and stats["tree_nodes"] > stats["tree_rounds"]


def test_a_tree_method_on_an_encoder_decoder_target_is_one_line_exit_2(tiny_pair, capsys):
    argv = ["generate", *pair_args(tiny_pair, "t5"), "--method", "pld-tree", "--max-new-tokens", "4", "hi"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "decoder-only" in err and "pld-tree" in err
