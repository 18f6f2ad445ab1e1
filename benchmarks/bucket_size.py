"""One package per model, or one per static-cache bucket? (issue 46)

Times plain decoding of the default target through its compiled package end to end (a prompt of
`--prompt` tokens, then `--new` tokens, prefill included), with the static cache forced to each
bucket in turn, interleaved over `--repeats` rounds so drift weighs on all alike. A pass attends
over its whole bucket, so a longer bucket costs a little more per step; one package per model
saves a build and the memory of a second package. Packages are built first where absent (untimed).

    python benchmarks/bucket_size.py --dtype float32 --buckets 512,1024,2048
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from draftlab.decode.build import build_decoder
from draftlab.decode.spec import DecoderConfig
from draftlab.models.compiled import PASS_SIZES, compiled_steps
from draftlab.models.loading import ModelSpec, load_model
from draftlab.plan.roles import DEFAULT_TARGET
from draftlab.sampling import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--buckets", default="512,1024")
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    buckets = [int(b) for b in args.buckets.split(",")]
    lm = load_model(ModelSpec(DEFAULT_TARGET, args.dtype))
    lm.eos_token_ids = set()  # every generation as long as asked
    decoder = build_decoder(DecoderConfig(method="ar", compile=True), lm)
    steps = compiled_steps(lm)
    prompt = [(7 * i + 11) % lm.vocab_size for i in range(args.prompt)]
    greedy = SamplingParams()
    times: dict[int, list[float]] = {b: [] for b in buckets}

    def force(bucket: int) -> None:
        steps.bucket = lambda needed, bucket=bucket: bucket  # the instance's choice, overridden

    for bucket in buckets:  # build or load each package, untimed
        force(bucket)
        t0 = time.perf_counter()
        decoder.target.warm(args.prompt + args.new + 9, PASS_SIZES)
        print(f"bucket {bucket}: package ready in {time.perf_counter() - t0:.1f} s", flush=True)
        decoder.generate(prompt, args.new, greedy)
    for _ in range(args.repeats):
        for bucket in buckets:
            force(bucket)
            t0 = time.perf_counter()
            out = decoder.generate(prompt, args.new, greedy)
            times[bucket].append(time.perf_counter() - t0)
            assert out.stats.new_tokens == args.new
    base = statistics.median(times[buckets[0]])
    print(
        f"{lm.spec.name} {args.dtype}, prompt {args.prompt} + {args.new} new tokens, torch {torch.__version__}"
    )
    for bucket in buckets:
        median = statistics.median(times[bucket])
        print(
            f"bucket {bucket}: median {median * 1000:.0f} ms (min {min(times[bucket]) * 1000:.0f}), "
            f"{args.new / median:.1f} tok/s, {median / base:.3f}x bucket {buckets[0]}"
        )


if __name__ == "__main__":
    main()
