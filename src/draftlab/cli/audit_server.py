"""`draftlab audit --engine llama-server`: llama-server's drafters, greedy, against its own plain
decoding of the same file; differences rerun on the file's Q4_1 copy on one thread (audit/server.py)."""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import torch
from rich.console import Console

from draftlab import __version__
from draftlab.audit.checks import MethodAudit, verdict
from draftlab.audit.server import RECHECK, ServerAudit
from draftlab.cli.engines import load_shells
from draftlab.decode.spec import method_spec
from draftlab.engines.llama_server.binary import server_binary
from draftlab.engines.llama_server.convert import q4_1_copy
from draftlab.engines.llama_server.decoder import LlamaServerDecoder, ServerPool
from draftlab.engines.llama_server.engine import method_server_args, server_methods, server_target
from draftlab.engines.llamacpp.load import load_llamacpp
from draftlab.hardware import hardware
from draftlab.models.cache import home
from draftlab.models.prompting import encode_prompt


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
