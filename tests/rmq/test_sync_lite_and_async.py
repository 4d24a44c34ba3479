"""rmq.sync beyond the basics: LitePullConsumer, ordered sends, send_async with callbacks in
worker threads, and more Admin calls; against the real servers on
the portal thread (portal_cluster)."""

from __future__ import annotations

import threading
import time

import pytest

from common.errors import MessageIllegalError
from common.model import MessageQueue
from common.remoting.codes import ResponseCode
from rmq import Message, SendStatus, sync
from rmq.errors import ClientError, InvalidMessageError
from rmq.producer import select_by_hash

MQ0 = MessageQueue("T", "broker-a", 0)
MQ1 = MessageQueue("T", "broker-a", 1)


@pytest.fixture
def cluster(portal_cluster):
    portal_cluster.call(portal_cluster.create_topic, "T", 2)
    return portal_cluster


def client(cls, cluster, *args, network=None, **kw):
    """A sync client of ``cls`` on ``cluster`` (through ``network``, default the cluster's)."""
    return cls(*args, cluster.namesrv, network=network or cluster.network, **kw)


def test_lite_pull_consumer_blocking_assign_poll_seek_commit(cluster):
    with client(sync.Producer, cluster, "pg") as p:
        for i in range(4):
            p.send(Message("T", f"a{i}"), queue=MQ0)
        p.send(Message("T", "b0"), queue=MQ1)
    c = client(sync.LitePullConsumer, cluster, "lg", consume_from="FIRST_OFFSET")
    c.assign([MQ0])  # before open: taken when the consumer starts
    with c:
        got: list[bytes] = []
        while len(got) < 4:
            got += [m.body for m in c.poll(2.0)]
        assert got == [b"a0", b"a1", b"a2", b"a3"]
        c.assign([MQ0, MQ1])  # while open: starts prefetching the new queue
        assert c.assignment() == {MQ0, MQ1}
        assert [m.body for m in c.poll(3.0)] == [b"b0"]
        c.seek_to_begin(MQ0)
        again = c.poll(3.0)
        assert [m.body for m in again] == [b"a0", b"a1", b"a2", b"a3"]
        c.seek(MQ0, 1)
        c.commit()
        assert c.committed(MQ0) == 1 and c.committed(MQ1) == 1
        with pytest.raises(ClientError, match="illegal"):
            c.seek(MQ0, 100)
    # seek moved the committed offset back, and the exit kept it there
    assert cluster.call(cluster.offsets, "lg", "T")[0] == 1


def test_send_orderly_and_selector_from_sync_code(cluster):
    with client(sync.Producer, cluster, "pg") as p:
        rs = [p.send_orderly(Message("T", f"m{i}"), "user-42") for i in range(3)]
        picked = p.send(Message("T", b"x"), selector=lambda mqs, m, arg: mqs[arg], arg=1)
    queues = [MQ0, MQ1]
    assert {r.message_queue for r in rs} == {select_by_hash(queues, Message("T", b"x"), "user-42")}
    assert [r.queue_offset for r in rs] == sorted(r.queue_offset for r in rs)
    assert picked.message_queue == MQ1


def test_send_async_runs_callbacks_in_worker_threads_and_close_waits(cluster):
    main = threading.get_ident()
    seen = []
    lock = threading.Lock()

    def on_result(r):
        with lock:
            seen.append(("ok", r.status, threading.get_ident() != main))

    def on_error(exc):
        with lock:
            seen.append(("error", type(exc), threading.get_ident() != main))

    p = client(sync.Producer, cluster, "pg")
    with pytest.raises(ClientError, match="not open"):
        p.send_async(Message("T", b"x"), on_result)
    with p:
        futs = [p.send_async(Message("T", f"m{i}"), on_result, on_error) for i in range(5)]
        with pytest.raises(InvalidMessageError):
            p.send_async(Message("T", b""), on_result)
    assert all(f.done() for f in futs)  # close() waited for every send in flight
    assert sorted(seen, key=str) == [("ok", SendStatus.SEND_OK, True)] * 5

    tap = cluster.tap()
    tap.fail(cluster.addr(), ResponseCode.MESSAGE_ILLEGAL)
    with client(sync.Producer, cluster, "pg", network=tap) as p:
        fut = p.send_async(Message("T", b"bad"), on_result, on_error)
        with pytest.raises(MessageIllegalError):
            fut.result(timeout=5)
    assert seen[-1] == ("error", MessageIllegalError, True)


def test_admin_master_addrs_blocks_too(cluster):
    with sync.Admin(cluster.namesrv, network=cluster.network) as admin:
        assert admin.master_addrs() == [cluster.addr()]


def test_push_consumer_plain_listener_runs_in_worker_threads(cluster):
    from rmq.push_consumer import ConsumeFromWhere

    with client(sync.Producer, cluster, "pg") as p:
        for i in range(5):
            p.send(Message("T", f"m{i}"))
    got: list[bytes] = []
    threads: set[int] = set()
    done = threading.Event()

    def listener(msgs):  # returns None: success
        threads.add(threading.get_ident())
        got.extend(m.body for m in msgs)
        if len(got) >= 5:
            done.set()

    c = client(sync.PushConsumer, cluster, "sg", consume_from=ConsumeFromWhere.FIRST_OFFSET)
    c.subscribe("T")
    c.register_listener(listener)
    with c:
        assert done.wait(30)
        assert {MQ0, MQ1} <= c.assigned_queues()  # plus %RETRY%sg, subscribed by itself
        # the consume service advances a queue's offset after the listener returns: give the
        # last call that moment, or the exit would (rightly) persist the offset before it
        time.sleep(0.5)
    assert sorted(got) == [f"m{i}".encode() for i in range(5)]
    assert threading.get_ident() not in threads
    # the exit persisted the consumed offsets on the broker
    offsets = cluster.call(cluster.offsets, "sg", "T")
    assert offsets.get(0, 0) + offsets.get(1, 0) == 5
