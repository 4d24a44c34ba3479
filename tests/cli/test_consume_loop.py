"""The `rmq consume` pull loop against the in-memory cluster (deterministic, no sockets)."""

from __future__ import annotations

import trio

from cli.consume import consume_topic
from common.model import MessageQueue
from rmq import Message, Producer
from rmq.testing import FakeCluster, FakeRemoting

NS = "127.0.0.1:9876"


async def filled_cluster(per_queue: int) -> FakeCluster:
    cluster = FakeCluster()
    cluster.add_broker("broker-a", "127.0.0.1:10911")
    cluster.create_topic("T", 4)
    async with Producer("pg", NS, remoting=FakeRemoting(cluster)) as p:
        for q in range(4):
            for i in range(per_queue):
                await p.send(Message("T", f"q{q}-{i}"), queue=MessageQueue("T", "broker-a", q))
    return cluster


async def test_count_is_exact_across_concurrent_queues(autojump_clock):
    cluster = await filled_cluster(3)
    seen: list[bytes] = []
    with trio.fail_after(60):
        n = await consume_topic(NS, "T", group="g", from_beginning=True, count=2,
                            on_message=lambda m: seen.append(m.body), handle_signals=False,
                            remoting=FakeRemoting(cluster))  # fmt: skip
    assert n == 2 and len(seen) == 2
    # committed offsets cover exactly what was handed over (0 for queues not read)
    committed = cluster.brokers[0].offsets
    assert sorted(committed) == [("g", "T", q) for q in range(4)]
    assert sum(committed.values()) == 2


async def test_group_resumes_and_new_group_starts_at_the_end(autojump_clock):
    cluster = await filled_cluster(2)
    seen: list[bytes] = []
    remoting = FakeRemoting(cluster)
    with trio.fail_after(60):
        await consume_topic(NS, "T", group="g", from_beginning=True, count=5,
                            on_message=lambda m: seen.append(m.body), handle_signals=False,
                            remoting=remoting)  # fmt: skip
    with trio.fail_after(60):
        await consume_topic(NS, "T", group="g", count=3,
                            on_message=lambda m: seen.append(m.body), handle_signals=False,
                            remoting=remoting)  # fmt: skip
    assert sorted(seen) == sorted(f"q{q}-{i}".encode() for q in range(4) for i in range(2))
    # a group without offsets starts at the end: nothing old, stops when idle
    fresh: list[bytes] = []
    with trio.fail_after(60):
        n = await consume_topic(NS, "T", group="new", idle_timeout=2.0,
                                on_message=lambda m: fresh.append(m.body),
                                handle_signals=False, remoting=remoting)  # fmt: skip
    assert n == 0 and fresh == []


async def test_without_follow_it_stops_once_every_queue_is_caught_up(autojump_clock):
    cluster = await filled_cluster(3)
    seen: list[bytes] = []
    start = trio.current_time()
    with trio.fail_after(60):
        n = await consume_topic(NS, "T", group="g", from_beginning=True, follow=False,
                                on_message=lambda m: seen.append(m.body),
                                handle_signals=False, remoting=FakeRemoting(cluster))  # fmt: skip
    assert n == 12 and sorted(seen) == sorted(f"q{q}-{i}".encode() for q in range(4)
                                              for i in range(3))  # fmt: skip
    assert trio.current_time() - start < 1.0  # no long poll when not following
    # caught up already: a second run of the group returns at once with nothing
    with trio.fail_after(60):
        again = await consume_topic(NS, "T", group="g", follow=False, on_message=seen.append,
                                    handle_signals=False, remoting=FakeRemoting(cluster))  # fmt: skip
    assert again == 0


async def test_follow_keeps_waiting_until_the_idle_timeout(autojump_clock):
    cluster = await filled_cluster(1)
    start = trio.current_time()
    with trio.fail_after(600):
        n = await consume_topic(NS, "T", group="g", from_beginning=True, follow=True,
                                idle_timeout=30.0, on_message=lambda m: None,
                                handle_signals=False, remoting=FakeRemoting(cluster))  # fmt: skip
    assert n == 4
    assert trio.current_time() - start >= 30.0
