"""The memory-bandwidth limit of plain decoding: weight bytes over measured read bandwidth."""

from __future__ import annotations

import pytest
import torch

from draftlab.bench.run_header import bandwidth_line
from draftlab.cli.profile import compile_order, out_of_reach_reason
from draftlab.models.bandwidth import (
    HEADROOM,
    Bandwidth,
    least_decoding_ms,
    limit_ms,
    measure_read_bandwidth,
    weight_bytes,
)
from draftlab.models.cost_curve import CostCurve, out_of_reach
from draftlab.models.loading import ModelSpec, load_model


def test_weight_bytes_count_each_weight_once_in_its_dtype(tiny_pair):
    target = str(tiny_pair["llama"][0])
    full = load_model(ModelSpec(target, dtype="float32"))
    half = load_model(ModelSpec(target, dtype="bfloat16"))
    shell = load_model(ModelSpec(target, dtype="bfloat16"), weights=False)
    params = dict(full.model.named_parameters())  # a tied output layer is listed once
    assert weight_bytes(full) == 4 * sum(p.numel() for p in params.values())
    assert weight_bytes(half) == weight_bytes(full) // 2 == weight_bytes(shell)
    tied = full.model.config.tie_word_embeddings
    assert ("lm_head.weight" in params) != tied


def test_limit_is_bytes_over_bandwidth():
    measured = Bandwidth(gb_per_s=20.0, threads=2, buffer_bytes=1 << 29, measured_at="-")
    assert limit_ms(270_000_000, measured) == pytest.approx(13.5)
    real = measure_read_bandwidth(buffer_bytes=1 << 24, repeats=3)
    assert real.gb_per_s > 0 and real.threads == torch.get_num_threads()


def test_the_report_sets_each_plain_decoding_against_its_limit():
    summary = {
        "run": {
            "extra": {
                "bandwidth": {
                    "gb_per_s": 25.0,
                    "threads": 2,
                    "weight_bytes": {"ar": 500_000_000, "ar@llamacpp": 100_000_000},
                }
            }
        },
        "overall": {"ar": {"decode_tokens_per_s": 25.0}, "ar@llamacpp": {"decode_tokens_per_s": 100.0}},
    }
    line = bandwidth_line(summary)
    assert line.startswith("memory read 25.0 GB/s (2 threads): ")
    # ar: 40 ms a token against 20 ms; llama.cpp: 10 ms against 4 ms.
    assert "ar 40.0 ms/token = 2.0× its limit 20.0 ms (500 MB)" in line
    assert "ar@llamacpp 10.0 ms/token = 2.5× its limit 4.0 ms (100 MB)" in line
    assert bandwidth_line({"run": {"extra": {}}, "overall": {}}) is None


def test_a_4_bit_step_reads_the_packed_codes_and_the_q8_0_head_not_the_embedding(tiny_pair):
    from draftlab.models import q4

    target = str(tiny_pair["llama"][0])
    lm = load_model(ModelSpec(target, dtype="q4_1"))
    model = lm.model
    assert isinstance(model.get_output_embeddings(), q4.Q8Head)
    packed = 0
    for module in model.modules():
        if isinstance(module, q4.Q4Linear):  # half a byte a weight, a float16 scale and minimum per 32
            packed += (
                module.out_features * module.in_features // 2
                + 4 * module.out_features * module.in_features // 32
            )
        elif isinstance(module, q4.Q8Head):  # a byte a weight, a float16 scale per 32
            packed += (
                module.out_features * module.in_features + 2 * module.out_features * module.in_features // 32
            )
    embedding = model.get_input_embeddings().weight
    rest = sum(p.numel() * p.element_size() for p in model.parameters()) - embedding.numel() * 2
    assert weight_bytes(lm) == packed + rest
    # A drafter's head (no output embeddings of its own) counts its parameters.
    head = type("Head", (), {"model": torch.nn.Linear(4, 2, bias=False)})()
    assert weight_bytes(head) == 8 * 4


def _flat(step_ms: float) -> CostCurve:
    """A synthetic curve: every pass `step_ms`, a prompt 0.1 ms a token."""
    return CostCurve([1, 8], [64, 1024], [[step_ms, step_ms]] * 2, [16, 1024], [1.6, 102.4])


def test_a_dtype_whose_bandwidth_bound_loses_to_a_measured_one_needs_no_package():
    """`profile --compile` builds the lightest dtype's package first and passes over a heavier one
    whose plain decoding, even at the memory limit (with headroom), is slower than one already
    predicted by more than the tie band; a bound within the band, or no bandwidth, builds it."""
    bandwidth = Bandwidth(gb_per_s=40.0, threads=2, buffer_bytes=1 << 29, measured_at="-")
    limits = {
        "target/float32": {"weight_bytes": 540_000_000},  # 13.5 ms a step at the limit, 9.0 with headroom
        "target/bfloat16": {"weight_bytes": 270_000_000},  # 6.75, 4.5 with headroom
        "target/q4_1": {"weight_bytes": 100_000_000},
    }
    assert compile_order(["float32", "bfloat16", "q4_1"], limits) == ["q4_1", "bfloat16", "float32"]
    assert least_decoding_ms(540_000_000, bandwidth, 65) == pytest.approx(64 * 13.5 / HEADROOM)
    ways = {"float32": "eager", "bfloat16": "eager", "q4_1": "compiled"}
    # The 4-bit package predicted 4 ms a step: 63 steps after a 25.6 ms prompt, 277.6 ms.
    curves = {"float32": _flat(40.0), "bfloat16": _flat(30.0), "q4_1": _flat(4.0)}
    why = out_of_reach_reason("float32", limits, curves, ways, bandwidth, 64)
    assert why is not None and "q4_1 compiled" in why and "40.0 GB/s" in why
    # bfloat16's bound, 63 x 4.5 = 283.5 ms, is within 10% of 277.6: it is built and measured.
    assert out_of_reach_reason("bfloat16", limits, curves, ways, bandwidth, 64) is None
    assert out_of_reach(283.5 * 1.2, 277.6) and not out_of_reach(283.5, 277.6)
    # Slower 4-bit passes leave float32 within reach too; without a bandwidth nothing is passed over.
    assert out_of_reach_reason("float32", limits, {**curves, "q4_1": _flat(8.0)}, ways, bandwidth, 64) is None
    assert out_of_reach_reason("float32", limits, curves, ways, None, 64) is None
    # Its own eager curve is no reason to skip it: only the other dtypes' count.
    assert out_of_reach_reason("float32", limits, {"float32": _flat(1.0)}, ways, bandwidth, 64) is None
