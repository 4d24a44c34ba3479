"""`rmq up`'s arguments read straight off the command line, before typer (see the function).

Kept apart from `commands.py`, which defines `up`: this module only reads its signature.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from cli.local.commands import up

__all__ = ["fast_up_arguments"]


def fast_up_arguments(argv: list[str]) -> dict[str, Any] | None:
    """The arguments of `up` for a plain `up [--option value | --flag] ...` command line,
    read off `up`'s own typer options; None for anything else (help, other commands, global
    options, unknown or odd options, values typer would refuse), which typer then parses.

    typer converts every parameter through pydantic, whose import costs `rmq up` ~0.1 s
    before it can spawn the first node; this path never gets there. It accepts only what it
    parses exactly as typer does, so errors and help are always typer's own.
    """
    if not argv or argv[0] != "up":
        return None
    import inspect
    import types
    import typing

    hints = typing.get_type_hints(up, include_extras=True)
    kwargs: dict[str, Any] = {}
    options: dict[str, tuple[str, Any, Any]] = {}
    for name, param in inspect.signature(up).parameters.items():
        if hints[name] is typer.Context:
            continue  # typer's own, not an option
        base, info = typing.get_args(hints[name])[:2]
        if typing.get_origin(base) in (typing.Union, types.UnionType):
            # `X | None`: an option without a default of its own (the TOML file may set it)
            inner = [a for a in typing.get_args(base) if a is not type(None)]
            base = inner[0] if len(inner) == 1 else None
        if base not in (int, float, str, bool, Path):
            return None
        kwargs[name] = param.default
        for decl in (info.default, *info.param_decls):
            if isinstance(decl, str) and decl.startswith("--"):
                options[decl] = (name, base, info)
    args = argv[1:]
    if "--config" in args:
        # with a topology file, which flags were typed matters (they override the file):
        # typer's parser knows that (parameter sources), this one does not
        return None
    i = 0
    while i < len(args):
        found = options.get(args[i])
        if found is None:
            return None
        name, base, info = found
        if base is bool:
            kwargs[name] = True
            i += 1
            continue
        if i + 1 == len(args) or args[i + 1].startswith("-"):
            return None
        try:
            value = base(args[i + 1])
        except ValueError:
            return None
        if info.min is not None and value < info.min or info.max is not None and value > info.max:
            return None
        kwargs[name] = value
        i += 2
    return kwargs
