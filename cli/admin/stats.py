"""`rmq stats`: per topic and consumer group, what is waiting and how fast it moves
(mqadmin statsAll)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from cli.admin.options import JsonOpt, open_admin
from cli.app import _run, examples

if TYPE_CHECKING:
    from rmq.admin import StatsRow


@examples("rmq stats", "rmq stats --topic Orders --json", "rmq stats --active")
def stats(
    ctx: typer.Context,
    topic: Annotated[str | None, typer.Option("--topic", "-t", help="Only this topic.")] = None,
    active: Annotated[
        bool, typer.Option("--active", "-a", help="Only topics with traffic in 24 hours.")
    ] = False,
    show_all: Annotated[bool, typer.Option("--all", help="Include system topics.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Per topic and consumer group: accumulation (messages not yet consumed), in and out TPS
    over the last minute, messages in and out over 24 hours, summed over the masters."""
    from cli.admin import render_ops

    async def main() -> list[StatsRow]:
        async with open_admin(ctx) as admin:
            return await admin.stats_all(topic, include_system=show_all)

    rows = _run(main)
    if active:
        rows = [r for r in rows if r.in_msg_24h > 0 or r.out_msg_24h > 0]
    render_ops.stats(rows, as_json=as_json)
