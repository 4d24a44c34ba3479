"""`rmq producer list`: producer clients online, from the heartbeats the masters received
(mqadmin producerConnection / GET_ALL_PRODUCER_INFO)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from cli.admin.options import JsonOpt, open_admin
from cli.app import _run, examples

if TYPE_CHECKING:
    from rmq.admin_api import ProducerInfo


@examples("rmq producer list", "rmq producer list --group pg1 --json")
def producer_list(
    ctx: typer.Context,
    group: Annotated[str | None, typer.Option("--group", "-g", help="Only this group.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Producer groups and their online clients: client id, address, language, version and
    last heartbeat."""
    from cli.admin import render_ops

    async def main() -> list[ProducerInfo]:
        async with open_admin(ctx) as admin:
            return await admin.producers(group)

    render_ops.producer_list(_run(main), as_json=as_json)
