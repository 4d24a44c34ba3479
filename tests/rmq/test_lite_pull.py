"""LitePullConsumer (assign mode) against rmq.testing fakes with the autojump clock."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from common.model import MessageQueue
from common.remoting.codes import RequestCode
from rmq.errors import ClientError
from rmq.lite_pull_consumer import LitePullConsumer
from rmq.testing import FakeCluster, FakeRemoting

NS = "127.0.0.1:9876"
G = "lite-g"


@pytest.fixture
def cluster() -> FakeCluster:
    c = FakeCluster()
    c.add_broker("broker-a", "127.0.0.1:10911")
    c.create_topic("T", 2)
    return c


def mq(i: int) -> MessageQueue:
    return MessageQueue("T", "broker-a", i)


def fill(cluster: FakeCluster, qid: int, *bodies: str) -> None:
    b = cluster.brokers[0]
    for body in bodies:
        b.append("T", qid, 0, body.encode(), {"TAGS": "t", "UNIQ_KEY": body}, 0)


def consumer(cluster: FakeCluster, **kw) -> LitePullConsumer:
    return LitePullConsumer(G, NS, remoting=FakeRemoting(cluster), **kw)


def pulls(cluster: FakeCluster) -> list:
    return [r for r in cluster.brokers[0].requests if r.code == RequestCode.PULL_MESSAGE]


async def drain(c: LitePullConsumer, n: int, timeout: float = 30.0) -> list[str]:
    got: list[str] = []
    with trio.fail_after(timeout):
        while len(got) < n:
            got += [m.body.decode() for m in await c.poll(1.0)]
    return got


async def test_first_offset_gets_everything_in_queue_order(cluster, autojump_clock):
    fill(cluster, 0, *[f"a{i}" for i in range(40)])
    fill(cluster, 1, *[f"b{i}" for i in range(3)])
    async with consumer(cluster, consume_from="FIRST_OFFSET", pull_batch_size=8) as c:
        c.assign([mq(0), mq(1)])
        got = await drain(c, 43)
    assert sorted(got) == sorted([f"a{i}" for i in range(40)] + [f"b{i}" for i in range(3)])
    assert [g for g in got if g[0] == "a"] == [f"a{i}" for i in range(40)]
    # round-robin: queue 1's few messages are not stuck behind queue 0's many
    assert max(got.index(f"b{i}") for i in range(3)) < 16


async def test_last_offset_skips_old_messages_and_long_polls_new_ones(cluster, autojump_clock):
    fill(cluster, 0, "old1", "old2")
    async with consumer(cluster) as c:
        c.assign([mq(0)])
        await trio.testing.wait_all_tasks_blocked()
        fill(cluster, 0, "new1")
        assert await drain(c, 1) == ["new1"]
        # pulls asked the broker to hold them (long polling: suspend flag, 20 s)
        req = pulls(cluster)[-1]
        assert (
            int(req.ext_fields["sysFlag"]) & 0x2
            and req.ext_fields["suspendTimeoutMillis"] == "20000"
        )


async def test_committed_offset_is_where_consumption_resumes(cluster, autojump_clock):
    fill(cluster, 0, *[f"m{i}" for i in range(6)])
    cluster.brokers[0].offsets[(G, "T", 0)] = 4
    async with consumer(cluster, consume_from="FIRST_OFFSET") as c:
        c.assign([mq(0)])
        assert await c.committed(mq(0)) == 4
        assert await drain(c, 2) == ["m4", "m5"]


async def test_poll_times_out_with_empty_list_on_the_trio_clock(cluster, autojump_clock):
    async with consumer(cluster) as c:
        c.assign([mq(0)])
        start = trio.current_time()
        assert await c.poll(3.0) == []
        assert trio.current_time() - start == pytest.approx(3.0)
    # the fake answers empty pulls at once: the consumer paused instead of spinning
    assert len(pulls(cluster)) <= 5


async def test_auto_commit_every_interval_and_on_close(cluster, autojump_clock):
    fill(cluster, 0, *[f"m{i}" for i in range(10)])
    offsets = cluster.brokers[0].offsets
    async with consumer(cluster, consume_from="FIRST_OFFSET", pull_batch_size=4) as c:
        c.assign([mq(0)])
        got = await c.poll(1.0)
        assert got and (G, "T", 0) not in offsets  # nothing committed before the interval
        await trio.sleep(5.5)
        assert offsets[(G, "T", 0)] == len(got)  # exactly what poll handed out
        got += await c.poll(1.0)
    assert offsets[(G, "T", 0)] == len(got)  # the exit committed the rest


async def test_manual_commit_when_auto_commit_is_off(cluster, autojump_clock):
    fill(cluster, 0, "a", "b", "c")
    offsets = cluster.brokers[0].offsets
    async with consumer(cluster, consume_from="FIRST_OFFSET", auto_commit=False) as c:
        c.assign([mq(0)])
        assert await drain(c, 3) == ["a", "b", "c"]
        await trio.sleep(12)
        assert (G, "T", 0) not in offsets
        await c.commit()
        assert await c.committed(mq(0)) == 3


async def test_seek_rewinds_and_forwards_within_bounds(cluster, autojump_clock):
    fill(cluster, 0, *[f"m{i}" for i in range(5)])
    async with consumer(cluster, consume_from="FIRST_OFFSET") as c:
        c.assign([mq(0)])
        assert await drain(c, 5) == [f"m{i}" for i in range(5)]
        await c.seek(mq(0), 2)
        assert await drain(c, 3) == ["m2", "m3", "m4"]
        await c.seek_to_begin(mq(0))
        assert (await drain(c, 1))[0] == "m0"
        await c.seek_to_end(mq(0))
        assert await c.poll(2.0) == []
        fill(cluster, 0, "m5")
        assert await drain(c, 1) == ["m5"]
        with pytest.raises(ClientError, match="illegal"):
            await c.seek(mq(0), 99)
        with pytest.raises(ClientError, match="not assigned"):
            await c.seek(mq(1), 0)


async def test_seek_drops_buffered_messages_of_the_old_position(cluster, autojump_clock):
    fill(cluster, 0, *[f"m{i}" for i in range(10)])
    async with consumer(cluster, consume_from="FIRST_OFFSET", pull_batch_size=2) as c:
        c.assign([mq(0)])
        assert await drain(c, 2) == ["m0", "m1"]  # more are buffered behind these
        await c.seek(mq(0), 7)
        assert await drain(c, 3) == ["m7", "m8", "m9"]
        await c.commit()
    assert cluster.brokers[0].offsets[(G, "T", 0)] == 10


async def test_flow_control_stops_prefetch_at_the_threshold(cluster, autojump_clock):
    fill(cluster, 0, *[f"m{i}" for i in range(100)])
    async with consumer(
        cluster, consume_from="FIRST_OFFSET", pull_batch_size=5, pull_threshold_for_queue=10
    ) as c:
        c.assign([mq(0)])
        await trio.sleep(5)
        assert len(pulls(cluster)) == 2  # 10 buffered, then it waits for poll
        await c.poll(1.0)
        await trio.sleep(5)
        assert len(pulls(cluster)) == 3
        got = await drain(c, 95)
    assert len(got) == 95


async def test_reassign_stops_the_old_queue_and_starts_the_new(cluster, autojump_clock):
    fill(cluster, 0, "a0")
    fill(cluster, 1, "b0")
    async with consumer(cluster, consume_from="FIRST_OFFSET") as c:
        c.assign([mq(0)])
        assert await drain(c, 1) == ["a0"]
        c.assign([mq(1)])
        assert c.assignment() == frozenset({mq(1)})
        assert await drain(c, 1) == ["b0"]
        await trio.testing.wait_all_tasks_blocked()
        n = len([r for r in pulls(cluster) if r.ext_fields["queueId"] == "0"])
        fill(cluster, 0, "a1")
        assert await c.poll(3.0) == []
        assert len([r for r in pulls(cluster) if r.ext_fields["queueId"] == "0"]) == n


async def test_broker_down_then_back_loses_nothing(cluster, autojump_clock):
    broker = cluster.brokers[0]
    async with consumer(cluster, consume_from="FIRST_OFFSET") as c:
        broker.down = True
        c.assign([mq(0)])
        assert await c.poll(3.0) == []
        fill(cluster, 0, "x", "y")
        broker.down = False
        assert await drain(c, 2) == ["x", "y"]


async def test_assign_before_open_and_misuse_errors(cluster, autojump_clock):
    fill(cluster, 0, "a")
    c = consumer(cluster, consume_from="FIRST_OFFSET")
    c.assign([mq(0)])
    with pytest.raises(ClientError, match="not open"):
        await c.poll(1.0)
    async with c:
        assert await drain(c, 1) == ["a"]
        with pytest.raises(ClientError):
            c.assign(["T:0"])
    with pytest.raises(ClientError, match="consume_from"):
        LitePullConsumer(G, NS, consume_from="NEWEST")


async def test_fetch_queues_and_timestamp_start(cluster, autojump_clock):
    fill(cluster, 0, "a")
    with pytest.raises(ClientError, match="consume_timestamp_ms"):
        consumer(cluster, consume_from="TIMESTAMP")
    async with consumer(cluster, consume_from="TIMESTAMP", consume_timestamp_ms=1) as c:
        assert await c.fetch_queues("T") == [mq(0), mq(1)]
        c.assign([mq(0)])
        # the fake broker has no SEARCH_OFFSET: the error is retried, never fatal
        assert await c.poll(2.5) == []


async def test_an_unassigned_queue_still_commits_what_poll_handed_out(cluster, autojump_clock):
    fill(cluster, 0, *[f"m{i}" for i in range(6)])
    offsets = cluster.brokers[0].offsets
    async with consumer(cluster, consume_from="FIRST_OFFSET", auto_commit=False) as c:
        c.assign([mq(0)])
        got = await drain(c, 6)
        c.assign([])  # the queue leaves before any commit (Java persists it on the way out)
        await c.commit()
        assert offsets[(G, "T", 0)] == len(got) == 6
