"""`draftlab audit`: is every speculative method lossless on this pair, dtype and machine?

Exit code 0: every audited method that claims to be lossless is; 1: one is not; 2: bad input.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import time
from pathlib import Path

import torch
import transformers
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from draftlab import __version__
from draftlab.bench.audit import (
    RECHECKS,
    WRONG_RULE,
    MethodAudit,
    first_divergence,
    load_prompts,
    parse_methods,
    verdict,
)
from draftlab.cli import llamacpp_engine
from draftlab.cli.common import (
    add_method_args,
    add_model_args,
    cost_model,
    decoder_config,
    load_pair,
    load_spec,
    model_names,
)
from draftlab.cli.console import report_console
from draftlab.decode.methods import DecoderConfig, build_decoder, method_spec
from draftlab.errors import DraftlabError
from draftlab.models.cached import cached
from draftlab.models.llamacpp import runs_on_llamacpp
from draftlab.models.loading import LoadedModel, ModelSpec
from draftlab.models.profile import hardware
from draftlab.models.prompting import encode_prompt
from draftlab.sampling import SamplingParams
from draftlab.verify.exactness import (
    ResampleFromTargetRule,
    reuse_prefix,
    sample_pairs,
    two_token_law,
)
from draftlab.verify.rules import SpeculativeRule

GREEDY = SamplingParams()

AUDIT_TREE_BUDGET = 16  # nodes per round when the audit samples a tree method


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "audit",
        help="check that speculation does not change this pair's outputs (greedy and sampling)",
        description="Greedy: each method's tokens against ar's, per prompt (a difference only in bfloat16 "
        "or float16 is rerun in float32; on llama.cpp, on one thread). Sampling: a chi-square test of 2-token samples against the "
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
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_model_args(p)
    add_method_args(p)
    llamacpp_engine.add_engine_arg(p)
    p.set_defaults(max_new_tokens=256, temperature=1.0, func=run)
    for action in p._actions:
        if action.dest == "max_new_tokens":
            action.help = "greedy check: new tokens per prompt (default 256)"
        elif action.dest == "temperature":
            action.help = "sampling check: temperature (default 1; the greedy check always uses 0)"
        elif action.dest == "seed":
            action.help = "sampling check: the first seed (sample i uses seed + i)"


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
        out = Path(args.json_path)
        if out.is_dir():
            raise DraftlabError(f"--json '{out}' is a folder, not a file")
        if not out.parent.is_dir():
            raise DraftlabError(f"--json '{out}': folder '{out.parent}' does not exist")


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


def _token_text(lm: LoadedModel, token: int | None) -> str:
    if token is None:
        return "(end)"
    return lm.tokenizer.decode([token])


def _logit_gap(lm: LoadedModel, ids: list[int], a: int, b: int | None) -> float | None:
    """logit(a) - logit(b) where ar wrote a and the method b: how near a tie the choice was."""
    if b is None:
        return None
    if runs_on_llamacpp(lm):
        runner = cached(lm)
        runner.start(ids)
        logits = runner.forward(ids, keep=1)[-1]
    else:
        with torch.inference_mode():
            logits = lm.model(input_ids=torch.tensor([ids], device=lm.device)).logits[0, -1].float()
    return float(logits[a] - logits[b])


class Audit:
    def __init__(self, args: argparse.Namespace, bar: _Bar) -> None:
        self.args = args
        self.bar = bar
        self.rechecked: tuple[LoadedModel, LoadedModel | None] | None = None
        self.ar_rechecked: dict[int, list[int]] = {}

    # ------------------------------------------------------------------ greedy

    def decoders(self, methods, target, draft, cost):
        configs = {m: decoder_config(self.args, m) for m in ["ar", *methods]}
        return {m: build_decoder(c, target, draft, cost if c.adaptive else None) for m, c in configs.items()}

    def recheck_pair(self, target: LoadedModel, draft: LoadedModel | None):
        """The pair a difference is rerun on: float32 copies, or on llama.cpp one-thread copies (there
        every pass size takes the same kernels; the GGUF's quantization cannot change)."""
        if self.rechecked is None:
            self.rechecked = (_recheck_copy(target), _recheck_copy(draft) if draft is not None else None)
        return self.rechecked

    @staticmethod
    def recheck_key(target, draft) -> str | None:
        """The record key of the rerun this pair gets on a difference, or None (nothing to rerun)."""
        if runs_on_llamacpp(target):
            return "float32" if _checkpoint_of(target) else "one_thread"
        low = {target.spec.dtype, draft.spec.dtype if draft else "float32"} != {"float32"}
        return "float32" if low else None

    def greedy(self, audits, target, draft, cost, prompts):
        args = self.args
        decoders = self.decoders([a.method for a in audits], target, draft, cost)
        recheck = self.recheck_key(target, draft)
        for i, ids in enumerate(prompts):
            self.bar.say(f"greedy · prompt {i + 1}/{len(prompts)} · ar")
            ar = decoders["ar"].generate(ids, args.max_new_tokens, GREEDY).tokens
            self.bar.step()
            for audit in audits:
                self.bar.say(f"greedy · prompt {i + 1}/{len(prompts)} · {audit.method}")
                tokens = decoders[audit.method].generate(ids, args.max_new_tokens, GREEDY).tokens
                self.bar.step()
                audit.greedy_prompts += 1
                at = first_divergence(ar, tokens)
                if at is None:
                    audit.greedy_identical += 1
                    continue
                want = ar[at] if at < len(ar) else None
                got = tokens[at] if at < len(tokens) else None
                record = {
                    "prompt": i + 1,
                    "position": at,
                    "ar_token": want,
                    "method_token": got,
                    "ar_text": _token_text(target, want),
                    "method_text": _token_text(target, got),
                    "logit_gap": _logit_gap(target, ids + ar[:at], want, got) if want is not None else None,
                    recheck or "float32": None,
                }
                if recheck and audit.lossless_claim:
                    record[recheck] = self.recheck(audit.method, i, ids, target, draft)
                audit.divergences.append(record)

    def recheck(self, method: str, i: int, ids: list[int], target, draft) -> str:
        args = self.args
        t32, d32 = self.recheck_pair(target, draft)
        self.bar.add(2 if i not in self.ar_rechecked else 1)
        how = "one-thread" if runs_on_llamacpp(target) else "float32"
        self.bar.say(f"greedy · prompt {i + 1} · {how} recheck · {method}")
        if i not in self.ar_rechecked:
            ar = build_decoder(decoder_config(args, "ar"), t32)
            self.ar_rechecked[i] = ar.generate(ids, args.max_new_tokens, GREEDY).tokens
            self.bar.step()
        config = decoder_config(args, method)
        # On one llama.cpp thread every pass size rounds alike, so how rounds are sized cannot matter
        # there, and fixed k spares profiling the copy.
        sized = config.adaptive and not runs_on_llamacpp(t32)
        cost = cost_model(args, t32, d32 if config.needs_draft else None) if sized else None
        tokens = build_decoder(config, t32, d32, cost).generate(ids, args.max_new_tokens, GREEDY).tokens
        self.bar.step()
        return "matches" if tokens == self.ar_rechecked[i] else "diverges"

    # ------------------------------------------------------------------ sampling

    def sample(self, config: DecoderConfig, target, draft, ids, law, label, rule=None) -> dict:
        """One method at one prefix: `--samples` 2-token generations, their p-value under `law`."""
        t_reuse = reuse_prefix(target, ids)
        d_reuse = reuse_prefix(draft, ids) if draft is not None and config.needs_draft else None
        if config.spec.tree and config.tree_budget is None:
            # Without a cost model a tree method verifies a chain; a fixed budget tests the tree rule.
            config = dataclasses.replace(config, tree_budget=AUDIT_TREE_BUDGET)
        decoder = build_decoder(config, t_reuse, d_reuse)  # no cost model: every round drafts its k
        if rule is not None:
            decoder.rule = rule
        self.bar.say(label)
        seeds = range(self.args.seed, self.args.seed + self.args.samples)
        run = sample_pairs(decoder, ids, self.params, seeds, on_sample=self.bar.step)
        return {"p_value": law.p_value(run.counts), **run.to_dict()}

    @property
    def params(self) -> SamplingParams:
        a = self.args
        return SamplingParams(temperature=a.temperature, top_k=a.top_k, top_p=a.top_p)

    def sampling(self, audits, target, draft, prefixes, alpha_per_test) -> dict | None:
        args = self.args
        configs = {a.method: decoder_config(args, a.method) for a in audits}
        wrong = _power_method(audits, configs, target, draft)
        self.bar.add(len(prefixes) * args.samples * (len(audits) + (wrong is not None)))
        power: dict | None = None
        if wrong is not None:
            power = {"rule": WRONG_RULE, "proposer_of": wrong, "prefixes": [], "shown": False}
        recheck = self.recheck_key(target, draft)
        for j, ids in enumerate(prefixes):
            law = two_token_law(target, ids, self.params, args.samples)
            where = f"sampling · prefix {j + 1}/{len(prefixes)}"
            for audit in audits:
                config = configs[audit.method]
                result = self.sample(config, target, draft, ids, law, f"{where} · {audit.method}")
                result.update(prefix=j + 1, cells=law.degrees_of_freedom + 1, law_cells=len(law.cells))
                if recheck and audit.lossless_claim and result["p_value"] < alpha_per_test:
                    t32, d32 = self.recheck_pair(target, draft)
                    law32 = two_token_law(t32, ids, self.params, args.samples)
                    self.bar.add(args.samples)
                    again = self.sample(config, t32, d32, ids, law32, f"{where} · {audit.method} · {recheck}")
                    result[f"{recheck}_p_value"] = again["p_value"]
                audit.sampling.append(result)
            if power is not None:
                result = self.sample(
                    configs[wrong],
                    target,
                    draft,
                    ids,
                    law,
                    f"{where} · wrong rule",
                    rule=ResampleFromTargetRule(),
                )
                result.update(prefix=j + 1, rejected=result["p_value"] < alpha_per_test)
                power["prefixes"].append(result)
        if power is not None:
            power["shown"] = any(r["rejected"] for r in power["prefixes"])
        return power


def _power_method(audits, configs, target, draft) -> str | None:
    """The audited method whose decoder the wrong rule goes into: one with a speculative-sampling rule,
    a draft model's proposer (stochastic q) preferred."""
    found = []
    for audit in audits:
        if not audit.lossless_claim:
            continue
        decoder = build_decoder(configs[audit.method], target, draft)
        if isinstance(getattr(decoder, "rule", None), SpeculativeRule):
            found.append((getattr(decoder.proposer, "draft", None) is None, audit.method))
    return min(found)[1] if found else None


def run(args: argparse.Namespace) -> int:
    t_start = time.perf_counter()
    check_input(args)
    methods = parse_methods(args.methods)
    texts = load_prompts(args.prompts)
    needs_draft = [m for m in methods if method_spec(m).needs_draft]
    _, draft_name = model_names(args, bool(needs_draft))
    if needs_draft and draft_name is None:
        if args.methods is not None:
            raise DraftlabError(f"method '{needs_draft[0]}' needs a draft model: pass --draft")
        methods = [m for m in methods if m not in needs_draft]
        Console(stderr=True).print(f"[dim]no --draft: {', '.join(needs_draft)} not audited[/]")
    if args.engine == "llamacpp":
        for m in methods:
            llamacpp_engine.check_method(m)
        target, draft = llamacpp_engine.load_pair(args, any(method_spec(m).needs_draft for m in methods))
    else:
        target, draft = load_pair(args, any(method_spec(m).needs_draft for m in methods))
    prompts = [encode_prompt(target, t, chat=not args.no_chat) for t in texts]
    configs = {m: decoder_config(args, m) for m in ["ar", *methods]}
    ar = build_decoder(configs["ar"], target)
    for ids in prompts:
        ar.check_prompt(ids, args.max_new_tokens)
    adaptive = any(c.adaptive for c in configs.values())
    cost = cost_model(args, target, draft) if adaptive else None

    audits = [MethodAudit(m, method_spec(m).lossless) for m in methods]
    prefixes = prompts[: args.prefixes] if args.samples else []
    claims = sum(a.lossless_claim for a in audits)
    alpha_per_test = args.alpha / max(1, claims * len(prefixes))
    bar = _Bar(args.quiet)
    audit = Audit(args, bar)
    bar.add(len(prompts) * (1 + len(audits)))
    with bar.progress:
        t0 = time.perf_counter()
        audit.greedy(audits, target, draft, cost, prompts)
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
        "dtype_choice": getattr(args, "dtype_choices", {}).get(target.spec.name),
        "hardware": hardware(target.device),
        "engine": args.engine,
        "recheck": audit.recheck_key(target, draft),
        "versions": _versions(target),
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
    console = report_console(False)
    _print_report(console, result, audits, power, prefixes)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result, indent=2, ensure_ascii=False, default=str) + "\n")
    console.print(line, markup=False, highlight=False)
    return 1 if result["not_lossless"] else 0


def _checkpoint_of(lm) -> str | None:
    """The transformers checkpoint a llama.cpp model was exported from (`--gguf-type` other than own),
    or None. Its storages are not batch-invariant even on one thread (BF16 and F32 passes of one and
    of several tokens differed by up to 0.23 and 0.012 in the logits on the Zen5, where the Q4_1 file's
    were bitwise equal), so a difference is rerun on the checkpoint in float32 instead."""
    from draftlab.models.llamacpp import OWN_STORAGE  # noqa: PLC0415

    storage = getattr(lm.spec, "storage", OWN_STORAGE)
    return lm.spec.name if runs_on_llamacpp(lm) and storage != OWN_STORAGE else None


def _recheck_copy(lm):
    checkpoint = _checkpoint_of(lm)
    if checkpoint:
        return load_spec(ModelSpec(checkpoint, dtype="float32"))
    if runs_on_llamacpp(lm):
        from draftlab.models.llamacpp import load_llamacpp  # noqa: PLC0415

        return load_llamacpp(
            lm.spec.name,
            tokenizer=lm.tokenizer,
            n_ctx=lm.context_length,
            n_threads=1,
            storage=lm.spec.storage,
        )
    return load_spec(dataclasses.replace(lm.spec, dtype="float32"))


def _versions(target) -> dict:
    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    if runs_on_llamacpp(target):
        import llama_cpp  # noqa: PLC0415

        versions["llama_cpp"] = llama_cpp.__version__
    return versions


def _p(value: float) -> str:
    return f"{value:.2g}" if value < 0.01 else f"{value:.2f}"


def _print_report(console: Console, result: dict, audits, power, prefixes) -> None:
    s = result["settings"]
    dtype = result["dtype"]["target"] + (
        f"/{result['dtype']['draft']}"
        if result["draft"] and result["dtype"]["draft"] != result["dtype"]["target"]
        else ""
    )
    hw = result["hardware"]
    console.print(
        f"[bold]draftlab audit[/]: target {result['target']} · draft {result['draft'] or '-'} · {dtype} on "
        f"{hw.get('name') or hw['kind']} ({result['device']['target']})",
        highlight=False,
    )
    lines = [
        f"greedy: {len(s['prompts'])} prompts × {s['max_new_tokens']} new tokens, each method against ar",
    ]
    if prefixes:
        sp = s["sampling"]
        lines.append(
            f"sampling: {len(prefixes)} prefix{'es' if len(prefixes) > 1 else ''} × {s['samples']} samples of the first 2 tokens at temperature "
            f"{sp['temperature']:g}"
            + (f", top-k {sp['top_k']}" if sp["top_k"] else "")
            + (f", top-p {sp['top_p']:g}" if sp["top_p"] < 1 else "")
            + " (every round drafts its full k, so that the acceptance rule is exercised)"
            + f"; chi-square against the target's exact law, α = {s['alpha']:g} "
            f"({_p(s['alpha_per_test'])} per test, Bonferroni)"
        )
    for text in lines:
        console.print(text, highlight=False)
    table = Table(show_lines=False)
    for col in (
        "method",
        "greedy identical",
        "first divergence",
        "one-thread recheck" if result["recheck"] == "one_thread" else "float32 recheck",
        "sampling p",
        "α",
        "result",
    ):
        table.add_column(col, justify="left" if col in ("method", "first divergence", "result") else "right")
    for a in audits:
        first = a.divergences[0] if a.divergences else None
        where = (
            f"prompt {first['prompt']}, token {first['position']}: {first['ar_text']!r} (ar) vs "
            f"{first['method_text']!r}"
            + (f", gap {first['logit_gap']:.3g}" if first["logit_gap"] is not None else "")
            if first
            else "-"
        )
        rechecks = [d[key] for d in a.divergences for key, _ in RECHECKS if d.get(key)]
        recheck = f"{rechecks.count('matches')}/{len(rechecks)} match" if rechecks else "-"
        ps = ", ".join(
            _p(x["p_value"])
            + "".join(
                f" ({name} {_p(x[f'{key}_p_value'])})" for key, name in RECHECKS if f"{key}_p_value" in x
            )
            for x in a.sampling
        )
        drafted = sum(x["drafted"] for x in a.sampling)
        accepted = sum(x["accepted"] for x in a.sampling)
        style = (
            "red" if a.status == "NOT lossless" else "green" if a.status.startswith("lossless") else "yellow"
        )
        table.add_row(
            a.method,
            f"{a.greedy_identical}/{a.greedy_prompts}",
            where,
            recheck,
            ps or "-",
            f"{accepted / drafted:.2f}" if drafted else "-",
            f"[{style}]{a.status}[/]",
        )
    if power is not None:
        drafted = sum(x["drafted"] for x in power["prefixes"])
        accepted = sum(x["accepted"] for x in power["prefixes"])
        table.add_row(
            f"wrong rule ({power['proposer_of']}'s drafts)",
            "",
            f"power check: {WRONG_RULE}",
            "",
            ", ".join(_p(x["p_value"]) for x in power["prefixes"]),
            f"{accepted / drafted:.2f}" if drafted else "-",
            "[green]rejected: the check has power[/]" if power["shown"] else "[red]NOT rejected: no power[/]",
        )
    console.print(table)
    for a in audits:
        for reason in a.reasons if a.status != "lossless" else []:
            console.print(f"  {a.method}: {reason}", markup=False, highlight=False)
    e = result["elapsed_s"]
    console.print(
        f"took {_duration(e['total'])} (greedy {_duration(e['greedy'])}, sampling {_duration(e['sampling'])})",
        highlight=False,
    )


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes = math.floor(seconds / 60)
    return f"{minutes} min {seconds - 60 * minutes:.0f} s"
