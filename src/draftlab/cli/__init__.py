"""Layer 6: the `draftlab` command line. Bad input ends in one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import signal
import sys
import threading

from draftlab import __version__
from draftlab.errors import DraftlabError

# Each subcommand lives in its own module exposing `add_parser(subparsers)`.
SUBCOMMANDS = ("generate", "bench", "sweep", "profile", "report", "models", "distill", "audit")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # main() prints "draftlab: error: "; the command's own name follows, once.
        command = self.prog.removeprefix("draftlab").strip()
        raise DraftlabError(f"{command}: {message}" if command else message)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser; where `argv` names a command, only that command's module is imported, so that a
    light one (`report`) loads no torch."""
    parser = _Parser(
        prog="draftlab", description="Speculative decoding for Hugging Face models, measured honestly."
    )
    parser.add_argument("--version", action="version", version=f"draftlab {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    words = [a for a in argv or () if not a.startswith("-")]
    chosen = words[0] if words and words[0] in SUBCOMMANDS else None
    for name in SUBCOMMANDS:
        if chosen is not None and name != chosen:
            subparsers.add_parser(name)
            continue
        try:
            module = importlib.import_module(f"draftlab.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"draftlab.cli.{name}":
                continue
            raise
        module.add_parser(subparsers)
    return parser


def _quiet_libraries() -> None:
    """transformers reads these when it is first imported (a command that never needs it does not pay
    for importing it here)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    transformers = sys.modules.get("transformers")
    if transformers is not None:
        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's or `kill`'s stop), ended as Ctrl-C is: files closed, results kept."""


def _on_sigterm(signum, frame) -> None:
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    on_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if on_main_thread else None
    try:
        return _main(argv)
    finally:
        if on_main_thread:
            signal.signal(signal.SIGTERM, previous)


def _main(argv: list[str] | None) -> int:
    args = None
    try:
        _quiet_libraries()
        argv = sys.argv[1:] if argv is None else argv
        args = build_parser(argv).parse_args(argv)
        return int(args.func(args) or 0)
    except DraftlabError as exc:
        print(f"draftlab: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:
        what = "terminated" if isinstance(stop, Terminated) else "interrupted"
        # Only commands that write a run folder have something to keep and a --resume to continue it.
        kept = "; results written so far are kept (rerun with --resume)" if hasattr(args, "resume") else ""
        print(f"draftlab: {what}{kept}", file=sys.stderr)
        return 128 + signal.SIGTERM if isinstance(stop, Terminated) else 130
    except OSError as exc:
        if exc.errno not in _ENVIRONMENT_ERRORS:
            return _internal_error(exc)
        # The machine refused (a read-only or full disk, no permission): not a bug, one line.
        where = f": '{exc.filename}'" if exc.filename else ""
        print(f"draftlab: error: {exc.strerror}{where}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - a bug of ours: one line for the user, the traceback kept
        return _internal_error(exc)


_ENVIRONMENT_ERRORS = {errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT}


def _internal_error(exc: Exception) -> int:
    where = _save_traceback()
    print(
        f"draftlab: internal error: {type(exc).__name__}: {exc} (a bug in draftlab; results written so "
        f"far are kept, and the traceback is in {where})",
        file=sys.stderr,
    )
    return 1


def _save_traceback() -> str:
    """Write the current exception's traceback under the draftlab home; returns where."""
    import traceback

    from draftlab.models.cache import home

    text = traceback.format_exc()
    try:
        path = home() / "last-error.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return str(path)
    except (OSError, DraftlabError):
        return "(not saved: the draftlab home is not writable)"


if __name__ == "__main__":
    sys.exit(main())
