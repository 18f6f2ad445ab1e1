"""What llama-server runs for a method: the target file (its catalogue GGUF's BF16 copy, or the
user's .gguf), the drafter's options, and the GGUF of our draft or head it loads, written once.
The engine's variants and its audit both start servers from these."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from draftlab.decode.spec import method_spec
from draftlab.engines.llama_server import methods
from draftlab.engines.llama_server.convert import head_gguf
from draftlab.engines.llama_server.methods import NAME
from draftlab.engines.llamacpp.engine import gguf_target
from draftlab.engines.llamacpp.export import export_gguf
from draftlab.engines.llamacpp.load import locate
from draftlab.engines.llamacpp.model import OWN_STORAGE, is_llamacpp_source
from draftlab.errors import DraftlabError
from draftlab.models.cache import home
from draftlab.models.loading import ModelSpec, load_model, resolve_path
from draftlab.models.registry import ENTRIES
from draftlab.plan.configs import parse_list
from draftlab.plan.roles import head_name

DEFAULT_METHODS = "ar,ngram-mod,ngram-simple,ngram-map-k,ngram-cache"


def default_methods(args: argparse.Namespace) -> str:
    """llama.cpp's n-gram drafters, and our draft (draft-simple) and EAGLE-3 head (draft-eagle3) where
    they are at hand: the shipped ones for the default target, or --draft and --head."""
    extra = []
    if args.target is None or getattr(args, "draft", None):
        extra.append("sps")
    if head_name(args):
        extra += ["eagle", "eagle+ngram-mod"]
    if getattr(args, "dflash", None):
        extra.append("dflash")
    return ",".join([DEFAULT_METHODS, *extra])


def server_methods(args: argparse.Namespace) -> list[str]:
    """--methods (default: default_methods) as llama-server methods other than ar, each checked to
    run there (a one-line error names one that does not)."""
    text = args.methods if args.methods is not None else default_methods(args)
    names = [m for m in parse_list(text, str, "method") if m != "ar"]
    for name in names:
        method_spec(name)
    for name in names:
        if methods.counterpart(method_spec(name)) is None:
            raise DraftlabError(f"method '{name}' is not available on engine {NAME}")
    return list(dict.fromkeys(names))


# What the server runs a catalogue target from: its BF16 copy, whose verification of several tokens is
# cheap on CPUs (docs/engines.md), unless --gguf-type names another storage.
DEFAULT_STORAGE = "bf16"


def draft_gguf(name: str, reference: Path) -> Path:
    """Our transformers draft as a BF16 GGUF for llama-server's draft-simple, written once."""
    out = home() / "gguf" / f"{Path(name).name}-bf16.gguf"
    if not out.is_file():
        Console(stderr=True).print(
            f"[dim]writing the draft {name} as a bf16 GGUF for llama-server (once): {out}[/]"
        )
        export_gguf(load_model(ModelSpec(name, dtype="float32")), out, reference, "bf16")
    return out


def method_server_args(method: str, args: argparse.Namespace, target, draft, binary: Path) -> list[str]:
    """llama-server's options for a method at its own defaults: the drafter's type, and the GGUF of
    our draft (draft-simple), our EAGLE-3 head (draft-eagle3) or our DFlash drafter (draft-dflash),
    written once."""
    kind = methods.counterpart(method_spec(method))
    spec_args: list[str] = [] if not kind else ["--spec-type", kind]
    if kind == "draft-simple":
        if draft is None:
            raise DraftlabError(f"method '{method}' on llama-server needs a draft model (--draft)")
        spec_args += ["-md", str(_draft_file(draft, target))]
    elif kind and "draft-eagle3" in kind.split(","):
        head = head_name(args)
        if head is None:
            raise DraftlabError(f"method '{method}' on llama-server needs an EAGLE-3 head (--head)")
        spec_args += ["-md", str(_head_file(head, target, binary))]
    elif kind == "draft-dflash":
        drafter = getattr(args, "dflash", None)
        if drafter is None:
            raise DraftlabError(f"method '{method}' on llama-server needs a DFlash drafter (--dflash)")
        spec_args += ["-md", str(_head_file(drafter, target, binary, "dflash"))]
    return spec_args


def _user_gguf(name: str) -> Path | None:
    """A .gguf file the user named, to run as it is (a catalogue name is not one)."""
    return Path(name).expanduser() if name not in ENTRIES and is_llamacpp_source(name) else None


def _draft_file(draft, target) -> Path:
    """The draft as llama-server loads it: the user's GGUF, or our transformers draft written once as one."""
    own = _user_gguf(draft.spec.name)
    if own is not None:
        return own
    return draft_gguf(draft.spec.name, _user_gguf(target.spec.name) or locate(target.spec.name)[0])


def _head_file(head: str, target, binary: Path, kind: str = "eagle3") -> Path:
    """A head as llama-server loads it: the user's GGUF, or its folder (EAGLE-3's speculators layout,
    DFlash's) converted once by llama.cpp's converter beside the target's transformers folder."""
    own = _user_gguf(head)
    if own is not None:
        return own
    if _user_gguf(target.spec.name) is not None:
        flag = "--dflash" if kind == "dflash" else "--head"
        raise DraftlabError(
            f"{flag} '{head}' is not a GGUF: llama.cpp's converter needs the target's transformers "
            "folder to write one, and the target is a GGUF file; pass the head as a .gguf"
        )
    return head_gguf(resolve_path(head), resolve_path(target.spec.name), binary, kind=kind)


def server_target(args: argparse.Namespace, target):
    """The target as the server runs it: its catalogue GGUF in --gguf-type's storage (BF16 unless
    named), or the .gguf it is."""
    storage = args.gguf_type if args.gguf_type not in (OWN_STORAGE, "auto") else DEFAULT_STORAGE
    return gguf_target(args, target, storage)
