"""`llamacpp`: draftlab's own loop over a GGUF target that llama.cpp evaluates (and a .gguf or
transformers draft), and llama.cpp's own prompt lookup; in a default run on a CPU, llama.cpp's plain
decoding of the target's own GGUF and its BF16 copy, for "vs best ar"."""

from __future__ import annotations

import argparse
import importlib.util

import torch
from rich.console import Console

from draftlab.bench.runner import Variant
from draftlab.decode.build import check_fits
from draftlab.decode.spec import DecoderConfig, MethodSpec
from draftlab.engines.base import BenchRequest, EngineDefaults, EngineVariants
from draftlab.engines.llamacpp import methods
from draftlab.engines.llamacpp.audit import LlamaCppRecheck
from draftlab.engines.llamacpp.audit import versions as llamacpp_versions
from draftlab.engines.llamacpp.export import OUTTYPES
from draftlab.engines.llamacpp.export_command import add_export_command
from draftlab.engines.llamacpp.load import load_llamacpp
from draftlab.engines.llamacpp.model import OWN_STORAGE, LlamaCppLM, is_llamacpp_source
from draftlab.errors import DraftlabError
from draftlab.models.cost_curve import CostCurve, pick_checked
from draftlab.models.loading import LoadedModel, ModelSpec, check_compatible
from draftlab.models.registry import ENTRIES
from draftlab.plan.configs import variant_params
from draftlab.plan.profiles import cost_model, load_spec, machine_profile
from draftlab.plan.roles import model_names

SUFFIX = "@" + methods.NAME  # llama.cpp variants are labelled "ar@llamacpp", "pld@llamacpp", ...
# Rounds on llama.cpp use a fixed k until llama.cpp has a cost profile: speculation there is opt-in.
DEFAULT_METHODS = "ar,pld,sps"

AUTO_STORAGE = "auto"
# What `--gguf-type auto` chooses between: the same weights, kernels of other costs (docs/engines.md).
AUTO_CANDIDATES = (OWN_STORAGE, "bf16")
# A transformers draft beside a llama.cpp target has no shared dtype to follow, and its speed is not
# profiled against llama.cpp yet: float32 is exact, and plain decoding's fastest dtype on our CPUs.
DRAFT_DTYPE = "float32"


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


def resolve_storage(args: argparse.Namespace, name: str) -> tuple[str, str | None]:
    """`--gguf-type auto`: of AUTO_CANDIDATES, the storage whose plain decoding of a 256-token prompt
    and --max-new-tokens is predicted fastest by its profile (measured once, then cached), as
    `--dtype auto` picks a dtype; a GGUF file runs as it is. Returns the storage and, where it was
    chosen, why."""

    if args.gguf_type != AUTO_STORAGE:
        return args.gguf_type, None
    entry = ENTRIES.get(name)
    if entry is None or entry.kind != "gguf-wheel":
        return OWN_STORAGE, None

    def price(storage: str, check: bool) -> CostCurve:
        # One model at a time: each holds its weights and KV cache.
        lm = load_llamacpp(name, tokenizer=args.tokenizer, n_ctx=args.n_ctx, storage=storage)
        return machine_profile(lm, check=check).curve

    new_tokens = getattr(args, "max_new_tokens", None) or 64
    storage, predicted, _ = pick_checked(AUTO_CANDIDATES, price, 256, new_tokens)
    others = ", ".join(f"{s} {ms / 1000:.2f} s" for s, ms in predicted.items() if s != storage)
    reason = (
        f"--gguf-type auto: {storage}, plain decoding of a 256-token prompt + {new_tokens} tokens "
        f"predicted {predicted[storage] / 1000:.2f} s (vs {others})"
    )
    Console(stderr=True).print(f"[dim]{reason}[/]")
    return storage, reason


def installed() -> bool:
    """Whether llama-cpp-python can be imported here (without importing it)."""

    return importlib.util.find_spec("llama_cpp") is not None


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
    storage = resolve_storage(args, target_name)[0]
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


def gguf_file_target(args: argparse.Namespace, engines: list[str]) -> bool:
    """Whether --target names a .gguf file for a run of engines that all run one (llama.cpp's own:
    `takes_gguf`); any other engine needs the target as transformers loads it (a catalogue name or
    a Hugging Face folder)."""
    from draftlab import engines as registry  # noqa: PLC0415 - the list holds this engine

    name = args.target or ""
    if not name or name in ENTRIES or not is_llamacpp_source(name):
        return False
    takers = [n for n in registry.engine_names() if getattr(registry.get(n), "takes_gguf", False)]
    if not set(engines) <= set(takers):
        raise DraftlabError(
            f"--target '{name}' is a GGUF file, which only the {' and '.join(takers)} engines run; "
            f"got --engines {','.join(engines)}"
        )
    return True


def default_llamacpp(args: argparse.Namespace, engines: list[str], target: LoadedModel) -> list[str]:
    """The default run adds llama.cpp's plain decoding of the target's own GGUF when llama.cpp is
    installed: "vs best ar" must count the fastest plain decoding a CPU user has."""
    if args.engines is not None or engines != ["hf"] or args.methods is not None:
        return []
    if target.spec.device != "cpu" or not installed():
        return []
    return ["ar"] if is_llamacpp_source(target.spec.name) else []


def gguf_target(args: argparse.Namespace, target, storage: str):
    """The target as llama.cpp runs it: itself when it is a GGUF, else its catalogue GGUF in `storage`."""
    if target.engine == "llamacpp":
        return target
    tokenizer = args.tokenizer or target.tokenizer
    return load_llamacpp(target.spec.name, tokenizer=tokenizer, n_ctx=args.n_ctx, storage=storage)


def llamacpp_variants(
    args: argparse.Namespace,
    configs: dict[str, DecoderConfig],
    target: LoadedModel,
    draft: LoadedModel | None,
    sampling,
) -> tuple[list[Variant], dict]:
    """The methods on llama.cpp: our loop over the GGUF target, with the transformers draft for sps."""

    tokenizer = args.tokenizer or target.tokenizer
    storage, why = resolve_storage(args, target.spec.name)
    gguf = gguf_target(args, target, storage)
    variants = []
    costs: dict[int, object] = {}  # id(draft) -> the cost model of llama.cpp's target beside it
    for method, config in configs.items():
        check_fits(config, gguf)
        params = {**variant_params(args, config), "engine": "llamacpp", "quantization": gguf.spec.dtype}
        uses_draft = draft if config.needs_draft else None
        cost = None
        if config.adaptive:
            if id(uses_draft) not in costs:
                costs[id(uses_draft)] = cost_model(args.fixed_k, gguf, uses_draft)
            cost = costs[id(uses_draft)]
        variants.append(Variant(method + SUFFIX, config, gguf, uses_draft, sampling, params, cost))
    for storage in other_storages(args, gguf):
        plain = load_llamacpp(target.spec.name, tokenizer=tokenizer, n_ctx=args.n_ctx, storage=storage)
        params = {
            **variant_params(args, configs["ar"]),
            "engine": "llamacpp",
            "quantization": plain.spec.dtype,
        }
        label = f"ar{SUFFIX} {plain.spec.dtype}"
        variants.append(Variant(label, configs["ar"], plain, None, sampling, params))
    return variants, {
        "gguf": gguf.path,
        "quantization": gguf.spec.dtype,
        "threads": gguf.threads,
        "storage": gguf.spec.storage,
        "storage_choice": why,
    }


def other_storages(args: argparse.Namespace, gguf) -> list[str]:
    """Where llama.cpp runs a catalogue target from its own GGUF or its BF16 copy, "vs best ar" counts
    plain decoding on the other too (unless --ar-dtypes none): the same weights, other kernels, and on
    our CPUs neither is fastest everywhere (BF16 prefills faster, Q4_1 decodes faster)."""

    pair = AUTO_CANDIDATES  # the two that compete: the shipped file, the BF16 copy
    if args.ar_dtypes == "none" or gguf.spec.name not in ENTRIES or gguf.spec.storage not in pair:
        return []
    return [s for s in pair if s != gguf.spec.storage]


class LlamaCppEngine(EngineDefaults):
    name = methods.NAME
    suffix = SUFFIX
    help = (
        "our loop over the GGUF target run by llama.cpp (default: the default target's own Q4_1 "
        "GGUF), with a .gguf or transformers draft (scripts/install-llamacpp.sh)"
    )
    default_methods = DEFAULT_METHODS
    takes_gguf = True  # a user's .gguf target (and draft) as they are
    runs_here = True

    def counterpart(self, spec: MethodSpec) -> str | None:
        return methods.counterpart(spec)

    def add_args(self, group: argparse._ArgumentGroup) -> None:
        add_llamacpp_args(group)

    def check_args(self, args: argparse.Namespace, engines: list[str]) -> None:
        check_gguf_type(args)
        gguf_file_target(args, engines)  # a GGUF target with an engine that cannot run one: one line

    def load_pair(self, args, need_draft: bool, engines: list[str], plan=None):
        # A GGUF file has no transformers shell: llama.cpp's model is the target.
        return load_pair(args, need_draft) if gguf_file_target(args, engines) else None

    def load_here(self, args, need_draft: bool, chosen=None):
        return load_pair(args, need_draft)

    def joins(self, args, engines, target) -> list[str]:
        return default_llamacpp(args, engines, target)

    def add_model_commands(self, sub: argparse._SubParsersAction) -> None:
        """`draftlab models export-gguf`: a transformers checkpoint as a GGUF for this engine."""
        add_export_command(sub)

    def recheck(self) -> LlamaCppRecheck:
        return LlamaCppRecheck()

    def versions(self) -> dict[str, str]:
        return llamacpp_versions()

    def absent(self, target) -> str | None:
        if target.spec.device == "cpu" and not installed():
            return (
                "llama.cpp, the fastest plain decoding on most CPUs, is not installed "
                '(scripts/install-llamacpp.sh): "vs best ar" covers only the engines listed'
            )
        return None

    def bench_variants(self, request: BenchRequest) -> EngineVariants:
        draft = request.draft
        model = getattr(draft, "model", None)
        if model is not None and getattr(model, "device", None) == torch.device("meta"):
            draft = load_spec(draft.spec)  # a weightless shell: llama.cpp's sps drafts with its weights
        variants, record = llamacpp_variants(
            request.args, request.configs, request.target, draft, request.sampling
        )
        baselines = {v.label: "ar" + SUFFIX for v in variants}
        return EngineVariants(variants, baselines, {"llamacpp": record})
