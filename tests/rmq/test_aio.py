"""rmq.aio: a real asyncio loop (asyncio.run in plain test functions) driving the Trio
clients on the portal thread, against the real servers on that thread (portal_cluster)."""

from __future__ import annotations

import asyncio
import threading

import pytest
import trio

from common.errors import MessageIllegalError
from common.model import MessageQueue
from common.remoting.codes import ResponseCode
from rmq import Message, PullStatus, SendStatus, aio
from rmq.errors import ClientError, InvalidMessageError
from rmq.portal import get_portal
from rmq.producer import select_by_hash

MQ0 = MessageQueue("T", "broker-a", 0)


@pytest.fixture
def broker_fields():
    # a failed consume comes back after delay level 3: at once here (10 s by default), on the
    # real clock
    return {"store": {"message_delay_level": "0s 0s 0s 0s"}}


@pytest.fixture
def cluster(portal_cluster):
    portal_cluster.call(portal_cluster.create_topic, "T", 2)
    return portal_cluster


def client(cls, cluster, *args, network=None, **kw):
    """An aio client of ``cls`` on ``cluster`` (through ``network``, default the cluster's)."""
    return cls(*args, cluster.namesrv, network=network or cluster.network, **kw)


def test_produce_orderly_batch_and_pull_from_asyncio(cluster):
    async def main():
        async with client(aio.Producer, cluster, "pg") as p:
            results = await asyncio.gather(*(p.send(Message("T", f"m{i}")) for i in range(10)))
            ordered = [await p.send_orderly(Message("T", f"o{i}"), "key-1") for i in range(3)]
            batch = await p.send_batch([Message("T", "b0"), Message("T", "b1")], queue=MQ0)
        async with client(aio.PullConsumer, cluster, "cg") as c:
            queues = await c.fetch_queues("T")
            found = [await c.pull(q, 0, 64) for q in queues]
        return results, ordered, batch, queues, found

    results, ordered, batch, queues, found = asyncio.run(main())
    assert all(r.status is SendStatus.SEND_OK for r in results)
    assert len({r.msg_id for r in results}) == 10
    assert {r.message_queue for r in ordered} == {
        select_by_hash(queues, Message("T", b"x"), "key-1")
    }
    assert batch.message_queue == MQ0
    assert all(r.status is PullStatus.FOUND for r in found)
    assert sum(len(r.messages) for r in found) == 15


def test_errors_arrive_as_themselves_and_misuse_is_a_client_error(cluster):
    tap = cluster.tap()
    tap.fail(cluster.addr(), ResponseCode.MESSAGE_ILLEGAL)

    async def main():
        p = client(aio.Producer, cluster, "pg", network=tap)
        with pytest.raises(ClientError, match="not open"):
            await p.send(Message("T", b"x"))
        async with p:
            with pytest.raises(MessageIllegalError) as info:
                await p.send(Message("T", b"x"))
            assert not info.value.retriable
            with pytest.raises(InvalidMessageError):
                await p.send(Message("T", b""))
            with pytest.raises(ClientError, match="already open"):
                await p.__aenter__()
        # a user exception leaves `async with` unchanged, and the client still closes
        with pytest.raises(KeyError):
            async with client(aio.Producer, cluster, "pg"):
                raise KeyError("mine")

    asyncio.run(main())


def test_cancelling_the_asyncio_await_cancels_the_trio_task(cluster):
    events = []

    async def trio_side():
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            events.append("trio task cancelled")
            raise

    async def main():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(aio._bridge(trio_side), 0.2)

    asyncio.run(main())
    # the cancellation travels to the portal thread: wait for it there
    fut = get_portal().submit(trio.sleep, 0.1)
    fut.result(timeout=5)
    assert events == ["trio task cancelled"]


def test_lite_pull_from_asyncio_assign_seek_poll_commit(cluster):
    async def main():
        async with client(aio.Producer, cluster, "pg") as p:
            for i in range(5):
                await p.send(Message("T", f"m{i}"), queue=MQ0)
        async with client(
            aio.LitePullConsumer, cluster, "lg", consume_from="FIRST_OFFSET", auto_commit=False
        ) as c:
            c.assign([MQ0])
            got: list[bytes] = []
            while len(got) < 5:
                got += [m.body for m in await c.poll(2.0)]
            await c.seek(MQ0, 3)
            again = await c.poll(2.0)
            await c.commit()
            return got, [m.body for m in again], await c.committed(MQ0)

    got, again, committed = asyncio.run(main())
    assert got == [f"m{i}".encode() for i in range(5)]
    assert again == [b"m3", b"m4"]
    assert committed == 5


def test_send_async_callbacks_run_on_the_loop_and_exit_waits_for_them(cluster):
    tap = cluster.tap()

    async def main():
        loop_thread = threading.get_ident()
        seen = []

        async def on_error(exc):
            seen.append(("error", type(exc), threading.get_ident() == loop_thread))

        async with client(aio.Producer, cluster, "pg", network=tap) as p:
            first = p.send_async(
                Message("T", b"a"),
                lambda r: seen.append(("ok", r.status, threading.get_ident() == loop_thread)),
            )
            assert not first.done()  # send_async returned before the send finished
            assert (await first).status is SendStatus.SEND_OK
            tap.fail(cluster.addr(), ResponseCode.MESSAGE_ILLEGAL)
            t = p.send_async(Message("T", b"b"), seen.append, on_error)
            with pytest.raises(InvalidMessageError):
                p.send_async(Message("T", b""), seen.append)
        assert t.done()  # __aexit__ waited for the sends in flight
        assert isinstance(t.exception(), MessageIllegalError)
        return seen

    seen = asyncio.run(main())
    assert seen == [("ok", SendStatus.SEND_OK, True), ("error", MessageIllegalError, True)]


def test_admin_coroutines_are_mirrored(cluster):
    async def main():
        async with aio.Admin(cluster.namesrv, network=cluster.network) as admin:
            return await admin.topic_list(), await admin.max_offset(MQ0)

    topics, max_offset = asyncio.run(main())
    assert "T" in topics and max_offset == 0


def test_push_consumer_async_listener_runs_on_the_callers_loop(cluster):
    from rmq.push_consumer import ConsumeFromWhere, ConsumeStatus

    async def main():
        loop_thread = threading.get_ident()
        got, threads = [], set()
        done = asyncio.Event()
        failed_once = set()

        async def listener(msgs):
            await asyncio.sleep(0)  # a real asyncio coroutine, on this loop
            threads.add(threading.get_ident())
            for m in msgs:
                if m.body == b"m3" and m.body not in failed_once:
                    failed_once.add(m.body)
                    raise RuntimeError("first delivery of m3 fails")  # -> RECONSUME_LATER
                got.append(m.body)
            if len(set(got)) >= 6:
                done.set()
            return ConsumeStatus.SUCCESS

        async with client(aio.Producer, cluster, "pg") as p:
            for i in range(6):
                await p.send(Message("T", f"m{i}"))
        c = client(aio.PushConsumer, cluster, "ag", consume_from=ConsumeFromWhere.FIRST_OFFSET)
        c.subscribe("T")
        c.register_listener(listener)
        async with c:
            await asyncio.wait_for(done.wait(), 30)
            assert c.assigned_queues()
            assert c.client_id
        return got, threads, loop_thread, failed_once

    got, threads, loop_thread, failed_once = asyncio.run(main())
    assert threads == {loop_thread}
    assert failed_once == {b"m3"}  # the exception became a failed consume, not a crash
    assert set(got) == {f"m{i}".encode() for i in range(6)}  # m3 came back after its failure
