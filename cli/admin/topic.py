"""`rmq topic`: create, update, delete, list and inspect topics (mqadmin updateTopic,
deleteTopic, topicList, topicRoute, topicStatus)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from cli.admin.options import ClusterOpt, JsonOpt, open_admin
from cli.app import _run, examples
from cli.errors import CliError

if TYPE_CHECKING:
    from common.model import TopicRouteData
    from rmq.admin_api import QueueStats

QueuesOpt = Annotated[
    int, typer.Option("--queues", "-q", min=1, max=1024, help="Read and write queue count.")
]


@examples(
    "rmq topic create TopicTest",
    "rmq topic create Orders --queues 4 --cluster DefaultCluster",
    "rmq topic create Orders --broker 127.0.0.1:10911 --json",
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
            )

    render.topic_changed("created", topic, _run(main), as_json=as_json)


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


@examples("rmq topic delete Orders", "rmq topic delete Orders --cluster DefaultCluster")
def topic_delete(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    cluster: ClusterOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Delete a topic from its brokers (its messages become unreachable) and the nameserver."""
    from cli.admin import render

    async def main() -> list[str]:
        async with open_admin(ctx) as admin:
            return await admin.delete_topic(topic, cluster)

    render.topic_changed("deleted", topic, _run(main), as_json=as_json)


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
