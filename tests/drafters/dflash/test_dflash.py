"""DFlash block drafters: the cached context equals a pass over the whole context, the files round
trip, greedy output is the target's, sampling follows the target's law (with power shown), and the
method runs end to end from the CLI."""

from __future__ import annotations

import argparse
import json

import pytest
import torch
from helpers import write_suite
from tiny import make_model, random_dflash
from tolerance import FALSE_FAILURE, SHOWN_POWER, assert_greedy_equal, reduction_length, sum_tol

from draftlab.audit.law import ResampleFromTargetRule
from draftlab.cli import main
from draftlab.decode.build import build_decoder
from draftlab.decode.loop import SpeculativeDecoder
from draftlab.decode.spec import DecoderConfig
from draftlab.drafters.dflash.head import default_taps
from draftlab.drafters.dflash.io import is_dflash_folder, load_dflash, save_dflash
from draftlab.drafters.dflash.lm import load_dflash_lm
from draftlab.drafters.dflash.proposer import DFlashProposer
from draftlab.errors import DraftlabError
from draftlab.models.cached import CachedModel
from draftlab.models.loading import ModelSpec, load_model
from draftlab.sampling import Sampler, SamplingParams
from draftlab.verify.rules import SpeculativeRule


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    root = tmp_path_factory.mktemp("dflash")
    path = make_model("llama", root / "target", seed=1, hidden=64, layers=4)
    target = load_model(ModelSpec(str(path), "float32"))
    save_dflash(random_dflash(target, block_size=5, layers=2), root / "dflash", str(path))
    return target, load_dflash_lm(str(root / "dflash"), target), root


def _features(target, ids, layers):
    with torch.no_grad():
        out = target.model(torch.tensor([ids]), output_hidden_states=True)
    return torch.cat([out.hidden_states[i][0] for i in layers], -1)


def test_default_taps_follow_the_reference_rule():
    assert default_taps(32, 1) == (16,)
    assert default_taps(30, 5) == (1, 8, 14, 20, 27)
    assert default_taps(4, 2) == (1, 1)


def test_cached_context_equals_one_pass_over_it(llama):
    """Drafting after features arrived over several rounds (cached, then cropped back to final
    positions) reads what a drafter given the whole context at once reads."""
    target, lm, _ = llama
    ids = target.tokenizer("the cat sat on the mat and then the dog ran")["input_ids"]
    feats = _features(target, ids, lm.model.feature_layers)
    params, sampler = SamplingParams(temperature=1.0), Sampler(0)
    step = DFlashProposer(lm)
    step.start(ids[:4], ids[:4])
    step.take_features(0, feats[:3])
    for end in (4, 7, len(ids) - 1):  # rounds that made positions final, drafting in between
        step.propose(ids[: end + 1], 3, params, sampler)
        step.take_features(step.known, feats[step.known : end])
        assert step.known == end
    once = DFlashProposer(lm)
    once.start(ids, ids)
    once.take_features(0, feats[: len(ids) - 1])
    a = step.propose(ids, 4, params, Sampler(1))
    b = once.propose(ids, 4, params, Sampler(1))
    # Softmax turns a logit error d into a relative probability error of at most 2d.
    log_p = torch.log(b.probs)
    spread = float((log_p.max(-1).values[:, None] - log_p).abs().max())
    d = sum_tol(reduction_length(lm.model.config), torch.float32, max(1.0, spread))
    torch.testing.assert_close(a.probs, b.probs, rtol=2 * d, atol=sum_tol(b.probs.shape[-1]))
    assert step._cached == once._cached == len(ids) - 1  # only final positions stay cached


def test_the_files_round_trip_in_the_published_layout(llama, tmp_path):
    target, lm, root = llama
    data = json.loads((root / "dflash" / "config.json").read_text())
    assert data["architectures"] == ["DFlashDraftModel"] and data["model_type"] == "qwen3"
    assert data["block_size"] == 5 and data["dflash_config"]["target_layer_ids"] == list(lm.model.taps)
    assert data["num_target_layers"] == 4 and data["num_hidden_layers"] == 2
    assert is_dflash_folder(root / "dflash") and not is_dflash_folder(target.path)
    again = load_dflash(root / "dflash")
    for name, tensor in lm.model.state_dict().items():
        assert torch.equal(tensor, again.state_dict()[name]), name


@pytest.mark.parametrize("method", ["dflash", "dflash-tree"])
def test_a_pruned_vocabulary_proposes_only_its_tokens_and_output_stays_the_targets(llama, tmp_path, method):
    """A drafter pruned to a third of the vocabulary scores its tokens as the whole head does,
    never proposes another, round trips with its map, and greedy output is still the target's."""
    target, lm, root = llama
    vocabulary = torch.arange(0, target.vocab_size, 3)
    pruned = load_dflash(root / "dflash")
    pruned.prune(vocabulary, lm.output_head.weight.detach().float())
    save_dflash(pruned, tmp_path / "pruned", str(target.path))
    data = json.loads((tmp_path / "pruned" / "config.json").read_text())
    assert data["draft_vocab_size"] == len(vocabulary)
    small = load_dflash_lm(str(tmp_path / "pruned"), target)
    assert torch.equal(small.model.target_ids(), vocabulary)

    prompt = target.tokenizer("the cat sat on the mat and then the dog")["input_ids"]
    feats = _features(target, prompt, lm.model.feature_layers)
    rows = {}
    for name, which in (("full", lm), ("pruned", small)):
        step = DFlashProposer(which)
        step.start(prompt, prompt)
        step.take_features(0, feats[: len(prompt) - 1])
        rows[name] = step.block_logits(prompt, 4)
    outside = torch.ones(target.vocab_size, dtype=torch.bool)
    outside[vocabulary] = False
    assert torch.isinf(rows["pruned"][:, outside]).all() and (rows["pruned"][:, outside] < 0).all()
    tol = sum_tol(reduction_length(lm.model.config), torch.float32, float(rows["full"].abs().max()))
    torch.testing.assert_close(rows["pruned"][:, vocabulary], rows["full"][:, vocabulary], rtol=0, atol=tol)

    ar = build_decoder(DecoderConfig("ar"), target).generate(prompt, 40, SamplingParams())
    config = DecoderConfig.of(method=method, gamma=4, fixed_k=True, tree_budget=6, tree_width=3)
    got = build_decoder(config, target, small).generate(prompt, 40, SamplingParams())
    assert got.stats.drafted > 0
    assert_greedy_equal(target, prompt, got.tokens, ar.tokens, method)


@pytest.mark.parametrize("fixed_k", [True, False])
def test_greedy_dflash_writes_what_the_target_alone_writes(llama, fixed_k):
    from draftlab.decode.cost import CostModel
    from draftlab.decode.timing import TickClock
    from draftlab.models.cost_curve import CostCurve

    target, lm, _ = llama
    prompt = target.tokenizer("the cat sat on the mat and then the dog")["input_ids"]
    ar = build_decoder(DecoderConfig("ar"), target).generate(prompt, 40, SamplingParams())
    cost = None
    if not fixed_k:  # sized rounds: k = 0 is a plain step, and the context still keeps up
        curve = CostCurve([1, 2, 4, 8], [64], [[1.0, 1.02, 1.05, 1.2]])
        cost = CostModel(curve, CostCurve([1, 2, 4, 8], [64], [[0.1, 0.1, 0.11, 0.12]]), clock=TickClock())
    decoder = build_decoder(DecoderConfig("dflash", gamma=4, fixed_k=fixed_k), target, lm, cost)
    got = decoder.generate(prompt, 40, SamplingParams())
    assert (decoder.sizer is not None) != fixed_k
    assert decoder.sizer is None or decoder.sizer.cost.block  # one pass drafts the block
    if fixed_k:
        assert got.stats.drafted_per_position[0] == got.stats.rounds - 1  # all but the prefill round
    assert_greedy_equal(target, prompt, got.tokens, ar.tokens, "dflash")


@pytest.mark.parametrize("budget", [6, None])
def test_greedy_dflash_tree_writes_what_the_target_alone_writes(llama, budget):
    from draftlab.decode.cost import CostModel
    from draftlab.decode.timing import TickClock
    from draftlab.models.cost_curve import CostCurve

    target, lm, _ = llama
    prompt = target.tokenizer("the cat sat on the mat and then the dog")["input_ids"]
    ar = build_decoder(DecoderConfig("ar"), target).generate(prompt, 40, SamplingParams())
    cost = None
    if budget is None:  # the tree sizer picks the nodes; a block's levels all come from one pass
        curve = CostCurve([1, 2, 4, 8], [64], [[1.0, 1.02, 1.05, 1.2]])
        cost = CostModel(curve, CostCurve([1, 2, 4, 8], [64], [[0.1, 0.1, 0.11, 0.12]]), clock=TickClock())
    config = DecoderConfig.of(method="dflash-tree", gamma=4, tree_budget=budget, tree_width=3)
    decoder = build_decoder(config, target, lm, cost)
    got = decoder.generate(prompt, 40, SamplingParams())
    if budget is not None:
        assert got.stats.drafted > 0
    else:
        assert decoder.sizer.expand_threshold(64) == 0.0
    assert_greedy_equal(target, prompt, got.tokens, ar.tokens, "dflash-tree")


def test_a_block_tree_gives_every_node_of_a_depth_that_rows_likeliest_tokens(llama):
    """Rows of a block do not depend on the tokens chosen before them: a node's children are its
    depth's row's top tokens, whatever the node; nodes come best first by path probability."""
    from draftlab.drafters.dflash.proposer import DFlashTreeProposer

    target, lm, _ = llama
    ids = target.tokenizer("the cat sat on the mat")["input_ids"]
    feats = _features(target, ids, lm.model.feature_layers)
    tree = DFlashTreeProposer(lm, width=2, max_nodes=10)
    tree.start(ids, ids)
    tree.take_features(0, feats[: len(ids) - 1])
    proposal = tree.propose(ids, 3, SamplingParams(), Sampler(0))
    assert proposal.is_tree and len(proposal.tokens) == 10
    depths, parents = proposal.depths(), proposal.parent_list()
    by_depth: dict[int, set[int]] = {}
    for i, d in enumerate(depths):
        by_depth.setdefault(d, set()).add(proposal.tokens[i])
        assert parents[i] < i  # topological
    assert all(len(tokens) <= 2 for tokens in by_depth.values())  # one row's top-2 per depth
    # The ten likeliest of the full tree's 2 + 4 + 8 paths (the same block, passed again).
    top = torch.softmax(tree.block_logits(ids, 3).float(), -1).topk(2, -1).values.tolist()
    full = [a for a in top[0]]
    full += [a * b for a in top[0] for b in top[1]]
    full += [a * b * c for a in top[0] for b in top[1] for c in top[2]]
    values = sorted(proposal.path_values(proposal.scores), reverse=True)
    assert values == pytest.approx(sorted(full, reverse=True)[:10])


def test_dflash_refuses_what_it_cannot_draft_with(llama, tmp_path):
    target, lm, root = llama
    with pytest.raises(DraftlabError, match="needs a DFlash drafter"):
        build_decoder(DecoderConfig("dflash"), target)
    with pytest.raises(DraftlabError, match="not a DFlash drafter"):
        build_decoder(DecoderConfig("dflash"), target, target)
    with pytest.raises(DraftlabError, match="not a DFlash drafter folder"):
        load_dflash_lm(target.path, target)
    other = load_model(
        ModelSpec(str(make_model("llama", tmp_path / "wide", seed=2, hidden=32, layers=2)), "float32")
    )
    with pytest.raises(DraftlabError, match="reads target layers"):
        load_dflash_lm(str(root / "dflash"), other)


# ----------------------------------------------------------------- sampling: exact, with power shown


@pytest.fixture(scope="module")
def vocab6(tmp_path_factory):
    from test_sampling_exact import _tiny_vocab_model

    root = tmp_path_factory.mktemp("vocab6-dflash")
    target = _tiny_vocab_model(root / "target", 11)
    save_dflash(random_dflash(target, block_size=3, seed=5, scale=2.0, mask_token_id=2), root / "d", "t")
    return target, load_dflash_lm(str(root / "d"), target)


def _decoder(target, lm, rule, tree=False):
    if tree:
        from draftlab.drafters.dflash.proposer import DFlashTreeProposer

        proposer = DFlashTreeProposer(lm, width=2, max_nodes=4)
        return SpeculativeDecoder(CachedModel(target), proposer, rule, gamma=2, tree_budget=4)
    return SpeculativeDecoder(CachedModel(target), DFlashProposer(lm), rule, gamma=2)


def test_greedy_dflash_on_six_tokens_accepts_drafts_and_stays_the_targets(vocab6):
    target, lm = vocab6
    prompt = [0, 3, 1]
    ar = build_decoder(DecoderConfig("ar"), target).generate(prompt, 30, SamplingParams())
    got = build_decoder(DecoderConfig("dflash", gamma=2, fixed_k=True), target, lm).generate(
        prompt, 30, SamplingParams()
    )
    assert got.stats.accepted > 0
    assert got.tokens == ar.tokens


@pytest.mark.statistical
@pytest.mark.parametrize("tree", [False, True])
def test_dflash_sampling_follows_the_target_and_a_wrong_rule_is_caught(vocab6, tree):
    from test_sampling_exact import PARAMS, PROMPT, chi_square_p

    from draftlab.audit.law import sample_pairs

    target, lm = vocab6
    # 2,500 draws: the wrong rule reads p ~ 1e-25 (chain) and 1e-47 (tree) here, far past SHOWN_POWER.
    run = sample_pairs(_decoder(target, lm, SpeculativeRule(), tree), PROMPT, PARAMS, range(2500))
    assert run.acceptance is not None and 0.05 < run.acceptance < 0.95, run.acceptance
    assert chi_square_p(target, run.counts) > FALSE_FAILURE
    wrong = sample_pairs(_decoder(target, lm, ResampleFromTargetRule(), tree), PROMPT, PARAMS, range(2500))
    assert chi_square_p(target, wrong.counts) < SHOWN_POWER


# ----------------------------------------------------------------- the CLI


def test_generate_and_bench_run_dflash_from_the_cli(llama, tmp_path, capsys):
    target, _, root = llama
    drafter = str(root / "dflash")
    base = ["--target", target.path, "--dtype", "float32", "--max-new-tokens", "12"]
    assert main(["generate", "the cat", "--method", "dflash", "--dflash", drafter, *base]) == 0
    capsys.readouterr()
    out = tmp_path / "run"
    suite = write_suite(
        tmp_path / "suite.jsonl", [{"id": "a", "category": "qa", "prompt": "the cat sat on the mat"}]
    )
    argv = [
        "bench",
        "--methods",
        "dflash",
        "--dflash",
        drafter,
        "--suite",
        str(suite),
        "--out",
        str(out),
        "--quiet",
    ]
    assert main([*argv, *base, "--fixed-k"]) == 0
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    dflash = [r for r in rows if r["method"] == "dflash"]
    assert dflash and all(r["params"]["dflash"] == drafter for r in dflash)
    assert f"| heads | {drafter} (DFlash drafter) |" in (out / "report.md").read_text()
    # Without --methods, a run given --dflash adds both DFlash methods to the default set (sized by
    # cost, so they draft only where it pays); without it, neither.
    from draftlab.engines import get  # noqa: PLC0415

    defaults = get("hf").methods
    assert {"dflash", "dflash-tree"} <= set(
        defaults(argparse.Namespace(target=None, dflash=drafter)).split(",")
    )
    assert "dflash" not in defaults(argparse.Namespace(target=None, dflash=None)).split(",")
    assert main(["generate", "x", "--method", "dflash", *base]) == 2
    assert "pass --dflash" in capsys.readouterr().err
