"""EAGLE-3 heads: the head's cached passes, its training forward, losslessness, and its files.

The decisive check is that training and drafting compute the same thing: step j of the
training-time test at position p must give the logits the cached head gives when it drafts p
after j - 1 tokens of its own (`test_training_step_j_is_drafting_the_jth_token`).
"""

from __future__ import annotations

import json

import pytest
import torch
from tiny import make_model, random_head
from tolerance import FALSE_FAILURE, SHOWN_POWER, assert_greedy_equal, logits_tol

from draftlab.audit.law import ResampleFromTargetRule
from draftlab.cli import main
from draftlab.decode.build import build_decoder
from draftlab.decode.loop import SpeculativeDecoder
from draftlab.decode.spec import DecoderConfig
from draftlab.drafters.eagle3.cached import HeadModel
from draftlab.drafters.eagle3.head import default_aux_layers
from draftlab.drafters.eagle3.io import is_head_folder, load_head, load_head_lm, save_head
from draftlab.drafters.eagle3.proposer import EagleProposer
from draftlab.drafters.eagle3.train import step_masks, ttt_forward
from draftlab.errors import DraftlabError
from draftlab.models.cached import CachedModel
from draftlab.models.loading import ModelSpec, load_model
from draftlab.sampling import SamplingParams
from draftlab.verify.rules import SpeculativeRule


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    root = tmp_path_factory.mktemp("eagle")
    path = make_model("llama", root / "target", seed=1, hidden=64, layers=4)
    target = load_model(ModelSpec(str(path), "float32"))
    head = random_head(target, torch.arange(0, target.vocab_size, 2))  # a draft vocabulary of half
    save_head(head, root / "head", str(path), ["LlamaForCausalLM"])
    return target, load_head_lm(str(root / "head"), target), root


def _features(target, ids):
    layers = default_aux_layers(target.model.config.num_hidden_layers)
    with torch.no_grad():
        out = target.model(torch.tensor([ids]), output_hidden_states=True)
    return torch.cat([out.hidden_states[i][0] for i in layers], -1)


def test_the_files_round_trip_in_the_speculators_layout(llama, tmp_path):
    target, head_lm, root = llama
    config = json.loads((root / "head" / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and "model_type" not in config
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 4
    assert config["norm_before_residual"] is False  # written always: vLLM and speculators default differently
    assert config["draft_vocab_size"] == target.vocab_size // 2
    from safetensors.torch import load_file

    tensors = load_file(str(root / "head" / "model.safetensors"))
    assert tensors["fc.weight"].shape == (64, 3 * 64)
    assert tensors["layers.0.self_attn.q_proj.weight"].shape[1] == 2 * 64
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
    assert int(tensors["t2d"].sum()) == config["draft_vocab_size"]
    assert "embed_tokens.weight" not in tensors  # the target's: vLLM and load_head share it
    ids = torch.arange(config["draft_vocab_size"]) + tensors["d2t"]
    assert torch.equal(ids, torch.arange(0, target.vocab_size, 2))
    # EAGLE's own layout (midlayer.*, a plain Llama config) loads to the same head.
    eagle = tmp_path / "eagle-layout"
    eagle.mkdir()
    flat = {**config["transformer_layer_config"], "draft_vocab_size": config["draft_vocab_size"]}
    flat["architectures"] = ["LlamaForCausalLMEagle3"]
    (eagle / "config.json").write_text(json.dumps(flat))
    from safetensors.torch import save_file

    save_file(
        {k.replace("layers.0.", "midlayer."): v for k, v in tensors.items()}, str(eagle / "m.safetensors")
    )
    assert is_head_folder(eagle) and is_head_folder(root / "head") and not is_head_folder(root / "target")
    again = load_head(eagle, target.model.config, target.model.get_input_embeddings().weight)
    for name, tensor in head_lm.model.state_dict().items():
        assert torch.equal(tensor, again.state_dict()[name]), name


def test_cached_passes_equal_one_pass(llama):
    """Feeding the head token by token, in one pass, or after a crop gives the same logits."""
    target, head_lm, _ = llama
    ids = [5, 17, 33, 8, 90, 41, 12, 7]
    aux = _features(target, ids)
    one = HeadModel(head_lm)
    one.start(ids)
    one.take_features(0, aux)
    whole = one.forward(ids)
    step = HeadModel(head_lm)
    step.start(ids)
    step.take_features(0, aux)
    rows = [step.forward(ids[:3])]
    rows += [step.forward([t]) for t in ids[3:6]]
    step.crop(4)
    rows = rows[:1] + rows[1:2] + [step.forward(ids[4:])]
    bound = logits_tol(head_lm.model, whole[torch.isfinite(whole)])
    torch.testing.assert_close(torch.cat(rows), whole, atol=bound, rtol=0)


def test_target_features_are_fused_only_when_the_head_drafts(llama, monkeypatch):
    """Rounds that do not draft only keep the target's features; the next draft fuses every row
    since in one call, as fusing them one round at a time would (a rewrite replaces the tail)."""
    target, head_lm, _ = llama
    ids = [5, 17, 33, 8, 90, 41, 12, 7]
    aux = _features(target, ids)
    head = HeadModel(head_lm)
    calls = []
    fuse = head_lm.model.fuse
    monkeypatch.setattr(head_lm.model, "fuse", lambda rows: calls.append(len(rows)) or fuse(rows))
    head.start(ids)
    head.take_features(0, aux[:3])
    head.take_features(3, aux[3:5])
    head.take_features(4, -aux[4:6])  # a round that kept other tokens from position 4 on
    assert calls == [] and head.known == 6 and head.ready(7)
    head.forward(ids[:7])
    assert calls == [6], "one fuse for every row taken since"
    with torch.no_grad():
        want = fuse(torch.cat([aux[:4], -aux[4:6]]))
    torch.testing.assert_close(head._features.view(), want, atol=logits_tol(head_lm.model, want), rtol=0)
    head.take_features(6, aux[6:8])
    head.trim_features(7)
    head.forward([ids[7]])
    assert calls == [6, 1] and len(head._features) == 7


def test_training_step_j_is_drafting_the_jth_token(llama):
    """The training-time test's masks and shifts are what the cached head does when it drafts."""
    target, head_lm, _ = llama
    head = head_lm.model
    ids = [5, 17, 33, 8, 90, 41, 12, 7, 60, 3]
    aux = _features(target, ids)
    with torch.no_grad():
        steps = ttt_forward(head, torch.tensor([ids]), aux[None], steps=3)
    to_draft = head.draft_to_target
    for j in range(3):
        for p in range(j + 1, len(ids)):
            model = HeadModel(head_lm)
            model.start(ids)
            model.take_features(0, aux[: p - j])  # the target has scored positions < p - j
            logits = model.forward(ids[: p - j + 1])[-1]
            for r in range(p - j + 1, p + 1):  # j tokens of its own
                logits = model.forward([ids[r]])[-1]
            got = logits[to_draft]
            want = steps[j][0, p]
            torch.testing.assert_close(got, want, atol=logits_tol(head, want), rtol=0)


def test_step_masks_see_the_chain_and_nothing_later():
    masks = step_masks(5, 3, "cpu")
    assert masks[0].shape == (5, 5) and torch.equal(masks[0], torch.ones(5, 5).tril().bool())
    m = masks[2]  # step 2 at position 4: step 0 up to 2, step 1 at 3, itself at 4
    assert m[4, :5].tolist() == [True, True, True, False, False]
    assert m[4, 5:10].tolist() == [False, False, False, True, False]
    assert m[4, 10:].tolist() == [False, False, False, False, True]


@pytest.mark.parametrize("method", ["eagle", "eagle-tree"])
def test_greedy_eagle_writes_what_the_target_alone_writes(llama, method):
    target, head_lm, _ = llama
    prompt = target.tokenizer("the cat sat on the mat and then the dog")["input_ids"]
    params = SamplingParams()
    ar = build_decoder(DecoderConfig("ar"), target).generate(prompt, 48, params)
    budget = 10 if method == "eagle-tree" else None
    config = DecoderConfig.of(method=method, gamma=4, tree_budget=budget, draft_confidence=0.0)
    got = build_decoder(config, target, head_lm).generate(prompt, 48, params)
    assert got.stats.drafted > 0
    assert got.stats.target_calls < ar.stats.target_calls or got.stats.accepted == 0
    assert_greedy_equal(target, prompt, got.tokens, ar.tokens, method)


@pytest.mark.parametrize(
    ("flags", "dtype"), [(["avx2"], "float32"), (["avx2", "avx512f", "avx512_bf16"], "q8_0")]
)
def test_beside_a_4bit_target_the_head_runs_as_a_draft_would(llama, monkeypatch, flags, dtype):
    # On a CPU that emulates bfloat16 the head runs in float32 (an eager bfloat16 head cost 1.5-3.9
    # compiled target steps on a Zen3), reading the target's bfloat16 features: still its tokens.
    # Where bfloat16 is native its matrices (`fc` too) and LM head run from Q8_0 blocks.
    from draftlab.models.loading import DTYPES  # noqa: PLC0415
    from draftlab.models.q4 import Q8Linear  # noqa: PLC0415

    target, _, root = llama
    monkeypatch.setattr("draftlab.models.loading.effective_isa", lambda _cpu_flags: flags)
    q4 = load_model(ModelSpec(target.path, "q4_1"))
    head_lm = load_head_lm(str(root / "head"), q4)
    assert head_lm.model.dtype == DTYPES[dtype]
    assert head_lm.spec.dtype == dtype
    blocks = {n for n, m in head_lm.model.named_modules() if isinstance(m, Q8Linear)}
    if dtype == "q8_0":
        assert {"fc", "lm_head", "layers.0.mlp.down_proj", "layers.0.self_attn.o_proj"} <= blocks, blocks
        dense = load_head_lm(str(root / "head"), q4, dtype="float32")
        assert head_lm.num_parameters == dense.num_parameters
    else:
        assert not blocks
    prompt = q4.tokenizer("the cat sat on the mat and then the dog")["input_ids"]
    ar = build_decoder(DecoderConfig("ar"), q4).generate(prompt, 32, SamplingParams())
    config = DecoderConfig.of(method="eagle", gamma=4, draft_confidence=0.0)
    got = build_decoder(config, q4, head_lm).generate(prompt, 32, SamplingParams())
    assert got.stats.drafted > 0
    assert_greedy_equal(q4, prompt, got.tokens, ar.tokens, "eagle beside q4_1")


def test_greedy_eagle_with_cost_aware_sizing(llama):
    """With a profile the rounds are sized (k = 0 is a plain step): still the target's tokens."""
    from draftlab.decode.cost import CostModel
    from draftlab.decode.timing import TickClock
    from draftlab.models.cost_curve import CostCurve

    target, head_lm, _ = llama
    curve = CostCurve([1, 2, 4, 8], [64], [[1.0, 1.05, 1.1, 1.3]])
    head_curve = CostCurve([1, 2, 4, 8], [64], [[0.1, 0.11, 0.12, 0.15]])
    prompt = target.tokenizer("a big red house and a small blue tree")["input_ids"]
    ar = build_decoder(DecoderConfig("ar"), target).generate(prompt, 40, SamplingParams())
    for method in ("eagle", "eagle-tree"):
        decoder = build_decoder(
            DecoderConfig(method), target, head_lm, CostModel(curve, head_curve, clock=TickClock())
        )
        got = decoder.generate(prompt, 40, SamplingParams())
        assert decoder.sizer is not None
        assert_greedy_equal(target, prompt, got.tokens, ar.tokens, method)


def test_the_first_round_drafts_nothing_and_later_rounds_read_target_features(llama):
    target, head_lm, _ = llama
    prompt = target.tokenizer("the dog ran under the tree")["input_ids"]
    decoder = build_decoder(DecoderConfig("eagle", gamma=3, fixed_k=True), target, head_lm)
    got = decoder.generate(prompt, 12, SamplingParams())
    assert got.stats.drafted_per_position[0] == got.stats.rounds - 1  # every round but the prefill
    head = decoder.proposer.draft
    assert head.known == len(prompt) + len(got.tokens) - 1  # every final token but the last


def test_head_methods_refuse_a_model_and_a_missing_head(llama):
    target, _, _ = llama
    with pytest.raises(DraftlabError, match="needs an EAGLE-3 head"):
        build_decoder(DecoderConfig("eagle"), target)
    with pytest.raises(DraftlabError, match="not an EAGLE-3 head"):
        build_decoder(DecoderConfig("eagle"), target, target)
    with pytest.raises(DraftlabError, match="not an EAGLE-3 head folder"):
        load_head_lm(target.path, target)


# ----------------------------------------------------------------- sampling: exact, with power shown


@pytest.fixture(scope="module")
def vocab6(tmp_path_factory):
    from test_sampling_exact import _tiny_vocab_model

    root = tmp_path_factory.mktemp("vocab6-eagle")
    target = _tiny_vocab_model(root / "target", 11)
    head = random_head(target, torch.tensor([0, 1, 3, 4]), seed=5, scale=2.0)  # never proposes 2 or 5
    save_head(head, root / "head", str(root / "target"), ["LlamaForCausalLM"])
    return target, load_head_lm(str(root / "head"), target)


def _eagle_decoder(target, head_lm, rule):
    proposer = EagleProposer(HeadModel(head_lm))
    return SpeculativeDecoder(CachedModel(target), proposer, rule, gamma=2)


def _counts(decoder, samples):
    from test_sampling_exact import PARAMS, PROMPT

    from draftlab.audit.law import sample_pairs

    # The head drafts from round 2 on: the first token is the prefill round's own, the second one
    # comes through the acceptance rule over a head draft (budget 1: γ is cut to 1).
    return sample_pairs(decoder, PROMPT, PARAMS, range(samples))


@pytest.mark.statistical
def test_eagle_sampling_follows_the_target_and_a_wrong_rule_is_caught(vocab6):
    from test_sampling_exact import chi_square_p

    target, head_lm = vocab6
    run = _counts(_eagle_decoder(target, head_lm, SpeculativeRule()), 10_000)
    assert run.acceptance is not None and 0.1 < run.acceptance < 0.95, run.acceptance
    assert chi_square_p(target, run.counts) > FALSE_FAILURE
    # Fewer draws show power for the 10,000 above: the wrong rule reads p ~ 3e-35 at 2,000 here.
    wrong = _counts(_eagle_decoder(target, head_lm, ResampleFromTargetRule()), 2000)
    assert chi_square_p(target, wrong.counts) < SHOWN_POWER


def test_a_resumed_run_redoes_the_steps_past_its_checkpoint_in_the_log(tmp_path):
    from draftlab.drafters.eagle3.distill import _trim_log

    log = tmp_path / "train_log.jsonl"
    log.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(1, 8)))
    _trim_log(log, 5)  # stopped at step 7, checkpointed at 5
    assert [json.loads(line)["step"] for line in log.read_text().splitlines()] == [1, 2, 3, 4, 5]


def test_profile_prices_a_head_beside_its_target(llama, tmp_path, capsys, monkeypatch):
    """`draftlab profile --head`: the head's own cost curve, and the break-even α of drafting with it."""
    monkeypatch.setenv("DRAFTLAB_PROFILE_DIR", str(tmp_path / "profiles"))
    target, _, root = llama
    out = tmp_path / "prof"
    argv = ["profile", "--target", target.spec.name, "--head", str(root / "head"), "--dtype", "float32"]
    assert main([*argv, "--repeats", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "eagle (head passes)" in printed and "head " in printed
    data = json.loads((out / "profile.json").read_text())
    assert {"target/float32", "head/float32"} == set(data["profiles"])
    head = data["profiles"]["head/float32"]["curve"]
    assert all(ms > 0 for row in head["ms"] for ms in row)
    # A pass reads the head's own weights and one row of its copy of the target's embedding a token.
    from draftlab.models.bandwidth import weight_bytes

    _, head_lm, _ = llama
    embedding = head_lm.model.embed_tokens.weight
    assert weight_bytes(head_lm) == 4 * head_lm.num_parameters > 0
    assert weight_bytes(head_lm) + embedding.numel() * 4 == 4 * sum(
        p.numel() for p in head_lm.model.parameters()
    )


def test_the_heads_rows_grow_without_copying_their_history_and_replace_their_tail():
    """The head's per-position features and outputs (`Rows`): a write from a position replaces
    everything after it, past the buffer's first size too, and a cut forgets the tail."""
    from draftlab.drafters.eagle3.cached import Rows
    from draftlab.errors import DraftlabError

    rows = Rows(3, torch.float32, torch.device("cpu"))
    history = torch.arange(300 * 3, dtype=torch.float32).reshape(300, 3)
    rows.put(0, history[:200])
    rows.put(200, history[200:])  # grows past the first 256 rows, keeping the first 200
    assert len(rows) == 300 and torch.equal(rows.view(), history)
    rows.put(100, -history[:5])  # a rewrite from position 100 drops everything after it
    assert len(rows) == 105 and torch.equal(rows.view()[:100], history[:100])
    assert torch.equal(rows[104], -history[4])
    rows.cut(50)
    assert len(rows) == 50 and torch.equal(rows.view(), history[:50])
    with pytest.raises(IndexError):
        rows[50]
    with pytest.raises(DraftlabError, match="rows from 60, but only 50"):
        rows.put(60, history[:1])


def test_rows_put_later_read_as_rows_put_at_once_whatever_cuts_and_puts_come_between():
    """`put_later` (an EAGLE head's target features, written only when the head next drafts): any
    sequence of puts, later puts and cuts reads back as a plain list of rows does, past the buffer's
    first size too; a later put past the rows kept is refused at once."""
    import random

    from draftlab.drafters.eagle3.cached import Rows
    from draftlab.errors import DraftlabError

    rng = random.Random(0)
    rows = Rows(2, torch.float32, torch.device("cpu"))
    want: list[list[float]] = []
    for step in range(400):
        action = rng.random()
        if action < 0.15 and want:
            length = max(len(want) - rng.randrange(6), 0)  # a round's rollback
            rows.cut(length)
            del want[length:]
        else:
            start = rng.randrange(max(len(want) - 3, 0), len(want) + 1)
            new = torch.randn(rng.randrange(1, 9), 2)
            (rows.put_later if action < 0.8 else rows.put)(start, new)
            want[start:] = new.tolist()
        assert len(rows) == len(want)
        if rng.random() < 0.1 or step == 399:
            assert torch.equal(rows.view(), torch.tensor(want).reshape(-1, 2)), step
    assert len(want) > 256
    # The buffer grows in the first of several pending puts, the last ending further on.
    grown = Rows(2, torch.float32, torch.device("cpu"))
    grown.put(0, torch.zeros(250, 2))
    grown.put_later(250, torch.ones(8, 2))
    grown.put_later(258, 2 * torch.ones(8, 2))
    assert torch.equal(grown.view(), torch.cat([torch.zeros(250, 2), torch.ones(8, 2), 2 * torch.ones(8, 2)]))
    with pytest.raises(DraftlabError, match="only"):
        rows.put_later(len(want) + 1, torch.zeros(1, 2))
