"""`rmq cluster` and `rmq broker status`: what the brokers of a cluster say about themselves
(mqadmin clusterList and brokerStatus).

`rmq broker` is two things: `rmq broker [OPTIONS]` runs a broker (cli/servers/commands.py) and
`rmq broker status ADDR` asks one. Click cannot have a command and a group under one name,
so `broker` here is a group whose class hands any argument list that does not start with one
of its subcommands to the server command, unchanged (same options, help and errors).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.admin.options import JsonOpt, open_admin
from cli.app import NamesrvGroup, _namesrv, _run, app, examples

if TYPE_CHECKING:
    # typer vendors click: the Command and Context its groups take are these
    from typer._click.core import Command, Context

    from cli.runtime_info.status import BrokerStatus


BrokerAddrOpt = Annotated[
    str | None, typer.Option("--broker", help="Ask only this broker (host:port).")
]


def _cluster_list(ctx: typer.Context, broker_addr: str | None, as_json: bool) -> None:
    from cli.admin import render

    async def main() -> list[BrokerStatus]:
        from cli.runtime_info.status import broker_status, cluster_status

        if broker_addr is not None:
            return await broker_status(broker_addr)
        return await cluster_status(_namesrv(ctx))

    render.cluster_status(_run(main), as_json=as_json)


def cluster_default(
    ctx: typer.Context, broker_addr: BrokerAddrOpt = None, as_json: JsonOpt = False
) -> None:
    """List brokers with their role and replication state (same as `rmq cluster list`)."""
    if ctx.invoked_subcommand is None:
        _cluster_list(ctx, broker_addr, as_json)


@examples(
    "rmq cluster list",
    "rmq cluster list --json",
    "rmq cluster list --broker 127.0.0.1:10911   # one broker, no nameserver needed",
)
def cluster_list(
    ctx: typer.Context, broker_addr: BrokerAddrOpt = None, as_json: JsonOpt = False
) -> None:
    """List brokers with their role and replication state.

    Per master: push2SlaveMaxOffset and, per connected slave, its HA address, acknowledged
    offset and lag in bytes and milliseconds. Per slave: its master's HA address, whether it
    is connected and the offset it last reported.
    """
    _cluster_list(ctx, broker_addr, as_json)


class BrokerGroup(NamesrvGroup):
    """`rmq broker status ADDR`, and anything else goes to the `rmq broker` server command."""

    def _server(self) -> Command | None:
        import typer.main

        for info in app.registered_commands:
            name = info.name or (info.callback.__name__ if info.callback else "")
            if name == "broker":
                server = typer.main.get_command_from_info(
                    info, pretty_exceptions_short=True, rich_markup_mode=None
                )
                # a fresh object per call: extending its epilog changes nobody else's
                server.epilog = (server.epilog or "") + (
                    "\n\n\b\nAsk a running broker instead:\n"
                    "  rmq broker status 127.0.0.1:10911 [--json]\n"
                    "  rmq broker config get|set 127.0.0.1:10911 ...\n"
                    "  rmq broker perm wipe|add broker-a"
                )
                return server
        return None

    def make_context(
        self, info_name: str | None, args: list[str], parent: Context | None = None, **extra: Any
    ) -> Context:
        if not (args and args[0] in self.commands):
            server = self._server()
            if server is not None:
                return server.make_context(info_name, args, parent=parent, **extra)
        return super().make_context(info_name, args, parent=parent, **extra)


@examples("rmq broker status 127.0.0.1:10911", "rmq broker status 127.0.0.1:10911 --json")
def broker_status_cmd(
    ctx: typer.Context,
    addr: Annotated[str, typer.Argument(help="Broker address host:port.")],
    as_json: JsonOpt = False,
) -> None:
    """Runtime info of one broker (mqadmin brokerStatus): versions, put/get totals, CommitLog
    offsets, replication state."""
    from cli.admin import render

    async def main() -> dict[str, str]:
        async with open_admin(ctx) as admin:
            return await admin.broker_runtime_info(addr)

    render.broker_runtime(addr, _run(main), as_json=as_json)
