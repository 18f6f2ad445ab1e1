"""`--engine llamacpp`: the target (and a .gguf draft) run by llama.cpp, in draftlab's own decode loop."""

from __future__ import annotations

import argparse
import importlib.util

from rich.console import Console

from draftlab.cli.common import load_spec, machine_profile, model_names
from draftlab.cli.engine_option import add_engine_option
from draftlab.decode.spec import method_spec
from draftlab.engines import engines_for
from draftlab.engines.llamacpp.export import OUTTYPES
from draftlab.engines.llamacpp.load import load_llamacpp
from draftlab.engines.llamacpp.model import OWN_STORAGE, LlamaCppLM, is_llamacpp_source
from draftlab.errors import DraftlabError
from draftlab.models.cost_curve import pick_dtype
from draftlab.models.loading import LoadedModel, ModelSpec, check_compatible
from draftlab.models.registry import ENTRIES

ENGINES = ("hf", "llamacpp")
AUTO_STORAGE = "auto"
# What `--gguf-type auto` chooses between: the same weights, kernels of other costs (docs/engines.md).
AUTO_CANDIDATES = (OWN_STORAGE, "bf16")
# A transformers draft beside a llama.cpp target has no shared dtype to follow, and its speed is not
# profiled against llama.cpp yet: float32 is exact, and plain decoding's fastest dtype on our CPUs.
DRAFT_DTYPE = "float32"


def add_engine_arg(p: argparse.ArgumentParser, engines: tuple[str, ...] = ENGINES) -> None:
    g = p.add_argument_group("engine")
    add_engine_option(g, engines)
    add_llamacpp_args(g)


def add_llamacpp_args(g) -> None:
    """The llama.cpp engine's own options (generate, bench and sweep share them)."""
    g.add_argument(
        "--tokenizer",
        default=None,
        help="llamacpp: the Hugging Face tokenizer (folder or hub id) of a .gguf target; default: the "
        "GGUF's own vocabulary (a catalogue name brings its own tokenizer)",
    )
    g.add_argument(
        "--n-ctx", type=int, default=None, help="llamacpp: context to allocate (default: min(4096, trained))"
    )
    g.add_argument(
        "--gguf-type",
        default=OWN_STORAGE,
        metavar="TYPE",
        help=f"llamacpp: what llama.cpp runs a catalogue target from: {OWN_STORAGE} (default: the GGUF it "
        f"ships as) or its weights exported once into the model cache as {', '.join(OUTTYPES)}; "
        f"{AUTO_STORAGE}: {' or '.join(AUTO_CANDIDATES)}, whichever plain decoding the profiles predict "
        "fastest here. The storage picks llama.cpp's kernels, so what prefill and verification cost "
        "(docs/engines.md)",
    )


def check_gguf_type(args: argparse.Namespace) -> None:
    """--gguf-type is checked before anything loads."""
    if args.gguf_type not in (OWN_STORAGE, AUTO_STORAGE, *OUTTYPES):
        raise DraftlabError(
            f"--gguf-type must be {OWN_STORAGE}, {AUTO_STORAGE} or one of {', '.join(OUTTYPES)}, "
            f"got '{args.gguf_type}'"
        )


def resolve_storage(args: argparse.Namespace, name: str) -> str:
    """`--gguf-type auto`: of AUTO_CANDIDATES, the storage whose plain decoding of a 256-token prompt
    and --max-new-tokens is predicted fastest by its profile (measured once, then cached), as
    `--dtype auto` picks a dtype; a GGUF file runs as it is."""

    if args.gguf_type != AUTO_STORAGE:
        return args.gguf_type
    entry = ENTRIES.get(name)
    if entry is None or entry.kind != "gguf-wheel":
        return OWN_STORAGE
    choices = getattr(args, "storage_choices", None)
    if choices is None:
        choices = args.storage_choices = {}
    if name not in choices:
        curves = {}
        for storage in AUTO_CANDIDATES:
            lm = load_llamacpp(name, tokenizer=args.tokenizer, n_ctx=args.n_ctx, storage=storage)
            curves[storage] = machine_profile(lm).curve
            del lm  # each holds its weights and KV cache: one at a time
        new_tokens = getattr(args, "max_new_tokens", None) or 64
        storage, predicted = pick_dtype(curves, 256, new_tokens)
        others = ", ".join(f"{s} {ms / 1000:.2f} s" for s, ms in predicted.items() if s != storage)
        reason = (
            f"--gguf-type auto: {storage}, plain decoding of a 256-token prompt + {new_tokens} tokens "
            f"predicted {predicted[storage] / 1000:.2f} s (vs {others})"
        )
        Console(stderr=True).print(f"[dim]{reason}[/]")
        choices[name] = {"storage": storage, "reason": reason}
    return choices[name]["storage"]


def installed() -> bool:
    """Whether llama-cpp-python can be imported here (without importing it)."""

    return importlib.util.find_spec("llama_cpp") is not None


def check_method(method: str) -> None:
    """Methods decoded by transformers' generate() or vLLM need their engine; the rest of our loop and
    llama.cpp's own decoding run here."""
    spec = method_spec(method)
    if "llamacpp" not in engines_for(spec):
        raise DraftlabError(
            f"method '{method}' is not available on engine llamacpp (it is decoded by "
            f"{'vLLM' if spec.engine == 'vllm' else 'transformers generate()'}, not by draftlab's loop)"
        )


def load_pair(
    args: argparse.Namespace, need_draft: bool
) -> tuple[LlamaCppLM, LoadedModel | LlamaCppLM | None]:
    """The llama.cpp target and the draft: a .gguf draft on llama.cpp too, any other on transformers."""
    for flag, value in (("--target-dtype", args.target_dtype), ("--target-device", args.target_device)):
        if value is not None:
            raise DraftlabError(
                f"{flag} does not apply to a llama.cpp target (it runs in its GGUF's own quantization, on the CPU)"
            )
    if args.device != "cpu":
        raise DraftlabError(
            f"--device {args.device}: the llama.cpp target runs on the CPU here; place a transformers "
            "draft with --draft-device"
        )
    check_gguf_type(args)
    if args.n_ctx is not None and args.n_ctx < 1:
        raise DraftlabError(f"--n-ctx must be >= 1, got {args.n_ctx}")
    target_name, draft_name = model_names(args, need_draft)
    if need_draft and draft_name is None:
        raise DraftlabError("this method needs a draft model: pass --draft")
    storage = resolve_storage(args, target_name)
    target = load_llamacpp(target_name, tokenizer=args.tokenizer, n_ctx=args.n_ctx, storage=storage)
    if draft_name is None:
        return target, None
    draft: LoadedModel | LlamaCppLM
    if is_llamacpp_source(draft_name):
        if args.draft_dtype is not None:
            raise DraftlabError(f"--draft-dtype does not apply to the GGUF draft '{draft_name}'")
        # The target's tokenizer, checked against the draft GGUF's vocabulary while loading it.
        draft = load_llamacpp(draft_name, tokenizer=target.tokenizer, n_ctx=target.context_length)
    else:
        dtype = args.draft_dtype or (args.dtype if args.dtype != "auto" else DRAFT_DTYPE)
        device = args.draft_device or args.device
        draft = load_spec(ModelSpec(draft_name, dtype, device, args.attn_implementation))
    check_compatible(target, draft)  # type: ignore[arg-type]
    return target, draft
