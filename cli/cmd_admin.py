"""mqadmin-style commands: topics, cluster, produce, consume."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from cli.app import _examples, _namesrv, _run, app, topic_app

# --- topics ----------------------------------------------------------------------------------


@topic_app.command(
    "create",
    epilog=_examples(
        "rmq topic create TopicTest",
        "rmq topic create Orders --queues 4 --cluster DefaultCluster",
        "rmq topic create Orders --broker 127.0.0.1:10911",
    ),
)
def topic_create(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    queues: Annotated[
        int, typer.Option("--queues", "-q", min=1, help="Read and write queue count.")
    ] = 8,
    cluster: Annotated[
        str | None, typer.Option("--cluster", help="Create on every master of it.")
    ] = None,
    broker_addr: Annotated[
        str | None, typer.Option("--broker", help="Create on this broker only.")
    ] = None,
    perm: Annotated[
        int, typer.Option("--perm", help="Permission: 6 read+write, 4 read, 2 write.")
    ] = 6,
) -> None:
    """Create (or update) a topic on the masters of a cluster or on one broker."""
    from cli import render

    async def main() -> list[str]:
        from rmq import Admin

        async with Admin(_namesrv(ctx)) as admin:
            return await admin.create_topic(
                topic, queues=queues, cluster=cluster, broker_addr=broker_addr, perm=perm
            )

    render.topic_created(topic, _run(main))


@topic_app.command("list", epilog=_examples("rmq topic list", "rmq -n 10.0.0.1:9876 topic list"))
def topic_list(ctx: typer.Context) -> None:
    """List every topic the nameserver knows."""
    from cli import render

    async def main() -> list[str]:
        from rmq import Admin

        async with Admin(_namesrv(ctx)) as admin:
            return await admin.topic_list()

    render.topic_list(_run(main))


@topic_app.command("route", epilog=_examples("rmq topic route TopicTest"))
def topic_route(ctx: typer.Context, topic: str = typer.Argument(..., help="Topic name.")) -> None:
    """Show the brokers and queues of a topic."""
    from cli import render

    async def main():
        from rmq import Admin

        async with Admin(_namesrv(ctx)) as admin:
            return await admin.topic_route(topic)

    render.topic_route(topic, _run(main))


@app.command(
    "cluster",
    epilog=_examples(
        "rmq cluster",
        "rmq cluster --json",
        "rmq cluster --broker 127.0.0.1:10911   # one broker, no nameserver needed",
    ),
)
def cluster_list(
    ctx: typer.Context,
    broker_addr: Annotated[
        str | None, typer.Option("--broker", help="Ask only this broker (host:port).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
) -> None:
    """List brokers with their role and replication state.

    Per master: push2SlaveMaxOffset and, per connected slave, its HA address, acknowledged
    offset and lag in bytes and milliseconds. Per slave: its master's HA address, whether it
    is connected and the offset it last reported.
    """
    from cli import render

    async def main():
        from cli.status import broker_status, cluster_status

        if broker_addr is not None:
            return await broker_status(broker_addr)
        return await cluster_status(_namesrv(ctx))

    render.cluster_status(_run(main), as_json=as_json)


# --- messages --------------------------------------------------------------------------------


@app.command(
    epilog=_examples(
        "rmq produce --topic TopicTest hello world       # two messages",
        "printf 'a\\nb\\n' | rmq produce --topic TopicTest  # one message per line",
        "rmq produce --topic TopicTest --tags TagA --keys order-1 'payload'",
    ),
)
def produce(
    ctx: typer.Context,
    topic: Annotated[str, typer.Option("--topic", "-t", help="Topic.")],
    tags: Annotated[str | None, typer.Option("--tags", help="Message tag.")] = None,
    keys: Annotated[
        str | None, typer.Option("--keys", help="Message keys (space separated).")
    ] = None,
    group: Annotated[
        str, typer.Option("--group", "-g", help="Producer group.")
    ] = "rmq-cli-producer",
    delay_level: Annotated[
        int, typer.Option("--delay-level", min=0, max=18, help="1..18, 0 = none.")
    ] = 0,
    prop: Annotated[
        list[str] | None,
        typer.Option("--property", "-P", metavar="K=V", help="User property K=V (repeatable)."),
    ] = None,
    bodies: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="BODY...", help="Message bodies; without any, one message per stdin line."
        ),
    ] = None,
) -> None:
    """Send messages (arguments, or stdin lines) and print each SendResult."""
    from cli import render

    properties: dict[str, str] = {}
    for item in prop or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"expected K=V, got {item!r}", param_hint="--property")
        properties[key] = value
    if bodies:
        payloads = list(bodies)
    else:
        payloads = [line.rstrip("\r\n") for line in sys.stdin]
        payloads = [p for p in payloads if p]
    if not payloads:
        render.error("nothing to send: give BODY arguments or lines on stdin")
        raise typer.Exit(1)

    async def main() -> None:
        from rmq import Message, Producer

        async with Producer(group, _namesrv(ctx)) as producer:
            for body in payloads:
                msg = Message(
                    topic,
                    body,
                    tags=tags,
                    keys=keys,
                    properties=properties,
                    delay_level=delay_level,
                )
                render.send_result(await producer.send(msg))

    _run(main)


@app.command(
    epilog=_examples(
        "rmq consume --topic TopicTest                      # new messages, until Ctrl-C",
        "rmq consume --topic TopicTest --from-beginning --count 10",
        "rmq consume --topic TopicTest --group cg1 --tags 'TagA||TagB' -v",
    ),
)
def consume(
    ctx: typer.Context,
    topic: Annotated[str, typer.Option("--topic", "-t", help="Topic.")],
    group: Annotated[
        str, typer.Option("--group", "-g", help="Consumer group.")
    ] = "rmq-cli-consumer",
    from_beginning: Annotated[
        bool,
        typer.Option(
            "--from-beginning", help="Start at the oldest message, not the group's offset."
        ),
    ] = False,
    count: Annotated[
        int | None, typer.Option("--count", "-c", min=1, help="Stop after N messages.")
    ] = None,
    tags: Annotated[str, typer.Option("--tags", help="Tag expression: '*' or 'A||B'.")] = "*",
    idle_timeout: Annotated[
        float | None,
        typer.Option("--idle-timeout", help="Stop after this many seconds without a message."),
    ] = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show queue, offset, ids, tags.")
    ] = False,
) -> None:
    """Pull messages from every queue of a topic and print them (one line each)."""
    from cli import render

    async def main() -> None:
        from cli.consume import consume_topic

        await consume_topic(
            _namesrv(ctx),
            topic,
            group=group,
            from_beginning=from_beginning,
            count=count,
            tags=tags,
            idle_timeout=idle_timeout,
            on_message=lambda m: render.message(m, verbose=verbose),
        )

    _run(main)
