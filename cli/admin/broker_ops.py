"""`rmq broker config get|set` and `rmq broker perm wipe|add`: a running broker's settings
(mqadmin getBrokerConfig / updateBrokerConfig) and its write permission on the nameservers
(mqadmin wipeWritePerm / addWritePerm)."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.admin.options import ClusterOpt, JsonOpt, open_admin
from cli.app import _run, examples
from cli.errors import CliError


@examples(
    "rmq broker config get 127.0.0.1:10911",
    "rmq broker config get 127.0.0.1:10911 brokerPermission maxMessageSize",
    "rmq broker config get 127.0.0.1:10911 --json",
)
def config_get(
    ctx: typer.Context,
    addr: Annotated[str, typer.Argument(help="Broker address host:port.")],
    keys: Annotated[list[str] | None, typer.Argument(help="Only these keys.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """A broker's configuration as it runs (mqadmin getBrokerConfig)."""
    from cli.admin import render_ops

    async def main() -> tuple[dict[str, str], str]:
        async with open_admin(ctx) as admin:
            return await admin.broker_config(addr)

    props, version = _run(main)
    wanted = list(keys or [])
    missing = [k for k in wanted if k not in props]
    if missing:
        typer.echo(f"error: the broker has no config key {', '.join(missing)}", err=True)
        raise typer.Exit(1)
    render_ops.broker_config(addr, props, version, wanted, as_json=as_json)


@examples(
    "rmq broker config set 127.0.0.1:10911 longPollingEnable=false",
    "rmq broker config set --cluster DefaultCluster autoCreateTopicEnable=false",
    "rmq broker config set 127.0.0.1:10911 brokerPermission=4 --json",
)
def config_set(
    ctx: typer.Context,
    settings: Annotated[
        list[str],
        typer.Argument(help="[ADDR] KEY=VALUE...: one broker's address, or --cluster."),
    ],
    cluster: ClusterOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Change broker settings (mqadmin updateBrokerConfig): on one broker, or on every broker
    of a cluster. The broker applies at once the keys it reads live and writes every key to
    its config file; it says which keys wait for a restart and refuses unknown keys."""
    from cli.admin import render_ops

    addr = None
    if settings and "=" not in settings[0]:
        addr, settings = settings[0], settings[1:]
    if addr is None and cluster is None:
        raise typer.BadParameter("give a broker address or --cluster", param_hint="ADDR")
    props: dict[str, str] = {}
    for item in settings:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="KEY=VALUE")
        props[key.strip()] = value.strip()
    if not props:
        raise typer.BadParameter("nothing to set", param_hint="KEY=VALUE")

    async def main() -> list[tuple[str, str | None]]:
        async with open_admin(ctx) as admin:
            return await admin.update_broker_config(props, broker_addr=addr, cluster=cluster)

    render_ops.broker_config_set(props, _run(main), as_json=as_json)


def _write_perm(ctx: typer.Context, broker_name: str, *, wipe: bool, as_json: bool) -> None:
    from cli.admin import render_ops

    async def main() -> list[tuple[str, int]]:
        async with open_admin(ctx) as admin:
            results = await admin.write_perm(broker_name, wipe=wipe)
            if not any(n for _, n in results):
                info = await admin.cluster_info()
                if broker_name not in info.brokerAddrTable:
                    raise CliError(f"no broker named {broker_name} is registered")
            return results

    render_ops.write_perm("wiped" if wipe else "added", broker_name, _run(main), as_json=as_json)


@examples("rmq broker perm wipe broker-a", "rmq broker perm wipe broker-a --json")
def perm_wipe(
    ctx: typer.Context,
    broker_name: Annotated[str, typer.Argument(help="brokerName (all its nodes).")],
    as_json: JsonOpt = False,
) -> None:
    """Stop producers writing to a broker: every nameserver drops the write permission of its
    topics' queues there (mqadmin wipeWritePerm), e.g. to drain it before maintenance.
    Consumers keep reading. Undo with `rmq broker perm add`."""
    _write_perm(ctx, broker_name, wipe=True, as_json=as_json)


@examples("rmq broker perm add broker-a")
def perm_add(
    ctx: typer.Context,
    broker_name: Annotated[str, typer.Argument(help="brokerName (all its nodes).")],
    as_json: JsonOpt = False,
) -> None:
    """Give a broker's topics their write permission back on every nameserver (mqadmin
    addWritePerm)."""
    _write_perm(ctx, broker_name, wipe=False, as_json=as_json)
