"""The memory-bandwidth limit of plain decoding: weight bytes over measured read bandwidth."""

from __future__ import annotations

import pytest
import torch

from draftlab.bench.run_header import bandwidth_line
from draftlab.models.bandwidth import Bandwidth, limit_ms, measure_read_bandwidth, weight_bytes
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
