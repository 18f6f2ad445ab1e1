"""Engine overhead on the CPU (issue: core engine, section 7).

Builds a ~100M-parameter Llama target and a ~5M draft from configs (random weights), in
bfloat16, and measures:
  1. the share of SPS wall time spent outside model forward passes (target: < 10%);
  2. draftlab's `ar` against Hugging Face `generate` greedy on the same model, interleaved
     (target: ar >= 0.95x as fast).
Medians over rounds; the machine is noisy. Usage: python benchmarks/engine_overhead.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, models
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from draftlab.decode.build import build_decoder
from draftlab.decode.spec import DecoderConfig
from draftlab.models.loading import ModelSpec, load_model
from draftlab.sampling import SamplingParams

VOCAB = 32000


def build(directory: Path, hidden: int, layers: int, inter: int, heads: int, kv: int, seed: int) -> Path:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(directory)
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(directory)
    return directory


class ForwardTimer:
    """Wall time inside every forward pass of the given models (hooks around __call__)."""

    def __init__(self, *modules: torch.nn.Module) -> None:
        self.total = 0.0
        self._start = 0.0
        self.handles = []
        for m in modules:
            self.handles.append(m.register_forward_pre_hook(self._pre))
            self.handles.append(m.register_forward_hook(self._post))

    def _pre(self, *_):
        self._start = time.perf_counter()

    def _post(self, *_):
        self.total += time.perf_counter() - self._start

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp())
    target = load_model(ModelSpec(str(build(root / "t", 768, 12, 2048, 12, 4, 0)), dtype="bfloat16"))
    draft = load_model(ModelSpec(str(build(root / "d", 128, 2, 384, 4, 2, 1)), dtype="bfloat16"))
    print(
        f"target {target.num_parameters / 1e6:.1f}M, draft {draft.num_parameters / 1e6:.1f}M, "
        f"bf16, {torch.get_num_threads()} threads"
    )
    greedy = SamplingParams()
    gen = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(VOCAB, (args.prompt_tokens,), generator=gen).tolist() for _ in range(args.rounds)
    ]

    sps = build_decoder(DecoderConfig(method="sps", gamma=4), target, draft)
    ar = build_decoder(DecoderConfig(method="ar"), target)
    hf = build_decoder(DecoderConfig(method="hf-greedy"), target)
    for dec in (sps, ar, hf):  # warm-up
        dec.generate(prompts[0], 8, greedy)

    shares = []
    for ids in prompts:
        timer = ForwardTimer(target.model, draft.model)
        t0 = time.perf_counter()
        out = sps.generate(ids, args.new_tokens, greedy)
        wall = time.perf_counter() - t0
        timer.remove()
        shares.append(1 - timer.total / wall)
    print(
        f"sps: time outside model forwards = {statistics.median(shares):.1%} median "
        f"(min {min(shares):.1%}, max {max(shares):.1%}); last acceptance {out.stats.acceptance_rate:.2f}"
    )

    ratios, ar_rates, hf_rates = [], [], []
    for ids in prompts:
        a = ar.generate(ids, args.new_tokens, greedy)
        h = hf.generate(ids, args.new_tokens, greedy)
        assert a.tokens == h.tokens, "ar and hf-greedy disagree"
        ar_rates.append(a.stats.new_tokens / a.stats.total_s)
        hf_rates.append(h.stats.new_tokens / h.stats.total_s)
        ratios.append(ar_rates[-1] / hf_rates[-1])
    print(
        f"ar {statistics.median(ar_rates):.1f} tok/s vs hf-greedy {statistics.median(hf_rates):.1f} tok/s: "
        f"median ratio {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}), "
        "identical tokens"
    )


if __name__ == "__main__":
    main()
