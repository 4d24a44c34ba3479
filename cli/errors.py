"""Errors the `rmq` command reports as `error: <text>` on stderr with exit status 1, and the
policy that turns them into that line (`run_main`).

Imports nothing heavy at import time: the lean node entry point (`python -m cli.servers.node`) uses
the same policy as the typer commands.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

# The exit status of a command stopped by Ctrl-C (SIGINT), as shells report a process the
# signal ended: 128 + 2. Commands that stop cleanly on SIGINT (commit offsets, send what was
# read, stop their nodes) still leave with it, so `cmd && next` does not go on after a Ctrl-C.
INTERRUPTED = 130


class CliError(Exception):
    """An expected failure of a command (bad input, a node that would not start, ...)."""


class ControlError(CliError):
    """An operation on a running cluster the supervisor refuses (unknown node, not running...)."""


class Exit(Exception):  # named like typer.Exit, which it stands for
    """Leave with this exit status (the message, if any, is already printed)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def run_main(async_fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> Any:
    """trio.run with the CLI's error policy: known errors -> one stderr line, `Exit(1)`."""
    import trio

    from cli import render
    from common.errors import RmqError, unwrap_group

    try:
        return trio.run(async_fn, *args)
    except BaseException as exc:  # classified below, re-raised when unknown
        inner = unwrap_group(exc)
        if isinstance(inner, KeyboardInterrupt):
            raise Exit(INTERRUPTED) from None
        if isinstance(inner, CliError | RmqError | ValueError):
            render.error(describe(inner))
            raise Exit(1) from None
        if isinstance(inner, OSError):
            render.error(describe_os_error(inner))
            raise Exit(1) from None
        raise


def describe(exc: BaseException) -> str:
    from common.errors import RemotingConnectError, TopicNotExistError

    if isinstance(exc, RemotingConnectError):
        return f"cannot connect: {exc} (is the nameserver/broker running? see `rmq up`)"
    if isinstance(exc, TopicNotExistError):
        return f"topic does not exist: {exc.remark or exc}"
    return str(exc) or type(exc).__name__


def describe_os_error(exc: OSError) -> str:
    import errno

    if exc.errno == errno.EADDRINUSE:
        return f"address already in use: {exc.strerror or exc}"
    if exc.filename is not None and exc.strerror:
        # the path is what the user can fix; errno's class name and number are noise
        return f"{exc.filename}: {exc.strerror}"
    return f"{type(exc).__name__}: {exc}"
