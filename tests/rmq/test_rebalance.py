"""AllocateMessageQueueAveragely and group rebalancing on join/leave, against the real servers
(memory_cluster): the broker's own NOTIFY_CONSUMER_IDS_CHANGED, lost ones dropped by a Tap."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from common.model import MessageQueue
from common.remoting.codes import RequestCode
from rmq import PushConsumer, allocate_averagely

if TYPE_CHECKING:
    from tests.conftest import InProcessCluster

NS = "127.0.0.1:9876"


def mqs(n: int, broker: str = "b") -> list[MessageQueue]:
    return [MessageQueue("T", broker, i) for i in range(n)]


def test_allocate_averagely_matches_java_examples():
    queues = mqs(8)
    cids = ["c1", "c2", "c3"]
    # 8 % 3 = 2: the first two members take 3, the last takes 2, in contiguous runs
    assert [q.queueId for q in allocate_averagely("g", "c1", queues, cids)] == [0, 1, 2]
    assert [q.queueId for q in allocate_averagely("g", "c2", queues, cids)] == [3, 4, 5]
    assert [q.queueId for q in allocate_averagely("g", "c3", queues, cids)] == [6, 7]
    # more members than queues: one each, the rest get nothing
    two = mqs(2)
    assert allocate_averagely("g", "c1", two, cids) == [two[0]]
    assert allocate_averagely("g", "c2", two, cids) == [two[1]]
    assert allocate_averagely("g", "c3", two, cids) == []


def test_allocate_sorts_inputs_and_ignores_strangers():
    queues = mqs(4, "b") + mqs(4, "a")
    shuffled = list(reversed(queues))
    got = allocate_averagely("g", "x", shuffled, ["y", "x"])
    assert got == [MessageQueue("T", "a", i) for i in range(4)]
    assert allocate_averagely("g", "z", queues, ["x", "y"]) == []
    assert allocate_averagely("g", "x", [], ["x"]) == []


@given(st.integers(1, 40), st.integers(1, 12))
def test_allocation_is_a_partition(n_queues, n_members):
    queues = mqs(n_queues)
    cids = [f"c{i}" for i in range(n_members)]
    shares = [allocate_averagely("g", c, queues, cids) for c in cids]
    flat = [q for s in shares for q in s]
    assert sorted(flat, key=lambda q: q.queueId) == queues  # every queue exactly once
    sizes = [len(s) for s in shares]
    assert max(sizes) - min(sizes) <= 1


@pytest.fixture
async def cluster(memory_cluster):
    await memory_cluster.start_broker("broker-b", broker_name="broker-b")
    await memory_cluster.create_topic("T", 4)  # 8 queues over two brokers
    return memory_cluster


def consumer(cluster: InProcessCluster, name: str, **kw: Any) -> PushConsumer:
    kw.setdefault("network", cluster.network)
    c = PushConsumer("g", cluster.namesrv, instance_name=name, **kw)
    c.subscribe("T")

    async def listener(msgs):
        return None

    c.register_listener(listener)
    return c


def t_queues(c: PushConsumer) -> set[MessageQueue]:
    return {mq for mq in c.assigned_queues() if mq.topic == "T"}


async def test_members_join_and_leave_and_queues_follow(cluster, autojump_clock):
    all_t = {MessageQueue("T", b, i) for b in ("broker-a", "broker-b") for i in range(4)}
    async with consumer(cluster, "one") as c1:
        assert t_queues(c1) == all_t
        # the retry topic is subscribed automatically (clustering)
        assert any(mq.topic == "%RETRY%g" for mq in c1.assigned_queues())
        async with consumer(cluster, "two") as c2:
            await trio.sleep(1)  # the notify is delivered with the join; let both rebalance
            a, b = t_queues(c1), t_queues(c2)
            assert len(a) == len(b) == 4 and a | b == all_t and not a & b
            async with consumer(cluster, "three") as c3:
                await trio.sleep(1)
                shares = [t_queues(c) for c in (c1, c2, c3)]
                assert sorted(len(s) for s in shares) == [2, 3, 3]
                assert set().union(*shares) == all_t
            # three left (UNREGISTER_CLIENT): the others are told and take its queues
            await trio.sleep(1)
            a, b = t_queues(c1), t_queues(c2)
            assert a | b == all_t and not a & b
        await trio.sleep(1)
        assert t_queues(c1) == all_t


async def test_a_dead_member_is_noticed_through_the_broker(cluster, autojump_clock):
    async with consumer(cluster, "one") as c1:
        # a member that never says goodbye: only a heartbeat, then its connection closes
        ghost = cluster.tap()
        async with consumer(cluster, "ghost", network=ghost):
            await trio.sleep(1)
            assert len(t_queues(c1)) == 4
            await ghost.cut()  # its connections close; the broker drops it from the group
            # once its held pulls are given up (the channel's 1 s EOF grace) and tells "one"
            await trio.sleep(3)
            assert len(t_queues(c1)) == 8


async def test_periodic_rebalance_without_notify(cluster, autojump_clock):
    tap = cluster.tap()
    async with consumer(cluster, "one", rebalance_interval=20.0, network=tap) as c1:
        await trio.sleep(1)  # the rebalance its own join triggered is done
        # a member appears that the broker's notify never announces to "one" (lost)
        for node in ("broker-a", "broker-b"):
            tap.hang(cluster.addr(node), {RequestCode.NOTIFY_CONSUMER_IDS_CHANGED})
        async with consumer(cluster, "zzz"):
            await trio.sleep(5)
            assert len(t_queues(c1)) == 8
            await trio.sleep(15)
            assert len(t_queues(c1)) == 4
