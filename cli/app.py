"""The `rmq` typer application and what every command module shares.

Command modules (`cli/cmd_*.py`) add their commands to `app` on import; `cli/main.py` imports
them all. Each module owns one area so they can change independently: `cmd_servers` (namesrv,
broker), `cmd_local` (a local cluster: up/down/status/kill/restart), `cmd_admin` (mqadmin-style
topic/cluster/broker/group/message commands, produce, consume), `cmd_top` (the live TUI),
`cmd_bench` (the load generator).

Errors a user can cause (connection refused, unknown topic, bad config, port in use) print ONE
line on stderr and exit with status 1; no traceback.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Coroutine
from typing import Annotated, Any

import typer

from cli.node import DEFAULT_NAMESRV, Exit, run_main
from cli.version import print_version
from common.session_credentials import SessionCredentials


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
topic_app = typer.Typer(
    help="Create, list and inspect topics.",
    no_args_is_help=True,
    rich_markup_mode=None,
    epilog=_examples("rmq topic create T --queues 8", "rmq topic list", "rmq topic route T"),
)
app.add_typer(topic_app, name="topic")


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
            envvar="RMQ_NAMESRV",
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
