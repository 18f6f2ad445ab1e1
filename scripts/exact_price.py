"""What exact mode costs plain decoding: `ar` exact against `ar` as it runs without it, on the
default target, alternating the two so that a machine slowing down weighs on both alike.

    python scripts/exact_price.py q4_1 --compile
    ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 python scripts/exact_price.py q4_1 --compile

Prints one JSON line: tokens/s (prefill included) and decode tokens/s of each, their ratios, and
exact mode's pass width. Greedy, `--prompts` builtin prompts, `--tokens` new tokens each (no early
stop), two repeats. The width is chosen as `draftlab bench --exact` chooses it, from this machine's
cached cost profile (measured first if missing); `--widths 8` tries only those widths, in order.
"""

from __future__ import annotations

import argparse
import json

from draftlab.bench.suites import load_suite
from draftlab.decode.build import build_decoder, warm_compiled_passes
from draftlab.decode.spec import DecoderConfig
from draftlab.models.compiled import MAX_PASS
from draftlab.models.loading import ModelSpec, load_model
from draftlab.models.prompting import encode_prompt
from draftlab.plan.profiles import cost_model
from draftlab.plan.roles import DEFAULT_TARGET
from draftlab.sampling import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dtype", help="float32, bfloat16, float16 or q4_1")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--widths", help="exact widths to try, in order (default: by the cost profile)")
    args = parser.parse_args()
    target = load_model(ModelSpec(DEFAULT_TARGET, dtype=args.dtype))
    target.eos_token_ids = set()  # every generation as long as asked: equal work on both sides
    prompts = [encode_prompt(target, e.turns[0], chat=True) for e in load_suite("builtin")[: args.prompts]]
    need = max(len(p) for p in prompts) + args.tokens + MAX_PASS
    greedy = SamplingParams()
    decoders = {}
    for exact in (False, True):
        config = DecoderConfig(method="ar", exact=exact, compile=args.compile)
        cost = cost_model(False, target, None, compiled=args.compile) if exact and not args.widths else None
        decoders[exact] = build_decoder(config, target, None, cost)
        if exact and args.widths:
            decoders[exact].target.compiled.exact_order = tuple(int(w) for w in args.widths.split(","))
        warm_compiled_passes(decoders[exact], need, config)
        decoders[exact].generate(prompts[0], 8, greedy)  # untimed
    sums = {exact: [0, 0.0, 0, 0.0] for exact in decoders}  # tokens, s, decode tokens, decode s
    for _ in range(2):
        for exact, decoder in decoders.items():
            for ids in prompts:
                s = decoder.generate(ids, args.tokens, greedy).stats
                total = sums[exact]
                total[0] += s.new_tokens
                total[1] += s.total_s
                total[2] += s.new_tokens - s.first_tokens
                total[3] += s.decode_s
    steps = decoders[True].target.compiled
    out: dict = {
        "dtype": args.dtype,
        "compile": args.compile,
        "width": sorted(set(steps.exact_widths.values())),
    }
    for exact, (n, secs, dn, ds) in sums.items():
        out["exact" if exact else "not exact"] = {"tokens_per_s": n / secs, "decode_tokens_per_s": dn / ds}
    for key in ("tokens_per_s", "decode_tokens_per_s"):
        out[f"exact / not exact, {key}"] = out["exact"][key] / out["not exact"][key]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
