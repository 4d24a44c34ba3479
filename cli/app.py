"""The `rmq` typer application and what every command shares.

`app` is the root of the command tree, with the global `--namesrv` option (`_global`). The
commands themselves are plain functions in the subpackages of `cli/` (`cli/local/`, `cli/admin/`,
...); `cli/main.py` registers each one on `app` or on a group, in the order `rmq --help`
lists them. A command function carries its `Examples:` epilog with `@examples(...)`, which
`add_command` hands to typer when it registers the function.

`-n/--namesrv` is accepted after the command too (`rmq topic list -n HOST:PORT`): every command
and group registered through `add_command` / `command_group` carries it (`_NamesrvOption`), and
what it is given there replaces the global value for that run.

Errors a user can cause (connection refused, unknown topic, bad config, port in use) print ONE
line on stderr and exit with status 1; no traceback (`_run`, over `cli/errors.py`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Coroutine
from typing import Annotated, Any, TypeVar

import typer

from cli.client_network import TLS_CA_ENV, TLS_ENV
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


_NAMESRV_DECLS = ("--namesrv", "-n")
_NAMESRV_HELP = "Nameserver address(es), 'host:port[;host:port]'."


def _set_namesrv(ctx: typer.Context, value: str | None) -> None:
    if value is not None and not ctx.resilient_parsing:
        root = ctx.find_root()
        root.obj = {**(root.obj or {}), "namesrv": value}


def _namesrv_option(decls: tuple[str, ...]) -> Any:  # Any: typer's vendored click.Parameter
    """The `-n/--namesrv` option of a command (only `decls`, the ones it does not use for
    something else), built by typer from a one-parameter function, so it parses and shows in
    the help like the global one. It sets the root context's value and is not passed on."""
    import typer.main

    def namesrv(value: str | None = None) -> None: ...

    # set here, not written in the signature: this module's annotations are strings, and
    # `decls` is a local typer could not resolve from one
    namesrv.__annotations__ = {
        "value": Annotated[
            str | None,
            typer.Option(*decls, expose_value=False, callback=_set_namesrv, help=_NAMESRV_HELP),
        ],
        "return": None,
    }
    holder = typer.Typer(add_completion=False)
    holder.command()(namesrv)
    [param] = typer.main.get_command(holder).params
    return param


def _add_namesrv_option(params: list[Any]) -> None:
    taken = {opt for p in params for opt in getattr(p, "opts", ())}
    decls = tuple(d for d in _NAMESRV_DECLS if d not in taken)
    if decls:  # `rmq broker` has a --namesrv of its own (namesrvAddr): it gets -n only
        params.append(_namesrv_option(decls))


class NamesrvCommand(typer.core.TyperCommand):
    """A command that also takes `-n/--namesrv` after its name."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _add_namesrv_option(self.params)


class NamesrvGroup(typer.core.TyperGroup):
    """A group (`rmq topic`, `rmq cluster`) that also takes `-n/--namesrv` after its name."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _add_namesrv_option(self.params)


def add_command(group: typer.Typer, fn: Callable[..., Any], name: str | None = None) -> None:
    """Register `fn` as a command of `group` (named after the function unless `name` is
    given), with the examples `@examples` gave it and `-n/--namesrv` after its name."""
    group.command(name, epilog=_EPILOGS.get(fn), cls=NamesrvCommand)(fn)


def command_group(help: str, *example_lines: str, **settings: Any) -> typer.Typer:
    """A group of subcommands (`rmq topic ...`): its help line, examples and typer settings
    (by default it shows its help when called without a subcommand)."""
    settings.setdefault("no_args_is_help", True)
    settings.setdefault("cls", NamesrvGroup)
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
            help=_NAMESRV_HELP + " Also accepted after the command.",
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
    tls: Annotated[
        bool,
        typer.Option(
            "--tls",
            help=f"Connect with TLS (as {TLS_ENV}=1); the CA to trust: {TLS_CA_ENV}=ca.pem "
            "(default: .rmq/tls/ca.pem of `rmq up --tls` if present, else the system's).",
        ),
    ] = False,
) -> None:
    if tls:
        # every client the command opens reads it (network_from_env), as the env var
        os.environ[TLS_ENV] = "1"
    ctx.obj = {"namesrv": namesrv}
