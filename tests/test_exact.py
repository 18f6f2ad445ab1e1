"""Exact mode (`--exact`, models/exact.py): every pass scores each position bit for bit as plain
decoding's pass does, so greedy methods write plain decoding's tokens exactly, in bfloat16 too.

Without exact mode the same bfloat16 runs are not equal here: on a Sapphire Rapids Xeon, 7 of the 12
method-prompt pairs below wrote other tokens than `ar` (stories260K, 120 tokens). The width is
measured: the probe must find a pass that rounds by its row count or by a row's place in the pass
(a deliberately wrong model, below), and pick a wider pass or refuse."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import QUIET, check_error, noisy_copy, write_suite
from tiny import FAMILIES

from draftlab.decode.build import build_decoder, warm_compiled_passes
from draftlab.decode.cost import CostModel, exact_width_order
from draftlab.decode.spec import DecoderConfig
from draftlab.decode.timing import TickClock
from draftlab.errors import DraftlabError
from draftlab.models import exact
from draftlab.models.cached import CachedModel
from draftlab.models.compiled import MAX_PASS
from draftlab.models.cost_curve import CostCurve
from draftlab.models.loading import ModelSpec, load_model
from draftlab.models.prompting import encode_prompt
from draftlab.sampling import SamplingParams

GREEDY = SamplingParams()
STORY = "Once upon a time, there was a little dog named Max. Max liked to run and play in the park. "
# A long prompt too: a tree pass agreed with its chains after 24 tokens and not after 300 (models/exact.py).
PROMPTS = [STORY, "Lily and Tom went to the park. They", STORY * 11 + "One day, Max"]
METHODS = ("sps", "pld", "pld-tree", "sps-tree", "suffix", "hybrid")


def flat_curve(ms: dict[int, float]) -> CostCurve:
    return CostCurve(contexts=[0, 1024], sizes=sorted(ms), ms=[[ms[n] for n in sorted(ms)]] * 2)


# A flat verification curve, so the sizers draft and trees grow up to the longest exact pass.
COST = {1: 4.0, 2: 4.1, 4: 4.2, 8: 4.4}


def _bf16(path):
    model = load_model(ModelSpec(str(path), dtype="bfloat16"))
    model.eos_token_ids = set()  # every generation as long as asked
    return model


@pytest.fixture(scope="module")
def story_pair(stories, tmp_path_factory):
    draft_dir = noisy_copy(stories, tmp_path_factory.mktemp("exact") / "noisy")
    return _bf16(stories), _bf16(draft_dir)


def _generate(method, target, draft, ids, compile=False, n=120, params=GREEDY):
    config = DecoderConfig.of(method=method, exact=True, compile=compile, pld_tokens=6)
    cost = None
    if config.adaptive:
        draft_curve = flat_curve({1: 0.5, 2: 0.6, 8: 1.0}) if config.needs_draft else None
        cost = CostModel(flat_curve(COST), draft_curve, clock=TickClock())
    decoder = build_decoder(config, target, draft if config.needs_draft else None, cost)
    warm_compiled_passes(decoder, len(ids) + n + 16, config)
    return decoder.generate(ids, n, params)


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_every_lossless_method_writes_plain_decodings_tokens_in_bfloat16(story_pair, compile):
    target, draft = story_pair
    for prompt in PROMPTS:
        ids = encode_prompt(target, prompt, chat=False)
        ar = _generate("ar", target, draft, ids, compile)
        assert len(ar.tokens) == 120
        # The round split: the pass itself (compiled: the package's runner) apart from its inputs.
        assert ar.stats.pass_s > 0 and ar.stats.inputs_s > 0
        for method in METHODS if not compile else ("sps", "pld", "pld-tree", "sps-tree"):
            out = _generate(method, target, draft, ids, compile)
            assert out.tokens == ar.tokens, f"{method} compiled={compile}: not plain decoding's tokens"
            assert out.stats.drafted > 0, f"{method} never drafted: the equality says nothing"
            if method.endswith("tree") or method in ("suffix", "hybrid"):
                assert out.stats.tree_fallback.startswith("exact mode"), (
                    "exact mode verifies a tree's best chain"
                )


def test_sampling_in_exact_mode_writes_plain_decodings_tokens_for_a_seed(story_pair):
    """Exact mode samples with keyed noise (draftlab.sampling.KeyedSampler): in bfloat16, seed for
    seed, every lossless method writes the tokens plain decoding samples."""
    target, draft = story_pair
    ids = encode_prompt(target, STORY, chat=False)
    drafted = accepted = 0
    for seed in (0, 1):
        params = SamplingParams(temperature=0.8, top_p=0.95, seed=seed)
        ar = _generate("ar", target, draft, ids, n=80, params=params)
        for method in ("sps", "pld", "sps-tree"):
            out = _generate(method, target, draft, ids, n=80, params=params)
            assert out.tokens == ar.tokens, f"{method} seed {seed}: not plain decoding's sample"
            drafted, accepted = drafted + out.stats.drafted, accepted + out.stats.accepted
    assert accepted > 0.1 * drafted > 0, "drafts must be kept, or the equality says nothing"  # 111 of 599


def test_the_probe_finds_the_width_each_pass_shape_needs(story_pair):
    """A model whose passes round by their row count is exact only when every pass has the same
    rows; one whose rows round by their place in the pass is exact under no width."""
    model = load_model(ModelSpec(str(story_pair[0].path), dtype="float32"))  # a model object of its own
    shift = {"by": "rows"}

    def wrong(module, args, out):
        rows = out.shape[1]
        if shift["by"] == "rows":
            return out + (rows > 1) * 1e-3
        return out + torch.arange(rows, dtype=out.dtype)[None, :, None] * 1e-3

    cached = CachedModel(model, exact=True)
    bucket = 512
    handle = model.model.model.norm.register_forward_hook(wrong)
    try:
        tokens = exact.probe_tokens(int(model.vocab_size), exact.PREFIX + exact.PROBE)
        cached.start(tokens[: exact.PREFIX])
        cached._cache = cached.compiled.new_cache(bucket)
        cached.forward(tokens[: exact.PREFIX], keep=1)
        one = exact.logits_in_passes(cached, tokens, exact.PREFIX, 1, 1)
        assert not torch.equal(exact.logits_in_passes(cached, tokens, exact.PREFIX, 2, 1), one)
        cached.crop(0)
        width = cached.exact_width(bucket)
        assert width in exact.WIDTHS, "unpadded passes round by their rows: pad them"
        assert exact.is_exact(cached, width, bucket)
        shift["by"] = "place"
        assert exact.choose_width(cached, bucket) is None
        cached.compiled.exact_widths.clear()
        with pytest.raises(DraftlabError, match="no pass width up to 8"):
            cached.exact_width(bucket)
    finally:
        handle.remove()
    cached.compiled.exact_widths.clear()
    assert cached.exact_width(bucket) in exact.WIDTHS  # the model itself: which one is CPU-dependent


def test_generate_exact_from_the_cli(story_pair, capsys):
    """End to end: the width is measured and said, and the tokens are plain decoding's."""
    from draftlab.cli import main

    path = str(story_pair[0].path)
    runs = {}
    for method in ("ar", "pld"):
        for sampling in ([], ["--temperature", "0.9", "--seed", "5"]):
            argv = ["generate", "--target", path, "--dtype", "bfloat16", "--method", method, "--exact"]
            assert main([*argv, *sampling, "--max-new-tokens", "40", "--json", STORY]) == 0
            captured = capsys.readouterr()
            runs[method, bool(sampling)] = json.loads(captured.out)
            assert "exact mode: eager passes over a static cache" in captured.err
    for sampled in (False, True):
        assert runs["pld", sampled]["tokens"] == runs["ar", sampled]["tokens"]
    assert runs["ar", True]["tokens"] != runs["ar", False]["tokens"], "the seed's sample is not the argmax"
    runs = {key: runs[key] for key in runs if not key[1]}
    runs = {method: run for (method, _), run in runs.items()}
    assert runs["ar"]["exact"]["passes"] == "eager" and runs["ar"]["exact"]["width"]


def test_bench_exact_from_the_cli_samples_plain_decodings_tokens(story_pair, tmp_path, monkeypatch):
    """`bench --exact`, sampled: every generation of a lossless method is plain decoding's sample for
    its seed, the report says so, and it prices exactness beside plain decoding as it runs without it."""
    from test_routing import synthetic, write_profile

    from draftlab.bench.losslessness import with_plain_matches
    from draftlab.bench.records import read_records
    from draftlab.cli import main
    from draftlab.plan import profiles

    # Models as a new process loads them: an earlier test's `generate --exact` fixed the width of
    # the models this process already holds (per model object and bucket, without a cost model).
    monkeypatch.setattr(profiles, "_LOADED", {})
    # A flat profile of its own (8 rows at 1.09 steps: the width is 8, drafts up to 7), so that
    # the width and how much sps drafts do not follow this machine's measured curve.
    monkeypatch.setenv("DRAFTLAB_PROFILE_DIR", str(tmp_path / "profiles"))
    for model in story_pair:
        write_profile(str(model.path), "bfloat16", synthetic(10.0, verify4=1.05))

    suite = write_suite(
        tmp_path / "suite.jsonl",
        [{"id": f"s{i}", "category": "qa", "prompt": p} for i, p in enumerate(PROMPTS[:2])],
    )
    target, draft = (str(m.path) for m in story_pair)
    out = tmp_path / "run"
    argv = [
        "bench",
        "--target",
        target,
        "--draft",
        draft,
        "--dtype",
        "bfloat16",
        "--exact",
        "--methods",
        "ar,sps,pld",
        "--ar-dtypes",
        "none",
    ]
    run = [
        "--suite",
        str(suite),
        "--full",
        "--max-new-tokens",
        "48",
        "--temperature",
        "0.8",
        "--out",
        str(out),
    ]
    assert main([*argv, *run, *QUIET]) == 0
    records = with_plain_matches(read_records(out / "results.jsonl"))
    assert {"ar", "sps", "pld", "ar not exact"} <= {r.label for r in records}
    for r in records:
        if r.method in ("sps", "pld"):
            assert r.plain_match is True, (r.label, r.example_id)
    accepted = sum(r.accepted for r in records if r.method == "sps")
    assert accepted > 0, "sps drafts must be kept, or the equality says nothing"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["overall"]["sps"]["greedy_match_rate"] == 1.0
    # The width was chosen from the cost profile (every width in its order), for `ar` too, which
    # carries no cost model of its own but shares the sized methods' passes.
    widths = json.loads((out / "run.json").read_text())["extra"]["exact"]
    assert widths["ar"]["tried"] == widths["sps"]["tried"] == [8, 4, 2]
    assert json.loads((out / "run.json").read_text())["extra"]["exact"]


@pytest.mark.parametrize(
    ("ms", "order"),
    [
        ({1: 4.0, 2: 4.1, 4: 4.2, 8: 4.4}, (8, 4, 2)),  # flat (native bfloat16): room for long drafts
        ({1: 10.0, 2: 10.2, 4: 10.6, 8: 11.9}, (4, 2, 8)),  # 8 rows at 1.19 steps: over the price
        ({1: 14.7, 2: 14.2, 4: 16.9, 8: 31.0}, (2, 4, 8)),  # 4-bit, compiled, on a Zen4 (stop 60)
        ({1: 10.0, 2: 13.0, 4: 17.0, 8: 28.0}, (2, 4, 8)),  # steep (AVX2): none within, cheapest first
    ],
    ids=["flat", "xeon", "zen4-q4_1", "avx2"],
)
def test_the_width_is_the_widest_within_the_price_of_exactness(ms, order):
    """Every plain step pays for the width's rows: a width costing more than EXACT_PRICE times
    plain decoding's step comes after those that do not (a synthetic profile per CPU kind)."""
    assert exact_width_order(CostModel(flat_curve(ms)), exact.WIDTHS, 300) == order


def test_a_narrow_width_caps_the_drafts_and_stays_exact(stories):
    """On a steep curve exact mode pads to two rows: plain decoding pays nothing for it, each
    round verifies one draft, and `pld` still writes `ar`'s tokens; a longer pass than the width
    (fed directly) runs as passes of the width and scores as one-token passes do."""
    target = _bf16(stories)  # its own compiled steps: the width is chosen once per bucket
    ids = encode_prompt(target, STORY, chat=False)
    steep = flat_curve({1: 10.0, 2: 10.5, 4: 17.0, 8: 28.0})
    outs = {}
    for method in ("ar", "pld"):
        config = DecoderConfig.of(method=method, exact=True, pld_tokens=6)
        decoder = build_decoder(config, target, None, CostModel(steep, clock=TickClock()))
        warm_compiled_passes(decoder, len(ids) + 80 + 16, config)
        outs[method] = decoder.generate(ids, 80, GREEDY)
    assert set(decoder.target.compiled.exact_widths.values()) == {2}
    assert decoder.gamma == 1 and decoder.sizer.k_max == 1
    pld = outs["pld"].stats
    assert outs["pld"].tokens == outs["ar"].tokens
    assert pld.drafted > 0 and pld.drafted <= pld.rounds, "one draft a round at most"
    # A pass of 5 tokens after the prompt: two passes of two and one of one, padded to two.
    cached = decoder.target
    cached.start(ids)
    cached.forward(ids, keep=1)
    calls = cached.forward_calls
    whole = cached.forward(outs["ar"].tokens[:5])
    assert cached.forward_calls == calls + 3
    cached.crop(len(ids))
    single = torch.cat([cached.forward([t]) for t in outs["ar"].tokens[:5]])
    assert torch.equal(whole, single)


def test_the_cost_model_prices_every_pass_at_the_padded_width():
    cost = CostModel(flat_curve({1: 4.0, 2: 5.0, 4: 6.0, 8: 8.0}))
    assert cost.verify_ms(1, 10) == 4.0
    cost.min_rows = 4
    assert cost.verify_ms(1, 10) == cost.verify_ms(4, 10) == 6.0
    assert cost.verify_ms(MAX_PASS, 10) == 8.0


def test_exact_is_refused_where_it_cannot_mean_anything(capsys):
    with pytest.raises(DraftlabError, match="--exact runs the methods of draftlab's own loop"):
        DecoderConfig(method="hf-assisted", exact=True)
    check_error(capsys, ["generate", "--engine", "llamacpp", "--exact", "--method", "ar", "hi"], "--exact")


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "t5"])
def test_exact_mode_on_every_decoder_only_family_in_bfloat16(family, tiny_pair):
    target, draft = (_bf16(path) for path in tiny_pair[family])
    ids = encode_prompt(target, "the cat sat on the mat and then the dog ran", chat=False)
    ar = _generate("ar", target, draft, ids, n=60)
    for method in ("sps", "pld", "pld-tree"):
        out = _generate(method, target, draft, ids, n=60)
        assert out.tokens == ar.tokens, f"{family} {method}: not plain decoding's tokens"
        if method == "sps":
            assert out.stats.drafted > 0, f"{family}: sps never drafted, the equality says nothing"


def test_exact_mode_refuses_an_encoder_decoder_target(tiny_pair):
    with pytest.raises(DraftlabError, match="--exact needs a decoder-only target"):
        CachedModel(_bf16(tiny_pair["t5"][0]), exact=True)
