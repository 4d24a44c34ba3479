"""The `rmq` typer application and what every command shares.

`app` is the root of the command tree, with the global `--namesrv` option (`_global`). The
commands themselves are plain functions in the subpackages of `cli/` (`cli/local/`, `cli/admin/`,
...); `cli/main.py` registers each one on `app` or on a group, in the order `rmq --help`
lists them. A command function carries its `Examples:` epilog with `@examples(...)`, which
`add_command` hands to typer when it registers the function.

Errors a user can cause (connection refused, unknown topic, bad config, port in use) print ONE
line on stderr and exit with status 1; no traceback (`_run`, over `cli/errors.py`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Coroutine
from typing import Annotated, Any, TypeVar

import typer

from cli.errors import Exit, run_main
from cli.namesrv_address import DEFAULT_NAMESRV, NAMESRV_ENV
from cli.version import print_version
from common.session_credentials import SessionCredentials

F = TypeVar("F", bound=Callable[..., Any])

# command function -> its `Examples:` epilog (see `examples`)
_EPILOGS: dict[Callable[..., Any], str] = {}


def _examples(*lines: str) -> str:
    # "\b" stops click from re-wrapping the block, so each example stays on its own line
    return "Examples:\n\n\b\n" + "\n".join(f"  {line}" for line in lines)


app = typer.Typer(
    name="rmq",
    help="trio-rmq: a RocketMQ 4.x compatible nameserver, broker and client.",
    epilog=_examples(
        "rmq up                                  # local cluster on 9876 / 10911",
        "rmq topic create TopicTest --queues 4",
        "echo hello | rmq produce --topic TopicTest",
        "rmq consume --topic TopicTest --from-beginning --count 1",
    ),
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def examples(*lines: str) -> Callable[[F], F]:
    """Give a command function its `Examples:` epilog; `add_command` passes it to typer."""

    def attach(fn: F) -> F:
        _EPILOGS[fn] = _examples(*lines)
        return fn

    return attach


def add_command(group: typer.Typer, fn: Callable[..., Any], name: str | None = None) -> None:
    """Register `fn` as a command of `group` (named after the function unless `name` is
    given), with the examples `@examples` gave it."""
    group.command(name, epilog=_EPILOGS.get(fn))(fn)


def command_group(help: str, *example_lines: str, **settings: Any) -> typer.Typer:
    """A group of subcommands (`rmq topic ...`): its help line, examples and typer settings
    (by default it shows its help when called without a subcommand)."""
    settings.setdefault("no_args_is_help", True)
    epilog = _examples(*example_lines) if example_lines else None
    return typer.Typer(help=help, epilog=epilog, rich_markup_mode=None, **settings)


def _namesrv(ctx: typer.Context) -> str:
    obj = ctx.find_root().obj or {}
    return obj.get("namesrv", DEFAULT_NAMESRV)


def credentials_from_env() -> SessionCredentials | None:
    """Plain ACL credentials for every client the CLI opens: RMQ_ACCESS_KEY and
    RMQ_SECRET_KEY in the environment (kept out of argv, where `ps` would show them)."""
    ak, sk = os.environ.get("RMQ_ACCESS_KEY"), os.environ.get("RMQ_SECRET_KEY")
    return SessionCredentials(ak, sk) if ak and sk else None


def _run(async_fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> Any:
    """trio.run with the CLI's error policy: known errors -> one stderr line, exit 1."""
    try:
        return run_main(async_fn, *args)
    except Exit as exc:
        raise typer.Exit(exc.code) from None


@app.callback()
def _global(
    ctx: typer.Context,
    namesrv: Annotated[
        str,
        typer.Option(
            "--namesrv",
            "-n",
            envvar=NAMESRV_ENV,
            help="Nameserver address(es), 'host:port[;host:port]'.",
        ),
    ] = DEFAULT_NAMESRV,
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            is_eager=True,
            callback=print_version,
            help="Print the version (and a checkout's git commit) and exit.",
        ),
    ] = False,
) -> None:
    ctx.obj = {"namesrv": namesrv}
