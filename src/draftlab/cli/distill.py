"""`draftlab distill`: train a small draft for a target from the target's own responses."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from draftlab import engines as registry
from draftlab.errors import DraftlabError
from draftlab.outputs import check_folder, held_folder

if TYPE_CHECKING:
    from draftlab.distill.config import DistillConfig


def _parse(text: str, kind, what: str):
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid {what}: '{text}'") from None


def _positive_int(text: str) -> int:
    value = _parse(text, int, "positive integer")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _count(text: str) -> int:
    value = _parse(text, int, "count")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _nonneg_float(text: str) -> float:
    value = _parse(text, float, "number")
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = _nonneg_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def _duration(text: str) -> float:
    """Seconds from '90s', '60m', '1.5h' or a plain number of minutes."""
    units = {"s": 1, "m": 60, "h": 3600}
    number, unit = (text[:-1], text[-1]) if text and text[-1] in units else (text, "m")
    value = _parse(number, float, "duration")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive duration such as 60m, got '{text}'")
    return value * units[unit]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "distill",
        help="distill a small draft model for a target (KL to the target's own next-token distributions)",
        description="Generate the target's responses to prompts (recording its top-k next-token log-probs), "
        "then train a small Llama draft on them. Data shards and checkpoints live in the work folder, so an "
        "interrupted run resumes where it stopped.",
    )
    p.add_argument("--target", required=True, help="hub id, local folder or registry name of the target")
    p.add_argument("--out", required=True, help="folder for the draft (weights, tokenizer, recipe, log)")
    p.add_argument(
        "--force",
        action="store_true",
        help="write into an --out folder that holds files draftlab did not write (they may be replaced)",
    )
    p.add_argument(
        "--work-dir", default=None, help="data shards and checkpoints (default: OUT.work beside OUT)"
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (target and training)")
    p.add_argument("--target-dtype", choices=["bfloat16", "float32", "float16"], default="bfloat16")
    p.add_argument("--resume", action="store_true", help="require a checkpoint to continue from")
    p.add_argument("--restart", action="store_true", help="ignore any checkpoint (data shards are kept)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--json", action="store_true", help="print the result as one JSON record")

    d = p.add_argument_group("data")
    d.add_argument(
        "--prompts",
        action="append",
        help="JSONL prompt file ('prompt' or 'turns'); repeatable "
        "(default: draftlab's distill_prompts.jsonl)",
    )
    d.add_argument("--no-default-prompts", action="store_true", help="without --prompts, use no prompt file")
    d.add_argument(
        "--text", action="append", help="plain-text file for instructions and raw text; repeatable"
    )
    d.add_argument("--corpus-prompts", type=_count, default=240, help="instructions built on --text passages")
    d.add_argument(
        "--synth-prompts",
        type=_count,
        default=0,
        help="chat prompts of the benchmark's eight kinds composed from templates and --text passages",
    )
    d.add_argument(
        "--magpie-prompts",
        type=_count,
        default=0,
        help="user requests the target writes itself from its chat template's user header (Magpie), "
        "each then answered like the others; kept in the work folder",
    )
    d.add_argument("--raw-chunks", type=_count, default=32, help="raw --text chunks scored by the target")
    d.add_argument("--raw-chars", type=_positive_int, default=1200, help="characters per raw chunk")
    d.add_argument(
        "--samples-per-prompt", type=_count, default=1, help="sampled responses besides the greedy one"
    )
    d.add_argument("--sample-temperature", type=_positive_float, default=0.8)
    d.add_argument("--max-new-tokens", type=_positive_int, default=192, help="longest target response")
    d.add_argument("--top-k", type=_positive_int, default=32, help="teacher log-probs kept per position")
    d.add_argument("--gen-batch-size", type=_positive_int, default=32)
    d.add_argument(
        "--gen-minutes",
        type=_nonneg_float,
        default=None,
        help="stop generating data after this many minutes and train on what is on disk (0: no generation)",
    )
    d.add_argument(
        "--gen-dtype",
        choices=["auto", "bfloat16", "float32", "float16"],
        default="auto",
        help="dtype the target answers in (auto: bfloat16 for a head on a CPU with native bfloat16, "
        "where batched answers come 2-3x faster; otherwise --target-dtype)",
    )
    d.add_argument("--max-len", type=_positive_int, default=768, help="longest sequence (prompt + response)")
    d.add_argument(
        "--answers-with",
        default="auto",
        metavar="ENGINE",
        help="who writes the target's answers: hf (the target here, batched), llama-server (its parallel "
        "slots on the target's GGUF; the target here then scores each answer for its labels), or auto "
        "(default): from 128 jobs on, both answer one batch and the faster answers the rest",
    )

    h = p.add_argument_group("a head that drafts from the target's hidden states (instead of a draft model)")
    h.add_argument(
        "--head",
        choices=["eagle3", "dflash"],
        default=None,
        help="eagle3: an EAGLE-3 head (written in the speculators format); dflash: a DFlash block drafter "
        "(written in the DFlashDraftModel layout, for the dflash method's --dflash)",
    )
    h.add_argument("--block-size", type=_positive_int, default=8, help="dflash: positions a block pass fills")
    h.add_argument(
        "--dflash-layers", type=_positive_int, default=1, help="dflash: the drafter's decoder layers"
    )
    h.add_argument(
        "--anchors", type=_positive_int, default=16, help="dflash: blocks trained per sequence each step"
    )
    h.add_argument(
        "--draft-vocab",
        type=_positive_int,
        default=None,
        help="tokens the head can propose, the answers' most frequent (default: 8192 for eagle3, the "
        "whole vocabulary for dflash, whose llama.cpp converter reads no pruned vocabulary)",
    )
    h.add_argument(
        "--ttt-steps", type=_positive_int, default=3, help="training-time-test steps (chain depth trained)"
    )
    h.add_argument(
        "--time-budget",
        type=_duration,
        default=None,
        help="stop training when the whole run has taken this long (e.g. 60m, 1.5h, 900s); "
        "without --gen-minutes, generation takes at most half of it",
    )

    m = p.add_argument_group("draft")
    m.add_argument(
        "--init-from",
        default=None,
        help="start from an existing draft or, with --head, head (folder or registry name, e.g. "
        "smollm2-135m-draft, smollm2-135m-eagle3); its shape overrides the options below",
    )
    m.add_argument("--hidden-size", type=_positive_int, default=192)
    m.add_argument("--layers", type=_positive_int, default=4)
    m.add_argument("--intermediate-size", type=_positive_int, default=512)
    m.add_argument("--heads", type=_positive_int, default=3)
    m.add_argument("--kv-heads", type=_positive_int, default=1)

    t = p.add_argument_group("training")
    t.add_argument("--steps", type=_positive_int, default=600)
    t.add_argument("--batch-tokens", type=_positive_int, default=4096, help="tokens per optimizer step")
    t.add_argument("--lr", type=_positive_float, default=2e-3)
    t.add_argument("--warmup", type=_count, default=30)
    t.add_argument("--weight-decay", type=_nonneg_float, default=0.01)
    t.add_argument("--kl-weight", type=_nonneg_float, default=1.0)
    t.add_argument("--ce-weight", type=_nonneg_float, default=0.5)
    t.add_argument("--prompt-weight", type=_nonneg_float, default=0.2, help="loss weight of prompt positions")
    t.add_argument("--raw-weight", type=_nonneg_float, default=0.3, help="loss weight of raw-text positions")
    t.add_argument(
        "--save-every", type=_positive_int, default=50, help="checkpoint (and export) every N steps"
    )
    t.add_argument(
        "--autocast", choices=["auto", "on", "off"], default="auto", help="bf16 autocast in training"
    )
    t.add_argument("--log-every", type=_positive_int, default=10, help="train_log.jsonl line every N steps")
    t.add_argument("--seed", type=int, default=0)

    e = p.add_argument_group("evaluation")
    e.add_argument("--eval-prompts", default=None, help="held-out JSONL prompts (default: the builtin suite)")
    e.add_argument(
        "--eval-per-category", type=_count, default=2, help="prompts per category (0: no evaluation)"
    )
    e.add_argument("--eval-gamma", type=_positive_int, default=4)
    e.add_argument("--eval-max-new-tokens", type=_positive_int, default=64)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.kl_weight == 0 and args.ce_weight == 0:
        raise DraftlabError("--kl-weight and --ce-weight are both 0: nothing to train")
    if args.hidden_size % args.heads:
        raise DraftlabError(f"--hidden-size {args.hidden_size} is not a multiple of --heads {args.heads}")
    if args.heads % args.kv_heads:
        raise DraftlabError(f"--heads {args.heads} is not a multiple of --kv-heads {args.kv_heads}")
    if args.resume and args.restart:
        raise DraftlabError("--resume and --restart contradict each other")
    out = Path(args.out).expanduser()
    check_folder(out, "--out", args.force, legacy=_distilled_here)
    with held_folder(out, "distill"):  # one writer per folder, as bench's
        return _run_head(args) if args.head else _run_draft(args)


def _distilled_here(folder: Path) -> bool:
    """A folder an earlier draftlab distill wrote, before output markers existed: its recipe."""
    try:
        recipe = json.loads((folder / "recipe.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(recipe, dict) and {"train_config", "trained_steps"} <= set(recipe)


def _run_draft(args: argparse.Namespace) -> int:
    from draftlab.distill.pipeline import distill  # noqa: PLC0415 - keeps `--help` fast

    result = distill(distill_config(args))
    if args.json:
        print(json.dumps(result, default=str))
        return 0
    final = result.get("final") or {}
    print(
        f"draft written to {result['out']} after {result['steps']} steps (loss {final.get('loss', float('nan')):.3f})"
    )
    ev = result.get("evaluation")
    if ev and ev.get("mean_acceptance_rate") is not None:
        print(
            f"held-out: mean acceptance {ev['mean_acceptance_rate']:.3f} over {ev['prompts']} prompts; "
            f"AR {ev['ar_tokens_per_s']:.1f} tok/s, SPS {ev['sps_tokens_per_s']:.1f} tok/s ({ev['speedup']:.2f}×)"
        )
    return 0


def _run_dflash(args: argparse.Namespace) -> int:
    from draftlab.drafters.dflash.distill import DFlashOptions, distill_dflash  # noqa: PLC0415
    from draftlab.drafters.dflash.train import DFlashTrainConfig  # noqa: PLC0415

    if args.block_size < 2:
        raise DraftlabError(
            f"--block-size must be at least 2 (the anchor and one mask), got {args.block_size}"
        )
    train = DFlashTrainConfig(**_training(args), anchors=args.anchors)
    opts = DFlashOptions(
        args.block_size, args.dflash_layers, train, args.time_budget, args.save_every, args.draft_vocab
    )
    cfg = distill_config(args)
    result = distill_dflash(cfg, opts)
    for name in registry.engine_names():  # each engine that serves DFlash drafters writes its copy beside it
        export = getattr(registry.get(name), "export_head", None)
        if export is not None:
            result.update(export(cfg.out, cfg.target, "dflash"))
    if args.json:
        print(json.dumps(result, default=str))
        return 0
    final = result.get("final") or {}
    print(
        f"DFlash drafter written to {result['out']} after {result['steps']} steps "
        f"(loss {final.get('loss', float('nan')):.3f}, {result['train_tokens']} training tokens)"
    )
    held = result.get("held_out") or {}
    if held.get("mean_accepted_length") is not None:
        print(
            f"held-out answers: first-token top-1 {held['first_token_top1']:.3f}, mean accepted length "
            f"{held['mean_accepted_length']:.2f} of a block of {held['block_size']}"
        )
    return 0


def _run_head(args: argparse.Namespace) -> int:
    if args.head == "dflash":
        return _run_dflash(args)
    from draftlab.drafters.eagle3.distill import HeadOptions, distill_head  # noqa: PLC0415
    from draftlab.drafters.eagle3.train import HeadTrainConfig  # noqa: PLC0415

    train = HeadTrainConfig(**_training(args), ttt_steps=args.ttt_steps)
    opts = HeadOptions(args.head, args.draft_vocab or 8192, train, args.time_budget, args.save_every)
    cfg = distill_config(args)
    result = distill_head(cfg, opts)
    # Each engine that serves heads writes its copy beside it (llama-server: a GGUF).
    for name in registry.engine_names():
        export = getattr(registry.get(name), "export_head", None)
        if export is not None:
            result.update(export(cfg.out, cfg.target))
    if args.json:
        print(json.dumps(result, default=str))
        return 0
    final = result.get("final") or {}
    print(
        f"head written to {result['out']} after {result['steps']} steps (loss {final.get('loss', float('nan')):.3f}); "
        + (
            f"data generated at {result['generation_tokens_per_s']} tokens/s"
            if result["generation_tokens_per_s"]
            else "no data generated this run"
        )
    )
    held = result.get("held_out") or {}
    if held.get("first_token_top1") is not None:
        print(
            f"held-out answers: first-token top-1 {held['first_token_top1']:.3f}, chain mean accepted length "
            f"{held['chain_mean_accepted_length']:.2f} at γ = {held['gamma']}"
        )
    dec = result.get("decoding") or {}
    if dec.get("mean_accepted_length") is not None:
        print(
            f"held-out prompts: eagle mean accepted length {dec['mean_accepted_length']:.2f}, "
            f"{dec['speedup']:.2f}× ar over {dec['prompts']} prompts"
        )
    return 0


def distill_config(args: argparse.Namespace) -> DistillConfig:
    """The parsed command line as the distill pipeline's configuration (the head reads it too)."""
    from draftlab.distill import config as P  # noqa: PLC0415, N812
    from draftlab.distill import train as T  # noqa: PLC0415, N812

    out = Path(args.out).expanduser()
    prompt_paths = [Path(p).expanduser() for p in (args.prompts or [])]
    if not prompt_paths and not args.no_default_prompts and P.package_data("distill_prompts.jsonl"):
        prompt_paths = [P.package_data("distill_prompts.jsonl")]
    eval_prompts = (
        Path(args.eval_prompts).expanduser() if args.eval_prompts else P.package_data("builtin_suite.jsonl")
    )
    work = Path(args.work_dir).expanduser() if args.work_dir else out.parent / f"{out.name}.work"
    answerers = _answerers(args, work)
    return P.DistillConfig(
        target=args.target,
        target_dtype=args.target_dtype,
        device=args.device,
        out=out,
        work=work,
        resume=args.resume,
        restart=args.restart,
        quiet=args.quiet,
        init_from=args.init_from,
        shape=T.DraftShape(args.hidden_size, args.layers, args.intermediate_size, args.heads, args.kv_heads),
        train=T.TrainConfig(
            **_training(args),
            kl_weight=args.kl_weight,
            ce_weight=args.ce_weight,
            raw_weight=args.raw_weight,
            save_every=args.save_every,
            log_every=args.log_every,
        ),
        data=P.DataConfig(
            prompt_paths=tuple(prompt_paths),
            text_paths=tuple(Path(p).expanduser() for p in (args.text or [])),
            corpus_prompts=args.corpus_prompts,
            synth_prompts=args.synth_prompts,
            raw_chunks=args.raw_chunks,
            raw_chars=args.raw_chars,
            samples_per_prompt=args.samples_per_prompt,
            sample_temperature=args.sample_temperature,
            max_new_tokens=args.max_new_tokens,
            top_k=args.top_k,
            gen_batch_size=args.gen_batch_size,
            gen_minutes=args.gen_minutes,
            gen_dtype=args.gen_dtype,
            max_len=args.max_len,
            magpie_prompts=args.magpie_prompts,
        ),
        eval=P.EvalConfig(
            prompts=eval_prompts if args.eval_per_category > 0 else None,
            per_category=args.eval_per_category,
            gamma=args.eval_gamma,
            max_new_tokens=args.eval_max_new_tokens,
        ),
        seed=args.seed,
        cli={k: v for k, v in vars(args).items() if k != "func" and not callable(v)},
        answerers=answerers,
        answer_here=args.answers_with in ("auto", registry.DEFAULT),
    )


def _answerers(args: argparse.Namespace, work: Path) -> tuple:
    """(engine name, start) for each engine that may answer instead of the target here."""
    choice = args.answers_with
    offered = [n for n in registry.engine_names() if getattr(registry.get(n), "answerer", None)]
    if choice not in ("auto", registry.DEFAULT, *offered):
        raise DraftlabError(
            f"--answers-with '{choice}': choose from auto, {registry.DEFAULT}, {', '.join(offered)}"
        )
    found = []
    for name in offered:
        if choice not in ("auto", name):
            continue
        start = registry.get(name).answerer(
            args.target, args.target_dtype, args.max_new_tokens, args.max_len, work, required=choice == name
        )
        if start is not None:
            found.append((name, start))
    return tuple(found)


def _training(args: argparse.Namespace) -> dict:
    """What a draft's and a head's training share on the command line."""
    import torch  # noqa: PLC0415

    from draftlab.distill.config import autocast_enabled  # noqa: PLC0415

    return {
        "steps": args.steps,
        "batch_tokens": args.batch_tokens,
        "max_len": args.max_len,
        "lr": args.lr,
        "warmup": min(args.warmup, max(1, args.steps // 5)),
        "weight_decay": args.weight_decay,
        "prompt_weight": args.prompt_weight,
        "seed": args.seed,
        "autocast": autocast_enabled(args.autocast, torch.device(args.device)),
    }
