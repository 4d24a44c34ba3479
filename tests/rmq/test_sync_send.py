"""rmq.sync's plain send on the caller's thread (rmq/sync_send.py), against real servers on TCP."""

from __future__ import annotations

import socket
import threading

import pytest

from common.model import MessageQueue
from rmq import Message, SendStatus, sync
from rmq.portal import get_portal


@pytest.fixture
def cluster(portal_tcp_cluster):
    portal_tcp_cluster.call(portal_tcp_cluster.create_topic, "T", 2)
    return portal_tcp_cluster


@pytest.fixture
def portal_runs(monkeypatch):
    """How many calls crossed into the portal thread."""
    portal = get_portal()
    real = portal.run
    runs = [0]

    def counting(fn, *args):
        runs[0] += 1
        return real(fn, *args)

    monkeypatch.setattr(portal, "run", counting)
    return runs


def stored(cluster, topic="T"):
    return [m for q in (0, 1) for m in cluster.call(cluster.messages, topic, q)]


def test_plain_sends_stay_on_the_callers_thread(cluster, portal_runs):
    with sync.Producer("pg", cluster.namesrv) as p:
        first = p.send(Message("T", b"m0"))
        crossings = portal_runs[0]  # the route was fetched through the portal, once
        results = [p.send(Message("T", b"m%d" % i)) for i in range(1, 21)]
        assert portal_runs[0] == crossings
        # what does not fit the direct path still works, through the portal
        pinned = p.send(Message("T", b"pinned"), queue=MessageQueue("T", "broker-a", 1))
        assert portal_runs[0] == crossings + 1
    results = [first, *results, pinned]
    assert all(r.status is SendStatus.SEND_OK for r in results)
    assert {r.message_queue.queueId for r in results[:21]} == {0, 1}  # round robin
    bodies = {bytes(m.body): m for m in stored(cluster)}
    assert set(bodies) == {b"m%d" % i for i in range(21)} | {b"pinned"}
    for r in results:  # the msgId the caller got is the stored message's UNIQ_KEY
        body = b"pinned" if r is pinned else b"m%d" % results.index(r)
        assert bodies[body].properties["UNIQ_KEY"] == r.msg_id


def test_a_failed_direct_attempt_goes_on_through_the_portal_with_the_same_msg_id(
    cluster, monkeypatch
):
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    dead_addr = f"127.0.0.1:{dead.getsockname()[1]}"
    dead.close()  # nothing listens there: connection refused
    with sync.Producer("pg", cluster.namesrv) as p:
        assert p.send(Message("T", b"warm")).status is SendStatus.SEND_OK
        for route in p._direct._routes.values():
            route.masters = dict.fromkeys(route.masters, dead_addr)
        uniqs = []
        real_prepare = p._async._prepare

        def recording(msg, **kw):
            out = real_prepare(msg, **kw)
            uniqs.append(out[2])
            return out

        monkeypatch.setattr(p._async, "_prepare", recording)
        r = p.send(Message("T", b"retried"))
    assert r.status is SendStatus.SEND_OK
    assert uniqs == [r.msg_id]  # prepared once; the portal path sent the same message
    (m,) = [m for m in stored(cluster) if bytes(m.body) == b"retried"]
    assert m.properties["UNIQ_KEY"] == r.msg_id


def test_threads_share_the_direct_path(cluster):
    errors: list[BaseException] = []
    with sync.Producer("pg", cluster.namesrv) as p:

        def worker(n):
            try:
                for i in range(25):
                    assert p.send(Message("T", b"%d-%d" % (n, i))).status is SendStatus.SEND_OK
            except BaseException as exc:  # collected and asserted below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    assert sorted(bytes(m.body) for m in stored(cluster)) == sorted(
        b"%d-%d" % (n, i) for n in range(4) for i in range(25)
    )


def test_in_memory_networks_never_take_the_direct_path(portal_cluster):
    portal_cluster.call(portal_cluster.create_topic, "T", 2)
    with sync.Producer("pg", portal_cluster.namesrv, network=portal_cluster.network) as p:
        assert not p._async.over_tcp
        assert p.send(Message("T", b"x")).status is SendStatus.SEND_OK
        assert p._direct._routes == {}
