"""`rmq topic`: create, update, delete, list and inspect topics (mqadmin updateTopic,
deleteTopic, topicList, topicRoute, topicStatus)."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Annotated

import typer

from cli.admin.options import ClusterOpt, JsonOpt, open_admin
from cli.app import _run, examples
from cli.errors import CliError

if TYPE_CHECKING:
    from common.model import TopicRouteData
    from rmq.admin_api import QueueStats


class MessageTypeChoice(enum.StrEnum):
    """RocketMQ 5's topic message types (common/topic_message_type.py)."""

    NORMAL = "NORMAL"
    FIFO = "FIFO"
    DELAY = "DELAY"
    TRANSACTION = "TRANSACTION"
    MIXED = "MIXED"


QueuesOpt = Annotated[
    int, typer.Option("--queues", "-q", min=1, max=1024, help="Read and write queue count.")
]


@examples(
    "rmq topic create TopicTest",
    "rmq topic create Orders --queues 4 --cluster DefaultCluster",
    "rmq topic create Orders --broker 127.0.0.1:10911 --json",
    "rmq topic create Payments --message-type FIFO   # for 5.x FIFO producers",
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
    message_type: Annotated[
        MessageTypeChoice | None,
        typer.Option(
            "--message-type",
            case_sensitive=False,
            help="RocketMQ 5's message.type: what 5.x clients may send (default NORMAL).",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Create (or update) a topic on the masters of a cluster or on one broker."""
    from cli.admin import render

    _check_perm(perm)

    async def main() -> list[str]:
        async with open_admin(ctx) as admin:
            return await admin.create_topic(
                topic,
                queues=queues,
                cluster=cluster,
                broker_addr=broker_addr,
                perm=perm,
                order=order,
                message_type=message_type.value if message_type is not None else None,
            )

    render.topic_changed("created", topic, _run(main), as_json=as_json)


def _stdin_is_tty() -> bool:
    import sys

    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False


def _check_perm(perm: int | None) -> None:
    if perm is not None and perm not in (2, 4, 6):
        raise typer.BadParameter(
            "must be 2 (write), 4 (read) or 6 (read+write)", param_hint="--perm"
        )


@examples(
    "rmq topic update Orders --queues 16",
    "rmq topic update Orders --perm 4      # read-only: producers are refused",
)
def topic_update(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="An existing topic.")],
    queues: Annotated[
        int | None,
        typer.Option("--queues", "-q", min=1, max=1024, help="New queue count (default: keep)."),
    ] = None,
    perm: Annotated[
        int | None, typer.Option("--perm", help="New permission (default: keep).")
    ] = None,
    cluster: ClusterOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Change the queue count or permission of an existing topic on every broker serving it."""
    from cli.admin import render

    _check_perm(perm)

    async def main() -> list[str]:
        async with open_admin(ctx) as admin:
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
                    topic,
                    broker_addr=master,
                    queues=queues or (qd.writeQueueNums if qd else 8),
                    perm=perm if perm is not None else (qd.perm if qd else 6),
                )
                addrs.append(master)
            if not addrs:
                raise CliError(f"topic {topic} has no broker in cluster {cluster}")
            return addrs

    render.topic_changed("updated", topic, _run(main), as_json=as_json)


@examples(
    "rmq topic delete Orders                     # asks first",
    "rmq topic delete Orders --yes --cluster DefaultCluster",
)
def topic_delete(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    cluster: ClusterOpt = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Delete a topic from its brokers (its messages become unreachable) and the nameserver.

    The brokers delete the consumer offsets every group has on the topic with it (as
    RocketMQ's ConsumerOffsetManager.cleanOffsetByTopic does); a group left without any offset
    stays a subscription group, and `rmq group list` shows it as "(no offsets)". Asks for
    confirmation on the terminal (or a "y" line on stdin) unless --yes is given.
    """
    from cli.admin import render

    async def survey() -> list[str]:
        async with open_admin(ctx) as admin:
            if cluster is None:  # the topic's brokers; TopicNotExistError: one line
                groups = await admin.offset_topics_by_group(topic=topic)
            else:
                groups = await admin.offset_topics_by_group(cluster)
            return sorted(g for g, topics in groups.items() if topic in topics)

    groups = _run(survey)
    if not yes:
        what = f"topic {topic}" + (f" in cluster {cluster}" if cluster else "")
        offsets = (
            f"; the offsets of group(s) {', '.join(groups)} on it are deleted with it"
            if groups
            else "; no group has offsets on it"
        )
        question = f"Delete {what}? Its messages become unreachable{offsets}."
        try:
            ok = typer.confirm(question, default=False, err=True)
        except typer.Abort:  # stdin ended without an answer
            ok = False
        if not _stdin_is_tty():  # no Enter was echoed: end the question's line
            typer.echo("", err=True)
        if not ok:
            from cli.render import error

            error(f"topic {topic} not deleted (--yes deletes without asking)")
            raise typer.Exit(1)

    async def main() -> tuple[list[str], list[str]]:
        async with open_admin(ctx) as admin:
            addrs = await admin.delete_topic(topic, cluster)
            left = await admin.offset_topics_by_group(cluster)
            return addrs, [g for g in groups if g not in left]

    addrs, without = _run(main)
    render.topic_deleted(topic, addrs, groups, without, as_json=as_json)


@examples("rmq topic list", "rmq -n 10.0.0.1:9876 topic list --json")
def topic_list(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """List every topic the nameserver knows."""
    from cli.admin import render

    async def main() -> list[str]:
        async with open_admin(ctx) as admin:
            return await admin.topic_list()

    render.topic_list(_run(main), as_json=as_json)


@examples("rmq topic route TopicTest", "rmq topic route T --json")
def topic_route(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    as_json: JsonOpt = False,
) -> None:
    """Show the brokers and queues of a topic."""
    from cli.admin import render

    async def main() -> TopicRouteData:
        async with open_admin(ctx) as admin:
            return await admin.topic_route(topic)

    render.topic_route(topic, _run(main), as_json=as_json)


@examples("rmq topic status TopicTest", "rmq topic status TopicTest --json")
def topic_status(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    as_json: JsonOpt = False,
) -> None:
    """Per queue: min and max offset, message count and the time of the newest message."""
    from cli.admin import render

    async def main() -> list[QueueStats]:
        async with open_admin(ctx) as admin:
            return await admin.topic_stats(topic)

    render.topic_status(topic, _run(main), as_json=as_json)
