"""`rmq group`: consumer groups and their progress (mqadmin consumerProgress)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from cli.admin.options import ClusterOpt, JsonOpt, open_admin
from cli.app import _run, examples
from cli.errors import CliError
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
