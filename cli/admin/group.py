"""`rmq group`: consumer groups and their progress (mqadmin consumerProgress)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.admin.options import ClusterOpt, JsonOpt, open_admin
from cli.app import _run, examples
from cli.errors import CliError
from common.errors import RmqError
from common.mixall import is_system_group

if TYPE_CHECKING:
    from rmq.admin_api import ConsumerConnection, ConsumeStats


@examples("rmq group list", "rmq group list --all --json")
def group_list(
    ctx: typer.Context,
    cluster: ClusterOpt = None,
    show_all: Annotated[
        bool, typer.Option("--all", help="Include the brokers' system groups.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """List the consumer (subscription) groups the masters know; a group without any
    consumer offset (new, or its topic was deleted) is marked "(no offsets)"."""
    from cli.admin import render

    async def main() -> tuple[list[str], dict[str, set[str]]]:
        async with open_admin(ctx) as admin:
            return await admin.group_list(cluster), await admin.offset_topics_by_group(cluster)

    groups, offsets = _run(main)
    if not show_all:
        groups = [g for g in groups if not is_system_group(g)]
    without = {g for g in groups if g not in offsets}
    render.group_list(groups, without_offsets=without, as_json=as_json)


@examples("rmq group progress cg1", "rmq group progress cg1 --topic Orders --json")
def group_progress(
    ctx: typer.Context,
    group: Annotated[str, typer.Argument(help="Consumer group.")],
    topic: Annotated[str | None, typer.Option("--topic", "-t", help="Only this topic.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Per queue: broker offset, the group's consumer offset and the lag; totals; online
    consumers (mqadmin consumerProgress)."""
    from cli.admin import render

    async def main() -> tuple[ConsumeStats, list[ConsumerConnection]]:
        async with open_admin(ctx) as admin:
            stats = await admin.consume_stats(group, topic)
            if not stats.queues:
                where = f" on topic {topic}" if topic else ""
                raise CliError(f"consumer group {group} has no offsets{where} (unknown group?)")
            return stats, await admin.consumer_connections(group)

    stats, conns = _run(main)
    render.group_progress(stats, conns, topic, as_json=as_json)


BrokerOpt = Annotated[
    str | None, typer.Option("--broker", "-b", help="One broker address instead of a cluster.")
]


@examples(
    "rmq group create cg1",
    "rmq group create cg1 --retry-max-times 3 --no-broadcast --json",
    "rmq group create cg1 --broker 127.0.0.1:10911",
    "rmq group create fifo-cg --orderly",
)
def group_create(
    ctx: typer.Context,
    group: Annotated[str, typer.Argument(help="Consumer group.")],
    cluster: ClusterOpt = None,
    broker: BrokerOpt = None,
    retry_max_times: Annotated[
        int, typer.Option("--retry-max-times", help="Deliveries before the DLQ.")
    ] = 16,
    retry_queues: Annotated[int, typer.Option("--retry-queues", help="%RETRY% queues.")] = 1,
    broadcast: Annotated[
        bool, typer.Option("--broadcast/--no-broadcast", help="Allow broadcasting consumers.")
    ] = True,
    orderly: Annotated[
        bool,
        typer.Option(
            "--orderly", help="FIFO: pop serves a queue's next message after the last is acked."
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Create or update a subscription group on every master of the cluster, or on one
    broker (mqadmin updateSubGroup)."""
    from cli.admin import render_ops

    async def main() -> list[str]:
        async with open_admin(ctx) as admin:
            return await admin.create_group(
                group,
                cluster=cluster,
                broker_addr=broker,
                retry_max_times=retry_max_times,
                retry_queue_nums=retry_queues,
                consume_broadcast=broadcast,
                consume_message_orderly=orderly,
            )

    render_ops.group_changed("created", group, _run(main), as_json=as_json)


@examples(
    "rmq group delete cg1",
    "rmq group delete cg1 --keep-offsets --broker 127.0.0.1:10911",
)
def group_delete(
    ctx: typer.Context,
    group: Annotated[str, typer.Argument(help="Consumer group.")],
    cluster: ClusterOpt = None,
    broker: BrokerOpt = None,
    keep_offsets: Annotated[
        bool, typer.Option("--keep-offsets", help="Keep the group's committed offsets.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Delete a subscription group from every master of the cluster (and its %RETRY% and %DLQ%
    topics), or from one broker (mqadmin deleteSubGroup). Its committed offsets go too unless
    --keep-offsets; members still online re-create it at their next heartbeat when the broker
    auto-creates groups."""
    from cli.admin import render_ops

    async def main() -> list[str]:
        async with open_admin(ctx) as admin:
            return await admin.delete_group(
                group, cluster=cluster, broker_addr=broker, remove_offset=not keep_offsets
            )

    render_ops.group_changed("deleted", group, _run(main), as_json=as_json)


@examples("rmq group describe cg1", "rmq group describe cg1 --running --json")
def group_describe(
    ctx: typer.Context,
    group: Annotated[str, typer.Argument(help="Consumer group.")],
    running: Annotated[
        bool,
        typer.Option(
            "--running",
            help="Also ask each member for its running info (GET_CONSUMER_RUNNING_INFO, "
            "relayed by the broker): properties, subscriptions, queues held and their offsets.",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """A group's settings, its online members (client ids, addresses) and their
    subscriptions, as the masters see them (mqadmin consumerConnection)."""
    from cli.admin import render_ops

    async def main() -> tuple[Any, list[ConsumerConnection], Any]:
        async with open_admin(ctx) as admin:
            config = await admin.group_config(group)
            conns = await admin.consumer_connections(group)
            if config is None and not conns:
                raise CliError(f"consumer group {group} is not known to any master")
            info = None
            if running and conns:
                info = {}
                for c in conns:
                    try:
                        found = await admin.consumer_running_info(group, c.client_id)
                    except RmqError as exc:  # one member's failure is its entry, not the command's
                        info[c.client_id] = {"error": str(exc)}
                    else:
                        info[c.client_id] = render_ops.running_info_doc(found)
            return config, conns, info

    config, conns, info = _run(main)
    render_ops.group_describe(group, config, conns, info, as_json=as_json)
