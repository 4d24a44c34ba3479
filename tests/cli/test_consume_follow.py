"""`rmq consume`: a new group starts at each queue's end, against a real broker with history.

The broker answers QUERY_CONSUMER_OFFSET with 0 for a group that never committed while the
queue still starts at 0 (RocketMQ's rule); the CLI must not take that 0 as the group's
position. A group that did commit 0 must still resume at 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio

from cli.messages.consume import consume_topic
from common.model import MessageQueue
from rmq import Message, Producer, PullConsumer

if TYPE_CHECKING:
    from tests.conftest import InProcessCluster

pytestmark = pytest.mark.integration

TOPIC = "FollowTopic"
QUEUES = 4
OLD = 20  # messages stored before any consumer exists


@pytest.fixture
async def namesrv(tcp_cluster: InProcessCluster) -> str:
    """The nameserver of a real nameserver and broker in this process (tcp_cluster), TOPIC
    holding OLD messages spread over its queues, every queue starting at offset 0."""
    await tcp_cluster.create_topic(TOPIC, QUEUES)
    async with Producer("pg", tcp_cluster.namesrv) as p:
        with trio.fail_after(20):
            for i in range(OLD):
                await p.send(Message(TOPIC, f"old-{i}"))
    return tcp_cluster.namesrv


async def test_broker_answers_zero_for_a_new_group(namesrv: str) -> None:
    # the premise: RocketMQ's QUERY_CONSUMER_OFFSET rule is kept as it is
    async with PullConsumer("never-committed", namesrv) as c:
        mq = MessageQueue(TOPIC, "broker-a", 0)
        assert await c.min_offset(mq) == 0
        assert await c.query_offset(mq) == 0


async def test_new_group_without_follow_reads_nothing_old(namesrv: str) -> None:
    seen: list[bytes] = []
    with trio.fail_after(30):
        n = await consume_topic(
            namesrv,
            TOPIC,
            group="fresh",
            follow=False,
            on_message=lambda m: seen.append(m.body),
            handle_signals=False,
        )
    assert (n, seen) == (0, [])
    # the group now has a position on every queue: the end
    async with PullConsumer("fresh", namesrv) as c:
        for mq in await c.fetch_queues(TOPIC):
            assert await c.query_offset(mq) == await c.max_offset(mq) > 0


async def test_follow_with_a_new_group_prints_only_new_messages(namesrv: str) -> None:
    seen: list[bytes] = []
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:

            async def follow() -> None:
                await consume_topic(
                    namesrv,
                    TOPIC,
                    group="fresh-f",
                    count=3,
                    long_poll=1.0,
                    on_message=lambda m: seen.append(m.body),
                    handle_signals=False,
                    follow=True,
                )
                nursery.cancel_scope.cancel()

            nursery.start_soon(follow)
            # keep sending new messages until three were followed: however long the
            # consumer takes to find its start, only new ones can be printed
            async with Producer("pg2", namesrv) as p:
                i = 0
                while True:
                    await p.send(Message(TOPIC, f"new-{i}"))
                    i += 1
                    await trio.sleep(0.1)
    assert len(seen) == 3
    assert all(body.startswith(b"new-") for body in seen), seen


async def test_group_that_committed_zero_resumes_at_zero(namesrv: str) -> None:
    async with PullConsumer("at-zero", namesrv) as c:
        queues = await c.fetch_queues(TOPIC)
        for mq in queues:
            await c.commit_offset(mq, 0 if mq.queueId == 1 else await c.max_offset(mq))
        q1 = await c.max_offset(MessageQueue(TOPIC, "broker-a", 1))
    seen: list[bytes] = []
    with trio.fail_after(30):
        n = await consume_topic(
            namesrv,
            TOPIC,
            group="at-zero",
            follow=False,
            on_message=lambda m: seen.append(m.body),
            handle_signals=False,
        )
    assert n == q1 > 0 and all(b.startswith(b"old-") for b in seen)
