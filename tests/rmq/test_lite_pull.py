"""LitePullConsumer (assign mode) against the real servers (memory_cluster) with the autojump
clock; a broker down or without SEARCH_OFFSET is made by tests.support.tap.Tap."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.testing

from common.model import MessageQueue
from common.remoting.codes import RequestCode, ResponseCode
from rmq import Message, Producer
from rmq.errors import ClientError
from rmq.lite_pull_consumer import LitePullConsumer

if TYPE_CHECKING:
    from common.remoting.command import RemotingCommand
    from tests.conftest import InProcessCluster
    from tests.support.tap import Tap

G = "lite-g"


@pytest.fixture
async def cluster(memory_cluster):
    await memory_cluster.create_topic("T", 2)
    return memory_cluster


@pytest.fixture
def tap(cluster):
    return cluster.tap()


def mq(i: int) -> MessageQueue:
    return MessageQueue("T", "broker-a", i)


async def fill(cluster: InProcessCluster, qid: int, *bodies: str) -> None:
    async with Producer("pg", cluster.namesrv, network=cluster.network) as p:
        for body in bodies:
            await p.send(Message("T", body, tags="t"), queue=mq(qid))


def consumer(cluster: InProcessCluster, tap: Tap, **kw: Any) -> LitePullConsumer:
    return LitePullConsumer(G, cluster.namesrv, network=tap, **kw)


def pulls(tap: Tap) -> list[RemotingCommand]:
    return tap.requests(RequestCode.PULL_MESSAGE)


def no_offset(cluster: InProcessCluster, tap: Tap) -> None:
    query = {RequestCode.QUERY_CONSUMER_OFFSET}
    tap.fail(cluster.addr(), ResponseCode.QUERY_NOT_FOUND, requests=query, forever=True)


def committed(cluster: InProcessCluster) -> dict[int, int]:
    """queue id -> the offset the broker holds for the group on T."""
    return cluster.offsets(G, "T")


async def drain(c: LitePullConsumer, n: int, timeout: float = 30.0) -> list[str]:
    got: list[str] = []
    with trio.fail_after(timeout):
        while len(got) < n:
            got += [m.body.decode() for m in await c.poll(1.0)]
    return got


async def test_first_offset_gets_everything_in_queue_order(cluster, tap, autojump_clock):
    await fill(cluster, 0, *[f"a{i}" for i in range(40)])
    await fill(cluster, 1, *[f"b{i}" for i in range(3)])
    async with consumer(cluster, tap, consume_from="FIRST_OFFSET", pull_batch_size=8) as c:
        c.assign([mq(0), mq(1)])
        got = await drain(c, 43)
    assert sorted(got) == sorted([f"a{i}" for i in range(40)] + [f"b{i}" for i in range(3)])
    assert [g for g in got if g[0] == "a"] == [f"a{i}" for i in range(40)]
    # round-robin: queue 1's few messages are not stuck behind queue 0's many
    assert max(got.index(f"b{i}") for i in range(3)) < 16


async def test_last_offset_skips_old_messages_and_long_polls_new_ones(cluster, tap, autojump_clock):
    await fill(cluster, 0, "old1", "old2")
    # the broker has no offset for the group and says so (QUERY_NOT_FOUND); a new group on a
    # queue that still starts at 0 is answered 0 instead (test_push_start_offset.py)
    no_offset(cluster, tap)
    async with consumer(cluster, tap) as c:
        c.assign([mq(0)])
        await trio.testing.wait_all_tasks_blocked()
        await fill(cluster, 0, "new1")
        assert await drain(c, 1) == ["new1"]
        # pulls asked the broker to hold them (long polling: suspend flag, 20 s)
        req = pulls(tap)[-1]
        assert (
            int(req.ext_fields["sysFlag"]) & 0x2
            and req.ext_fields["suspendTimeoutMillis"] == "20000"
        )


async def test_committed_offset_is_where_consumption_resumes(cluster, tap, autojump_clock):
    await fill(cluster, 0, *[f"m{i}" for i in range(6)])
    cluster.broker().controller.consumer_offset_manager.commit_offset(G, "T", 0, 4)
    async with consumer(cluster, tap, consume_from="FIRST_OFFSET") as c:
        c.assign([mq(0)])
        assert await c.committed(mq(0)) == 4
        assert await drain(c, 2) == ["m4", "m5"]


async def test_poll_times_out_with_empty_list_on_the_trio_clock(cluster, tap, autojump_clock):
    async with consumer(cluster, tap) as c:
        c.assign([mq(0)])
        start = trio.current_time()
        assert await c.poll(3.0) == []
        assert trio.current_time() - start == pytest.approx(3.0)
    # empty pulls are held by the broker (long polling): the consumer does not spin
    assert len(pulls(tap)) <= 5


async def test_auto_commit_every_interval_and_on_close(cluster, tap, autojump_clock):
    await fill(cluster, 0, *[f"m{i}" for i in range(10)])
    async with consumer(cluster, tap, consume_from="FIRST_OFFSET", pull_batch_size=4) as c:
        c.assign([mq(0)])
        got = await c.poll(1.0)
        assert got and 0 not in committed(cluster)  # nothing committed before the interval
        await trio.sleep(5.5)
        assert committed(cluster)[0] == len(got)  # exactly what poll handed out
        got += await c.poll(1.0)
    assert committed(cluster)[0] == len(got)  # the exit committed the rest


async def test_manual_commit_when_auto_commit_is_off(cluster, tap, autojump_clock):
    await fill(cluster, 0, "a", "b", "c")
    async with consumer(cluster, tap, consume_from="FIRST_OFFSET", auto_commit=False) as c:
        c.assign([mq(0)])
        assert await drain(c, 3) == ["a", "b", "c"]
        await trio.sleep(12)
        assert 0 not in committed(cluster)
        await c.commit()
        assert await c.committed(mq(0)) == 3


async def test_seek_rewinds_and_forwards_within_bounds(cluster, tap, autojump_clock):
    await fill(cluster, 0, *[f"m{i}" for i in range(5)])
    async with consumer(cluster, tap, consume_from="FIRST_OFFSET") as c:
        c.assign([mq(0)])
        assert await drain(c, 5) == [f"m{i}" for i in range(5)]
        await c.seek(mq(0), 2)
        assert await drain(c, 3) == ["m2", "m3", "m4"]
        await c.seek_to_begin(mq(0))
        assert (await drain(c, 1))[0] == "m0"
        await c.seek_to_end(mq(0))
        assert await c.poll(2.0) == []
        await fill(cluster, 0, "m5")
        assert await drain(c, 1) == ["m5"]
        with pytest.raises(ClientError, match="illegal"):
            await c.seek(mq(0), 99)
        with pytest.raises(ClientError, match="not assigned"):
            await c.seek(mq(1), 0)


async def test_seek_drops_buffered_messages_of_the_old_position(cluster, tap, autojump_clock):
    await fill(cluster, 0, *[f"m{i}" for i in range(10)])
    async with consumer(cluster, tap, consume_from="FIRST_OFFSET", pull_batch_size=2) as c:
        c.assign([mq(0)])
        assert await drain(c, 2) == ["m0", "m1"]  # more are buffered behind these
        await c.seek(mq(0), 7)
        assert await drain(c, 3) == ["m7", "m8", "m9"]
        await c.commit()
    assert committed(cluster)[0] == 10


async def test_flow_control_stops_prefetch_at_the_threshold(cluster, tap, autojump_clock):
    await fill(cluster, 0, *[f"m{i}" for i in range(100)])
    async with consumer(
        cluster, tap, consume_from="FIRST_OFFSET", pull_batch_size=5, pull_threshold_for_queue=10
    ) as c:
        c.assign([mq(0)])
        await trio.sleep(5)
        assert len(pulls(tap)) == 2  # 10 buffered, then it waits for poll
        await c.poll(1.0)
        await trio.sleep(5)
        assert len(pulls(tap)) == 3
        got = await drain(c, 95)
    assert len(got) == 95


async def test_reassign_stops_the_old_queue_and_starts_the_new(cluster, tap, autojump_clock):
    await fill(cluster, 0, "a0")
    await fill(cluster, 1, "b0")
    async with consumer(cluster, tap, consume_from="FIRST_OFFSET") as c:
        c.assign([mq(0)])
        assert await drain(c, 1) == ["a0"]
        c.assign([mq(1)])
        assert c.assignment() == frozenset({mq(1)})
        assert await drain(c, 1) == ["b0"]
        await trio.testing.wait_all_tasks_blocked()
        n = len([r for r in pulls(tap) if r.ext_fields["queueId"] == "0"])
        await fill(cluster, 0, "a1")
        assert await c.poll(3.0) == []
        assert len([r for r in pulls(tap) if r.ext_fields["queueId"] == "0"]) == n


async def test_broker_down_then_back_loses_nothing(cluster, tap, autojump_clock):
    async with consumer(cluster, tap, consume_from="FIRST_OFFSET") as c:
        tap.refused.add(cluster.addr())  # down for the consumer (the producer still reaches it)
        c.assign([mq(0)])
        assert await c.poll(3.0) == []
        await fill(cluster, 0, "x", "y")
        tap.refused.clear()
        assert await drain(c, 2) == ["x", "y"]


async def test_assign_before_open_and_misuse_errors(cluster, tap, autojump_clock):
    await fill(cluster, 0, "a")
    c = consumer(cluster, tap, consume_from="FIRST_OFFSET")
    c.assign([mq(0)])
    with pytest.raises(ClientError, match="not open"):
        await c.poll(1.0)
    async with c:
        assert await drain(c, 1) == ["a"]
        with pytest.raises(ClientError):
            c.assign(["T:0"])  # type: ignore[list-item]  # not a MessageQueue, on purpose
    with pytest.raises(ClientError, match="consume_from"):
        LitePullConsumer(G, cluster.namesrv, consume_from="NEWEST")


async def test_fetch_queues_and_timestamp_start(cluster, tap, autojump_clock):
    await fill(cluster, 0, "a")
    with pytest.raises(ClientError, match="consume_timestamp_ms"):
        consumer(cluster, tap, consume_from="TIMESTAMP")
    async with consumer(cluster, tap, consume_from="TIMESTAMP", consume_timestamp_ms=1) as c:
        assert await c.fetch_queues("T") == [mq(0), mq(1)]
        no_offset(cluster, tap)
        # a broker without SEARCH_OFFSET: the error is retried, never fatal ...
        search = {RequestCode.SEARCH_OFFSET_BY_TIMESTAMP}
        tap.fail(cluster.addr(), ResponseCode.REQUEST_CODE_NOT_SUPPORTED, requests=search)
        c.assign([mq(0)])
        # ... and the next try starts from the time: everything stored since 1 ms
        assert await drain(c, 1) == ["a"]
        assert len(tap.requests(search)) == 2


async def test_an_unassigned_queue_still_commits_what_poll_handed_out(cluster, tap, autojump_clock):
    await fill(cluster, 0, *[f"m{i}" for i in range(6)])
    async with consumer(cluster, tap, consume_from="FIRST_OFFSET", auto_commit=False) as c:
        c.assign([mq(0)])
        got = await drain(c, 6)
        c.assign([])  # the queue leaves before any commit (Java persists it on the way out)
        await c.commit()
        assert committed(cluster)[0] == len(got) == 6
