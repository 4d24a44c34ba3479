"""mqadmin-style commands: cluster, broker, topic, group, message, produce, consume.

Each command parses its options, runs one coroutine through `_run` (errors a user can cause
-> one `error:` line on stderr, exit 1) and hands the result to `cli/admin_render.py`, which
prints tables or, with `--json`, one JSON document on stdout.

`rmq broker` is two things: `rmq broker [OPTIONS]` runs a broker (cli/cmd_servers.py) and
`rmq broker status ADDR` asks one. Click cannot have a command and a group under one name,
so `broker` here is a group whose class hands any argument list that does not start with one
of its subcommands to the server command, unchanged (same options, help and errors).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Any, BinaryIO

import typer

from cli.app import _examples, _namesrv, _run, app, topic_app
from cli.errors import CliError
from common.mixall import is_system_group

if TYPE_CHECKING:
    # typer vendors click: the Command and Context its groups take are these
    from typer._click.core import Command, Context

    from cli.status import BrokerStatus
    from common.message import MessageExt
    from common.model import TopicRouteData
    from rmq.admin import Admin
    from rmq.admin_api import ConsumerConnection, ConsumeStats, QueueStats

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of tables.")]

# Beyond this many stdin lines (stdin not a terminal), `rmq produce` shows a progress bar.
PROGRESS_THRESHOLD = 1000


def _admin(ctx: typer.Context) -> Admin:
    from rmq import Admin

    return Admin(_namesrv(ctx))


# --- cluster -----------------------------------------------------------------------------

cluster_app = typer.Typer(
    help="Brokers of the cluster with their role and replication state.",
    invoke_without_command=True,
    rich_markup_mode=None,
    epilog=_examples("rmq cluster", "rmq cluster list --json"),
)
app.add_typer(cluster_app, name="cluster")

BrokerAddrOpt = Annotated[
    str | None, typer.Option("--broker", help="Ask only this broker (host:port).")
]


def _cluster_list(ctx: typer.Context, broker_addr: str | None, as_json: bool) -> None:
    from cli import render

    async def main() -> list[BrokerStatus]:
        from cli.status import broker_status, cluster_status

        if broker_addr is not None:
            return await broker_status(broker_addr)
        return await cluster_status(_namesrv(ctx))

    render.cluster_status(_run(main), as_json=as_json)


@cluster_app.callback()
def cluster_default(ctx: typer.Context, broker_addr: BrokerAddrOpt = None,
                    as_json: JsonOpt = False) -> None:  # fmt: skip
    """List brokers with their role and replication state (same as `rmq cluster list`)."""
    if ctx.invoked_subcommand is None:
        _cluster_list(ctx, broker_addr, as_json)


@cluster_app.command(
    "list",
    epilog=_examples(
        "rmq cluster list",
        "rmq cluster list --json",
        "rmq cluster list --broker 127.0.0.1:10911   # one broker, no nameserver needed",
    ),
)
def cluster_list(ctx: typer.Context, broker_addr: BrokerAddrOpt = None,
                 as_json: JsonOpt = False) -> None:  # fmt: skip
    """List brokers with their role and replication state.

    Per master: push2SlaveMaxOffset and, per connected slave, its HA address, acknowledged
    offset and lag in bytes and milliseconds. Per slave: its master's HA address, whether it
    is connected and the offset it last reported.
    """
    _cluster_list(ctx, broker_addr, as_json)


# --- broker status ---------------------------------------------------------------------------


class _BrokerGroup(typer.core.TyperGroup):
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
                    "  rmq broker status 127.0.0.1:10911 [--json]"
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


broker_app = typer.Typer(
    cls=_BrokerGroup,
    help="Run a broker (`rmq broker [OPTIONS]`, see `rmq broker --help`) or ask one "
    "(`rmq broker status ADDR`).",
    rich_markup_mode=None,
)
app.add_typer(broker_app, name="broker")


@broker_app.command(
    "status",
    epilog=_examples(
        "rmq broker status 127.0.0.1:10911", "rmq broker status 127.0.0.1:10911 --json"
    ),
)
def broker_status_cmd(
    ctx: typer.Context,
    addr: Annotated[str, typer.Argument(help="Broker address host:port.")],
    as_json: JsonOpt = False,
) -> None:
    """Runtime info of one broker (mqadmin brokerStatus): versions, put/get totals, CommitLog
    offsets, replication state."""
    from cli import admin_render

    async def main() -> dict[str, str]:
        async with _admin(ctx) as admin:
            return await admin.broker_runtime_info(addr)

    admin_render.broker_runtime(addr, _run(main), as_json=as_json)


# --- topics ----------------------------------------------------------------------------------

QueuesOpt = Annotated[int, typer.Option("--queues", "-q", min=1, max=1024,
                                        help="Read and write queue count.")]  # fmt: skip
ClusterOpt = Annotated[str | None, typer.Option("--cluster", "-c", help="Cluster name.")]


@topic_app.command(
    "create",
    epilog=_examples(
        "rmq topic create TopicTest",
        "rmq topic create Orders --queues 4 --cluster DefaultCluster",
        "rmq topic create Orders --broker 127.0.0.1:10911 --json",
    ),
)
def topic_create(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    queues: QueuesOpt = 8,
    cluster: ClusterOpt = None,
    broker_addr: Annotated[
        str | None, typer.Option("--broker", help="Create on this broker only.")
    ] = None,
    perm: Annotated[
        int, typer.Option("--perm", help="Permission: 6 read+write, 4 read, 2 write.")
    ] = 6,
    order: Annotated[bool, typer.Option("--order", help="Mark as an ordered topic.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Create (or update) a topic on the masters of a cluster or on one broker."""
    from cli import admin_render

    _check_perm(perm)

    async def main() -> list[str]:
        async with _admin(ctx) as admin:
            return await admin.create_topic(topic, queues=queues, cluster=cluster,
                                            broker_addr=broker_addr, perm=perm, order=order)  # fmt: skip

    admin_render.topic_changed("created", topic, _run(main), as_json=as_json)


def _check_perm(perm: int | None) -> None:
    if perm is not None and perm not in (2, 4, 6):
        raise typer.BadParameter("must be 2 (write), 4 (read) or 6 (read+write)",
                                 param_hint="--perm")  # fmt: skip


@topic_app.command(
    "update",
    epilog=_examples(
        "rmq topic update Orders --queues 16",
        "rmq topic update Orders --perm 4      # read-only: producers are refused",
    ),
)
def topic_update(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="An existing topic.")],
    queues: Annotated[
        int | None,
        typer.Option("--queues", "-q", min=1, max=1024, help="New queue count (default: keep)."),
    ] = None,  # fmt: skip
    perm: Annotated[
        int | None, typer.Option("--perm", help="New permission (default: keep).")
    ] = None,
    cluster: ClusterOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Change the queue count or permission of an existing topic on every broker serving it."""
    from cli import admin_render

    _check_perm(perm)

    async def main() -> list[str]:
        async with _admin(ctx) as admin:
            route = await admin.topic_route(topic)  # TopicNotExistError: one line
            addrs = []
            for bd in sorted(route.brokerDatas, key=lambda b: b.brokerName):
                if cluster is not None and bd.cluster != cluster:
                    continue
                master = bd.brokerAddrs.get(0)
                if master is None:
                    raise CliError(f"broker {bd.brokerName} of {topic} has no master to update")
                qd = next((q for q in route.queueDatas if q.brokerName == bd.brokerName), None)
                await admin.create_topic(
                    topic, broker_addr=master,
                    queues=queues or (qd.writeQueueNums if qd else 8),
                    perm=perm if perm is not None else (qd.perm if qd else 6),
                )  # fmt: skip
                addrs.append(master)
            if not addrs:
                raise CliError(f"topic {topic} has no broker in cluster {cluster}")
            return addrs

    admin_render.topic_changed("updated", topic, _run(main), as_json=as_json)


@topic_app.command(
    "delete",
    epilog=_examples("rmq topic delete Orders", "rmq topic delete Orders --cluster DefaultCluster"),
)
def topic_delete(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    cluster: ClusterOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Delete a topic from its brokers (its messages become unreachable) and the nameserver."""
    from cli import admin_render

    async def main() -> list[str]:
        async with _admin(ctx) as admin:
            return await admin.delete_topic(topic, cluster)

    admin_render.topic_changed("deleted", topic, _run(main), as_json=as_json)


@topic_app.command(
    "list", epilog=_examples("rmq topic list", "rmq -n 10.0.0.1:9876 topic list --json")
)
def topic_list(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """List every topic the nameserver knows."""
    from cli import admin_render

    async def main() -> list[str]:
        async with _admin(ctx) as admin:
            return await admin.topic_list()

    admin_render.topic_list(_run(main), as_json=as_json)


@topic_app.command(
    "route", epilog=_examples("rmq topic route TopicTest", "rmq topic route T --json")
)
def topic_route(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    as_json: JsonOpt = False,
) -> None:
    """Show the brokers and queues of a topic."""
    from cli import admin_render

    async def main() -> TopicRouteData:
        async with _admin(ctx) as admin:
            return await admin.topic_route(topic)

    admin_render.topic_route(topic, _run(main), as_json=as_json)


@topic_app.command(
    "status", epilog=_examples("rmq topic status TopicTest", "rmq topic status TopicTest --json")
)
def topic_status(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    as_json: JsonOpt = False,
) -> None:
    """Per queue: min and max offset, message count and the time of the newest message."""
    from cli import admin_render

    async def main() -> list[QueueStats]:
        async with _admin(ctx) as admin:
            return await admin.topic_stats(topic)

    admin_render.topic_status(topic, _run(main), as_json=as_json)


# --- groups ----------------------------------------------------------------------------------

group_app = typer.Typer(
    help="Consumer groups and their progress.",
    no_args_is_help=True,
    rich_markup_mode=None,
    epilog=_examples("rmq group list", "rmq group progress cg1"),
)
app.add_typer(group_app, name="group")


@group_app.command("list", epilog=_examples("rmq group list", "rmq group list --all --json"))
def group_list(
    ctx: typer.Context,
    cluster: ClusterOpt = None,
    show_all: Annotated[
        bool, typer.Option("--all", help="Include the brokers' system groups.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """List the consumer (subscription) groups the masters know."""
    from cli import admin_render

    async def main() -> list[str]:
        async with _admin(ctx) as admin:
            return await admin.group_list(cluster)

    groups = _run(main)
    if not show_all:
        groups = [g for g in groups if not is_system_group(g)]
    admin_render.group_list(groups, as_json=as_json)


@group_app.command(
    "progress",
    epilog=_examples("rmq group progress cg1", "rmq group progress cg1 --topic Orders --json"),
)
def group_progress(
    ctx: typer.Context,
    group: Annotated[str, typer.Argument(help="Consumer group.")],
    topic: Annotated[str | None, typer.Option("--topic", "-t", help="Only this topic.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Per queue: broker offset, the group's consumer offset and the lag; totals; online
    consumers (mqadmin consumerProgress)."""
    from cli import admin_render

    async def main() -> tuple[ConsumeStats, list[ConsumerConnection]]:
        async with _admin(ctx) as admin:
            stats = await admin.consume_stats(group, topic)
            if not stats.queues:
                where = f" on topic {topic}" if topic else ""
                raise CliError(f"consumer group {group} has no offsets{where} (unknown group?)")
            return stats, await admin.consumer_connections(group)

    stats, conns = _run(main)
    admin_render.group_progress(stats, conns, topic, as_json=as_json)


# --- messages --------------------------------------------------------------------------------

message_app = typer.Typer(
    help="Find messages by key, msgId or queue offset.",
    no_args_is_help=True,
    rich_markup_mode=None,
    epilog=_examples("rmq message query --topic Orders --key order-1"),
)
app.add_typer(message_app, name="message")


@message_app.command(
    "query",
    epilog=_examples(
        "rmq message query --topic Orders --key order-1",
        "rmq message query --id 7F000001000029AF0000000000000000   # offset msgId",
        "rmq message query --topic Orders --id 0A0B0C0D...            # client msgId (UNIQ_KEY)",
        "rmq message query --topic Orders --broker broker-a --queue 0 --offset 42 --json",
    ),
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
    from cli import admin_render

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

        async with _admin(ctx) as admin:
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

    admin_render.messages(_run(main), as_json=as_json)


# --- produce / consume -----------------------------------------------------------------------


@app.command(
    epilog=_examples(
        "rmq produce --topic TopicTest hello world       # two messages",
        "printf 'a\\nb\\n' | rmq produce --topic TopicTest  # one message per line",
        "rmq produce --topic TopicTest --tags TagA --keys order-1 'payload'",
        "seq 100000 | rmq produce -t TopicTest --json > results.json   # progress bar on stderr",
        "tail -f app.log | rmq produce -t Logs           # each line sent as it arrives",
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
    progress: Annotated[
        bool | None,
        typer.Option(
            "--progress/--no-progress",
            help="Progress bar on stderr instead of one line per message (default, when "
            f"stdin is not a terminal: once more than {PROGRESS_THRESHOLD} lines were read "
            "or stdin stays open longer than a second).",
        ),
    ] = None,  # fmt: skip
    allow_not_replicated: Annotated[
        bool,
        typer.Option(
            "--allow-not-replicated",
            help="Exit 0 even when the broker stored a message without the replication or "
            "flush it was configured to wait for (SLAVE_NOT_AVAILABLE, FLUSH_SLAVE_TIMEOUT, "
            "FLUSH_DISK_TIMEOUT). Default: say so on stderr and exit 1.",
        ),
    ] = False,  # fmt: skip
    as_json: JsonOpt = False,
    bodies: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="BODY...", help="Message bodies; without any, one message per stdin line."
        ),
    ] = None,
) -> None:
    """Send messages (arguments, or stdin lines), print each SendResult and a summary line.

    Stdin lines are sent as they arrive, in batches (up to 512 lines, several batches in
    flight), so `tail -f log | rmq produce` works; empty lines are skipped. Within a queue
    the messages keep the order of the lines. With a progress bar the per-message lines are
    left out; --json prints one document with every result instead.
    """
    from cli import admin_render, render
    from cli.produce import MessageTemplate, ProduceStats
    from cli.produce import produce as produce_lines

    properties: dict[str, str] = {}
    for item in prop or []:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise typer.BadParameter(f"expected K=V, got {item!r}", param_hint="--property")
        properties[k] = v
    from_stdin = not bodies
    if as_json:
        mode = "json"
    elif progress is not None:
        mode = "bar" if progress else "lines"
    else:
        mode = "auto" if from_stdin and not _stdin_is_tty() else "lines"
    template = MessageTemplate(topic, tags=tags, keys=keys, properties=properties,
                               delay_level=delay_level)  # fmt: skip
    stats = ProduceStats()

    async def main() -> tuple[ProduceStats, float]:
        import trio

        started = trio.current_time()
        display = admin_render.ProduceDisplay(topic, stats, mode=mode,
                                              threshold=PROGRESS_THRESHOLD)  # fmt: skip
        try:
            await produce_lines(
                _namesrv(ctx), template, group=group,
                stream=_stdin_bytes() if from_stdin else None, bodies=bodies or (),
                stats=stats, on_results=display.results, on_sent=display.sent,
            )  # fmt: skip
        finally:
            seconds = trio.current_time() - started
            display.close(seconds)
        if stats.sent:
            display.summary(seconds)
        return stats, seconds

    stats, _seconds = _run(main)
    if not stats.sent:
        render.error("nothing to send: give BODY arguments or lines on stdin")
        raise typer.Exit(1)
    if stats.not_durable and not allow_not_replicated:
        parts = ", ".join(f"{k} {v}" for k, v in sorted(stats.statuses.items()))
        render.error(
            f"{stats.not_durable} of {stats.sent} message(s) were stored without the "
            f"replication or flush the broker waits for ({parts}); "
            "--allow-not-replicated accepts that"
        )
        raise typer.Exit(1)


def _stdin_is_tty() -> bool:
    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False


def _stdin_bytes() -> BinaryIO:
    """Stdin as a binary stream (typer's CliRunner gives a text wrapper over bytes too); a
    stand-in stdin without a buffer is taken to be a byte stream itself."""
    stdin: Any = sys.stdin  # whatever was put in its place: its type is not known here
    stream: BinaryIO = stdin.buffer if hasattr(stdin, "buffer") else stdin
    return stream


@app.command(
    epilog=_examples(
        "rmq consume --topic TopicTest --from-beginning   # everything, then exit",
        "rmq consume --topic TopicTest -f                 # new messages, until Ctrl-C",
        "rmq consume --topic TopicTest --from-beginning --count 10 --json",
        "rmq consume --topic TopicTest --group cg1 --tags 'TagA||TagB' -v -f",
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
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            "-f",
            help="Keep waiting for new messages until Ctrl-C. Default: stop once "
            "every queue is caught up.",
        ),
    ] = False,  # fmt: skip
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
    as_json: JsonOpt = False,
) -> None:
    """Pull messages from every queue of a topic and print them (one line each).

    Starts at the group's committed offset (the queue's end for a new group) or, with
    --from-beginning, at the oldest message. Without --follow it stops when every queue is
    caught up; with it, it waits for new messages until Ctrl-C (or --count / --idle-timeout).
    The group's offsets are committed on the way out, so the next run continues from there.
    """
    from cli import admin_render, render

    collected: list[Any] = []
    served = {"by": ""}  # the node that answered the pull whose messages are being printed

    def on_message(m: Any) -> None:
        if as_json:
            collected.append(m)
        else:
            render.message(m, verbose=verbose, served_by=served["by"])

    async def main() -> None:
        from cli.consume import consume_topic

        await consume_topic(_namesrv(ctx), topic, group=group, from_beginning=from_beginning,
                            count=count, tags=tags, idle_timeout=idle_timeout,
                            on_message=on_message, follow=follow,
                            served_by=lambda addr: served.update(by=addr))  # fmt: skip

    _run(main)
    if as_json:
        admin_render.consumed_json(topic, collected)
