"""`draftlab bench`: every method on the same prompts, interleaved, with an honest report."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import torch
import transformers
from rich.console import Console

from draftlab import __version__
from draftlab.bench.records import RunInfo
from draftlab.bench.report import render
from draftlab.bench.runner import BenchPlan, Variant, check_contexts, run_bench
from draftlab.bench.suites import SUBTASKS, load_suite
from draftlab.cli.common import (
    add_method_args,
    add_model_args,
    cost_model,
    decoder_config,
    load_pair,
    load_spec,
    sampling_from,
)
from draftlab.cli.console import report_console
from draftlab.decode.methods import METHODS, method_spec
from draftlab.errors import DraftlabError
from draftlab.files import LOCK_FILE, folder_lock
from draftlab.models.loading import DTYPES, LoadedModel
from draftlab.models.profile import hardware, supported_dtypes

DEFAULT_METHODS = "ar,sps,pld,hf-assisted"


def add_suite_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("prompts")
    g.add_argument(
        "--suite",
        default="builtin",
        help="builtin, a JSONL file (Spec-Bench or generic), or hf:DATASET[:CONFIG]:SPLIT",
    )
    g.add_argument(
        "--subtasks",
        default=None,
        help=f"comma-separated subtasks (default: all; builtin: {', '.join(SUBTASKS)})",
    )
    g.add_argument("--limit", type=int, default=2, help="prompts per subtask (default 2)")
    g.add_argument("--full", action="store_true", help="every prompt of the suite (ignores --limit)")
    g.add_argument("--no-chat", action="store_true", help="do not apply the tokenizer's chat template")
    g.add_argument("--hf-field", default="text", help="hf suites: the text field")
    g.add_argument("--hf-subtask", default="summarization", help="hf suites: the subtask name")
    g.add_argument(
        "--hf-instruction", default="Summarize the following article.\n\n{text}", help="hf suites: template"
    )


def add_run_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("run")
    g.add_argument("--out", default=None, help="results folder (default: runs/<kind>-<time>)")
    g.add_argument("--resume", action="store_true", help="continue an interrupted run in --out")
    g.add_argument("--repeats", type=int, default=1)
    g.add_argument("--warmup", type=int, default=1, help="untimed warm-up generations per variant")
    g.add_argument("--per-example", action="store_true", help="also print the per-example timing table")
    g.add_argument("--quiet", action="store_true", help="no progress bar")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("bench", help="benchmark methods over a prompt suite, per subtask")
    p.add_argument("--methods", default=DEFAULT_METHODS, help=f"comma-separated, from {', '.join(METHODS)}")
    p.add_argument(
        "--ar-dtypes",
        default="supported",
        help="also run ar in these dtypes (comma-separated), so that 'vs best ar' compares with the "
        "fastest plain decoding here: supported (default: every dtype the device supports) or none",
    )
    add_model_args(p)
    add_method_args(p)
    add_suite_args(p)
    add_run_args(p)
    p.set_defaults(func=run)


def parse_list(text: str, kind, name: str) -> list:
    try:
        values = [kind(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        raise DraftlabError(f"invalid {name} list: '{text}'") from None
    if not values:
        raise DraftlabError(f"empty {name} list")
    return values


def check_out(args: argparse.Namespace) -> None:
    """Refuse an unusable --out before any model loads: a file, a path under a file, no write access."""
    if args.resume and not args.out:
        raise DraftlabError("--resume needs --out (the folder of the run to continue)")
    if not args.out:
        return
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise DraftlabError(f"--out '{out}' is a file, not a folder")
    existing = next((p for p in [out, *out.parents] if p.exists()), Path("."))
    if not existing.is_dir():
        raise DraftlabError(f"--out '{out}' lies under '{existing}', which is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise DraftlabError(f"--out '{out}' is not writable ('{existing}' does not allow it)")


@contextmanager
def claimed_out(args: argparse.Namespace, kind: str) -> Iterator[Path]:
    """Check --out, then hold it (created if needed) for the whole run: one writer per folder.

    A folder this run created is removed again if the run fails before writing anything into it.
    """
    check_out(args)
    if not args.out:
        args.out = str(Path("runs") / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}")
    out = Path(args.out)
    created = [p for p in [out, *out.parents] if not p.exists()]  # the folder first, then its parents
    out.mkdir(parents=True, exist_ok=True)
    try:
        with folder_lock(out):
            yield out
    except BaseException:
        if created:
            (out / LOCK_FILE).unlink(missing_ok=True)
            with suppress(OSError):
                for folder in created:
                    folder.rmdir()  # only while empty: nothing the run wrote is removed
        raise


def run(args: argparse.Namespace) -> int:
    with claimed_out(args, "bench"):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    methods = parse_list(args.methods, str, "method")
    for m in methods:
        method_spec(m)
    if "ar" not in methods:
        methods.insert(0, "ar")  # speed-ups are always measured against our own AR baseline
    configs = {m: decoder_config(args, m) for m in methods}
    sampling = sampling_from(args)
    examples = suite_examples(args)
    needs_draft = any(method_spec(m).needs_draft for m in methods)
    target, draft = load_pair(args, needs_draft)
    # Before profiling: a draft too short for these prompts is refused now, not mid-run.
    check_contexts(
        [(target, draft if needs_draft else None)], examples, args.max_new_tokens, not args.no_chat
    )
    adaptive = any(c.adaptive for c in configs.values())
    cost = cost_model(args, target, draft) if adaptive else None
    others = [load_spec(dataclasses.replace(target.spec, dtype=d)) for d in other_dtypes(args, target)]
    # With --dtype auto, cost-aware methods run each generation in the dtype predicted fastest for it.
    routed = adaptive and (args.target_dtype or args.dtype) == "auto"
    alternatives = [(o, cost_model(args, o, draft)) for o in others] if routed else []
    variants = []
    for m in methods:
        params = variant_params(args, configs[m])
        routes = alternatives if configs[m].adaptive else []
        if routes:
            params["dtypes"] = [target.spec.dtype, *(o.spec.dtype for o, _ in routes)]
        variants.append(Variant(m, configs[m], target, draft, sampling, params, cost, routes))
    for other in others:
        params = variant_params(args, configs["ar"], dtype=other.spec.dtype)
        variants.append(Variant(f"ar {other.spec.dtype}", configs["ar"], other, None, sampling, params))
    return execute(args, "bench", variants, {v.label: "ar" for v in variants}, target, draft, examples)


def other_dtypes(args: argparse.Namespace, target: LoadedModel) -> list[str]:
    """Every other dtype the device supports (or --ar-dtypes), for "vs best ar" and for routing."""
    if args.ar_dtypes == "none":
        return []
    dtypes = (
        supported_dtypes(target.spec.device)
        if args.ar_dtypes == "supported"
        else parse_list(args.ar_dtypes, str, "dtype")
    )
    out: list[str] = []
    predicted = (getattr(args, "dtype_choices", {}).get(target.spec.name) or {}).get("predicted_s", {})
    for dtype in dtypes:
        if dtype == target.spec.dtype:
            continue
        if dtype not in DTYPES:
            raise DraftlabError(f"unknown dtype '{dtype}' in --ar-dtypes (choose from {', '.join(DTYPES)})")
        if args.ar_dtypes == "supported" and predicted and predicted[dtype] > 1.25 * min(predicted.values()):
            # Its profile says it cannot be the fastest plain decoding here: measuring it costs time only.
            Console(stderr=True).print(
                f"[dim]ar in {dtype} skipped: predicted {predicted[dtype]:.2f} s per generation, "
                f"over 1.25× the fastest dtype's {min(predicted.values()):.2f} s[/]"
            )
            continue
        out.append(dtype)
    return out


def suite_examples(args: argparse.Namespace):
    subtasks = [s.strip() for s in args.subtasks.split(",")] if args.subtasks else None
    return load_suite(
        args.suite,
        subtasks,
        None if args.full else args.limit,
        hf_field=args.hf_field,
        hf_subtask=args.hf_subtask,
        hf_instruction=args.hf_instruction,
    )


def variant_params(args: argparse.Namespace, config, **extra) -> dict:
    params = {
        **config.settings(),
        "attn_implementation": args.attn_implementation or "default",
        "top_k": args.top_k,
        "top_p": args.top_p,
    }
    params.update(extra)
    return params


def execute(
    args: argparse.Namespace,
    kind: str,
    variants: list[Variant],
    baselines: dict[str, str],
    target: LoadedModel,
    draft: LoadedModel | None,
    examples,
    extra: dict | None = None,
) -> int:
    out = Path(args.out)  # set and held by claimed_out
    plan = BenchPlan(
        variants,
        examples,
        args.max_new_tokens,
        chat=not args.no_chat,
        repeats=args.repeats,
        warmup=args.warmup,
        baselines=baselines,
    )
    info = RunInfo(
        target=target.spec.name,
        draft=draft.spec.name if draft else None,
        dtype=target.spec.dtype if draft is None else f"{target.spec.dtype}/{draft.spec.dtype}",
        device=target.spec.device if draft is None else f"{target.spec.device}/{draft.spec.device}",
        temperature=args.temperature,
        max_new_tokens=args.max_new_tokens,
        baseline="ar" if "ar" in baselines.values() else next(iter(baselines.values())),
        labels=[v.label for v in variants],
        suite=args.suite,
        extra={
            "kind": kind,
            "baselines": baselines,
            "examples": len(examples),
            "turns": sum(len(e.turns) for e in examples),
            "repeats": args.repeats,
            "chat": not args.no_chat,
            "sampling": {"top_k": args.top_k, "top_p": args.top_p, "seed": args.seed},
            "variants": {v.label: json.loads(json.dumps(v.params, default=str)) for v in variants},
            "torch_threads": torch.get_num_threads(),
            "versions": {
                "draftlab": __version__,
                "torch": torch.__version__,
                "transformers": transformers.__version__,
            },
            "host": {
                "machine": platform.machine(),
                "processor": platform.processor(),
                "python": platform.python_version(),
            },
            "hardware": hardware(target.device),
            "dtype_choice": getattr(args, "dtype_choices", {}).get(target.spec.name),
            "sizing": "fixed k" if getattr(args, "fixed_k", False) else "cost-aware",
            **(extra or {}),
        },
    )
    Console(stderr=True, quiet=args.quiet).print(
        f"[bold]draftlab {kind}[/] → {out}  ({len(examples)} examples, {len(variants)} variants)"
    )
    run_bench(plan, out, info, resume=args.resume, quiet=args.quiet)
    render(out, report_console(False), per_example=args.per_example)
    return 0
