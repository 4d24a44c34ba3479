"""Message trace through a real nameserver and broker in process: a traced producer and a
traced push consumer write Pub, SubBefore and SubAfter records to the trace topic, and
QUERY_MESSAGE on that topic by the message's msgId finds them all."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio

from common.message import MessageExt
from rmq import Admin, ConsumeFromWhere, Message, Producer, PushConsumer
from rmq.trace.encoder import MessageType, TraceContext, TraceType, decode

if TYPE_CHECKING:
    from tests.conftest import InProcessCluster

pytestmark = pytest.mark.timeout(30)


async def traces_of(
    cluster: InProcessCluster, msg_id: str, topic: str = "RMQ_SYS_TRACE_TOPIC"
) -> list[tuple[MessageExt, TraceContext]]:
    async with Admin(cluster.namesrv, network=cluster.network) as admin:
        found = await admin.query_message_by_key(topic, msg_id, 64)
    return [
        (m, c) for m in found for c in decode(m.body.decode()) if c.trace_beans[0].msg_id == msg_id
    ]


async def consume_one(cluster: InProcessCluster, *, orderly: bool = False, **kw: Any) -> list[str]:
    got: list[str] = []

    async def listener(msgs):
        got.extend(m.uniq_key or "" for m in msgs)

    c = PushConsumer(
        "cg",
        cluster.namesrv,
        network=cluster.network,
        consume_from=ConsumeFromWhere.FIRST_OFFSET,
        **kw,
    )
    c.subscribe("T")
    if orderly:
        c.register_orderly_listener(listener)
    else:
        c.register_listener(listener)
    async with c:
        with trio.fail_after(20):
            while not got:  # noqa: ASYNC110 (polling a plain list)
                await trio.sleep(0.1)
    return got


async def test_send_and_consume_are_traced(memory_cluster, autojump_clock):
    cluster = memory_cluster
    await cluster.create_topic("T", 1)
    async with Producer("pg", cluster.namesrv, network=cluster.network, enable_trace=True) as p:
        sent = await p.send(Message("T", b"hello", tags="TagA", keys="order-1"))
        untraced_before = p._send_tracer.dispatcher.discarded if p._send_tracer else -1
    assert untraced_before == 0
    assert await consume_one(cluster, enable_trace=True) == [sent.msg_id]

    found = await traces_of(cluster, sent.msg_id)
    kinds = sorted(c.trace_type.value for _, c in found)
    assert kinds == ["Pub", "SubAfter", "SubBefore"]
    by = {c.trace_type: (m, c) for m, c in found}
    m, pub = by[TraceType.Pub]
    bean = pub.trace_beans[0]
    assert (pub.group_name, bean.topic, bean.tags, bean.keys) == ("pg", "T", "TagA", "order-1")
    assert bean.offset_msg_id == sent.offset_msg_id and bean.body_length == 5
    assert bean.store_host == cluster.addr() and bean.msg_type is MessageType.Normal_Msg
    assert pub.success and pub.region_id == "DefaultRegion"
    # the trace message is keyed by the msgId and the message's keys
    assert sent.msg_id in (m.keys or "").split(" ") and "order-1" in (m.keys or "").split(" ")
    _, before = by[TraceType.SubBefore]
    _, after = by[TraceType.SubAfter]
    assert before.group_name == after.group_name == "cg"
    assert before.request_id == after.request_id and after.success
    # the trace messages are found by the message's business key as well
    async with Admin(cluster.namesrv, network=cluster.network) as admin:
        by_key = await admin.query_message_by_key("RMQ_SYS_TRACE_TOPIC", "order-1", 64)
    assert {x.commit_log_offset for x in by_key} == {x.commit_log_offset for x, _ in found}


async def test_custom_trace_topic_and_untraced_clients(memory_cluster, autojump_clock):
    cluster = memory_cluster
    await cluster.create_topic("T", 1)
    await cluster.create_topic("MyTrace", 1)
    async with Producer(
        "pg", cluster.namesrv, network=cluster.network, enable_trace=True, trace_topic="MyTrace"
    ) as p:
        traced = await p.send(Message("T", b"1"))
    async with Producer("pg2", cluster.namesrv, network=cluster.network) as p:
        plain = await p.send(Message("T", b"2"))
    assert [c.trace_type for _, c in await traces_of(cluster, traced.msg_id, "MyTrace")] == [
        TraceType.Pub
    ]
    assert await traces_of(cluster, plain.msg_id, "MyTrace") == []
    assert cluster.messages("MyTrace", 0) and "RMQ_SYS_TRACE_TOPIC" not in (
        cluster.broker().controller.topic_config_manager.table
    )


async def test_failed_listener_is_traced_as_failed(memory_cluster, autojump_clock):
    cluster = memory_cluster
    await cluster.create_topic("T", 1)
    async with Producer("pg", cluster.namesrv, network=cluster.network) as p:
        sent = await p.send(Message("T", b"x"))
    calls = 0

    async def listener(msgs):
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("boom")

    c = PushConsumer(
        "cg",
        cluster.namesrv,
        network=cluster.network,
        consume_from=ConsumeFromWhere.FIRST_OFFSET,
        enable_trace=True,
    )
    c.subscribe("T")
    c.register_listener(listener)
    async with c:
        with trio.fail_after(60):
            while calls < 2:  # noqa: ASYNC110
                await trio.sleep(0.5)
    afters = sorted(
        (c for _, c in await traces_of(cluster, sent.msg_id) if c.trace_type is TraceType.SubAfter),
        key=lambda c: c.time_stamp,
    )
    assert [(a.success, a.context_code) for a in afters] == [(False, 2), (True, 0)]


async def _cluster(tmp_path: Path, nursery: trio.Nursery, **fields: Any) -> InProcessCluster:
    from tests.conftest import InProcessCluster
    from tests.support.memory_network import MemoryNetwork

    cluster = InProcessCluster(MemoryNetwork(), nursery, tmp_path)
    await cluster.start_namesrv()
    await cluster.start_broker(**fields)
    return cluster


async def test_trace_topic_enable_without_auto_create(tmp_path, nursery, autojump_clock):
    # RocketMQ's traceTopicEnable: the broker creates RMQ_SYS_TRACE_TOPIC itself
    cluster = await _cluster(
        tmp_path, nursery, auto_create_topic_enable=False, trace_topic_enable=True
    )
    await cluster.create_topic("T", 1)
    async with Producer("pg", cluster.namesrv, network=cluster.network, enable_trace=True) as p:
        sent = await p.send(Message("T", b"x"))
    assert [c.trace_type for _, c in await traces_of(cluster, sent.msg_id)] == [TraceType.Pub]


async def test_no_trace_topic_does_not_hurt_the_sends(tmp_path, nursery, autojump_clock):
    cluster = await _cluster(tmp_path, nursery, auto_create_topic_enable=False)
    await cluster.create_topic("T", 1)
    async with Producer("pg", cluster.namesrv, network=cluster.network, enable_trace=True) as p:
        for _ in range(5):
            await p.send(Message("T", b"x"))
        await trio.sleep(1)
        assert p._send_tracer is not None
        dispatcher = p._send_tracer.dispatcher
        assert dispatcher.send_failures >= 1 and dispatcher.sent_messages == 0
    assert len(cluster.messages("T", 0)) == 5


async def test_traces_another_client_wrote_are_read(memory_cluster, autojump_clock):
    # a Java trace producer's message as it reaches the broker: SEND_MESSAGE_V2 with the
    # batch's records as body and every msgId / key in KEYS (space-separated)
    from common.message_properties import encode_properties
    from common.remoting.client import open_remoting_client
    from common.remoting.codes import ResponseCode
    from tests.support.wire import send_v2

    cluster = memory_cluster
    C, F = "\x01", "\x02"
    mid, other = "AC1415116D1418B4AAC217FE1B4E0000", "AC1415116D1418B4AAC217FE1B4E0001"
    body = (
        f"Pub{C}1700000000000{C}DefaultRegion{C}PID-java{C}Orders{C}{mid}{C}TagA{C}k1{C}"
        f"10.0.0.5:10911{C}26{C}7{C}0{C}0A00000500002A9F0000000000002329{C}true{F}"
        f"Pub{C}1700000000001{C}DefaultRegion{C}PID-java{C}Orders{C}{other}{C}{C}{C}"
        f"10.0.0.5:10911{C}1{C}2{C}0{C}0A00000500002A9F000000000000232A{C}true{F}"
        f"SubBefore{C}1700000000050{C}DefaultRegion{C}CID-java{C}REQ{C}{mid}{C}0{C}k1{F}"
        f"SubAfter{C}REQ{C}{mid}{C}12{C}true{C}k1{C}0{C}1700000000062{C}CID-java{F}"
    ).encode()
    cmd = send_v2("RMQ_SYS_TRACE_TOPIC", 0, body, group="_INNER_TRACE_PRODUCER-PID-java")
    cmd.ext_fields["i"] = encode_properties({"KEYS": f"{mid} k1 {other}", "WAIT": "true"})
    async with open_remoting_client(network=cluster.network) as raw:
        r = await raw.invoke(cluster.addr(), cmd)
    assert r.code == ResponseCode.SUCCESS
    async with Admin(cluster.namesrv, network=cluster.network) as admin:
        views = await admin.query_trace(mid)
        assert [v.msg_id for v in await admin.query_trace(other)] == [other]
    assert [(v.trace_type, v.group, v.cost_time) for v in views] == [
        (TraceType.Pub, "PID-java", 7),
        (TraceType.SubBefore, "CID-java", 0),
        (TraceType.SubAfter, "CID-java", 12),
    ]
    pub = views[0]
    assert (pub.topic, pub.tags, pub.keys, pub.store_host) == (
        "Orders",
        "TagA",
        "k1",
        "10.0.0.5:10911",
    )
    # the client is the trace message's born host: the raw connection that wrote it
    assert pub.client_host.startswith("127.0.0.1:") and pub.client_host == views[2].client_host


async def test_orderly_consumption_is_traced(memory_cluster, autojump_clock):
    cluster = memory_cluster
    await cluster.create_topic("T", 1)
    async with Producer("pg", cluster.namesrv, network=cluster.network) as p:
        sent = await p.send(Message("T", b"x"))
    assert await consume_one(cluster, orderly=True, enable_trace=True) == [sent.msg_id]
    kinds = sorted(c.trace_type.value for _, c in await traces_of(cluster, sent.msg_id))
    assert kinds == ["SubAfter", "SubBefore"]  # the producer was not traced
