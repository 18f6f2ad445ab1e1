"""`draftlab generate`: one prompt, one method, the text and its statistics."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from rich.console import Console
from rich.table import Table

from draftlab import engines as registry
from draftlab.cli.common import add_compile_arg, add_method_args, add_model_args
from draftlab.cli.engine_option import add_engine_arg
from draftlab.cli.engines import check_methods
from draftlab.decode.build import build_decoder, check_fits, compiled_passes, warm_compiled_passes
from draftlab.decode.spec import method_names
from draftlab.decode.timing import collector_paused
from draftlab.errors import DraftlabError
from draftlab.files import decode_utf8
from draftlab.models import exact
from draftlab.models.compiled import RESERVE
from draftlab.models.loading import check_context
from draftlab.models.prompting import encode_prompt
from draftlab.plan.compile import compile_seconds
from draftlab.plan.configs import decoder_config, sampling_from
from draftlab.plan.profiles import cost_model
from draftlab.plan.roles import load_head
from draftlab.progress import progress_bar


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("generate", help="generate text for one prompt with one method")
    p.add_argument("prompt", nargs="?", help="the prompt; '-' reads standard input")
    p.add_argument("--method", choices=method_names(), default="sps")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template")
    p.add_argument("--json", action="store_true", help="print one JSON record instead of text and a table")
    add_model_args(p)
    add_method_args(p)
    add_compile_arg(
        p,
        "the target's passes of up to 8 tokens through an AOTInductor package over a static cache "
        "(hf engine, the methods of our own loop, token trees included); built once per machine (about "
        "1-2 min on 2 cores, untimed) and "
        "loaded by later runs; the time is reported",
    )
    add_engine_arg(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    prompt = decode_utf8(sys.stdin.buffer.read(), "standard input") if args.prompt == "-" else args.prompt
    if prompt is None or not prompt.strip():
        raise DraftlabError("empty prompt")
    config = dataclasses.replace(decoder_config(args, args.method), compile=args.compile, exact=args.exact)
    params = sampling_from(args)
    engine = registry.get(args.engine)
    if not engine.compiles and args.exact:
        raise DraftlabError(
            f"--exact is for the hf engine (our own passes); {args.engine} runs its own kernels"
        )
    if not engine.compiles and args.compile:
        raise DraftlabError(
            f"--compile is for the hf engine (compiled transformers passes); {args.engine} runs its own kernels"
        )
    check_methods([args.method], [args.engine])
    if config.spec.needs_head:  # the head reads the target's hidden states: an engine that loads them
        target, _ = engine.load_here(args, False)
        check_fits(config, target)
        draft = load_head(args, target, args.method)
    else:
        target, draft = engine.load_here(args, config.needs_draft)
    check_fits(config, target)
    ids = encode_prompt(target, prompt, chat=args.chat)
    check_context(target, draft if config.needs_draft else None, len(ids), args.max_new_tokens)
    # On llama.cpp the target's curve is llama.cpp's own (`draftlab profile --engine llamacpp`).
    # With --compile, the curve of the compiled passes (measured once, compiling them).
    second = draft if config.needs_draft else None
    cost = cost_model(args.fixed_k, target, second, compiled=config.compile) if config.adaptive else None
    decoder = build_decoder(config, target, draft, cost)
    compiled = None
    if config.compile or config.exact:
        # Untimed: every pass this method takes over this prompt's static cache compiles first.
        with progress_bar("[bold]compile[/]", console=Console(stderr=True)) as progress:
            task = progress.add_task("", total=len(compiled_passes(config)))

            def on_pass(length: int, size: int) -> None:
                progress.update(task, advance=1, description=f"cache {length} · {size}-token pass")

            warm_compiled_passes(decoder, len(ids) + args.max_new_tokens + RESERVE, config, on_pass)
        if config.compile:
            compiled = compile_seconds(target)
            seconds = ", ".join(
                f"{c['seconds']:.1f} s ({c['package']}, {n}-token cache)" for n, c in compiled.items()
            )
            Console(stderr=True).print(f"[dim]compiled passes ready in {seconds}[/]")
    if config.exact:
        Console(stderr=True).print(f"[dim]{exact.describe(exact.record(decoder.target))}[/]")
    with collector_paused():
        result = decoder.generate(ids, args.max_new_tokens, params)
    if args.json:
        record = {
            "method": args.method,
            "engine": args.engine,
            "target": target.spec.name,
            "draft": draft.spec.name if draft else None,
            "gamma": config.spec.gamma(config),
            "settings": config.settings(),
            "dtype": target.spec.dtype,
            "sizing": "cost-aware" if cost is not None else "fixed k",
            "compile_s": compiled,
            "exact": exact.record(decoder.target) if config.exact else None,
            "temperature": params.temperature,
            "text": result.text,
            "tokens": result.tokens,
            "stats": result.stats.to_dict(),
        }
        print(json.dumps(record, ensure_ascii=False))
        return 0
    console = Console()
    console.print(result.text, markup=False, highlight=False)
    s = result.stats
    table = Table(
        title=f"{args.method} · target {target.spec.name}"
        + (f" ({args.engine})" if engine.suffix else "")
        + (f" · draft {draft.spec.name}" if draft else "")
    )
    for col in (
        "new tokens",
        "total s",
        "prefill ms",
        "decode ms/token",
        "tokens/s",
        "target calls",
        "draft calls",
        "acceptance α",
        "mean accepted",
    ):
        table.add_column(col, justify="right")
    per_tok = s.decode_s * 1000 / max(s.new_tokens - s.first_tokens, 1)
    table.add_row(
        str(s.new_tokens),
        f"{s.total_s:.3f}",
        f"{s.prefill_s * 1000:.1f}",
        f"{per_tok:.2f}",
        f"{s.tokens_per_s:.1f}" if s.tokens_per_s else "-",
        str(s.target_calls),
        str(s.draft_calls),
        f"{s.acceptance_rate:.3f}" if s.acceptance_rate is not None else "-",
        f"{s.mean_accepted_length:.2f}" if s.mean_accepted_length else "-",
    )
    Console(stderr=True).print(table)
    return 0
