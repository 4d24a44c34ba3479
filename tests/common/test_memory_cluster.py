"""The real nameserver, broker and client in one process on the in-memory network (autojump)."""

from __future__ import annotations

import pytest
import trio

from common.remoting.client import open_remoting_client
from rmq import Admin, Message, Producer, PullConsumer
from rmq.pull_consumer import PullStatus
from tests.support.memory_network import MemoryNetwork


async def test_produce_and_pull_through_real_servers_without_sockets(
    memory_cluster, autojump_clock
):
    net, ns = memory_cluster.network, memory_cluster.namesrv
    async with Admin(ns, network=net) as admin:
        await admin.create_topic("Orders", broker_addr=memory_cluster.broker().addr, queues=2)
        async with open_remoting_client(network=net) as remoting:
            async with Producer("pg", ns, remoting=remoting) as producer:
                sent = [await producer.send(Message("Orders", b"m%d" % i)) for i in range(10)]
        assert {r.queue_offset for r in sent} <= set(range(10))
        got: list[bytes] = []
        async with PullConsumer("cg", ns, network=net) as consumer:
            for mq in await consumer.fetch_queues("Orders"):
                result = await consumer.pull(mq, 0, max_nums=32)
                if result.status is PullStatus.FOUND:
                    got.extend(m.body for m in result.messages)
        assert sorted(got) == sorted(b"m%d" % i for i in range(10))
    assert trio.current_time() < 60  # autojump: the whole exchange needed no real waiting


async def test_refused_and_cut_connections():
    net = MemoryNetwork()
    with pytest.raises(ConnectionRefusedError):
        await net.connect("127.0.0.1:1")
    bound = await net.listen("127.0.0.1", 0)
    assert net.listening(bound.port)
    client_end = await net.connect(f"127.0.0.1:{bound.port}")
    server_end = await bound.listeners[0].accept()
    await client_end.send_all(b"ping")
    assert await server_end.receive_some(10) == b"ping"
    assert net.peer_addr(server_end).startswith("127.0.0.1:")
    with pytest.raises(OSError):
        await net.listen("127.0.0.1", bound.port)  # in use
    net.refused.add(bound.port)
    with pytest.raises(ConnectionRefusedError):
        await net.connect(f"127.0.0.1:{bound.port}")
    await net.cut(bound.port)
    assert await server_end.receive_some(10) == b""  # the peer sees the connection end
    await bound.listeners[0].aclose()
    assert not net.listening(bound.port)
