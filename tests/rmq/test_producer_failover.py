"""The producer rides through a failover: within its send timeout it waits for a route with a
master instead of raising (rmq/producer.py, "Riding through a failover").

A failover is played on the in-memory cluster by rewriting the nameserver's answers for the
topic: for a while the route names no master (a DLedger group between two leaders), or a
master address nothing listens on (the killed leader, still registered), then the real one.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING

import pytest
import trio

from common.errors import RemotingConnectError, ServiceNotAvailableError
from common.model import MessageQueue
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from common.serde import dumps, loads
from rmq import Message, Producer, SendStatus, aio, sync
from rmq.errors import BrokerNotFoundError, NoRouteInfoError, NoWritableMasterError
from tests.support.tap import SENDS

if TYPE_CHECKING:
    from tests.support.tap import Tap

DEAD = "127.0.0.1:1"  # no listener: connects are refused


class Failover:
    """Rewrites routes of `topic`: `master` is what brokerId 0 of every broker becomes
    (None: no master; "keep": the real one)."""

    def __init__(self, tap: Tap, namesrv: str, topic: str) -> None:
        self.master: str | None = "keep"
        self.asked = 0

        def edit(resp: RemotingCommand) -> None:
            route = loads(resp.body_bytes())
            if resp.code != ResponseCode.SUCCESS or not route.get("queueDatas"):
                return
            if {q["brokerName"] for q in route["queueDatas"]} != {"broker-a"}:
                return  # another topic's (TBW102's) route
            self.asked += 1
            if self.master == "keep":
                return
            for bd in route["brokerDatas"]:
                bd["brokerAddrs"].pop("0", None)
                if self.master is not None:
                    bd["brokerAddrs"]["0"] = self.master
            resp.body = dumps(route)

        tap.rewrite(namesrv, RequestCode.GET_ROUTEINFO_BY_TOPIC, edit)
        self.topic = topic

    async def recover_after(self, delay: float) -> None:
        await trio.sleep(delay)
        self.master = "keep"


@pytest.fixture
async def cluster(memory_cluster):
    await memory_cluster.create_topic("T", 2, nodes=("broker-a",))
    return memory_cluster


def sends(tap: Tap) -> list:
    return [r for _, r in tap.sent if r.code in SENDS]


@pytest.mark.parametrize("during", [None, DEAD], ids=["no-master", "dead-master"])
async def test_send_waits_for_the_new_master_and_succeeds(cluster, autojump_clock, during):
    tap = cluster.tap()
    failover = Failover(tap, cluster.namesrv, "T")
    async with Producer("pg", cluster.namesrv, network=tap) as p:
        assert (await p.send(Message("T", b"before"))).status is SendStatus.SEND_OK
        p.client.invalidate("T")  # as after the old leader's connection dropped
        failover.master = during
        asked = failover.asked
        async with trio.open_nursery() as nursery:
            nursery.start_soon(failover.recover_after, 1.5)
            start = trio.current_time()
            result = await p.send(Message("T", b"across"))
            waited = trio.current_time() - start
    assert result.status is SendStatus.SEND_OK
    assert result.message_queue.brokerName == "broker-a"
    # it waited for the route (latency, not an error), asking again every 50-100 ms
    assert 1.5 <= waited < 1.7
    assert 15 <= failover.asked - asked <= 32
    assert len(sends(tap)) == 2  # the dead master was never reached: only connects refused


async def test_a_chosen_queue_waits_for_its_broker(cluster, autojump_clock):
    # BrokerNotFoundError (no master known for the queue's broker), then found
    tap = cluster.tap()
    failover = Failover(tap, cluster.namesrv, "T")
    mq = MessageQueue("T", "broker-a", 1)
    async with Producer("pg", cluster.namesrv, network=tap) as p:
        failover.master = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(failover.recover_after, 0.7)
            result = await p.send(Message("T", b"x"), queue=mq)
    assert result.message_queue == mq and trio.current_time() >= 0.7


async def test_no_master_until_the_deadline_raises_the_cause_not_a_hang(cluster, autojump_clock):
    # a SYNC_MASTER master down with no slave taking writes: the send fails, after its timeout
    tap = cluster.tap()
    failover = Failover(tap, cluster.namesrv, "T")
    failover.master = None
    async with Producer("pg", cluster.namesrv, network=tap) as p:
        start = trio.current_time()
        with pytest.raises(NoWritableMasterError):
            await p.send(Message("T", b"x"), timeout=2.0)
        assert trio.current_time() - start == pytest.approx(2.0)
        failover.master = DEAD
        start = trio.current_time()
        with pytest.raises(RemotingConnectError):
            await p.send(Message("T", b"x"))  # the default 3 s send timeout
        assert trio.current_time() - start == pytest.approx(3.0)
    assert sends(tap) == []


async def test_a_refusing_store_is_retried_until_the_deadline(cluster, autojump_clock):
    # SERVICE_NOT_AVAILABLE stores nothing, so it does not use up the retries; with backoff
    # the number of tries stays bounded
    tap = cluster.tap()
    tap.fail(cluster.addr("broker-a"), ResponseCode.SERVICE_NOT_AVAILABLE, forever=True)
    async with Producer("pg", cluster.namesrv, network=tap, retry_times=2) as p:
        with pytest.raises(ServiceNotAvailableError):
            await p.send(Message("T", b"x"), timeout=1.0)
    assert trio.current_time() >= 1.0
    assert 5 <= len(sends(tap)) <= 12


async def test_other_brokers_take_the_send_at_once(memory_cluster, autojump_clock):
    # the failed master is left out of this send: with another broker there is no wait
    cluster = memory_cluster
    await cluster.start_broker("broker-b", broker_name="broker-b")
    await cluster.create_topic("T", 1)
    tap = cluster.tap()
    cluster.network.refused.add(cluster.broker("broker-a").port)
    async with Producer("pg", cluster.namesrv, network=tap) as p:
        for _ in range(4):
            start = trio.current_time()
            result = await p.send(Message("T", b"x"))
            assert result.message_queue.brokerName == "broker-b"
            assert trio.current_time() == start


def test_the_blocking_producer_rides_through_too(portal_cluster):
    portal_cluster.call(portal_cluster.create_topic, "T", 2)
    tap = portal_cluster.tap()
    failover = Failover(tap, portal_cluster.namesrv, "T")
    failover.master = None

    def recover() -> None:
        failover.master = "keep"

    with sync.Producer("pg", portal_cluster.namesrv, network=tap) as p:
        timer = threading.Timer(0.3, recover)
        timer.start()
        try:
            result = p.send(Message("T", b"x"))
        finally:
            timer.cancel()
    assert result.status is SendStatus.SEND_OK


def test_the_asyncio_producer_rides_through_too(portal_cluster):
    portal_cluster.call(portal_cluster.create_topic, "T", 2)
    tap = portal_cluster.tap()
    failover = Failover(tap, portal_cluster.namesrv, "T")
    failover.master = DEAD

    async def main() -> SendStatus:
        async with aio.Producer("pg", portal_cluster.namesrv, network=tap) as p:
            asyncio.get_running_loop().call_later(0.3, setattr, failover, "master", "keep")
            return (await p.send(Message("T", b"x"))).status

    assert asyncio.run(main()) is SendStatus.SEND_OK
    assert failover.asked >= 2  # the dead master's route, then the live one


async def test_a_read_only_topic_is_refused_at_once(cluster, autojump_clock):
    # no writable queue at all is the topic's configuration, not a failover: nothing to wait for
    tap = cluster.tap()

    def read_only(resp: RemotingCommand) -> None:
        route = loads(resp.body_bytes())
        for qd in route.get("queueDatas", []):
            qd["perm"] = 4
        resp.body = dumps(route)

    tap.rewrite(cluster.namesrv, RequestCode.GET_ROUTEINFO_BY_TOPIC, read_only)
    async with Producer("pg", cluster.namesrv, network=tap) as p:
        with pytest.raises(NoRouteInfoError) as info:
            await p.send(Message("T", b"x"))
    assert not isinstance(info.value, NoWritableMasterError)
    assert trio.current_time() == 0


async def test_an_ordered_send_waits_for_the_route_it_selects_from(cluster, autojump_clock):
    tap = cluster.tap()
    failover = Failover(tap, cluster.namesrv, "T")
    failover.master = None
    async with Producer("pg", cluster.namesrv, network=tap) as p:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(failover.recover_after, 0.6)
            result = await p.send_orderly(Message("T", b"x"), "key")
        assert trio.current_time() >= 0.6
        failover.master = None
        p.client.invalidate("T")
        start = trio.current_time()
        # the queue is selected from the queues known before; its broker has no master then
        with pytest.raises((NoWritableMasterError, BrokerNotFoundError)):
            await p.send_orderly(Message("T", b"y"), "key", timeout=1.0)
        assert trio.current_time() - start == pytest.approx(1.0)
    assert result.status is SendStatus.SEND_OK
