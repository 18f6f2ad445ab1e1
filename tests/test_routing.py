"""`--dtype auto` and per-generation dtype routing, driven by synthetic cost profiles.

A CPU's cost profile decides which dtype the target runs in, which other dtypes `ar` also runs in,
and which copies a cost-aware method routes generations to. Emulating an ISA on one machine does
not reproduce another CPU's profile (an AVX2-only AMD EPYC keeps bfloat16 within 25% of float32,
an AMX Xeon rules it out), so every branch is driven here by profiles written into the cache:
each must end in a working run or a one-line error, never a traceback.
"""

from __future__ import annotations

import json

import helpers
import pytest
from helpers import QUIET, write_suite

from draftlab.cli import main
from draftlab.decode.build import build_decoder
from draftlab.decode.cost import CostModel
from draftlab.decode.router import DtypeRouter
from draftlab.decode.spec import DecoderConfig
from draftlab.decode.timing import TickClock
from draftlab.models.cached import _TREE_SUPPORT
from draftlab.models.cost_curve import CostCurve, Profile
from draftlab.models.loading import ModelSpec, load_model
from draftlab.models.profile import save
from draftlab.sampling import SamplingParams

METHODS = "ar,sps,pld,pld-tree,sps-tree"


def synthetic(step_ms: float, verify4: float = 1.1, prefill_per_token: float = 0.05) -> CostCurve:
    """helpers.synthetic with a cheap prefill (0.05 ms a prompt token) unless given."""
    return helpers.synthetic(step_ms, verify4, prefill_per_token)


def write_profile(path: str, dtype: str, curve: CostCurve) -> None:
    lm = load_model(ModelSpec(path, dtype=dtype))
    save(lm, Profile(lm.fingerprint(), curve, 1, 0.0, "2026-11-25T00:00:00"))


@pytest.fixture
def profiles(tmp_path, monkeypatch):
    """An empty profile cache of this test's own, and the dtypes the 'CPU' supports, natively (a draft
    follows the target's dtype)."""
    monkeypatch.setenv("DRAFTLAB_PROFILE_DIR", str(tmp_path / "profiles"))
    native = ["avx2", "avx512f", "avx512_bf16", "avx512_fp16"]
    monkeypatch.setattr("draftlab.models.loading.effective_isa", lambda flags: native)

    def supports(*dtypes: str) -> None:
        monkeypatch.setattr("draftlab.models.loading.supported_dtypes", lambda device: list(dtypes))

    return supports


def bench(tmp_path, tiny_pair, capsys, methods: str = METHODS, *more: str) -> tuple[int, dict, str]:
    target, draft = tiny_pair["llama"]
    suite = write_suite(
        tmp_path / "suite.jsonl",
        [
            {"id": "a", "category": "qa", "prompt": "the cat sat on the mat the cat sat on the"},
            {"id": "b", "category": "summarization", "prompt": "the dog ran under the big tree and the dog"},
        ],
    )
    out = tmp_path / "run"
    argv = ["bench", "--target", str(target), "--draft", str(draft), "--suite", str(suite)]
    argv += ["--methods", methods, "--max-new-tokens", "12", "--out", str(out), *QUIET, *more]
    code = main(argv)
    err = capsys.readouterr().err
    run = json.loads((out / "run.json").read_text()) if (out / "run.json").exists() else {}
    return code, run, err


def labels_run(tmp_path) -> set[str]:
    rows = (tmp_path / "run" / "results.jsonl").read_text().splitlines()
    return {json.loads(r)["label"] for r in rows}


def test_one_supported_dtype_runs_without_alternatives(tmp_path, tiny_pair, profiles, capsys):
    profiles("float32")
    target, _ = tiny_pair["llama"]
    write_profile(str(target), "float32", synthetic(10.0))
    code, run, err = bench(tmp_path, tiny_pair, capsys)
    assert code == 0, err
    assert run["extra"]["dtype_choice"]["dtype"] == "float32"
    assert labels_run(tmp_path) == set(METHODS.split(","))  # no "ar bfloat16"
    assert "Traceback" not in err


def test_two_dtypes_within_ten_percent_route_every_cost_aware_method(tmp_path, tiny_pair, profiles, capsys):
    """The AMD EPYC case: bfloat16 within 10% of float32, kept as an alternative and routed."""
    profiles("float32", "bfloat16")
    target, _ = tiny_pair["llama"]
    write_profile(str(target), "float32", synthetic(10.0, verify4=1.6))
    write_profile(str(target), "bfloat16", synthetic(10.5, verify4=1.1))
    code, run, err = bench(tmp_path, tiny_pair, capsys)
    assert code == 0, err
    # Tied within the band: the cheaper multi-token pass wins (speculation gains most there).
    assert run["extra"]["dtype_choice"]["dtype"] == "bfloat16"
    assert {"ar float32", "ar routed"} <= labels_run(tmp_path)
    for method in ("sps", "pld", "pld-tree", "sps-tree"):
        assert run["extra"]["variants"][method]["dtypes"] == ["bfloat16", "float32"]
        # Its speed-up over plain decoding is over plain decoding routed the same way.
        assert run["extra"]["baselines"][method] == "ar routed"
    assert run["extra"]["variants"]["ar routed"]["dtypes"] == ["bfloat16", "float32"]
    assert run["extra"]["baselines"]["ar routed"] == "ar"
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    # A plain decoding like any other: a candidate for the best ar.
    assert summary["overall"]["ar routed"]["vs_best_ar"] is not None
    assert summary["overall"]["pld"]["greedy_compared"] >= 1, "same-dtype references exist"


def test_plain_decoding_routes_across_dtypes_by_its_predicted_time(tiny_pair):
    """`ar` with a cost model carries a sizer that never drafts, so the router can send each prompt to
    the copy predicted fastest for plain decoding, as it does for the methods."""
    target_dir, _ = tiny_pair["llama"]
    fp32 = load_model(ModelSpec(str(target_dir), dtype="float32"))
    bf16 = load_model(ModelSpec(str(target_dir), dtype="bfloat16"))
    slow, fast = CostModel(synthetic(20.0), clock=TickClock()), CostModel(synthetic(10.0), clock=TickClock())
    routed = build_decoder(DecoderConfig(method="ar"), fp32, None, slow, [(bf16, fast)])
    assert isinstance(routed, DtypeRouter) and routed.choose(8, 16) == "bfloat16"
    ids = [5, 6, 7, 8]
    out = routed.generate(ids, 8, SamplingParams())
    assert out.stats.dtype == "bfloat16" and out.stats.drafted == 0
    plain = build_decoder(DecoderConfig(method="ar"), bf16).generate(ids, 8, SamplingParams())
    assert out.tokens == plain.tokens
    # Prefill-heavy: a long prompt goes where prefill is cheap.
    cheap_prefill = CostModel(synthetic(20.0, prefill_per_token=0.01), clock=TickClock())
    dear_prefill = CostModel(synthetic(19.0, prefill_per_token=0.5), clock=TickClock())
    routed = build_decoder(DecoderConfig(method="ar"), fp32, None, cheap_prefill, [(bf16, dear_prefill)])
    assert routed.choose(1000, 4) == "float32" and routed.choose(8, 64) == "bfloat16"


def test_a_draft_profiled_in_only_some_dtypes_is_measured_where_missing(
    tmp_path, tiny_pair, profiles, capsys
):
    profiles("float32", "bfloat16")
    target, draft = tiny_pair["llama"]
    write_profile(str(target), "float32", synthetic(10.0, verify4=1.6))
    write_profile(str(target), "bfloat16", synthetic(10.2, verify4=1.1))
    write_profile(str(draft), "float32", synthetic(1.0))  # none in bfloat16, the dtype chosen
    code, run, err = bench(tmp_path, tiny_pair, capsys)
    assert code == 0, err
    assert run["extra"]["dtype_choice"]["dtype"] == "bfloat16"
    measured = "".join(err.split())  # rich may wrap a long path anywhere
    assert f"profiling{draft}(bfloat16)" in measured
    assert f"profiling{draft}(float32)" not in measured and f"profiling{target}" not in measured


def test_missing_profiles_are_measured_on_first_use(tmp_path, tiny_pair, profiles, capsys):
    profiles("float32", "bfloat16")
    code, run, err = bench(tmp_path, tiny_pair, capsys, methods="ar,pld")
    assert code == 0, err
    assert "profiling" in err
    assert run["extra"]["dtype_choice"]["dtype"] in ("float32", "bfloat16")


def test_a_hopeless_dtype_is_neither_run_nor_routed(tmp_path, tiny_pair, profiles, capsys):
    """The AMX case: bfloat16 emulated at 3× the cost is skipped, for ar and for routing."""
    profiles("float32", "bfloat16")
    target, _ = tiny_pair["llama"]
    write_profile(str(target), "float32", synthetic(10.0))
    write_profile(str(target), "bfloat16", synthetic(30.0, verify4=4.0))
    code, run, err = bench(tmp_path, tiny_pair, capsys, methods="ar,pld")
    assert code == 0, err
    assert run["extra"]["dtype_choice"]["dtype"] == "float32"
    assert "ar in bfloat16: predicted" in err and "skipped" in err
    assert labels_run(tmp_path) == {"ar", "pld"}
    assert "dtypes" not in run["extra"]["variants"]["pld"]
    # The report's plan says what was left out; --full measures it all the same.
    assert any(line.startswith("ar in bfloat16: predicted") for line in run["extra"]["plan"]["left_out"])
    assert "ar in bfloat16: predicted" in (tmp_path / "run" / "report.md").read_text().split("\n## ", 1)[0]
    (tmp_path / "full").mkdir()
    code, run, err = bench(tmp_path / "full", tiny_pair, capsys, "ar,pld", "--full")
    assert code == 0, err
    assert run["extra"]["plan"]["left_out"] == [] and "ar bfloat16" in labels_run(tmp_path / "full")


def test_a_copy_that_cannot_verify_trees_is_not_routed(tiny_pair):
    """The crash of issue 20: the bfloat16 copy of a tree method failed the tree check, had no tree
    sizer, and routing it raised AttributeError. Such a copy would run another method (chains)
    under the same label, so the method keeps to the dtypes that verify trees."""
    target_dir, _ = tiny_pair["llama"]
    fp32 = load_model(ModelSpec(str(target_dir), dtype="float32"))
    bf16 = load_model(ModelSpec(str(target_dir), dtype="bfloat16"))
    flat = CostModel(synthetic(10.0))
    try:
        _TREE_SUPPORT[bf16.model] = False  # what the check found on the AVX2 EPYC with a fixed 1e-3
        tree = build_decoder(DecoderConfig(method="pld-tree"), fp32, None, flat, [(bf16, flat)])
        assert not isinstance(tree, DtypeRouter) and tree.trees
        chain = build_decoder(DecoderConfig(method="pld"), fp32, None, flat, [(bf16, flat)])
        assert isinstance(chain, DtypeRouter) and set(chain.decoders) == {"float32", "bfloat16"}
    finally:
        _TREE_SUPPORT.pop(bf16.model, None)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_trees_pass_the_tree_check_in_every_dtype(tiny_pair, dtype):
    """The check's tolerance comes from the dtype and the measured rounding, not a fixed 1e-3."""
    from draftlab.models.cached import CachedModel

    target_dir, _ = tiny_pair["llama"]
    lm = load_model(ModelSpec(str(target_dir), dtype=dtype))
    assert CachedModel(lm)._check_trees()


def test_the_default_run_on_a_slow_cpu_leaves_out_what_adds_nothing(tmp_path, tiny_pair, profiles, capsys):
    """Priced from a Zen3-like profile (steep, slow), the default bench drops the draft methods that
    cannot pay there and one prompt per subtask, says so before the first generation, records it,
    and `--full` runs everything."""
    profiles("float32")
    target, draft = tiny_pair["llama"]
    write_profile(str(target), "float32", synthetic(2500.0, verify4=4.2))
    write_profile(str(draft), "float32", synthetic(250.0, verify4=4.2))
    rows = [
        {"id": f"{cat}-{i}", "category": cat, "prompt": f"the cat sat on the mat {i} the cat"}
        for cat in ("qa", "summarization")
        for i in range(2)
    ]
    suite = write_suite(tmp_path / "suite.jsonl", rows)
    models = ["--target", str(target), "--draft", str(draft), "--suite", str(suite), "--max-new-tokens", "8"]
    assert main(["bench", *models, "--out", str(tmp_path / "default"), *QUIET]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "predicted:" in err and "--full runs it" in err
    plan = json.loads((tmp_path / "default" / "run.json").read_text())["extra"]["plan"]
    dropped = {line.split(":")[0] for line in plan["left_out"]}
    assert {"sps", "sps-tree", "hybrid", "hf-assisted"} <= dropped
    assert "prompts: 1 per subtask instead of 2" in plan["left_out"]
    assert plan["predicted_s"] < plan["everything_s"]
    records = (tmp_path / "default" / "results.jsonl").read_text().splitlines()
    labels = {json.loads(r)["label"] for r in records}
    assert labels == {"ar", "pld", "pld-tree", "suffix"} and len(records) == 4 * 2
    header = (tmp_path / "default" / "report.md").read_text().split("\n## ", 1)[0]
    assert "| plan | predicted " in header and "left out: " in header and "`--full` restores them" in header
    assert "prompts: 1 per subtask instead of 2" in header
    # --full: every method and prompt, whatever the prediction.
    assert main(["bench", *models, "--full", "--out", str(tmp_path / "full"), *QUIET]) == 0
    plan = json.loads((tmp_path / "full" / "run.json").read_text())["extra"]["plan"]
    assert plan["left_out"] == [] and plan["budget_s"] is None
    assert len((tmp_path / "full" / "results.jsonl").read_text().splitlines()) == 8 * 4


def test_a_run_without_llamacpp_says_first_that_best_ar_covers_only_our_engines(
    tmp_path, tiny_pair, profiles, capsys, monkeypatch
):
    """The newcomer's run without llama.cpp named a "winner" that beat only our own plain decoding."""
    from draftlab.bench.run_header import header_rows
    from draftlab.engines.llamacpp import engine as llamacpp_engine

    profiles("float32")
    monkeypatch.setattr(llamacpp_engine, "installed", lambda: False)
    code, run, err = bench(tmp_path, tiny_pair, capsys, "ar,pld")
    assert code == 0, err
    missing = run["extra"]["engines_missing"]
    assert "llama.cpp" in missing and "scripts/install-llamacpp.sh" in missing
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert header_rows(summary)[0] == ("not measured", missing)
    assert missing in (tmp_path / "run" / "report.md").read_text()
