"""`--help` of every command and sub-command prints its help and exits 0 (a `%` in a help text once
crashed `draftlab bench --help`, the first thing a newcomer types)."""

from __future__ import annotations

import argparse

import pytest

from draftlab.cli import SUBCOMMANDS, build_parser, main


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [path]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _commands(sub, (*path, name))
    return found


COMMANDS = _commands(build_parser())


def test_every_command_is_found():
    assert {path[0] for path in COMMANDS if path} == set(SUBCOMMANDS)
    assert any(len(path) == 2 for path in COMMANDS), "the sub-commands (models ...) are walked too"


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "draftlab")
def test_help_exits_zero(path, capsys):
    with pytest.raises(SystemExit) as stop:
        main([*path, "--help"])
    out, err = capsys.readouterr()
    assert stop.value.code == 0, err
    assert out.startswith("usage: draftlab"), out[:200]
    assert "internal error" not in err
