"""`draftlab audit`: is every speculative method lossless on this pair, dtype and machine?

Exit code 0: every audited method that claims to be lossless is; 1: one is not; 2: bad input.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from draftlab import __version__
from draftlab import engines as registry
from draftlab.audit.checks import MethodAudit, load_prompts, parse_methods, verdict
from draftlab.audit.report import print_report
from draftlab.audit.runner import Audit, AuditSettings, Parts, versions
from draftlab.cli.common import add_method_args, add_model_args
from draftlab.cli.console import report_console
from draftlab.cli.engine_option import add_engine_arg, in_process
from draftlab.cli.engines import check_methods
from draftlab.decode.build import build_decoder
from draftlab.decode.spec import method_spec
from draftlab.errors import DraftlabError
from draftlab.files import file_lock, write_text
from draftlab.hardware import hardware
from draftlab.models.prompting import encode_prompt
from draftlab.outputs import check_new_file
from draftlab.plan.configs import decoder_config
from draftlab.plan.dtypes import dtype_choices
from draftlab.plan.profiles import cost_model
from draftlab.plan.roles import model_names
from draftlab.sampling import SamplingParams


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "audit",
        help="check that speculation does not change this pair's outputs (greedy and sampling)",
        description="Greedy: each method's tokens against ar's, per prompt (a difference only in bfloat16 "
        "or float16 is rerun in float32; on llama.cpp, on one thread; on llama-server, on the file's Q4_1 copy on one thread). Sampling: a chi-square test of 2-token samples against the "
        "target's exact law, with a deliberately wrong rule as the power check. Exit 0: lossless; "
        "1: a method is not; 2: bad input.",
    )
    p.add_argument(
        "--methods",
        default=None,
        help="comma-separated (default: every speculative method of the registry that our loop runs and "
        "that claims to be lossless; hf-assisted and bild only when named, bild reported as lossy by design)",
    )
    p.add_argument("--prompts", default=None, help="a text file (one prompt per line) or JSONL with 'prompt'")
    p.add_argument("--no-chat", action="store_true", help="do not apply the tokenizer's chat template")
    p.add_argument(
        "--samples",
        type=int,
        default=2000,
        help="2-token samples per method and prefix (0: no sampling check)",
    )
    p.add_argument("--prefixes", type=int, default=2, help="sampling prefixes: the first prompts (default 2)")
    p.add_argument(
        "--alpha",
        type=float,
        default=0.001,
        help="significance level, Bonferroni-split over methods × prefixes (default 0.001)",
    )
    p.add_argument("--json", dest="json_path", default=None, help="write the full result to this file")
    p.add_argument("--force", action="store_true", help="replace --json where a file already is")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_model_args(p)
    add_method_args(p)
    add_engine_arg(p, audited_engines())
    p.set_defaults(max_new_tokens=256, temperature=1.0, func=run)
    for action in p._actions:
        if action.dest == "max_new_tokens":
            action.help = "greedy check: new tokens per prompt (default 256)"
        elif action.dest == "temperature":
            action.help = "sampling check: temperature (default 1; the greedy check always uses 0)"
        elif action.dest == "seed":
            action.help = "sampling check: the first seed (sample i uses seed + i)"


def audited_engines() -> tuple[str, ...]:
    """The engines that decode here (our audit runs on them), and those with an audit of their own."""
    own = (n for n in registry.engine_names() if hasattr(registry.get(n), "audit"))
    return tuple(dict.fromkeys((*in_process(), *own)))


def check_input(args: argparse.Namespace) -> None:
    if args.max_new_tokens < 1:
        raise DraftlabError(f"max_new_tokens must be >= 1, got {args.max_new_tokens}")
    if args.samples < 0:
        raise DraftlabError(f"--samples must be >= 0, got {args.samples}")
    if args.samples and args.samples < 100:
        raise DraftlabError(f"--samples must be 0 or at least 100 for a chi-square test, got {args.samples}")
    if args.prefixes < 1:
        raise DraftlabError(f"--prefixes must be >= 1, got {args.prefixes}")
    if not 0 < args.alpha < 1:
        raise DraftlabError(f"--alpha must be in (0, 1), got {args.alpha}")
    if args.samples and not args.temperature > 0:
        raise DraftlabError(
            f"the sampling check needs a temperature > 0, got {args.temperature} (--samples 0 skips it)"
        )
    SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    if args.json_path:
        check_new_file(Path(args.json_path), "--json", args.force)


class _Bar:
    """The progress bar on stderr: one unit per generation."""

    def __init__(self, quiet: bool) -> None:
        self.progress = Progress(
            TextColumn("[bold]audit[/]"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=Console(stderr=True, quiet=quiet),
            disable=quiet,
        )
        self.task = self.progress.add_task("", total=0)

    def add(self, n: int) -> None:
        total = self.progress.tasks[0].total or 0
        self.progress.update(self.task, total=total + n)

    def say(self, text: str) -> None:
        self.progress.update(self.task, description=text)

    def step(self) -> None:
        self.progress.advance(self.task)


def run(args: argparse.Namespace) -> int:
    check_input(args)
    if not args.json_path:
        return _run(args)
    with file_lock(Path(args.json_path)):  # one writer per file, as bench's per folder
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    t_start = time.perf_counter()
    engine = registry.get(args.engine)
    if hasattr(engine, "audit"):  # the engine audits its own drafters (it decodes elsewhere)
        result, audits = engine.audit(args, load_prompts(args.prompts), _Bar(args.quiet))
        return _finish(args, result, audits, None, [])
    methods = parse_methods(args.methods)
    texts = load_prompts(args.prompts)
    needs_draft = [m for m in methods if method_spec(m).needs_draft]
    _, draft_name = model_names(args, bool(needs_draft))
    if needs_draft and draft_name is None:
        if args.methods is not None:
            raise DraftlabError(f"method '{needs_draft[0]}' needs a draft model: pass --draft")
        methods = [m for m in methods if m not in needs_draft]
        Console(stderr=True).print(f"[dim]no --draft: {', '.join(needs_draft)} not audited[/]")
    check_methods(methods, [args.engine])
    # `--dtype auto`'s choice, where the engine reads the target's transformers weights.
    chosen = dtype_choices(args, model_names(args, False)[0]) if engine.reads_weights else {}
    target, draft = engine.load_here(args, any(method_spec(m).needs_draft for m in methods), chosen)
    prompts = [encode_prompt(target, t, chat=not args.no_chat) for t in texts]
    configs = {m: decoder_config(args, m) for m in ["ar", *methods]}
    ar = build_decoder(configs["ar"], target)
    for ids in prompts:
        ar.check_prompt(ids, args.max_new_tokens)
    adaptive = any(c.adaptive for c in configs.values())
    cost = cost_model(args.fixed_k, target, draft) if adaptive else None

    audits = [MethodAudit(m, method_spec(m).lossless) for m in methods]
    prefixes = prompts[: args.prefixes] if args.samples else []
    claims = sum(a.lossless_claim for a in audits)
    alpha_per_test = args.alpha / max(1, claims * len(prefixes))
    bar = _Bar(args.quiet)
    settings = AuditSettings(
        args.max_new_tokens,
        args.samples,
        args.seed,
        SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p),
    )
    parts = Parts(
        config_of=lambda method: decoder_config(args, method),
        cost_of=lambda t, d: cost_model(args.fixed_k, t, d),
        recheck=engine.recheck(),
    )
    audit = Audit(settings, parts, bar)
    bar.add(len(prompts) * (1 + len(audits)))
    with bar.progress:
        t0 = time.perf_counter()
        audit.greedy(audits, target, draft, cost, prompts)
        audit.exact_greedy(audits, target, draft, cost, prompts)
        greedy_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        power = audit.sampling(audits, target, draft, prefixes, alpha_per_test) if prefixes else None
        sampling_s = time.perf_counter() - t0
    for a in audits:
        a.judge(alpha_per_test)
    line = verdict(audits, power)
    elapsed = time.perf_counter() - t_start
    result = {
        "draftlab": __version__,
        "target": target.spec.name,
        "draft": draft.spec.name if draft else None,
        "dtype": {"target": target.spec.dtype, "draft": draft.spec.dtype if draft else None},
        "device": {"target": target.spec.device, "draft": draft.spec.device if draft else None},
        "dtype_choice": choice.record() if (choice := chosen.get(target.spec.name)) else None,
        "hardware": hardware(target.device),
        "engine": args.engine,
        "recheck": audit.recheck_key(target, draft),
        "versions": {**versions(), **engine.versions()},
        "host": {"machine": platform.machine(), "python": platform.python_version()},
        "torch_threads": torch.get_num_threads(),
        "settings": {
            "methods": methods,
            "prompts": texts,
            "chat": not args.no_chat,
            "max_new_tokens": args.max_new_tokens,
            "samples": args.samples,
            "prefixes": len(prefixes),
            "sampling": dataclasses.asdict(audit.params),
            "seed": args.seed,
            "alpha": args.alpha,
            "alpha_per_test": alpha_per_test,
            "sizing": {m: ("cost-aware" if configs[m].adaptive and cost else "fixed k") for m in methods},
            "sampling_sizing": "fixed k (every round drafts, so that the acceptance rule is exercised)",
            "decoder": {m: configs[m].settings() for m in methods},
        },
        "methods": {a.method: a.to_dict() for a in audits},
        "power": power,
        "verdict": line,
        "not_lossless": [a.method for a in audits if a.status == "NOT lossless"],
        "elapsed_s": {"total": elapsed, "greedy": greedy_s, "sampling": sampling_s},
    }
    return _finish(args, result, audits, power, prefixes)


def _finish(args: argparse.Namespace, result: dict, audits, power, prefixes) -> int:
    console = report_console(False)
    print_report(console, result, audits, power, prefixes)
    if args.json_path:
        write_text(args.json_path, json.dumps(result, indent=2, ensure_ascii=False, default=str) + "\n")
    console.print(result["verdict"], markup=False, highlight=False, soft_wrap=True)  # one line, for scripts
    return 1 if result["not_lossless"] else 0
