"""The one `--engine` option: each command offers the engines it can run, with each engine's own help."""

from __future__ import annotations

from draftlab import engines as registry


def add_engine_option(group, engines: tuple[str, ...]) -> None:
    group.add_argument(
        "--engine",
        choices=engines,
        default=registry.DEFAULT,
        help="; ".join(f"{name}: {registry.get(name).help}" for name in engines),
    )


def in_process() -> tuple[str, ...]:
    """The engines that decode one generation in this process: generate, profile and audit offer them."""
    return tuple(name for name in registry.engine_names() if registry.get(name).runs_here)


def add_engine_arg(p, engines: tuple[str, ...] | None = None) -> None:
    """--engine (default: the engines that run in this process) and those engines' options."""
    g = p.add_argument_group("engine")
    add_engine_option(g, engines or in_process())
    for name in in_process():
        registry.get(name).add_args(g)
