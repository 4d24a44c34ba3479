"""rmq.Admin's calls against a real in-process nameserver + broker (tcp_cluster).

Runtime info, group list, consume stats (lag), connections, topic stats, delete topic, and the
three ways to find a message (key, msgId / UNIQ_KEY, queue offset), checked against what was
produced. The fastjson `Map<MessageQueue, V>` parser is also checked on its own.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
import trio

from common.errors import ProtocolError, RemotingConnectError, TopicNotExistError
from common.model import MessageQueue
from rmq import Admin, Message, Producer, PullConsumer
from rmq.admin import MessageNotFoundError
from rmq.admin_api import QueueConsumeStats, parse_mq_map
from rmq.errors import ClientError

if TYPE_CHECKING:
    from rmq import SendResult

pytestmark = pytest.mark.integration


async def produce(ns: str, topic: str, n: int, **kw: Any) -> list[SendResult]:
    async with Producer("pg", ns) as p:
        return [await p.send(Message(topic, f"m{i}", **kw)) for i in range(n)]


async def wait_route(admin: Admin, topic: str) -> None:
    with trio.fail_after(10):
        while True:
            try:
                await admin.topic_route(topic)
                return
            except TopicNotExistError:
                await trio.sleep(0.02)


def test_mq_map_parses_fastjson_object_keys_and_strict_json():
    fast = (
        b'{"consumeTps":1.5,"offsetTable":{{"brokerName":"b","queueId":1,"topic":"T"}:'
        b'{"brokerOffset":9,"consumerOffset":4,"lastTimestamp":7},'
        b' {"brokerName":"b","queueId":0,"topic":"T"} : {"brokerOffset":2}}}'
    )
    others, entries = parse_mq_map(fast, "offsetTable")
    assert others == {"consumeTps": 1.5}
    assert entries == [
        (MessageQueue("T", "b", 1), {"brokerOffset": 9, "consumerOffset": 4, "lastTimestamp": 7}),
        (MessageQueue("T", "b", 0), {"brokerOffset": 2}),
    ]
    key = json.dumps({"topic": "T", "brokerName": "b", "queueId": 3})
    strict = json.dumps({"offsetTable": {key: {"maxOffset": 1}}}).encode()
    assert parse_mq_map(strict, "offsetTable")[1] == [(MessageQueue("T", "b", 3), {"maxOffset": 1})]
    assert parse_mq_map(b'{"offsetTable":{}}', "offsetTable") == ({}, [])
    for junk in (
        b"",
        b"[]",
        b'{"offsetTable":{1:2}}',
        b'{"offsetTable":{}} x',
        b'{"offsetTable":{{"topic":"T"}:{}}}',
    ):
        with pytest.raises(ProtocolError):
            parse_mq_map(junk, "offsetTable")


def test_lag_is_broker_minus_consumer_and_never_negative():
    mq = MessageQueue("T", "b", 0)
    assert QueueConsumeStats(mq, 10, 4, 0).lag == 6
    assert QueueConsumeStats(mq, 3, 5, 0).lag == 0


async def test_runtime_info_and_group_list(tcp_cluster):
    await produce(tcp_cluster.namesrv, "RtTopic", 3)
    async with PullConsumer("cg-list", tcp_cluster.namesrv) as c:
        for mq in await c.fetch_queues("RtTopic"):
            await c.pull(mq, 0)
    async with Admin(tcp_cluster.namesrv) as admin:
        info = await admin.broker_runtime_info(tcp_cluster.addr())
        groups = await admin.group_list()
        with pytest.raises(ClientError, match="not registered"):
            await admin.group_list("NoSuchCluster")
        with pytest.raises(RemotingConnectError):
            await admin.broker_runtime_info("127.0.0.1:1")
    assert int(info["msgPutTotalTodayNow"]) == 3
    assert info["brokerVersionDesc"]
    assert "cg-list" in groups and "TOOLS_CONSUMER" in groups
    assert groups == sorted(groups)


async def test_consume_stats_reports_per_queue_lag_and_total(tcp_cluster):
    results = await produce(tcp_cluster.namesrv, "LagTopic", 10)
    per_queue: dict[int, int] = {}
    for r in results:
        per_queue[r.message_queue.queueId] = per_queue.get(r.message_queue.queueId, 0) + 1
    consumed_mq = results[0].message_queue
    async with PullConsumer("cg-lag", tcp_cluster.namesrv) as c:
        pulled = await c.pull(consumed_mq, 0, max_nums=1)
        await c.commit_offset(consumed_mq, 1)
    consumed_at = pulled.messages[0].store_timestamp
    async with Admin(tcp_cluster.namesrv) as admin:
        stats = await admin.consume_stats("cg-lag", "LagTopic")
        all_topics = await admin.consume_stats("cg-lag")
        with pytest.raises(TopicNotExistError):
            await admin.consume_stats("cg-lag", "NoSuchTopic")
    assert stats.group == "cg-lag"
    assert [q.queue.queueId for q in stats.queues] == sorted(q.queue.queueId for q in stats.queues)
    by_q = {q.queue.queueId: q for q in stats.queues}
    for qid, n in per_queue.items():
        expected_consumer = 1 if qid == consumed_mq.queueId else 0
        assert by_q[qid].broker_offset == n
        assert by_q[qid].consumer_offset == expected_consumer
        assert by_q[qid].lag == n - expected_consumer
    assert by_q[consumed_mq.queueId].last_timestamp == consumed_at
    assert stats.lag == 9 and stats.broker_offset == 10 and stats.consumer_offset == 1
    assert all_topics.topics() == ["LagTopic"] and all_topics.lag == 9


async def test_consumer_connections_empty_when_no_push_consumer(tcp_cluster):
    async with Admin(tcp_cluster.namesrv) as admin:
        assert await admin.consumer_connections("nobody-home") == []


async def test_consumer_connections_lists_a_heartbeating_client(tcp_cluster):
    from common.model import ConsumerData, HeartbeatData, SubscriptionData
    from common.remoting.codes import RequestCode
    from common.remoting.command import RemotingCommand
    from common.serde import to_json

    heartbeat = HeartbeatData(
        clientID="127.0.0.1@test-1",
        consumerDataSet=[
            ConsumerData(
                groupName="cg-online",
                subscriptionDataSet=[SubscriptionData(topic="HbTopic", subString="*")],
            )
        ],
    )
    async with Admin(tcp_cluster.namesrv) as admin:
        resp = await admin.client.remoting.invoke(
            tcp_cluster.addr(),
            RemotingCommand.request(RequestCode.HEART_BEAT, body=to_json(heartbeat)),
            3.0,
        )
        assert resp.code == 0, resp.remark
        conns = await admin.consumer_connections("cg-online")
    assert [c.client_id for c in conns] == ["127.0.0.1@test-1"]
    assert conns[0].subscriptions == {"HbTopic": "*"}
    assert conns[0].message_model and conns[0].consume_type


async def test_topic_stats_min_max_and_last_update(tcp_cluster):
    results = await produce(tcp_cluster.namesrv, "StatTopic", 6)
    async with Admin(tcp_cluster.namesrv) as admin:
        stats = await admin.topic_stats("StatTopic")
        with pytest.raises(TopicNotExistError):
            await admin.topic_stats("NoSuchTopic")
    assert sum(q.max_offset for q in stats) == 6
    assert all(q.min_offset == 0 for q in stats)
    newest: dict[int, int] = {}
    async with PullConsumer("cg-stat", tcp_cluster.namesrv) as c:
        for q in stats:
            if q.max_offset:
                r = await c.pull(q.queue, q.max_offset - 1)
                newest[q.queue.queueId] = r.messages[-1].store_timestamp
    for q in stats:
        assert q.last_update_timestamp == newest.get(q.queue.queueId, 0)
    assert {r.message_queue.queueId for r in results} == set(newest)


async def test_delete_topic_removes_route_and_broker_config(tcp_cluster):
    async with Admin(tcp_cluster.namesrv) as admin:
        await admin.create_topic("DelTopic", queues=2)
        await wait_route(admin, "DelTopic")
        deleted = await admin.delete_topic("DelTopic")
        assert deleted == [tcp_cluster.addr()]
        with pytest.raises(TopicNotExistError):
            await admin.topic_route("DelTopic")
        assert "DelTopic" not in await admin.topic_list()
        with pytest.raises(TopicNotExistError):
            await admin.delete_topic("DelTopic")
        # the broker's own table no longer has it: stats of it are refused
        with pytest.raises(TopicNotExistError):
            await admin._admin_api.topic_stats(tcp_cluster.addr(), "DelTopic", timeout=3)


async def test_query_by_key_finds_exactly_the_keyed_messages(tcp_cluster):
    async with Producer("pg", tcp_cluster.namesrv) as p:
        a = [
            await p.send(Message("KeyTopic", f"a{i}", keys=["order-1", f"x{i}"])) for i in range(3)
        ]
        await p.send(Message("KeyTopic", "b", keys="order-2", tags="TagB"))
    async with Admin(tcp_cluster.namesrv) as admin:
        with trio.fail_after(5):  # the index is written by the reput task, right after the put
            while True:
                found = await admin.query_message_by_key("KeyTopic", "order-1")
                if len(found) >= 3:
                    break
                await trio.sleep(0.02)
        assert await admin.query_message_by_key("KeyTopic", "order-3") == []
        assert len(await admin.query_message_by_key("KeyTopic", "order-1", max_num=2)) == 2
        with pytest.raises(TopicNotExistError):
            await admin.query_message_by_key("NoSuchTopic", "k")
    assert [m.body for m in found] == [b"a0", b"a1", b"a2"]
    assert [m.uniq_key for m in found] == [r.msg_id for r in a]


async def test_view_message_by_offset_id_and_by_uniq_key(tcp_cluster):
    async with Producer("pg", tcp_cluster.namesrv) as p:
        r = await p.send(
            Message("ViewTopic", "hello", tags="T1", keys="k1", properties={"color": "red"})
        )
    async with Admin(tcp_cluster.namesrv) as admin:
        by_offset = await admin.view_message(r.offset_msg_id)
        by_offset_lower = await admin.view_message(r.offset_msg_id.lower())
        with trio.fail_after(5):
            while True:
                try:
                    by_uniq = await admin.view_message(r.msg_id, "ViewTopic")
                    break
                except MessageNotFoundError:
                    await trio.sleep(0.02)
        with pytest.raises(ClientError, match="give its topic"):
            await admin.view_message(r.msg_id)
        with pytest.raises(ClientError, match="malformed msgId"):
            await admin.view_message("not-an-id")
        with pytest.raises(MessageNotFoundError):
            await admin.view_message("0" * 32, "ViewTopic")
    for m in (by_offset, by_offset_lower, by_uniq):
        assert (m.topic, m.body, m.tags, m.keys) == ("ViewTopic", b"hello", "T1", "k1")
        assert m.properties["color"] == "red"
        assert m.msg_id == r.offset_msg_id and m.uniq_key == r.msg_id


async def test_message_at_queue_offset(tcp_cluster):
    results = await produce(tcp_cluster.namesrv, "AtTopic", 5)
    target = results[3]
    async with Admin(tcp_cluster.namesrv) as admin:
        m = await admin.message_at(target.message_queue, target.queue_offset)
        with pytest.raises(MessageNotFoundError, match="offset 99"):
            await admin.message_at(target.message_queue, 99)
        with pytest.raises(ClientError, match=">= 0"):
            await admin.message_at(target.message_queue, -1)
        with pytest.raises(TopicNotExistError):
            await admin.message_at(MessageQueue("NoSuchTopic", "broker-a", 0), 0)
    assert m.uniq_key == target.msg_id and m.body == b"m3"
