"""Offset reset end to end through our client (memory_cluster, autojump): a running
PushConsumer told RESET_CONSUMER_CLIENT_OFFSET consumes again from the new offsets, an offline
group starts there, and the broker relays (221, 307, 309) reach the consumer through Admin."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest
import trio

from common.model import MessageQueue
from rmq import Admin, ConsumeFromWhere, Message, MessageModel, Producer, PushConsumer
from rmq.errors import ClientError

if TYPE_CHECKING:
    from common.message import MessageExt
    from tests.conftest import InProcessCluster

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def cluster(memory_cluster):
    await memory_cluster.create_topic("T", 2)
    return memory_cluster


async def produce(cluster: InProcessCluster, bodies: list[str]) -> None:
    async with Producer("pg", cluster.namesrv, network=cluster.network) as p:
        for b in bodies:
            await p.send(Message("T", b.encode()))


def consumer(cluster: InProcessCluster, got: list[str]) -> PushConsumer:
    c = PushConsumer(
        "g",
        cluster.namesrv,
        network=cluster.network,
        consume_from=ConsumeFromWhere.FIRST_OFFSET,
        instance_name="c1",
    )
    c.subscribe("T", "*")

    async def listener(msgs: list[MessageExt]) -> None:
        got.extend(m.body.decode() for m in msgs)

    c.register_listener(listener)
    return c


async def wait_for(pred: Callable[[], object], limit: float = 60.0) -> None:
    with trio.fail_after(limit):
        while not pred():  # noqa: ASYNC110 (polling a plain predicate)
            await trio.sleep(0.1)


def committed(cluster: InProcessCluster) -> dict[int, int]:
    return cluster.offsets("g", "T")


async def test_running_consumer_consumes_again_from_the_reset_time(cluster, autojump_clock):
    first = [f"a{i}" for i in range(10)]
    later = [f"b{i}" for i in range(10)]
    await produce(cluster, first)
    # store times are wall-clock milliseconds (the autojump clock does not move them): the b*
    # must be stored later, and by far more than the b* are apart from each other, since a
    # lookup by time between two messages takes the closer one (ConsumeQueue.
    # getOffsetInQueueByTime): with 10 ms, a loaded host's spread of the first b* across the
    # queues made a queue's last a* the closer one
    await trio.to_thread.run_sync(time.sleep, 0.5)
    await produce(cluster, later)
    # per queue, the store time of its first b* message: everything from there comes again
    b_times = [
        next(m.store_timestamp for m in cluster.messages("T", q) if m.body.startswith(b"b"))
        for q in (0, 1)
    ]
    got: list[str] = []
    async with consumer(cluster, got) as c:
        await wait_for(lambda: len(got) >= 20)
        await wait_for(lambda: committed(cluster) == {0: 10, 1: 10})
        async with Admin(cluster.namesrv, network=cluster.network) as admin:
            rows = await admin.reset_offset("g", "T", min(b_times), dry_run=True)
            assert committed(cluster) == {0: 10, 1: 10}  # a dry run changes nothing
            assert [(r.queue.queueId, r.old_offset) for r in rows] == [(0, 10), (1, 10)]
            assert {r.new_offset for r in rows} == {5}
            rows = await admin.reset_offset("g", "T", min(b_times))
            assert [(r.old_offset, r.new_offset) for r in rows] == [(10, 5), (10, 5)]
        await wait_for(lambda: len(got) >= 30)
        await trio.sleep(6)  # a persist round
        assert sorted(got[20:]) == sorted(later)  # the b* again, and nothing before them
        assert committed(cluster) == {0: 10, 1: 10}
        assert len(c.assigned_queues()) == 3  # T's two queues and the retry queue, kept
        # skipAccumulatedMessage: what arrives while skipping is not consumed again
        async with Admin(cluster.namesrv, network=cluster.network) as admin:
            rows = await admin.reset_offset("g", "T", -1)
            assert {r.new_offset for r in rows} == {10}
        await produce(cluster, ["c0"])
        await wait_for(lambda: "c0" in got)
        assert len(got) == 31


async def test_offline_group_starts_at_the_reset_offsets(cluster, autojump_clock):
    await produce(cluster, [f"m{i}" for i in range(6)])
    got: list[str] = []
    async with consumer(cluster, got):
        await wait_for(lambda: len(got) >= 6)
    assert committed(cluster) == {0: 3, 1: 3}
    async with Admin(cluster.namesrv, network=cluster.network) as admin:
        rows = await admin.reset_offset("g", "T", 0)  # earliest
        assert [(r.old_offset, r.new_offset) for r in rows] == [(3, 0), (3, 0)]
        with pytest.raises(ClientError, match="no offsets on topic T"):
            await admin.reset_offset("nobody", "T", 0)
    assert committed(cluster) == {0: 0, 1: 0}
    again: list[str] = []
    async with consumer(cluster, again):
        await wait_for(lambda: len(again) >= 6)
    assert sorted(again) == sorted(got)


async def test_status_running_info_and_direct_consume_reach_the_consumer(cluster, autojump_clock):
    await produce(cluster, ["x0", "x1"])
    got: list[str] = []
    async with consumer(cluster, got) as c:
        await wait_for(lambda: len(got) >= 2)
        await trio.sleep(6)
        async with Admin(cluster.namesrv, network=cluster.network) as admin:
            status = await admin.consumer_status("g", "T")
            assert status == {
                c.client_id: {
                    MessageQueue("T", "broker-a", 0): 1,
                    MessageQueue("T", "broker-a", 1): 1,
                }
            }
            info = await admin.consumer_running_info("g", c.client_id)
            assert info.properties["PROP_CONSUME_TYPE"] == "CONSUME_PASSIVELY"
            assert info.properties["PROP_NAMESERVER_ADDR"] == cluster.namesrv + ";"
            assert {s["topic"] for s in info.subscriptions} == {"T", "%RETRY%g"}
            table = dict(info.mq_table)
            assert table[MessageQueue("T", "broker-a", 0)]["commitOffset"] == 1
            assert set(info.status_table) == {"T", "%RETRY%g"}
            with pytest.raises(Exception, match="not online"):
                await admin.consumer_running_info("g", "nobody@1")
            direct = cluster.messages("T", 0)[0]
            result = await admin.consume_message_directly("g", c.client_id, direct.msg_id)
            assert result.consume_result == "CR_SUCCESS"
        assert got.count(direct.body.decode()) == 2  # the listener saw it once more


async def test_a_topic_on_two_brokers_is_reset_on_both(memory_cluster, autojump_clock):
    cluster = memory_cluster
    await cluster.start_broker("broker-b", broker_name="broker-b")
    await cluster.create_topic("T", 2)
    await produce(cluster, [f"m{i}" for i in range(8)])
    got: list[str] = []
    async with consumer(cluster, got):
        await wait_for(lambda: len(got) >= 8)
        await wait_for(lambda: sum(cluster.offsets("g", "T", "broker-b").values()) > 0)
        async with Admin(cluster.namesrv, network=cluster.network) as admin:
            rows = await admin.reset_offset("g", "T", 0)
        assert {r.queue.brokerName for r in rows} == {"broker-a", "broker-b"}
        assert {r.new_offset for r in rows} == {0}
        await wait_for(lambda: len(got) >= 16)
    assert sorted(got[8:]) == sorted(got[:8])


@pytest.mark.parametrize("mode", ["orderly", "broadcasting"])
async def test_orderly_and_broadcasting_consumers_follow_a_reset(
    cluster, autojump_clock, tmp_path, mode
):
    await produce(cluster, [f"o{i}" for i in range(6)])
    got: list[str] = []
    c = PushConsumer(
        f"g-{mode}",
        cluster.namesrv,
        network=cluster.network,
        consume_from=ConsumeFromWhere.FIRST_OFFSET,
        message_model=MessageModel.BROADCASTING
        if mode == "broadcasting"
        else MessageModel.CLUSTERING,
        offset_store_dir=tmp_path,
    )
    c.subscribe("T", "*")

    async def listener(msgs: list[MessageExt]) -> None:
        got.extend(m.body.decode() for m in msgs)

    if mode == "orderly":
        c.register_orderly_listener(listener)
    else:
        c.register_listener(listener)
    async with c, Admin(cluster.namesrv, network=cluster.network) as admin:
        await wait_for(lambda: len(got) >= 6)
        await trio.sleep(6)  # offsets persisted (the broker's, or the local file)
        if mode == "broadcasting":
            # a broadcasting group keeps no offsets on the broker: give it some to reset
            for q in (0, 1):
                await admin.update_consumer_offset(c.group, MessageQueue("T", "broker-a", q), 3)
        await admin.reset_offset(c.group, "T", 0)
        await wait_for(lambda: len(got) >= 12)
    for q in (0, 1):  # per queue, again from its first message (orderly: in order)
        bodies = [m.body.decode() for m in cluster.messages("T", q)]
        mine = [b for b in got if b in bodies]
        if mode == "orderly":
            assert mine == bodies + bodies
        else:
            assert sorted(mine) == sorted(bodies + bodies)
