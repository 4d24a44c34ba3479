"""The `rmq consume` pull loop against the real servers in process (memory_cluster, autojump)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio

from cli.messages.consume import consume_topic
from common.model import MessageQueue
from common.remoting.client import open_remoting_client
from rmq import Message, Producer

if TYPE_CHECKING:
    from tests.conftest import InProcessCluster


@pytest.fixture
async def remoting(memory_cluster):
    """The command takes a RemotingClient (`remoting=`): one on the cluster's network."""
    async with open_remoting_client(network=memory_cluster.network) as client:
        yield client


async def fill(cluster: InProcessCluster, per_queue: int) -> None:
    await cluster.create_topic("T", 4)
    async with Producer("pg", cluster.namesrv, network=cluster.network) as p:
        for q in range(4):
            for i in range(per_queue):
                await p.send(Message("T", f"q{q}-{i}"), queue=MessageQueue("T", "broker-a", q))


def consume(cluster, remoting, **kw):
    kw.setdefault("on_message", lambda m: None)
    return consume_topic(cluster.namesrv, "T", handle_signals=False, remoting=remoting, **kw)


async def test_count_is_exact_across_concurrent_queues(memory_cluster, remoting, autojump_clock):
    await fill(memory_cluster, 3)
    seen: list[bytes] = []
    with trio.fail_after(60):
        n = await consume(
            memory_cluster,
            remoting,
            group="g",
            from_beginning=True,
            count=2,
            on_message=lambda m: seen.append(m.body),
        )
    assert n == 2 and len(seen) == 2
    # committed offsets cover exactly what was handed over (0 for queues not read)
    committed = memory_cluster.offsets("g", "T")
    assert sorted(committed) == [0, 1, 2, 3]
    assert sum(committed.values()) == 2


async def test_group_resumes_and_new_group_starts_at_the_end(
    memory_cluster, remoting, autojump_clock
):
    await fill(memory_cluster, 2)
    seen: list[bytes] = []
    with trio.fail_after(60):
        await consume(
            memory_cluster,
            remoting,
            group="g",
            from_beginning=True,
            count=5,
            on_message=lambda m: seen.append(m.body),
        )
    with trio.fail_after(60):
        await consume(
            memory_cluster, remoting, group="g", count=3, on_message=lambda m: seen.append(m.body)
        )
    assert sorted(seen) == sorted(f"q{q}-{i}".encode() for q in range(4) for i in range(2))
    # a group without offsets starts at the end: nothing old, stops when idle
    fresh: list[bytes] = []
    with trio.fail_after(60):
        n = await consume(
            memory_cluster,
            remoting,
            group="new",
            idle_timeout=2.0,
            on_message=lambda m: fresh.append(m.body),
        )
    assert n == 0 and fresh == []


async def test_without_follow_it_stops_once_every_queue_is_caught_up(
    memory_cluster, remoting, autojump_clock
):
    await fill(memory_cluster, 3)
    seen: list[bytes] = []
    start = trio.current_time()
    with trio.fail_after(60):
        n = await consume(
            memory_cluster,
            remoting,
            group="g",
            from_beginning=True,
            follow=False,
            on_message=lambda m: seen.append(m.body),
        )
    assert n == 12 and sorted(seen) == sorted(
        f"q{q}-{i}".encode() for q in range(4) for i in range(3)
    )
    assert trio.current_time() - start < 1.0  # no long poll when not following
    # caught up already: a second run of the group returns at once with nothing
    with trio.fail_after(60):
        again = await consume(memory_cluster, remoting, group="g", follow=False)
    assert again == 0


async def test_follow_keeps_waiting_until_the_idle_timeout(
    memory_cluster, remoting, autojump_clock
):
    await fill(memory_cluster, 1)
    start = trio.current_time()
    with trio.fail_after(600):
        n = await consume(
            memory_cluster, remoting, group="g", from_beginning=True, follow=True, idle_timeout=30.0
        )
    assert n == 4
    assert trio.current_time() - start >= 30.0
