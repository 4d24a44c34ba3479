"""rmq.sync: the blocking twins run the async clients in a portal thread."""

from __future__ import annotations

import threading

import pytest

from common.errors import MessageIllegalError, RemotingConnectError
from common.model import MessageQueue
from rmq import Message, PullStatus, SendStatus, sync
from rmq.errors import ClientError
from rmq.testing import FakeCluster, FakeRemoting

NS = "127.0.0.1:9876"


@pytest.fixture
def cluster() -> FakeCluster:
    c = FakeCluster()
    c.add_broker("broker-a", "127.0.0.1:10911")
    c.create_topic("T", 2)
    return c


def test_produce_pull_and_offsets_from_plain_threads(cluster):
    remoting = FakeRemoting(cluster)
    with sync.Producer("pg", NS, remoting=remoting) as p:
        results = [p.send(Message("T", f"m{i}"), queue=MessageQueue("T", "broker-a", 0))
                   for i in range(3)]  # fmt: skip
        batch = p.send_batch([Message("T", "b0"), Message("T", "b1")])
    assert all(r.status is SendStatus.SEND_OK for r in results)
    assert len(batch.msg_id.split(",")) == 2
    with sync.PullConsumer("cg", NS, remoting=remoting) as c:
        queues = c.fetch_queues("T")
        r = c.pull(queues[0], 0)
        assert r.status is PullStatus.FOUND and [m.body for m in r.messages][:3] == [
            b"m0", b"m1", b"m2"
        ]  # fmt: skip
        c.commit_offset(queues[0], r.next_begin_offset)
        assert c.query_offset(queues[0]) == r.next_begin_offset
    with sync.Admin(NS, remoting=remoting) as admin:
        assert "T" in admin.topic_list()
        assert admin.consumer_offset("cg", queues[0]) == r.next_begin_offset


def test_errors_arrive_as_themselves(cluster):
    cluster.brokers[0].fail_next_sends = [13]
    with sync.Producer("pg", NS, remoting=FakeRemoting(cluster)) as p:
        with pytest.raises(MessageIllegalError):
            p.send(Message("T", b"x"))
        cluster.brokers[0].down = True
        with pytest.raises(RemotingConnectError):
            p.send(Message("T", b"x"))


def test_calls_from_several_threads_share_one_producer(cluster):
    errors: list[BaseException] = []
    with sync.Producer("pg", NS, remoting=FakeRemoting(cluster)) as p:

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
    assert sum(len(q) for q in cluster.brokers[0].queues.values()) == 80


def test_not_open_and_double_open_are_client_errors(cluster):
    p = sync.Producer("pg", NS, remoting=FakeRemoting(cluster))
    with pytest.raises(ClientError, match="not open"):
        p.send(Message("T", b"x"))
    p.open()
    try:
        with pytest.raises(ClientError, match="already open"):
            p.open()
    finally:
        p.close()
    p.close()  # closing twice is harmless
