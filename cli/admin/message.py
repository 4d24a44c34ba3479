"""`rmq message query`: find messages by key, msgId or queue offset (mqadmin queryMsgByKey,
queryMsgById, queryMsgByOffset)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from cli.admin.options import JsonOpt, open_admin
from cli.app import _run, examples
from cli.errors import CliError

if TYPE_CHECKING:
    from common.message import MessageExt


@examples(
    "rmq message query --topic Orders --key order-1",
    "rmq message query --id 7F000001000029AF0000000000000000   # offset msgId",
    "rmq message query --topic Orders --id 0A0B0C0D...            # client msgId (UNIQ_KEY)",
    "rmq message query --topic Orders --broker broker-a --queue 0 --offset 42 --json",
)
def message_query(
    ctx: typer.Context,
    topic: Annotated[str | None, typer.Option("--topic", "-t", help="Topic.")] = None,
    key: Annotated[str | None, typer.Option("--key", "-k", help="Message key (KEYS).")] = None,
    msg_id: Annotated[
        str | None, typer.Option("--id", "-i", help="Offset msgId or UNIQ_KEY.")
    ] = None,
    queue: Annotated[int | None, typer.Option("--queue", "-q", min=0, help="Queue id.")] = None,
    broker: Annotated[str | None, typer.Option("--broker", "-b", help="Broker name.")] = None,
    offset: Annotated[
        int | None, typer.Option("--offset", "-o", min=0, help="Queue offset.")
    ] = None,
    max_num: Annotated[
        int, typer.Option("--max", min=1, max=1000, help="Most messages for --key.")
    ] = 32,
    as_json: JsonOpt = False,
) -> None:
    """Show messages with body, tags, keys, properties and store times.

    Exactly one of: --key (needs --topic), --id (an offset msgId alone; a UNIQ_KEY with
    --topic), or --queue/--offset (needs --topic; --broker when the topic has several).
    """
    from cli.admin import render

    by_offset = queue is not None or offset is not None or broker is not None
    modes = [key is not None, msg_id is not None, by_offset]
    if sum(modes) != 1:
        raise typer.BadParameter("give exactly one of --key, --id or --queue/--offset")
    if key is not None and topic is None:
        raise typer.BadParameter("--key needs --topic", param_hint="--topic")
    if by_offset and (topic is None or queue is None or offset is None):
        raise typer.BadParameter("--queue/--offset need --topic, --queue and --offset")

    async def main() -> list[MessageExt]:
        from rmq import MessageQueue

        async with open_admin(ctx) as admin:
            if key is not None:
                assert topic is not None
                found = await admin.query_message_by_key(topic, key, max_num)
                if not found:
                    raise CliError(f"no message with key {key!r} in topic {topic}")
                return found
            if msg_id is not None:
                return [await admin.view_message(msg_id, topic)]
            assert topic is not None and queue is not None and offset is not None
            name = broker
            if name is None:
                route = await admin.topic_route(topic)
                names = sorted({q.brokerName for q in route.queueDatas})
                if len(names) != 1:
                    raise CliError(f"topic {topic} is on brokers {', '.join(names)}: pass --broker")
                name = names[0]
            return [await admin.message_at(MessageQueue(topic, name, queue), offset)]

    render.messages(_run(main), as_json=as_json)
