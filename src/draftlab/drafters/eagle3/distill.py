"""`draftlab distill --head eagle3`: the target's answers, its features, a trained EAGLE-3 head.

Stages, each resumable from the work folder: (1) the target answers the prompts (the same data
stage and shards as draft distillation; it is the slow part on a CPU, so its tokens/s is
reported), (2) one teacher-forced target pass per sequence stores the features the head reads,
(3) the head trains with the training-time test until its steps or the time budget run out,
exported in the speculators format at every checkpoint, (4) it is evaluated on sequences and
prompts it did not train on.
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from draftlab.distill import data as D
from draftlab.distill.config import DistillConfig
from draftlab.distill.evaluate import eval_prompts, evaluate_pair
from draftlab.distill.inputs import generate_data, read_inputs
from draftlab.drafters.eagle3 import features as F
from draftlab.drafters.eagle3 import train as E
from draftlab.drafters.eagle3.head import Eagle3Head, default_aux_layers, head_for_target
from draftlab.drafters.eagle3.io import load_head, load_head_lm, save_head
from draftlab.errors import DraftlabError
from draftlab.files import write_text
from draftlab.models.loading import LoadedModel, ModelSpec, load_model, resolve_path
from draftlab.progress import maybe_progress

CHECKPOINT = "head-checkpoint.pt"
HELD_OUT_SHARE = 0.05  # of the prompt-file prompts, whose answers are never trained on


@dataclass(frozen=True)
class HeadOptions:
    kind: str  # "eagle3"
    draft_vocab: int
    train: E.HeadTrainConfig
    time_budget_s: float | None
    save_every: int


def held_out(record: dict, any_source: bool = False, prompt_of: dict[str, str] | None = None) -> bool:
    """The answers to 5% of the prompt-file prompts (of any sequence where there are none).

    Drawn by prompt (`prompt_of`: job key -> prompt name), so that no sampled answer to a held-out
    prompt is trained on; a key whose job is not among this run's falls back to its own name."""
    if record["source"] != "prompts" and not any_source:
        return False
    name = (prompt_of or {}).get(record["key"], record["key"])
    digest = int(hashlib.sha1(name.encode()).hexdigest()[:8], 16)
    return digest / 0xFFFFFFFF < HELD_OUT_SHARE


def distill_head(cfg: DistillConfig, opts: HeadOptions) -> dict:
    started = time.time()
    deadline = None if opts.time_budget_s is None else started + opts.time_budget_s
    if cfg.out.exists() and not cfg.out.is_dir():
        raise DraftlabError(f"--out '{cfg.out}' exists and is not a folder")
    inputs = read_inputs(cfg.data, cfg.seed)
    checkpoint_path = cfg.work / CHECKPOINT
    if cfg.restart:
        checkpoint_path.unlink(missing_ok=True)
    checkpoint = torch.load(checkpoint_path, weights_only=False) if checkpoint_path.exists() else None
    if cfg.resume and checkpoint is None:
        raise DraftlabError(f"--resume: no head checkpoint in '{cfg.work}'")
    target = load_model(ModelSpec(cfg.target, cfg.target_dtype, cfg.device))
    if target.is_encoder_decoder:
        raise DraftlabError("distill --head supports decoder-only targets only")
    cfg.out.mkdir(parents=True, exist_ok=True)
    cfg.work.mkdir(parents=True, exist_ok=True)

    # (1) answers. Without --gen-minutes, generation may use half of a time budget.
    data = cfg.data
    if data.gen_minutes is None and deadline is not None:
        cfg = replace(cfg, data=replace(data, gen_minutes=opts.time_budget_s / 120))
    before = D.data_stats(cfg.data_dir) if cfg.data_dir.exists() else {}
    jobs_left, gen_seconds, gen_dtype = generate_data(cfg, target, inputs, labels_from_answers=False)
    after = D.data_stats(cfg.data_dir)
    new_tokens = sum(after.get("response_tokens", {}).values()) - sum(
        before.get("response_tokens", {}).values()
    )
    # One record per key: the same instruction drawn twice is one job, whose batch-padded greedy
    # answers may differ in the last bits.
    records = list({r["key"]: r for r in reversed(D.load_shards(cfg.data_dir)) if len(r["ids"]) > 1}.values())
    if not records:
        raise DraftlabError("no training data: give --prompts or --text files (or keep the default prompts)")

    # (2) features
    layers = target.model.config.num_hidden_layers
    aux_layers = tuple(checkpoint["aux_layers"]) if checkpoint else default_aux_layers(layers)
    feature_dir = cfg.work / f"features-{'-'.join(map(str, aux_layers))}-{cfg.target_dtype}"
    t0 = time.time()
    with maybe_progress(not cfg.quiet) as progress:
        todo = len(records) - len(F.done_keys(feature_dir)) if feature_dir.exists() else len(records)
        task = progress.add_task("target features", total=max(todo, 1), info="") if progress else None

        def on_batch(n: int, tokens: int) -> None:
            if progress:
                progress.update(task, advance=n, info=f"{tokens} tokens in the last batch")

        F.extract(target.model, records, aux_layers, feature_dir, on_batch=on_batch)
    feature_seconds = time.time() - t0
    featured = F.load(feature_dir, records)
    any_source = not any(r["source"] == "prompts" for r in featured)
    prompt_of = D.prompt_keys(inputs.jobs)
    train_records = [r for r in featured if not held_out(r, any_source, prompt_of)]
    test_records = [r for r in featured if held_out(r, any_source, prompt_of)]

    # (3) the head
    lm_full = target.model.get_output_embeddings().weight.detach().float().cpu()
    embedding = target.model.get_input_embeddings().weight.detach().float().cpu()
    if checkpoint is not None:
        head = load_head(checkpoint_path.parent / "head-state", target.model.config, embedding)
        head.float()
        start_step, optimizer_state = int(checkpoint["step"]), checkpoint["optimizer"]
        train_seconds = float(checkpoint.get("train_seconds", 0.0))
    elif cfg.init_from:
        # Continue from an existing head (e.g. the shipped one) when the work folder is gone: its
        # layers and draft vocabulary are kept; the optimizer and schedule start afresh.
        head = load_head(resolve_path(cfg.init_from), target.model.config, embedding)
        head.float()
        if tuple(head.aux_layers) != tuple(aux_layers):
            raise DraftlabError(
                f"--init-from '{cfg.init_from}' reads target layers {list(head.aux_layers)}, "
                f"not {list(aux_layers)}"
            )
        start_step, optimizer_state, train_seconds = 0, None, 0.0
    else:
        vocab = F.draft_vocabulary(
            train_records, opts.draft_vocab, set(target.eos_token_ids), target.vocab_size
        )
        head = head_for_target(target.model.config, embedding, lm_full, vocab, aux_layers, seed=cfg.seed)
        start_step, optimizer_state, train_seconds = 0, None, 0.0
    log_path = cfg.out / "train_log.jsonl"
    _trim_log(log_path, start_step)  # steps past the checkpoint (a run stopped between saves) are redone
    last: dict = dict(checkpoint.get("last", {})) if checkpoint else {}
    t_train = time.time()
    verifier = cfg.target

    def on_save(step: int, optimizer: dict) -> None:
        seconds = train_seconds + time.time() - t_train
        save_head(head, cfg.work / "head-state", verifier, target.model.config.architectures or [])
        torch.save(
            {
                "step": step,
                "optimizer": optimizer,
                "train_seconds": seconds,
                "aux_layers": list(aux_layers),
                "last": last,
            },
            checkpoint_path,
        )
        export(head, cfg.out, verifier, target)

    with maybe_progress(not cfg.quiet and start_step < opts.train.steps) as progress:
        task = (
            progress.add_task("train head", total=opts.train.steps, completed=start_step, info="")
            if progress
            else None
        )
        with log_path.open("a", buffering=1) as log:  # line-buffered: the curve can be watched

            def on_step(step: int, metrics: dict) -> None:
                last.clear()
                last.update(metrics)
                log.write(json.dumps({"step": step, **metrics}) + "\n")
                if progress:
                    info = f"loss {metrics['loss']:.3f} top-1 {metrics['top1_0']:.3f}"
                    progress.update(task, completed=step, info=info)

            step = E.train(
                head,
                train_records,
                lm_full,
                opts.train,
                start_step,
                optimizer_state,
                deadline,
                on_step,
                on_save,
                opts.save_every,
                start_progress=float(last.get("progress", 0.0)),
            )
    train_seconds += time.time() - t_train

    # (4) evaluation
    held = E.held_out_metrics(head, test_records, lm_full, opts.train.ttt_steps)
    decoding = evaluate_decoding(cfg, target) if cfg.eval.prompts is not None else None
    recipe = {
        "what": "EAGLE-3 head trained by `draftlab distill --head eagle3` (training-time test over "
        f"{opts.train.ttt_steps} steps, soft cross-entropy to the target over the draft vocabulary)",
        "cli": cfg.cli,
        "target": {
            "name": cfg.target,
            "dtype": cfg.target_dtype,
            "layers": layers,
            "aux_layers": list(aux_layers),
        },
        "head": {
            "parameters": sum(p.numel() for n, p in head.named_parameters() if not n.startswith("embed")),
            "draft_vocab_size": head.draft_vocab_size,
            "hidden_size": head.config.hidden_size,
        },
        "data": {
            **D.data_stats(cfg.data_dir),
            "jobs": len(inputs.jobs),
            "magpie_prompts": len(inputs.magpie_items),
            "magpie_seconds_this_run": round(inputs.magpie_seconds, 1),
            "jobs_not_generated": jobs_left,
            "generation_seconds_this_run": round(gen_seconds, 1),
            "generated_response_tokens_this_run": new_tokens,
            "generation_tokens_per_s": round(new_tokens / gen_seconds, 1) if gen_seconds > 1 else None,
            "generation_engine": "draftlab's batched transformers generate",
            "generation_dtype": gen_dtype,
            "feature_seconds_this_run": round(feature_seconds, 1),
            "train_sequences": len(train_records),
            "held_out_sequences": len(test_records),
        },
        "init": f"{cfg.init_from} (--init-from)" if cfg.init_from else "a new head (head_for_target)",
        "train_config": asdict(opts.train),
        "trained_steps": step,
        "train_seconds": round(train_seconds, 1),
        "final_metrics": dict(last),
        "held_out": held,
        "decoding": decoding,
        "wall_seconds_this_run": round(time.time() - started, 1),
        "torch": torch.__version__,
    }
    write_text(cfg.out / "recipe.json", json.dumps(recipe, indent=2, default=str) + "\n")
    write_text(cfg.out / "README.md", _readme(recipe))
    return {
        "out": str(cfg.out),
        "steps": step,
        "final": dict(last),
        "held_out": held,
        "decoding": decoding,
        "generation_tokens_per_s": recipe["data"]["generation_tokens_per_s"],
        "seconds": time.time() - started,
    }


def _trim_log(path: Path, step: int) -> None:
    if not path.exists():
        return
    lines = path.read_text().splitlines()
    kept = [line for line in lines if line.strip() and json.loads(line).get("step", 0) <= step]
    if len(kept) != len(lines):
        write_text(path, "".join(line + "\n" for line in kept))


def export(head: Eagle3Head, out: Path, verifier: str, target: LoadedModel) -> None:
    """The head in bfloat16, in the speculators format (what `--head OUT` and vLLM load)."""
    shipped = copy.deepcopy(head).to(torch.bfloat16)  # the float32 head goes on training
    save_head(shipped, out, verifier, target.model.config.architectures or [])


def evaluate_decoding(cfg: DistillConfig, target: LoadedModel) -> dict:
    """eagle against ar on held-out chat prompts (the builtin suite unless --eval-prompts)."""

    ev = cfg.eval
    head = load_head_lm(str(cfg.out), target, "float32" if target.spec.dtype == "float32" else None)
    prompts = eval_prompts(ev.prompts, ev.per_category)
    result = evaluate_pair(target, head, prompts, ev.gamma, ev.max_new_tokens, method="eagle")
    result["prompt_file"] = ev.prompts.name
    return result


def _generated(d: dict) -> str:
    if not d.get("generated_response_tokens_this_run"):
        return "no answers generated this run (all on disk)"
    return (
        f"generation this run {d['generation_seconds_this_run']} s at {d['generation_tokens_per_s']} tokens/s"
    )


def _per_source(counts: dict | None) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted((counts or {}).items()))


def _readme(r: dict) -> str:
    d, h, t = r["data"], r["held_out"] or {}, r["train_config"]
    dec = r.get("decoding") or {}
    lines = [
        "# EAGLE-3 head",
        "",
        "Made by `draftlab distill --head eagle3`; `recipe.json` holds the command line and every figure,",
        "`train_log.jsonl` the training curve. Stored in the speculators format (vLLM's `method: eagle3`).",
        "",
        f"- target: `{r['target']['name']}` ({r['target']['dtype']}); features of layers "
        f"{r['target']['aux_layers']} of {r['target']['layers']}",
        f"- head: one decoder layer, {r['head']['parameters'] / 1e6:.1f}M parameters, draft vocabulary "
        f"{r['head']['draft_vocab_size']}",
        f"- data: {sum((d.get('sequences') or {}).values())} sequences ({_per_source(d.get('sequences'))}), "
        f"{sum((d.get('tokens') or {}).values())} tokens of which {sum((d.get('response_tokens') or {}).values())} "
        f"are the target's answers; "
        f"{d['train_sequences']} trained on, {d['held_out_sequences']} held out; {_generated(d)}",
        f"- training: {r['trained_steps']} steps of ~{t['batch_tokens']} tokens, {t['ttt_steps']} "
        f"training-time-test steps, lr {t['lr']}, {r['train_seconds']:.0f} s in all",
    ]
    if d.get("magpie_prompts"):
        seconds = d.get("magpie_seconds_this_run", 0)
        when = f"{seconds} s this run" if seconds else "all written by an earlier run"
        lines.append(f"- Magpie requests written by the target: {d['magpie_prompts']} ({when})")
    if h.get("first_token_top1") is not None:
        lines.append(
            f"- held-out answers ({h['positions']} positions): first-token top-1 {h['first_token_top1']:.3f}, "
            f"chain mean accepted length {h['chain_mean_accepted_length']:.2f} at γ = {h['gamma']}"
        )
    if dec.get("mean_accepted_length") is not None:
        lines.append(
            f"- decoding ({dec['prompts']} prompts of {dec['prompt_file']}, greedy, γ = {dec['gamma']}): mean "
            f"accepted length {dec['mean_accepted_length']:.2f}, acceptance {dec['pooled_acceptance_rate']:.3f}, "
            f"{dec['speedup']:.2f}× ar"
        )
    return "\n".join(lines) + "\n"
