"""The audit on llama-server: each of its drafters' greedy tokens against the plain server's on the
same file, token for token.

A difference is rerun with the same file quantized to Q4_1, on one thread, both the drafter and the
plain server: there a pass of a few tokens takes the same kernels as a pass of one, so a lossless
drafter writes the plain server's tokens. Matching there means the first difference was a near-tie
that the file's own multi-token passes round differently (the logit gap, read off the same file by
llama.cpp in this process, says how near). Long verification passes (ngram-mod drafts 48-64
tokens) round like a pass of the whole prefix even there, so a difference the rerun keeps is rounding
if its token is the target's own choice with the prefix scored in one pass, and a defect if not.

Only greedy decoding is audited here: the server samples with its own sampler and seeds, which the
two-token law check of our loop does not drive."""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console

from draftlab import __version__
from draftlab.audit.checks import IN_A_PASS, MethodAudit, first_divergence, verdict
from draftlab.audit.runner import GREEDY, Progress, divergence
from draftlab.decode.spec import method_spec
from draftlab.engines.llama_server.binary import server_binary
from draftlab.engines.llama_server.convert import q4_1_copy
from draftlab.engines.llama_server.decoder import LlamaServerDecoder, ServerPool
from draftlab.engines.llama_server.server_args import method_server_args, server_methods, server_target
from draftlab.engines.llamacpp.load import load_llamacpp
from draftlab.hardware import hardware
from draftlab.models.cache import home
from draftlab.models.cached import cached
from draftlab.models.prompting import encode_prompt
from draftlab.plan.roles import load_shells

RECHECK = "q4_1_one_thread"


@dataclass
class ServerAudit:
    max_new_tokens: int
    bar: Progress
    decoders: dict  # method (and "ar") -> its LlamaServerDecoder on the file the server runs
    recheck_decoders: Callable[[], dict]  # the same on the Q4_1 copy, one thread: made on first need
    recheck_model: Callable[[], object]  # the Q4_1 copy loaded by llama.cpp here, on one thread

    def __post_init__(self) -> None:
        self._last = None

    def _tokens(self, decoder, ids: list[int]) -> list[int]:
        if self._last is not None and self._last.pool is not decoder.pool:
            self._last.pause()  # one server at a time: the other file's stops first
        self._last = decoder
        return decoder.generate(ids, self.max_new_tokens, GREEDY).tokens

    def _judge_rerun(self, ids: list[int], ar: list[int], again: list[int], record: dict) -> str:
        """matches: the rerun wrote the plain server's tokens. in a pass: it did not, but the token it
        wrote where they part is the target's own choice when the whole prefix is scored in one pass
        (a long verification pass, such as ngram-mod's 48-64 drafted tokens, rounds like a pass
        of the prefix, not like one-token steps), so rounding. diverges: no pass of the target tried
        here picks it: a defect."""
        at = first_divergence(ar, again)
        if at is None:
            return "matches"
        if at >= len(ar) or at >= len(again):
            return "diverges"
        model = self.recheck_model()
        choice = one_pass_choice(model, ids + ar[:at])
        record["rerun"] = {"position": at, "ar_token": ar[at], "method_token": again[at], "one_pass": choice}
        return IN_A_PASS if choice == again[at] else "diverges"

    def greedy(self, audits: list[MethodAudit], target, prompts: list[list[int]]) -> None:
        """`target`: the same file loaded by llama.cpp in this process, for the logit gaps."""
        rechecks: dict | None = None
        ar_rechecked: dict[int, list[int]] = {}
        for i, ids in enumerate(prompts):
            where = f"greedy · prompt {i + 1}/{len(prompts)}"
            self.bar.say(f"{where} · ar")
            ar = self._tokens(self.decoders["ar"], ids)
            self.bar.step()
            for audit in audits:
                self.bar.say(f"{where} · {audit.method}")
                tokens = self._tokens(self.decoders[audit.method], ids)
                self.bar.step()
                audit.greedy_prompts += 1
                at = first_divergence(ar, tokens)
                if at is None:
                    audit.greedy_identical += 1
                    continue
                record = divergence(target, i, ids, ar, tokens, at, RECHECK)
                if audit.lossless_claim:
                    rechecks = rechecks or self.recheck_decoders()
                    self.bar.add(1 + (i not in ar_rechecked))
                    self.bar.say(f"{where} · Q4_1 one-thread recheck · {audit.method}")
                    if i not in ar_rechecked:
                        ar_rechecked[i] = self._tokens(rechecks["ar"], ids)
                        self.bar.step()
                    again = self._tokens(rechecks[audit.method], ids)
                    self.bar.step()
                    record[RECHECK] = self._judge_rerun(ids, ar_rechecked[i], again, record)
                audit.divergences.append(record)


def one_pass_choice(lm, prefix: list[int]) -> int:
    """The greedy token after `prefix` when the whole prefix is scored in one pass."""
    runner = cached(lm)
    runner.start(prefix)
    return int(runner.forward(prefix, keep=1)[-1].argmax())


def run_server_audit(args: argparse.Namespace, texts: list[str], bar) -> tuple[dict, list[MethodAudit]]:
    t_start = time.perf_counter()
    methods = server_methods(args)
    target, draft = load_shells(args, any(method_spec(m).needs_draft for m in methods))
    gguf = server_target(args, target)
    binary = server_binary()
    spec_args = {m: method_server_args(m, args, target, draft, binary) for m in ["ar", *methods]}
    prompts = [encode_prompt(gguf, t, chat=not args.no_chat) for t in texts]
    log = home() / "logs" / "llama-server-audit.log"
    pool = ServerPool(binary, Path(gguf.path), torch.get_num_threads(), gguf.context_length, log)
    pools = [pool]

    def rechecks() -> dict:
        pool.close()  # one server at a time
        copy = ServerPool(binary, q4_1_copy(Path(gguf.path)), 1, gguf.context_length, log)
        pools.append(copy)
        return {m: LlamaServerDecoder(copy, a, gguf.tokenizer) for m, a in spec_args.items()}

    copies: list = []

    def recheck_model():
        if not copies:
            path = q4_1_copy(Path(gguf.path))
            copies.append(
                load_llamacpp(str(path), tokenizer=gguf.tokenizer, n_ctx=gguf.context_length, n_threads=1)
            )
        return copies[0]

    decoders = {m: LlamaServerDecoder(pool, a, gguf.tokenizer) for m, a in spec_args.items()}
    audits = [MethodAudit(m, method_spec(m).lossless) for m in methods]
    bar.add(len(prompts) * (1 + len(audits)))
    try:
        with bar.progress:
            audit = ServerAudit(args.max_new_tokens, bar, decoders, rechecks, recheck_model)
            audit.greedy(audits, gguf, prompts)
    finally:
        for p in pools:
            p.close()
    for a in audits:
        a.judge(1.0)
    elapsed = time.perf_counter() - t_start
    result = {
        "draftlab": __version__,
        "target": target.spec.name,
        "draft": draft.spec.name if draft else None,
        "dtype": {"target": gguf.spec.dtype, "draft": None},
        "device": {"target": "cpu", "draft": None},
        "hardware": hardware(torch.device("cpu")),
        "engine": "llama-server",
        "recheck": RECHECK,
        "server": {"model": str(gguf.path), "log": str(log), "args": spec_args},
        "host": {"machine": platform.machine(), "python": platform.python_version()},
        "settings": {
            "methods": methods,
            "prompts": texts,
            "chat": not args.no_chat,
            "max_new_tokens": args.max_new_tokens,
            "samples": 0,
            "server_settings": "llama-server defaults",
        },
        "methods": {a.method: a.to_dict() for a in audits},
        "power": None,
        "verdict": verdict(audits, None),
        "not_lossless": [a.method for a in audits if a.status == "NOT lossless"],
        "elapsed_s": {"total": elapsed, "greedy": elapsed, "sampling": 0.0},
    }
    Console(stderr=True).print(
        "[dim]sampling check: not run on llama-server (it samples with its own sampler)[/]"
    )
    return result, audits
