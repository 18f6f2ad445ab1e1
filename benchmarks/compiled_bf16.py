"""Probe the decode step of the default target through compiled paths other than `--compile`'s
float32 package (issue 38): an AOTInductor package in bfloat16 with other inductor settings, and
torchao's int8 weight-only quantization under torch.compile.

    python benchmarks/compiled_bf16.py aoti --dtype bfloat16 --inductor freeze
    python benchmarks/compiled_bf16.py aoti --dtype bfloat16 --inductor autotune
    python benchmarks/compiled_bf16.py torchao-int8 --freeze   # needs `pip install --no-deps torchao`

`aoti` runs `draftlab generate --compile` with models/compiled.py's inductor settings replaced and
its packages kept apart (under /tmp/draftlab-probe-<settings>-<dtype>), so the shipped ones stay as
they are; run it twice to read a loaded package's step. `torchao-int8` times 48 one-token steps of
the target over a 512-token StaticCache after 8 warm ones. A probe on one prompt, not a benchmark:
figures in docs/results.md, "Compiled bfloat16: the first probe".
"""

from __future__ import annotations

import argparse
import os
import time

SETTINGS = {
    "freeze": {"freezing": True},
    "autotune": "float32",  # models/compiled.py's float32 settings: freezing, max-autotune, coordinate descent
}
PROMPT = "Summarize: the cat sat on the mat and was happy there."


def aoti(dtype: str, inductor: str) -> int:
    os.environ["DRAFTLAB_COMPILED_DIR"] = f"/tmp/draftlab-probe-{inductor}-{dtype}"
    import draftlab.models.compiled as compiled
    from draftlab.cli import main

    chosen = SETTINGS[inductor]
    chosen = compiled.INDUCTOR_CONFIGS if chosen == "float32" else chosen
    compiled.inductor_configs = lambda dtype: dict(chosen)
    argv = ["generate", "--compile", "--dtype", dtype, "--method", "ar", "--max-new-tokens", "64", PROMPT]
    return main(argv)


def torchao_int8(freeze: bool, steps: int = 48) -> int:
    import torch
    import torch._inductor.config as inductor_config
    from torchao.quantization import Int8WeightOnlyConfig, quantize_
    from transformers import AutoModelForCausalLM, StaticCache

    from draftlab.models.loading import resolve_path

    model = AutoModelForCausalLM.from_pretrained(resolve_path("smollm2-135m-instruct"), dtype=torch.bfloat16)
    model.eval()
    quantize_(model, Int8WeightOnlyConfig())
    inductor_config.freezing = freeze
    cache = StaticCache(config=model.config, max_cache_len=512)

    def step(token, position):
        return model(input_ids=token, past_key_values=cache, cache_position=position, use_cache=True).logits

    step = torch.compile(step)
    with torch.inference_mode():
        prompt = torch.arange(1, 9).unsqueeze(0)
        model(input_ids=prompt, past_key_values=cache, cache_position=torch.arange(8), use_cache=True)
        token = torch.tensor([[9]])
        for i in range(8):
            step(token, torch.tensor([8 + i]))
        t0 = time.perf_counter()
        for i in range(steps):
            step(token, torch.tensor([16 + i]))
        ms = (time.perf_counter() - t0) / steps * 1000
    print(f"int8 weight-only, torch.compile{' with freezing' if freeze else ''}: {ms:.2f} ms a step")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", choices=("aoti", "torchao-int8"))
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--inductor", default="freeze", choices=tuple(SETTINGS))
    parser.add_argument("--freeze", action="store_true", help="torchao-int8: inductor freezing")
    args = parser.parse_args()
    if args.path == "aoti":
        return aoti(args.dtype, args.inductor)
    return torchao_int8(args.freeze)


if __name__ == "__main__":
    raise SystemExit(main())
