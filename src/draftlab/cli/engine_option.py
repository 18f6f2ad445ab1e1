"""The one `--engine` option: each command offers the engines it can run, with each engine's own help."""

from __future__ import annotations

from draftlab import engines as registry


def add_engine_option(group, engines: tuple[str, ...]) -> None:
    group.add_argument(
        "--engine",
        choices=engines,
        default="hf",
        help="; ".join(f"{name}: {registry.get(name).help}" for name in engines),
    )


# The engines that run one generation in this process: generate, profile and audit offer them.
IN_PROCESS = ("hf", "llamacpp")


def add_engine_arg(p, engines: tuple[str, ...] = IN_PROCESS) -> None:
    """--engine and the options of the engines that run in this process."""
    g = p.add_argument_group("engine")
    add_engine_option(g, engines)
    for name in IN_PROCESS:
        registry.get(name).add_args(g)
