"""`--compile`: the target's passes of up to 8 tokens through an AOTInductor package over
transformers' StaticCache.

Compiled kernels sum in another order than eager ones, so compiled decoding must write plain
decoding's tokens up to a near-tie, and its logits must agree within the dtype's rounding bound.
"""

from __future__ import annotations

import json

import pytest
import torch
from helpers import QUIET, write_suite
from test_bad_input import cli, one_line
from tolerance import assert_greedy_equal, logits_tol, reduction_length, sum_tol
from transformers import DynamicCache, StaticCache

from draftlab.bench.records import read_records
from draftlab.cli import main
from draftlab.decode.build import build_decoder
from draftlab.decode.cost import CostModel
from draftlab.decode.spec import DecoderConfig
from draftlab.decode.timing import TickClock
from draftlab.drafters.eagle3.head import default_aux_layers
from draftlab.drafters.eagle3.io import load_head_lm, save_head
from draftlab.errors import DraftlabError
from draftlab.models.cached import CachedModel
from draftlab.models.compiled import (
    MAX_PASS,
    PASS_SIZES,
    RESERVE,
    capacity,
    compiled_steps,
    package_path,
    static_length,
    window,
)
from draftlab.models.cost_curve import CostCurve, Profile, verify_slope
from draftlab.models.loading import ModelSpec, load_model
from draftlab.models.profile import (
    QUICK_SIZES,
    find_cached,
    measure,
    profile_path,
    profile_points,
    save,
    with_far_context,
)
from draftlab.models.prompting import encode_prompt
from draftlab.plan.profiles import cost_model
from draftlab.sampling import SamplingParams, argmax_rows

TREE_METHODS = ("pld-tree", "suffix", "hybrid", "sps-tree", "eagle-tree")

GREEDY = SamplingParams()


@pytest.fixture(scope="module")
def story_model(stories):
    model = load_model(ModelSpec(str(stories), dtype="float32"))
    model.eos_token_ids = set()  # no early stop: every generation is as long as asked
    return model


@pytest.fixture(scope="module")
def story_head(story_model, tmp_path_factory):
    """A random EAGLE-3 head for stories260K (its whole vocabulary), saved and loaded as a user's."""
    from tiny import random_head

    folder = tmp_path_factory.mktemp("story-head") / "head"
    save_head(
        random_head(story_model, torch.arange(story_model.vocab_size)),
        folder,
        str(story_model.path),
        ["LlamaForCausalLM"],
    )
    return load_head_lm(str(folder), story_model)


def test_static_lengths_come_in_buckets():
    assert [static_length(n) for n in (1, 512, 513, 1500, 5000)] == [512, 512, 1024, 2048, 8192]
    assert static_length(5000, limit=4096) == 4096


def test_compiled_steps_give_eager_logits(tiny_pair, monkeypatch):
    """With max-autotune, as a user's float32 package is built (the suite's other builds skip it).
    A tiny Llama of 2 layers: its autotuned build took 51 s on a 2-core Zen3, stories260K's 90 s."""
    monkeypatch.setenv("DRAFTLAB_AUTOTUNE", "1")
    lm = load_model(ModelSpec(str(tiny_pair["llama"][0]), dtype="float32"))  # no package yet
    ids = encode_prompt(lm, "Once upon a time, there was a little dog named Max.", chat=False)
    eager, compiled = CachedModel(lm), CachedModel(lm, compiled=True)
    for cm in (eager, compiled):
        cm.start(ids)
    assert isinstance(compiled._cache, StaticCache) and isinstance(eager._cache, DynamicCache)
    assert capacity(compiled._cache) == static_length(len(ids) + RESERVE)
    a, b = eager.forward(ids), compiled.forward(ids)  # the prompt: eager on both
    torch.testing.assert_close(b, a, atol=logits_tol(lm.model, a), rtol=0)
    token = int(a[-1].argmax())
    for _ in range(12):  # one-token passes: compiled on one side
        a, b = eager.forward([token]), compiled.forward([token])
        torch.testing.assert_close(b, a, atol=logits_tol(lm.model, a), rtol=0)
        token = int(a[-1].argmax())
    steps = compiled_steps(lm)
    assert steps.compile_seconds, "getting the package ready is timed"
    calls = steps.calls
    # A verification pass of 3 tokens runs through the same package (its pass length is dynamic),
    # and gives the eager logits; rollback is the static cache's own crop, so the same tokens
    # again give the same.
    length = compiled.length
    a, again = eager.forward([token, 5, 7]), compiled.forward([token, 5, 7])
    assert again.shape == a.shape and steps.calls == calls + 1
    torch.testing.assert_close(again, a, atol=logits_tol(lm.model, a), rtol=0)
    assert list(steps.compile_seconds) == [capacity(compiled._cache)]
    compiled.crop(length)
    torch.testing.assert_close(compiled.forward([token, 5, 7]), again, atol=0, rtol=0)
    # After the rollback, the cache holds exactly the real tokens: the next step agrees too.
    a, b = eager.forward([9]), compiled.forward([9])
    torch.testing.assert_close(b, a, atol=logits_tol(lm.model, a), rtol=0)
    tuned = package_path(lm, capacity(compiled._cache))
    assert tuned.exists(), "the package built is the autotuned one"
    monkeypatch.setenv("DRAFTLAB_AUTOTUNE", "0")
    assert package_path(lm, capacity(compiled._cache)) != tuned


def test_a_compiled_pass_attends_over_its_window_of_the_bucket(stories):
    """A pass reads the bucket's slots up to the last it fills, rounded up to 64: slots past that
    window are never read (poisoned with NaN, the pass is still exact), while a pass over the whole
    bucket (exact mode's) reads them all. A model of its own: the poison stays in its caches."""
    story_model = load_model(ModelSpec(str(stories), dtype="float32"))
    assert [window(0, 1, 512), window(63, 1, 512), window(64, 1, 512), window(500, 8, 512)] == [
        64,
        64,
        128,
        512,
    ]
    ids = encode_prompt(story_model, "Once upon a time, there was a little dog named Max.", chat=False)
    eager, compiled = CachedModel(story_model), CachedModel(story_model, compiled=True)
    steps = compiled_steps(story_model)
    assert steps.windowed, "a Llama's sdpa attention takes the window"
    for cm in (eager, compiled):
        cm.start(ids)
        cm.forward(ids)
    length = compiled.length
    span = window(length, 3, capacity(compiled._cache))
    assert span < capacity(compiled._cache)
    with torch.inference_mode():  # the cache's tensors are inference tensors
        for layer in compiled._cache.layers:
            layer.values[:, :, span:] = float("nan")
    a, b = eager.forward([5, 7, 9]), compiled.forward([5, 7, 9])
    torch.testing.assert_close(b, a, atol=logits_tol(story_model.model, a), rtol=0)
    compiled.crop(length)
    with torch.inference_mode():
        whole = steps(compiled._cache, torch.tensor([[5, 7, 9]]), whole=True)
    assert torch.isnan(whole.logits).all(), "the whole bucket's pass reads the poisoned slots"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_window_attention_gives_each_query_row_its_own_output(dtype):
    """In half precision an odd pass attends with its last row twice (torch's CPU flash attention is
    slow on odd rows there); each real row still gets its own output, whatever the pass's length."""
    from types import SimpleNamespace

    from draftlab.models.attention import window_attention

    torch.manual_seed(0)
    module = SimpleNamespace(num_key_value_groups=3)
    keys, values = torch.randn(1, 3, 128, 16, dtype=dtype), torch.randn(1, 3, 128, 16, dtype=dtype)
    for rows in (1, 2, 3, 5):
        query = torch.randn(1, 9, rows, 16, dtype=dtype)
        mask = torch.zeros(1, 1, rows, 128, dtype=dtype)
        mask[..., 40 + torch.arange(rows)[:, None] < torch.arange(128)] = torch.finfo(dtype).min
        out, _ = window_attention(module, query, keys, values, mask, scaling=0.25, slots=64)
        assert out.shape == (1, rows, 9, 16)
        for row in range(rows):  # alone, over the same 64 slots
            want = torch.nn.functional.scaled_dot_product_attention(
                query[:, :, row : row + 1].float(),
                keys[:, :, :64].float().repeat_interleave(3, 1),
                values[:, :, :64].float().repeat_interleave(3, 1),
                attn_mask=mask[:, :, row : row + 1, :64].float(),
                scale=0.25,
            )
            tol = 4 * torch.finfo(dtype).eps * float(values.abs().max())
            torch.testing.assert_close(out[:, row].float(), want[:, :, 0], atol=tol, rtol=0)


def test_compiled_ar_sps_and_pld_write_plain_decodings_tokens(story_model):
    ids = encode_prompt(story_model, "Once upon a time, there was a little girl named Lily.", chat=False)
    plain = build_decoder(DecoderConfig(method="ar"), story_model).generate(ids, 120, GREEDY)
    for method in ("ar", "sps", "pld"):
        config = DecoderConfig(method=method, compile=True, fixed_k=True)
        got = build_decoder(config, story_model, story_model).generate(ids, 120, GREEDY)
        assert_greedy_equal(story_model, ids, got.tokens, plain.tokens, f"compiled {method}")
        if method == "pld":  # rejected lookups: the static cache is cropped back many times
            assert got.stats.accepted > 0 and got.stats.rollbacks > 10


def test_a_compiled_pass_returns_each_rows_argmax_beside_its_logits(story_model):
    """Greedy rules read the ids a package made (verify/rules.py): they must be its logits' argmax,
    row for row, for chains of every compiled length and after a padded pass; an eager pass (the
    prompt) makes none, and its rows are read from the logits."""
    ids = encode_prompt(story_model, "Once upon a time, there was a little girl named Lily.", chat=False)
    target = CachedModel(story_model, compiled=True)
    target.start(ids)
    target.forward(ids)
    assert target.argmax is None
    for n in (1, 2, 5, MAX_PASS):
        logits = target.forward(list(range(10, 10 + n)))
        assert target.argmax is not None and target.argmax == argmax_rows(logits)
        part = target.forward([3, 4, 5], keep=2)
        assert target.argmax == argmax_rows(part) and len(part) == 2
    before, target.compiled.pad_single = target.compiled.pad_single, True  # one token run as two
    try:
        logits = target.forward([7])
        assert target.argmax == argmax_rows(logits) and len(logits) == 1
    finally:
        target.compiled.pad_single = before


def test_a_draft_model_drafts_through_its_own_compiled_passes(story_model, stories):
    """sps under --compile: a draft model that is not the target's own model object runs its passes
    from its own packages over its own static cache (the default draft's eager step cost as much as
    the 4-bit target's compiled one); a draft that is the target's object stays eager, since the
    target's passes fill that object's one static cache."""
    ids = encode_prompt(story_model, "Once upon a time, there was a little dog named Max.", chat=False)
    plain = build_decoder(DecoderConfig(method="ar"), story_model).generate(ids, 100, GREEDY)
    config = DecoderConfig(method="sps", compile=True, fixed_k=True)
    draft = load_model(ModelSpec(str(stories), dtype="float32"))  # the same weights, another object
    decoder = build_decoder(config, story_model, draft)
    steps = decoder.proposer.draft.compiled
    assert steps is not None and steps is not decoder.target.compiled
    got = decoder.generate(ids, 100, GREEDY)
    assert_greedy_equal(story_model, ids, got.tokens, plain.tokens, "sps with a compiled draft")
    assert steps.calls > got.stats.drafted // 2  # its drafting passes ran through its package
    # The target's own weights draft: nearly every draft is its next token.
    assert got.stats.accepted >= 0.8 * got.stats.drafted > 0
    assert build_decoder(config, story_model, story_model).proposer.draft.compiled is None


def test_compiled_passes_give_the_eager_features(story_model):
    """An EAGLE head drafts from the hidden states of the target's passes: a compiled pass (padded or
    not) must hand over the eager pass's features of its real tokens, and only theirs."""
    layers = default_aux_layers(story_model.model.config.num_hidden_layers)
    ids = encode_prompt(story_model, "Once upon a time, there was a big red ball.", chat=False)
    eager, compiled = CachedModel(story_model), CachedModel(story_model, compiled=True)
    for cm in (eager, compiled):
        cm.start(ids)
        cm.forward(ids, features=layers)  # the prompt: eager on both
    token = int(eager.forward([5], features=layers)[-1].argmax())
    compiled.forward([5], features=layers)
    for chunk in ([token], [token, 5, 7], [9, 11]):  # one token, padded 3 -> 4, exactly 2
        a, b = eager.forward(chunk, features=layers), compiled.forward(chunk, features=layers)
        torch.testing.assert_close(b, a, atol=logits_tol(story_model.model, a), rtol=0)
        assert compiled.features.shape == (len(chunk), len(layers) * story_model.model.config.hidden_size)
        # Hidden states come from the same chains of sums as the logits, without the LM head's.
        bound = sum_tol(reduction_length(story_model.model.config), scale=float(eager.features.abs().max()))
        torch.testing.assert_close(compiled.features, eager.features, atol=bound, rtol=0)


def test_compiled_eagle_writes_plain_decodings_tokens(story_model, story_head):
    """`eagle` under --compile: the target's passes compiled, the head eager on their features."""
    ids = encode_prompt(story_model, "Once upon a time, there was a little cat named Tom.", chat=False)
    plain = build_decoder(DecoderConfig(method="ar"), story_model).generate(ids, 80, GREEDY)
    config = DecoderConfig.of(method="eagle", compile=True, fixed_k=True, gamma=3, draft_confidence=0.0)
    decoder = build_decoder(config, story_model, story_head)
    assert decoder.target.compiled is not None
    got = decoder.generate(ids, 80, GREEDY)
    assert got.stats.drafted > 0
    assert_greedy_equal(story_model, ids, got.tokens, plain.tokens, "compiled eagle")
    # The head read the compiled target's features for every final token but the last.
    assert decoder.proposer.draft.known == len(ids) + len(got.tokens) - 1
    # Its own passes ran through its own package, but for the prompt's catch-up.
    head = decoder.proposer.draft
    assert head.compiled is not None and head.compiled.calls >= head.forward_calls - 1 > 0


@pytest.mark.parametrize("method", ["dflash", "dflash-tree"])
def test_compiled_dflash_writes_plain_decodings_tokens(story_model, tmp_path, method):
    """dflash and dflash-tree under --compile: the target's passes compiled, the block drafter eager
    on their features."""
    from tiny import random_dflash

    from draftlab.drafters.dflash.io import save_dflash
    from draftlab.drafters.dflash.lm import load_dflash_lm

    save_dflash(random_dflash(story_model, block_size=4), tmp_path / "dflash", str(story_model.path))
    drafter = load_dflash_lm(str(tmp_path / "dflash"), story_model)
    ids = encode_prompt(story_model, "Once upon a time, there was a little cat named Tom.", chat=False)
    plain = build_decoder(DecoderConfig(method="ar"), story_model).generate(ids, 60, GREEDY)
    budget = 5 if method == "dflash-tree" else None
    config = DecoderConfig.of(method=method, compile=True, fixed_k=True, gamma=3, tree_budget=budget)
    decoder = build_decoder(config, story_model, drafter)
    assert decoder.target.compiled is not None
    got = decoder.generate(ids, 60, GREEDY)
    assert got.stats.drafted > 0
    assert_greedy_equal(story_model, ids, got.tokens, plain.tokens, f"compiled {method}")
    # The drafter read the compiled target's features for every final token but the last.
    assert decoder.proposer.known == len(ids) + len(got.tokens) - 1


def test_the_compiled_head_gives_the_eager_heads_logits_over_chains_and_trees(story_model, story_head):
    """The head's passes through its package over a static cache: the eager head's logits and
    outputs, for a catch-up chain, tree levels (a 4-D mask widened to the bucket) and after a crop."""
    from draftlab.drafters.eagle3.cached import HeadModel

    layers = story_head.model.aux_layers
    ids = encode_prompt(story_model, "Once upon a time, there was a big red ball.", chat=False)
    target = CachedModel(story_model)
    target.start(ids)
    target.forward(ids, features=layers)
    aux = target.features
    eager, compiled = HeadModel(story_head), HeadModel(story_head, compiled=True)
    tol = sum_tol(reduction_length(story_head.model.config), scale=30.0)
    for head in (eager, compiled):
        head.start(ids)
        head.take_features(0, aux)
    # The prompt's catch-up (longer than a package's pass) runs eagerly over the static cache, and
    # reads its window only: the slots past it poisoned with NaN, it still agrees.
    assert len(ids) > MAX_PASS
    with torch.inference_mode():
        compiled._cache.values[:, :, window(0, len(ids), compiled._cache.capacity) :] = float("nan")
    a, b = eager.forward(ids), compiled.forward(ids)
    finite = torch.isfinite(a)
    torch.testing.assert_close(b[finite], a[finite], atol=tol, rtol=0)
    calls = compiled.compiled.calls
    for step in (
        dict(new_ids=[5]),
        dict(new_ids=[7, 9, 11], tree=[-1, -1, -1]),
        dict(new_ids=[3, 4], tree=[0, 1]),
    ):
        a, b = eager.forward(**step), compiled.forward(**step)
        torch.testing.assert_close(b[finite[: len(b)]], a[finite[: len(a)]], atol=tol, rtol=0)
    assert compiled.compiled.calls == calls + 3, "every pass of up to 8 tokens ran through the package"
    torch.testing.assert_close(compiled._own.view(), eager._own.view(), atol=tol, rtol=0)
    for head in (eager, compiled):
        head.crop(len(ids) + 1)
    a, b = eager.forward([8]), compiled.forward([8])  # a drafted token reads its parent's output
    torch.testing.assert_close(b[finite[:1]], a[finite[:1]], atol=tol, rtol=0)
    # A pass reads its window of the bucket only: the slots past it poisoned with NaN, it still agrees.
    for head in (eager, compiled):
        head.crop(len(ids) + 1)
    cache = compiled._cache
    span = window(int(cache.length), 1, cache.capacity)
    assert span < cache.capacity
    with torch.inference_mode():
        cache.values[:, :, span:] = float("nan")
    a, b = eager.forward([8]), compiled.forward([8])
    torch.testing.assert_close(b[finite[:1]], a[finite[:1]], atol=tol, rtol=0)


def test_a_compiled_heads_catch_up_scores_its_kept_rows_only_and_attends_causally(
    story_model, story_head, monkeypatch
):
    """A prompt's catch-up through the compiled head (an eager pass over its static cache) keeping
    one row: the LM head reads that row alone, the attention is draftlab's causal kernel, and the
    row's logits are the full catch-up's last."""
    from draftlab.drafters.eagle3.cached import HeadModel
    from draftlab.models import kernels

    ids = encode_prompt(story_model, "Once upon a time, there was a big red ball.", chat=False)
    target = CachedModel(story_model)
    target.start(ids)
    target.forward(ids, features=story_head.model.aux_layers)
    full, one = HeadModel(story_head, compiled=True), HeadModel(story_head, compiled=True)
    for head in (full, one):
        head.start(ids)
        head.take_features(0, target.features)
    whole = full.forward(ids)
    rows, causal = [], []
    model = story_head.model
    monkeypatch.setattr(
        model, "logits", lambda hidden, logits=model.logits: rows.append(hidden.shape[-2]) or logits(hidden)
    )
    monkeypatch.setattr(
        kernels,
        "attend",
        lambda q, k, v, mask, scale, f=kernels.attend: causal.append(mask is None) or f(q, k, v, mask, scale),
    )
    last = one.forward(ids, keep=1)
    assert len(ids) > MAX_PASS and rows == [1] and causal == [True]
    tol = sum_tol(reduction_length(model.config), scale=30.0)
    finite = torch.isfinite(whole[-1:])
    torch.testing.assert_close(last[finite], whole[-1:][finite], atol=tol, rtol=0)
    torch.testing.assert_close(one._own.view(), full._own.view(), atol=tol, rtol=0)


def test_a_static_cache_grows_past_its_bucket(tiny_pair):
    lm = load_model(ModelSpec(str(tiny_pair["llama"][0]), dtype="float32"))
    lm.model.config.max_position_embeddings = 2048  # RoPE runs past the 512 it was made with
    prompt = [(7 * i + 3) % lm.vocab_size for i in range(12)]  # over 8 tokens: eager, no compile
    more = [(11 * i + 5) % lm.vocab_size for i in range(600)]
    eager, compiled = CachedModel(lm), CachedModel(lm, compiled=True)
    for cm in (eager, compiled):
        cm.start(prompt)
        cm.forward(prompt)
    assert capacity(compiled._cache) == 512
    a, b = eager.forward(more), compiled.forward(more)  # 612 tokens: the cache doubles, copying
    assert capacity(compiled._cache) == 1024
    torch.testing.assert_close(b, a, atol=logits_tol(lm.model, a), rtol=0)
    tail = list(range(3, 12))  # 9 tokens: an eager pass, as a prompt is (no compile needed here)
    a, b = eager.forward(tail), compiled.forward(tail)
    torch.testing.assert_close(b, a, atol=logits_tol(lm.model, a), rtol=0)


def test_compile_refuses_what_it_cannot_run(tiny_pair, capsys):
    for method in ("hf-assisted", "hf-greedy"):
        with pytest.raises(
            DraftlabError, match=f"--compile runs the methods of draftlab's own loop, not '{method}'"
        ):
            DecoderConfig(method=method, compile=True)
    lm = load_model(ModelSpec(str(tiny_pair["t5"][0]), dtype="float32"))
    with pytest.raises(DraftlabError, match="decoder-only"):
        CachedModel(lm, compiled=True)
    target = str(tiny_pair["llama"][0])
    result = cli("generate", "hello", "--target", target, "--method", "hf-greedy", "--compile")
    assert result.returncode == 2
    one_line(result.stderr, ["--compile", "'hf-greedy'"])
    assert main(["bench", "--target", target, "--engines", "llamacpp", "--compile"]) == 2
    assert "--compile is for the hf engine" in capsys.readouterr().err
    # A model off the CPU (here on the meta device; tests/test_cuda.py runs it on a GPU).
    lm = load_model(ModelSpec(target, dtype="float32"))
    lm.model.to("meta")
    with pytest.raises(DraftlabError, match=f"--compile builds CPU packages; '{target}' is on meta"):
        CachedModel(lm, compiled=True)


def test_opt_and_bloom_compile_with_and_without_tree_masks(tiny_pair):
    """OPT takes its positions as inputs, so its one-token pass exports, and its package verifies
    trees; Bloom's ALiBi reads positions from a 2-D mask, so its package is exported without the
    4-D mask and runs chains (its tree methods fall back to chains, as they do eagerly)."""
    for family, masked in (("opt", True), ("bloom", False)):
        lm = load_model(ModelSpec(str(tiny_pair[family][0]), dtype="float32"))
        eager, compiled = CachedModel(lm), CachedModel(lm, compiled=True)
        assert compiled_steps(lm).masked is masked and compiled.supports_trees() is masked
        for cm in (eager, compiled):
            cm.start([5, 6, 7])
            cm.forward([5, 6, 7])  # a prompt of 3 tokens: eager on both, the cache holds no keys yet
        for chunk in ([9], [9, 10, 11]):
            a, b = eager.forward(chunk), compiled.forward(chunk)
            torch.testing.assert_close(b, a, atol=logits_tol(lm.model, a), rtol=0)
        assert compiled_steps(lm).calls == 2
        decoder = build_decoder(DecoderConfig(method="pld-tree", compile=True), lm)
        assert decoder.trees is masked and bool(decoder.tree_fallback) is not masked


def test_a_pass_that_cannot_take_one_token_is_refused_in_one_line(tiny_pair):
    """OPT exported without positions assumes passes of 2 tokens or more (what `--compile` met
    before positions were inputs): the exported pass is refused, naming the model, before inductor
    compiles anything."""
    target = str(tiny_pair["opt"][0])
    lm = load_model(ModelSpec(target, dtype="float32"))
    compiled = CachedModel(lm, compiled=True)
    compiled_steps(lm).masked = False
    compiled.start([5, 6, 7])
    compiled.forward([5, 6, 7])
    with pytest.raises(DraftlabError) as error:
        compiled.forward([9])
    message = str(error.value)
    assert "\n" not in message and f"--compile cannot run '{target}'" in message, message
    assert message.endswith("decode it without --compile"), message
    assert not package_path(lm, 512, masked=False).exists(), "no package was compiled for it"


def test_bench_compile_adds_compiled_ar_compiled_before_timing(tiny_pair, tmp_path, capsys):
    target = str(tiny_pair["llama"][0])
    suite = write_suite(tmp_path / "suite.jsonl", [{"id": "a", "category": "qa", "prompt": "the cat sat on"}])
    out = tmp_path / "run"
    argv = ["bench", "--target", target, "--dtype", "float32", "--ar-dtypes", "none", "--suite", str(suite)]
    argv += ["--methods", "ar", "--max-new-tokens", "8", "--compile", "--out", str(out), *QUIET]
    assert main(argv) == 0
    run = json.loads((out / "run.json").read_text())
    assert run["extra"]["compile_s"] and all(c["seconds"] > 0 for c in run["extra"]["compile_s"].values())
    records = read_records(out / "results.jsonl")
    labels = {r.label for r in records}
    assert labels == {"ar", "ar compiled"}
    by_label = {r.label: r for r in records}
    assert by_label["ar compiled"].greedy_match is not False
    report = (out / "report.md").read_text()
    assert "ar compiled" in report
    # What was built or loaded, in how long, and the peak memory before and with the packages.
    peak = run["extra"]["peak_rss_mb"]
    assert 0 < peak["before_packages"] <= peak["with_packages"]
    row = next(line for line in report.splitlines() if line.startswith("| compiled passes |"))
    assert "--compile: compiled copies beside the eager methods" in row
    assert "512-token cache" in row and "peak memory" in row
    # Whether one-token passes run padded to two was decided by timing both, and is reported.
    single = run["extra"]["one_token_passes"]
    assert single["ms"]["one"] > 0 and single["ms"]["padded"] > 0 and isinstance(single["padded"], bool)
    assert "one-token passes run as" in row
    capsys.readouterr()


def test_bench_compile_gives_compiled_eagle_its_head(story_model, story_head):
    """`bench --compile --methods ar,eagle` adds 'eagle compiled' drafting with the head (it once
    got the draft model and refused to run)."""
    from draftlab.cli import build_parser
    from draftlab.engines.hf.engine import hf_variants
    from draftlab.plan.configs import decoder_config, sampling_from

    argv = ["bench", "--target", str(story_model.path), "--head", story_head.path, "--dtype", "float32"]
    args = build_parser().parse_args([*argv, "--methods", "ar,eagle", "--compile", "--fixed-k"])
    configs = {m: decoder_config(args, m) for m in ("ar", "eagle")}
    variants = {v.label: v for v in hf_variants(args, configs, story_model, None, sampling_from(args))}
    assert {"ar compiled", "eagle compiled"} <= set(variants)
    for label in ("eagle", "eagle compiled"):
        head = variants[label].draft
        assert getattr(head, "is_head", False) and head.path == variants["eagle"].draft.path, label
    assert variants["eagle compiled"].decoder.target.compiled is not None


def test_compiled_rounds_draft_no_more_than_the_longest_compiled_pass_verifies(story_model, story_head):
    """A verification pass longer than the compiled ones would run eagerly, at 2-3x the cost."""
    for method, field, second in (
        ("pld", "pld_tokens", None),
        ("sps", "gamma", story_model),
        ("eagle", "gamma", story_head),
    ):
        eager = build_decoder(DecoderConfig.of(method=method, **{field: 10}), story_model, second)
        compiled = build_decoder(
            DecoderConfig.of(method=method, compile=True, **{field: 10}), story_model, second
        )
        assert (eager.gamma, compiled.gamma) == (10, PASS_SIZES[-1] - 1), method


def test_a_warmed_target_compiles_nothing_while_it_generates(story_model, story_head):
    """The warm-up leaves the package of the generation's cache ready, so the timed run neither
    builds nor loads one; an EAGLE head's passes, which ask for hidden states, run the same
    package as plain passes. A new process loads the package the first one built."""
    decoder = build_decoder(DecoderConfig(method="ar", compile=True), story_model)
    ids = encode_prompt(story_model, "Once upon a time, a cat found a hat.", chat=False)
    passes: list[tuple[int, int]] = []
    decoder.target.warm(len(ids) + RESERVE, PASS_SIZES, lambda length, size: passes.append((length, size)))
    assert passes == [(512, n) for n in PASS_SIZES], "one progress call per warmed pass"
    steps = compiled_steps(story_model)
    ready = dict(steps.compile_seconds)
    assert list(ready) == [512]
    decoder.generate(ids, 8, GREEDY)
    config = DecoderConfig.of(method="eagle", compile=True, fixed_k=True, gamma=3, draft_confidence=0.0)
    eagle = build_decoder(config, story_model, story_head)
    calls = steps.calls
    got = eagle.generate(ids, 12, GREEDY)
    assert got.stats.drafted > 0
    assert steps.calls - calls == got.stats.target_calls - 1, "all but the prompt"
    assert steps.compile_seconds == ready and list(steps.runners) == [512]
    # Another process (here: another model object of the same weights) loads the built package.
    again = load_model(ModelSpec(str(story_model.path), dtype="float32"))
    other = build_decoder(DecoderConfig(method="ar", compile=True), again)
    other.target.warm(len(ids) + RESERVE, (1,))
    assert compiled_steps(again).loaded == {512: True}
    assert other.generate(ids, 8, GREEDY).tokens == decoder.generate(ids, 8, GREEDY).tokens


def test_compiled_runs_are_sized_from_the_compiled_passes_profile(tiny_pair, tmp_path, monkeypatch):
    """Synthetic profiles: the compiled curve (a 1-token pass at 5 ms, 8 tokens at 20 ms) and the
    eager one (30 ms and 33 ms) lead to other round sizes; `--compile` must read its own."""
    monkeypatch.setenv("DRAFTLAB_PROFILE_DIR", str(tmp_path / "profiles"))
    lm = load_model(ModelSpec(str(tiny_pair["llama"][0]), dtype="float32"))
    curves = {
        False: CostCurve([1, 2, 4, 8], [64, 256], [[30.0, 30.5, 31.0, 33.0]] * 2),
        True: CostCurve([1, 2, 4, 8], [64, 256], [[5.0, 8.0, 12.0, 20.0]] * 2),
    }
    for compiled, curve in curves.items():
        measured_at = "2026-11-26T00:00:01" if compiled else "2026-11-26T00:00:00"
        save(lm, Profile(lm.fingerprint(compiled), curve, 1, 0.0, measured_at))
    assert profile_path(lm, compiled=True) != profile_path(lm)
    # Predictions beside another engine read the eager profile, even where a compiled one is newer.
    assert find_cached(lm.spec.name, "float32").curve.ms == curves[False].ms
    assert cost_model(False, lm, None).target.ms == curves[False].ms
    assert cost_model(False, lm, None, compiled=True).target.ms == curves[True].ms
    # What the two curves decide: verifying 4 drafts costs 1.03x a plain step eager, 2.4x compiled.
    assert verify_slope(curves[False], 4, 64) < 1.1 < 2 < verify_slope(curves[True], 4, 64)
    # A draft model prices its passes by the profile of the way it runs: compiled beside a compiled
    # target when it is a model object of its own, eager otherwise (its passes then run eagerly).
    draft = load_model(ModelSpec(str(tiny_pair["llama"][1]), dtype="float32"))
    draft_curves = {
        False: CostCurve([1, 2, 4, 8], [64, 256], [[4.0, 4.2, 4.5, 5.0]] * 2),
        True: CostCurve([1, 2, 4, 8], [64, 256], [[0.5, 0.6, 0.8, 1.2]] * 2),
    }
    for compiled, curve in draft_curves.items():
        save(draft, Profile(draft.fingerprint(compiled), curve, 1, 0.0, "2026-11-26T00:00:02"))
    assert cost_model(False, lm, draft).draft.ms == draft_curves[False].ms
    assert cost_model(False, lm, draft, compiled=True).draft.ms == draft_curves[True].ms
    assert cost_model(False, lm, lm, compiled=True).draft.ms == curves[False].ms, "the target's own object"
    # What they decide: a 4-token draft costs 3.2x the compiled step eager, 0.4x compiled.
    priced = {c: cost_model(False, lm, draft, compiled=c) for c in (False, True)}
    assert priced[True].draft_ms(4, 64) < 0.5 * 5.0 < 3 * 5.0 < priced[False].draft_ms(4, 64)
    assert cost_model(True, lm, draft, compiled=True) is None, "fixed k: rounds are not sized"


def test_a_compiled_eagle_round_is_priced_by_the_heads_compiled_passes(
    story_model, story_head, tmp_path, monkeypatch
):
    """Under --compile the head drafts through its own package: its rounds are priced by that
    package's profile (on a Zen3 2.9 ms a pass), not by its eager passes (5.6 ms in float32)."""
    from draftlab.drafters.eagle3.cached import HeadModel
    from draftlab.models.cached import cached, compiles

    monkeypatch.setenv("DRAFTLAB_PROFILE_DIR", str(tmp_path / "profiles"))
    head_curves = {
        False: CostCurve([1, 2, 4, 8], [64, 256], [[5.6, 10.0, 11.8, 11.1]] * 2),
        True: CostCurve([1, 2, 4, 8], [64, 256], [[2.9, 3.0, 3.8, 5.2]] * 2),
    }
    for compiled, curve in head_curves.items():
        save(story_head, Profile(story_head.fingerprint(compiled), curve, 1, 0.0, "2026-12-02T00:00:00"))
        save(story_model, Profile(story_model.fingerprint(compiled), curve, 1, 0.0, "2026-12-02T00:00:00"))
    assert profile_path(story_head, compiled=True) != profile_path(story_head)
    assert cost_model(False, story_model, story_head).draft.ms == head_curves[False].ms
    assert cost_model(False, story_model, story_head, compiled=True).draft.ms == head_curves[True].ms
    # What `draftlab profile --compile` times is the head's package, as the decoder drafts with it.
    assert compiles(story_head)
    runner = cached(story_head, compiled=True)
    assert isinstance(runner, HeadModel) and runner.compiled is not None and runner.blind
    assert cached(story_head).compiled is None


def test_a_compiled_profile_times_compiled_passes_only_after_compiling_them(story_model):
    # One compiled size here (a graph compiles in tens of seconds on 2 cores); the profile's own
    # points are below.
    steps: list[str] = []
    curve = measure(
        story_model,
        sizes=(1,),
        contexts=[64],
        prefill_lengths=[16],
        repeats=2,
        compiled=True,
        far_context=True,
        on_step=steps.append,
    )
    assert compiled_steps(story_model).compile_seconds, "the pass was compiled"
    far = compiled_steps(story_model).bucket(66) - 2
    assert curve.contexts == [64, far], "the package's last context a pass fits is measured too"
    visits = [step.split(",")[0] for step in steps if step.startswith("context")]
    assert visits == [f"context {c}" for c in (64, far, 64, far)], "contexts in turn, round after round"
    # A compile takes seconds; a timed pass of this 260K-parameter model, milliseconds.
    assert curve.ms[0][0] < 500, curve.ms
    assert profile_points(2048, True, compiled=True) == (PASS_SIZES, [64, 256], [16, 64, 256])
    assert profile_points(2048, True, compiled=False)[0] == QUICK_SIZES


def test_a_compiled_profile_reaches_the_last_context_of_its_package():
    # Past its last measured context a curve extends the line through its last two points, and
    # holds it flat where noise read the second no dearer than the first: the suite's long prompts
    # were priced at 256 tokens' cost. The package's last context a full pass fits is measured too.
    assert with_far_context([64, 256], 1024, 8) == [64, 256, 1015]
    assert with_far_context([64, 256], 512, 8) == [64, 256, 503]
    assert with_far_context([64, 256], 200, 8) == [64, 191], "a context the package cannot hold is dropped"
    assert with_far_context([64], 73, 8) == [64], "already the last one"
    assert with_far_context([], 40, 8) == [31]


def test_a_compiled_tree_pass_gives_the_eager_tree_logits_and_keeps_its_path(story_model):
    """A token tree through the package: a 4-D mask over the whole bucket, each node seeing the
    sequence and its ancestors only; after the accepted path is compacted into place, the static
    cache holds that path alone, as the dynamic cache does."""
    ids = encode_prompt(story_model, "Once upon a time, there was a little dog named Max.", chat=False)
    eager, compiled = CachedModel(story_model), CachedModel(story_model, compiled=True)
    assert compiled.supports_trees()
    for cm in (eager, compiled):
        cm.start(ids)
        cm.forward(ids)
    calls = compiled_steps(story_model).calls
    nodes, parents = (
        [7, 9, 11, 13, 15, 17],
        [-1, 0, -1, 2, 2, 4],
    )  # root -> 7 -> 9; root -> 11 -> {13, 15 -> 17}
    a, b = eager.forward([5, *nodes], tree=parents), compiled.forward([5, *nodes], tree=parents)
    assert compiled_steps(story_model).calls == calls + 1, "one package pass scored the whole tree"
    torch.testing.assert_close(b, a, atol=logits_tol(story_model.model, a), rtol=0)
    # A tree grown over two calls (as a draft grows one level by level) scores the same.
    base = len(ids) + 1
    for cm in (eager, compiled):
        cm.crop(base)
    more_a = eager.forward([21, 23], tree=[-1, -1]), eager.forward([25], tree=[1])
    more_b = compiled.forward([21, 23], tree=[-1, -1]), compiled.forward([25], tree=[1])
    for x, y in zip(more_a, more_b, strict=True):
        torch.testing.assert_close(y, x, atol=logits_tol(story_model.model, x), rtol=0)
    # Keep a non-first branch: root -> 23 -> 25 moves down into place; the next pass agrees.
    for cm in (eager, compiled):
        cm.keep_path(base, [1, 2])
    assert compiled.length == eager.length == base + 2
    a, b = eager.forward([3]), compiled.forward([3])
    torch.testing.assert_close(b, a, atol=logits_tol(story_model.model, a), rtol=0)
    alone = CachedModel(story_model)
    alone.start(ids)
    alone.forward([*ids, 5, 23, 25])
    torch.testing.assert_close(alone.forward([3]), a, atol=logits_tol(story_model.model, a), rtol=0)


def test_compiled_tree_methods_write_plain_decodings_tokens(story_model, story_head, tmp_path):
    """pld-tree, suffix, hybrid, sps-tree and eagle-tree under --compile, trees sized from a cost
    profile and at fixed budgets: plain decoding's tokens in float32, every tree in one package pass."""
    from test_sizing import FLAT, curve
    from test_trees import _noisy_copy

    draft = _noisy_copy(story_model.path, tmp_path / "noisy")
    ids = encode_prompt(story_model, "Once upon a time, there was a little girl named Lily.", chat=False)
    plain = build_decoder(DecoderConfig(method="ar"), story_model).generate(ids, 100, GREEDY)
    steps = compiled_steps(story_model)
    for method in TREE_METHODS:
        second = story_head if method == "eagle-tree" else draft
        for budget in (None, 16, 3):
            cost = CostModel(FLAT, curve({1: 4.0, 2: 4.2, 16: 6.0}), clock=TickClock())
            config = DecoderConfig.of(method=method, compile=True, tree_budget=budget, gamma=4, pld_tokens=10)
            decoder = build_decoder(config, story_model, second, cost if budget is None else None)
            assert decoder.trees, f"{method}: trees, not the chain fallback"
            calls = steps.calls
            got = decoder.generate(ids, 100, GREEDY)
            label = f"compiled {method} budget={budget}"
            assert_greedy_equal(story_model, ids, got.tokens, plain.tokens, label)
            assert got.stats.tree_rounds > 0, label
            # Every pass but the prompt ran through the package: no tree outgrew the longest pass.
            assert steps.calls - calls == got.stats.target_calls - 1, label
            if budget is None:
                assert decoder.sizer.max_nodes == MAX_PASS - 1
            else:
                assert decoder.tree_budget == min(budget, MAX_PASS - 1)


def test_compiled_tree_methods_match_compiled_ar_on_a_random_tiny_model(tiny_pair):
    target = load_model(ModelSpec(str(tiny_pair["llama"][0]), dtype="float32"))
    draft = load_model(ModelSpec(str(tiny_pair["llama"][1]), dtype="float32"))
    target.eos_token_ids = set()
    ids = encode_prompt(
        target, "the cat sat on the mat and then the dog ran on the mat and then the", chat=False
    )
    ar = build_decoder(DecoderConfig(method="ar", compile=True), target).generate(ids, 200, GREEDY)
    for method in ("pld-tree", "sps-tree", "hybrid", "suffix"):
        config = DecoderConfig(method=method, compile=True, tree_budget=6, gamma=4)
        got = build_decoder(config, target, draft).generate(ids, 200, GREEDY)
        assert_greedy_equal(target, ids, got.tokens, ar.tokens, f"compiled {method}")


def _profiles(lm, compiled_ms: list[float], eager_ms: list[float]) -> None:
    """Synthetic eager and compiled profiles of `lm` (1-, 2-, 4- and 8-token passes, two contexts)."""
    for compiled, ms in ((False, eager_ms), (True, compiled_ms)):
        curve = CostCurve([1, 2, 4, 8], [64, 256], [ms] * 2)
        save(lm, Profile(lm.fingerprint(compiled), curve, 1, 0.0, "2026-11-27T00:00:00"))


def test_bench_runs_compiled_by_default_where_the_profiles_predict_it_faster(
    tiny_pair, tmp_path, monkeypatch
):
    """No --compile: the cached profiles decide. Without a compiled profile the run stays eager and
    says how to get one; where compiled plain decoding is predicted faster, every method of our loop
    runs compiled only, ar both ways; where slower, eager; --compile and --no-compile decide alone."""
    from draftlab.cli import build_parser
    from draftlab.plan.compile import compile_choice

    monkeypatch.setenv("DRAFTLAB_PROFILE_DIR", str(tmp_path / "profiles"))
    target = str(tiny_pair["llama"][0])
    lm = load_model(ModelSpec(target, dtype="float32"))
    parser = build_parser()

    def choice(*flags):
        return compile_choice(parser.parse_args(["bench", "--target", target, *flags]), lm)

    _profiles(lm, [30.0, 30.5, 31.0, 33.0], [30.0, 30.5, 31.0, 33.0])
    (profile_path(lm, compiled=True)).unlink()
    none = choice()
    assert not none.compiled and "draftlab profile --compile" in none.why
    _profiles(lm, [5.0, 8.0, 12.0, 20.0], [30.0, 30.5, 31.0, 33.0])
    faster = choice()
    assert faster.compiled and not faster.eager and faster.why.startswith("compiled:")
    assert (choice("--no-compile").compiled, choice("--compile").eager) == (False, True)
    # Within 10% (AVX2 kernels on the Zen5: 2.25 s against 2.27 s, then 0.95x eager ar): eager.
    _profiles(lm, [28.5, 29.0, 29.5, 31.0], [30.0, 30.5, 31.0, 33.0])
    assert choice().why.startswith("eager:")
    _profiles(lm, [40.0, 41.0, 42.0, 44.0], [30.0, 30.5, 31.0, 33.0])
    slower = choice()
    assert not slower.compiled and slower.eager and slower.why.startswith("eager:")
    # End to end from the CLI, compiled predicted faster: pld runs compiled only, ar both ways.
    _profiles(lm, [5.0, 8.0, 12.0, 20.0], [30.0, 30.5, 31.0, 33.0])
    suite = write_suite(tmp_path / "suite.jsonl", [{"id": "a", "category": "qa", "prompt": "the cat sat on"}])
    out = tmp_path / "run"
    argv = ["bench", "--target", target, "--dtype", "float32", "--ar-dtypes", "none", "--suite", str(suite)]
    assert main([*argv, "--methods", "ar,pld", "--max-new-tokens", "8", "--out", str(out), *QUIET]) == 0
    assert {r.label for r in read_records(out / "results.jsonl")} == {"ar", "ar compiled", "pld compiled"}
    run = json.loads((out / "run.json").read_text())
    assert run["extra"]["compile"]["compiled"] and not run["extra"]["compile"]["eager_too"]
    report = (out / "report.md").read_text()
    assert "| compiled passes | compiled: plain decoding of a 256-token prompt" in report


def test_one_token_passes_run_padded_to_two_where_that_is_faster(story_model):
    """bfloat16 on a Zen5: a frozen package's 1-token pass took 17.8 ms, its 2-token pass 13.5 ms.
    Padded, a plain step feeds its token twice and drops the copy: the token's logits and features
    are the unpadded pass's (the copy comes after it), and the cache holds the token once."""
    from draftlab.models.compiled import pads

    assert pads(17.8, 13.5) and not pads(16.4, 16.5) and not pads(10.0, 9.5)
    layers = default_aux_layers(story_model.model.config.num_hidden_layers)
    ids = encode_prompt(story_model, "Once upon a time, there was a little dog named Max.", chat=False)
    eager, compiled = CachedModel(story_model), CachedModel(story_model, compiled=True)
    steps = compiled_steps(story_model)
    for cm in (eager, compiled):
        cm.start(ids)
        cm.forward(ids)
    decided = steps.pad_single
    try:
        steps.pad_single = True
        token, calls = 5, steps.calls
        for _ in range(6):
            a, b = eager.forward([token], features=layers), compiled.forward([token], features=layers)
            torch.testing.assert_close(b, a, atol=logits_tol(story_model.model, a), rtol=0)
            assert compiled.features.shape == eager.features.shape
            assert int(compiled._cache.layers[0].cumulative_length) == compiled.length == eager.length
            token = int(a[-1].argmax())
        assert steps.calls == calls + 6
        # A verification pass after padded steps sees exactly the tokens fed.
        a, b = eager.forward([token, 7, 9]), compiled.forward([token, 7, 9])
        torch.testing.assert_close(b, a, atol=logits_tol(story_model.model, a), rtol=0)
    finally:
        steps.pad_single = decided


def test_models_compiled_lists_the_packages_and_clear_removes_them(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DRAFTLAB_COMPILED_DIR", str(tmp_path / "compiled"))
    folder = tmp_path / "compiled" / "smollm2-135m-instruct-float32-0123456789abcdef"
    folder.mkdir(parents=True)
    for name, size in (("512.pt2", 3_000_000), ("1024.pt2", 2_000_000), ("model.json", 10)):
        (folder / name).write_bytes(b"\0" * size)
    assert main(["models", "compiled"]) == 0
    out = capsys.readouterr().out
    assert "512, 1024" in out and "5 MB" in out and "--clear" in out
    assert main(["models", "compiled", "--clear"]) == 0
    assert "removed 1 package folders (0.01 GB)" in capsys.readouterr().out
    assert not folder.exists()


def test_without_a_working_compiler_compile_fails_in_one_line_and_profile_goes_on_eagerly(
    tiny_pair, tmp_path, monkeypatch, capsys, request
):
    """AOTInductor needs a C++ compiler: without one, `--compile` stops with a one-line error, and
    `draftlab profile --compile` (the README's first command) measures the eager profiles anyway, so
    that `draftlab bench` runs our loop eagerly."""
    import torch._inductor.config as inductor_config

    monkeypatch.setenv("DRAFTLAB_COMPILED_DIR", str(tmp_path / "compiled"))
    monkeypatch.setenv("DRAFTLAB_PROFILE_DIR", str(tmp_path / "profiles"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    # inductor's own patch: pytest's monkeypatch deletes a sub-config's key when it undoes it
    # (`config.cpp.cxx` then "does not exist" for every later build in this worker).
    no_compiler = inductor_config.patch({"cpp.cxx": (None, str(tmp_path / "no-such-g++"))})
    no_compiler.__enter__()
    request.addfinalizer(lambda: no_compiler.__exit__(None, None, None))
    target = str(tiny_pair["gpt_neox"][0])
    argv = ["generate", "hello", "--target", target, "--method", "ar", "--dtype", "float32", "--compile"]
    assert main(argv) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    one_line(error, ["--compile could not build a package", "run without --compile"])
    assert not list((tmp_path / "compiled").rglob("*.pt2")), "no package, not even a partial one"
    out = tmp_path / "profile"
    argv = [
        "profile",
        "--target",
        target,
        "--dtype",
        "float32",
        "--compile",
        "--repeats",
        "1",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    assert "no compiled profile of" in capsys.readouterr().out
    results = json.loads((out / "profile.json").read_text())
    assert "float32" in results["compile_failed"] and "target/float32" in results["profiles"]
