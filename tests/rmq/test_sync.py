"""rmq.sync: the blocking twins run the async clients in a portal thread, here against the real
servers on that same thread (portal_cluster)."""

from __future__ import annotations

import threading

import pytest

from common.errors import MessageIllegalError
from common.model import MessageQueue
from common.remoting.codes import ResponseCode
from rmq import Message, PullStatus, SendStatus, sync
from rmq.errors import ClientError, NoRouteInfoError


@pytest.fixture
def cluster(portal_cluster):
    portal_cluster.call(portal_cluster.create_topic, "T", 2)
    return portal_cluster


def test_produce_pull_and_offsets_from_plain_threads(cluster):
    ns, net = cluster.namesrv, cluster.network
    with sync.Producer("pg", ns, network=net) as p:
        results = [
            p.send(Message("T", f"m{i}"), queue=MessageQueue("T", "broker-a", 0)) for i in range(3)
        ]
        batch = p.send_batch([Message("T", "b0"), Message("T", "b1")])
    assert all(r.status is SendStatus.SEND_OK for r in results)
    assert len(batch.msg_id.split(",")) == 2
    with sync.PullConsumer("cg", ns, network=net) as c:
        queues = c.fetch_queues("T")
        r = c.pull(queues[0], 0)
        assert r.status is PullStatus.FOUND and [m.body for m in r.messages][:3] == [
            b"m0",
            b"m1",
            b"m2",
        ]
        c.commit_offset(queues[0], r.next_begin_offset)
        assert c.query_offset(queues[0]) == r.next_begin_offset
    with sync.Admin(ns, network=net) as admin:
        assert "T" in admin.topic_list()
        assert admin.consumer_offset("cg", queues[0]) == r.next_begin_offset


def test_errors_arrive_as_themselves(cluster):
    tap = cluster.tap()
    tap.fail(cluster.addr(), ResponseCode.MESSAGE_ILLEGAL)
    with sync.Producer("pg", cluster.namesrv, network=tap) as p:
        with pytest.raises(MessageIllegalError):
            p.send(Message("T", b"x"))
        cluster.call(cluster.stop_broker, "broker-a")
        # the refused connection sends the producer to the nameserver again, which forgot
        # the topic when its only broker unregistered
        with pytest.raises(NoRouteInfoError):
            p.send(Message("T", b"x"))


def test_calls_from_several_threads_share_one_producer(cluster):
    errors: list[BaseException] = []
    with sync.Producer("pg", cluster.namesrv, network=cluster.network) as p:

        def worker():
            try:
                for _ in range(20):
                    p.send(Message("T", b"x"))
            except BaseException as exc:  # collected and asserted below
                errors.append(exc)

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    assert sum(len(cluster.call(cluster.messages, "T", q)) for q in (0, 1)) == 80


def test_not_open_and_double_open_are_client_errors(cluster):
    p = sync.Producer("pg", cluster.namesrv, network=cluster.network)
    with pytest.raises(ClientError, match="not open"):
        p.send(Message("T", b"x"))
    p.open()
    try:
        with pytest.raises(ClientError, match="already open"):
            p.open()
    finally:
        p.close()
    p.close()  # closing twice is harmless
