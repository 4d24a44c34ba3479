"""PushConsumer against the in-memory cluster: delivery, tags, retry/DLQ, orderly locks,
flow control, broadcasting offsets, shutdown, broker->client requests."""

from __future__ import annotations

import pytest
import trio

from common.message import decode_record
from common.model import MessageQueue
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from common.serde import loads
from rmq import (
    ConsumeFromWhere,
    ConsumeStatus,
    Message,
    MessageModel,
    OrderlyStatus,
    Producer,
    PushConsumer,
)
from rmq.errors import ClientError
from rmq.testing import FakeCluster, FakeRemoting

NS = "127.0.0.1:9876"


@pytest.fixture
def cluster() -> FakeCluster:
    c = FakeCluster()
    c.add_broker("broker-a", "127.0.0.1:10911")
    c.add_broker("broker-b", "127.0.0.1:10921")
    c.create_topic("T", 2)
    return c


async def produce(cluster, n: int, *, tags=None, topic="T", prefix="m") -> None:
    async with Producer("pg", NS, remoting=FakeRemoting(cluster)) as p:
        for i in range(n):
            tag = tags[i % len(tags)] if tags else None
            await p.send(Message(topic, f"{prefix}{i}".encode(), tags=tag))


def make(cluster, listener, *, expr="*", orderly=False, name="c1", **kw) -> PushConsumer:
    kw.setdefault("consume_from", ConsumeFromWhere.FIRST_OFFSET)
    c = PushConsumer("g", NS, remoting=FakeRemoting(cluster), instance_name=name, **kw)
    c.subscribe("T", expr)
    if orderly:
        c.register_orderly_listener(listener)
    else:
        c.register_listener(listener)
    return c


async def wait_for(pred, limit: float = 60.0) -> None:
    with trio.fail_after(limit):
        while not pred():  # noqa: ASYNC110 (polling a plain predicate)
            await trio.sleep(0.1)


async def test_every_message_once_and_offsets_committed(cluster, autojump_clock):
    await produce(cluster, 40)
    got: list[bytes] = []

    async def listener(msgs):
        got.extend(m.body for m in msgs)

    async with make(cluster, listener, consume_batch_max_size=3) as c:
        await wait_for(lambda: len(got) >= 40)
        await produce(cluster, 10, prefix="late")  # long polling wakes up for these
        await wait_for(lambda: len(got) >= 50)
        await trio.sleep(6)  # a persist round
        assert len(c.assigned_queues()) == 6  # 4 of T + the retry queue of each broker
    assert sorted(got) == sorted([f"m{i}".encode() for i in range(40)] +
                                 [f"late{i}".encode() for i in range(10)])  # fmt: skip
    committed = {
        (b.name, *k): v for b in cluster.brokers for k, v in b.offsets.items() if k[1] == "T"
    }
    assert sum(committed.values()) == 50  # every queue committed to its end
    # pulls after consumption carry the consumed offset (COMMIT_OFFSET bit, as Java)
    pulls = [r for b in cluster.brokers for r in b.requests if r.code == RequestCode.PULL_MESSAGE]
    assert any(
        int(r.ext_fields["sysFlag"]) & 0x1 and int(r.ext_fields["commitOffset"]) > 0 for r in pulls
    )
    # shutdown said goodbye: the group is empty on the brokers
    assert cluster.members("g") == []


async def test_tag_expression_filters_on_both_sides(cluster, autojump_clock):
    await produce(cluster, 30, tags=["a", "b", "c"])
    got: list[str] = []

    async def listener(msgs):
        got.extend(m.tags for m in msgs)

    async with make(cluster, listener, expr="a || c"):
        await wait_for(lambda: len(got) >= 20)
        await trio.sleep(2)
    assert sorted(set(got)) == ["a", "c"] and len(got) == 20
    pulls = [r for b in cluster.brokers for r in b.requests if r.code == RequestCode.PULL_MESSAGE]
    assert any(r.ext_fields["subscription"] == "a || c" for r in pulls)


async def test_failures_are_retried_with_the_original_topic_then_go_to_the_dlq(
    cluster, autojump_clock
):
    await produce(cluster, 1)
    seen: list[tuple[str, int]] = []

    async def listener(msgs):
        for m in msgs:
            seen.append((m.topic, m.reconsume_times))
        return ConsumeStatus.RECONSUME_LATER

    async with make(cluster, listener, max_reconsume_times=2):
        await wait_for(lambda: len(cluster.send_backs) >= 3)
        await trio.sleep(2)
    # first delivery, then two redeliveries from %RETRY%g shown under topic T
    assert seen == [("T", 0), ("T", 1), ("T", 2)]
    assert [t for _, _, t in cluster.send_backs] == ["%RETRY%g", "%RETRY%g", "%DLQ%g"]
    back = [r for b in cluster.brokers for r in b.requests
            if r.code == RequestCode.CONSUMER_SEND_MSG_BACK]  # fmt: skip
    assert {r.ext_fields["delayLevel"] for r in back} == {"0"}
    assert {r.ext_fields["maxReconsumeTimes"] for r in back} == {"2"}
    dlq = [decode_record(r) for b in cluster.brokers for r in b.messages("%DLQ%g", 0)]
    assert [m.body for m in dlq] == [b"m0"]


async def test_an_exception_counts_as_reconsume_later(cluster, autojump_clock):
    await produce(cluster, 1)
    calls = 0

    async def listener(msgs):
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("boom")

    async with make(cluster, listener):
        await wait_for(lambda: calls >= 2)
    assert [t for _, _, t in cluster.send_backs] == ["%RETRY%g"]


async def test_send_back_failure_reconsumes_locally_and_holds_the_offset(cluster, autojump_clock):
    await produce(cluster, 1)
    calls: list[float] = []

    async def listener(msgs):
        calls.append(trio.current_time())
        return ConsumeStatus.RECONSUME_LATER if len(calls) == 1 else None

    for b in cluster.brokers:
        b.refuse_send_back = True
    async with make(cluster, listener) as c:
        await wait_for(lambda: len(calls) >= 2)
        await trio.sleep(3)
        assert len(calls) == 2  # not delivered again from a retry topic
        # while the message waited for its local retry, the queue's offset did not pass it
        assert calls[1] - calls[0] >= 5.0
        await trio.sleep(6)
        mq = next(
            mq
            for mq in c.assigned_queues()
            if mq.topic == "T"
            and cluster.broker(
                "127.0.0.1:10911" if mq.brokerName == "broker-a" else "127.0.0.1:10921"
            ).messages("T", mq.queueId)
        )
    broker = next(b for b in cluster.brokers if b.name == mq.brokerName)
    assert broker.offsets[("g", "T", mq.queueId)] == 1


async def test_flow_control_pauses_pulling_until_consumption_drains(cluster, autojump_clock):
    cluster.create_topic("T", 1, brokers=[cluster.brokers[0]])
    cluster.brokers[1].topics.pop("T")
    await produce(cluster, 100)
    release = trio.Event()
    started = 0

    async def listener(msgs):
        nonlocal started
        started += 1
        await release.wait()

    c = make(cluster, listener, pull_batch_size=8, pull_threshold_for_queue=10,
             consume_concurrency=100)  # fmt: skip
    async with c:
        await trio.sleep(5)
        pq = next(pq for mq, pq in c.rebalance.process_queue_table.items() if mq.topic == "T")
        # 16 cached (two pulls), then it stopped: above the threshold of 10
        assert pq.msg_count == 16
        assert started == 16
        release.set()
        await wait_for(lambda: started >= 100)


async def test_orderly_consumes_in_order_and_locks_its_queues(cluster, autojump_clock):
    await produce(cluster, 40)
    order: dict[tuple, list[int]] = {}
    attempts = 0

    async def listener(msgs):
        nonlocal attempts
        m = msgs[0]
        if m.queue_offset == 3 and attempts < 2:  # suspend twice on one message
            attempts += 1
            return OrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        order.setdefault((m.store_host, m.topic, m.queue_id), []).append(m.queue_offset)

    async with make(cluster, listener, orderly=True) as c:
        await wait_for(lambda: sum(map(len, order.values())) >= 40)
        locked = {mq for (g, mq), (cid, _) in cluster.locks.items() if cid == c.client_id}
        assert {mq for mq in c.assigned_queues()} <= locked
        # a second member cannot take a queue the first one holds
        other = make(cluster, listener, orderly=True, name="c2")
        async with other:
            await trio.sleep(1)
            mine, theirs = c.assigned_queues(), other.assigned_queues()
            assert not mine & theirs
    for offsets in order.values():
        assert offsets == sorted(offsets)
    assert attempts == 2
    # every lock was released on shutdown
    assert cluster.locks == {}


async def test_orderly_gives_up_after_max_reconsume_times_into_the_dlq(cluster, autojump_clock):
    await produce(cluster, 2)
    seen: list[bytes] = []

    async def listener(msgs):
        seen.extend(m.body for m in msgs)
        if msgs[0].body == b"m0":
            return OrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return OrderlyStatus.SUCCESS

    async with make(cluster, listener, orderly=True, max_reconsume_times=3):
        await wait_for(lambda: b"m1" in seen and cluster.send_backs)
        await trio.sleep(2)
    assert seen.count(b"m0") == 4  # first try + 3 local retries
    assert [t for _, _, t in cluster.send_backs] == ["%DLQ%g"]
    back = [r for b in cluster.brokers for r in b.requests
            if r.code == RequestCode.CONSUMER_SEND_MSG_BACK]  # fmt: skip
    assert back[0].ext_fields["delayLevel"] == "-1"


async def test_broadcasting_keeps_offsets_in_a_local_file(cluster, autojump_clock, tmp_path):
    await produce(cluster, 8)
    got_a: list[bytes] = []
    got_b: list[bytes] = []

    async def la(msgs):
        got_a.extend(m.body for m in msgs)

    async def lb(msgs):
        got_b.extend(m.body for m in msgs)
        return ConsumeStatus.RECONSUME_LATER  # dropped with a log line in broadcasting

    kw = dict(message_model=MessageModel.BROADCASTING, offset_store_dir=tmp_path)
    a = make(cluster, la, name="a", **kw)
    async with a, make(cluster, lb, name="b", **kw):
        await wait_for(lambda: len(got_a) >= 8 and len(got_b) >= 8)
        await trio.sleep(1)
    assert len(got_a) == len(got_b) == 8  # each gets everything; no retries
    assert cluster.send_backs == []
    assert not any(k[0] == "g" for b in cluster.brokers for k in b.offsets)
    offsets = (tmp_path / a.client_id / "g" / "offsets.json").read_text()
    assert '"offset": 2' in offsets or '"offset":2' in offsets
    # a restart of `a` resumes from its file: nothing is delivered twice
    await produce(cluster, 1, prefix="new")
    async with make(cluster, la, name="a", **kw):
        await wait_for(lambda: len(got_a) >= 9)
        await trio.sleep(2)
    assert got_a[8:] == [b"new0"]


async def test_consume_from_last_offset_skips_history(cluster, autojump_clock):
    await produce(cluster, 10)
    got: list[bytes] = []

    async def listener(msgs):
        got.extend(m.body for m in msgs)

    async with make(cluster, listener, consume_from=ConsumeFromWhere.LAST_OFFSET):
        await trio.sleep(1)
        await produce(cluster, 3, prefix="new")
        await wait_for(lambda: len(got) >= 3)
        await trio.sleep(1)
    assert sorted(got) == [b"new0", b"new1", b"new2"]


async def test_consumer_answers_broker_requests(cluster, autojump_clock):
    await produce(cluster, 1)
    got: list[bytes] = []

    async def listener(msgs):
        got.extend(m.body for m in msgs)

    remoting = FakeRemoting(cluster)
    c = PushConsumer("g", NS, remoting=remoting, instance_name="x")
    c.subscribe("T")
    c.register_listener(listener)
    async with c:
        info = await remoting.deliver(RemotingCommand.request(
            RequestCode.GET_CONSUMER_RUNNING_INFO, {"consumerGroup": "g", "clientId": "x"}))  # fmt: skip
        assert info.code == ResponseCode.SUCCESS
        body = loads(info.body_bytes())
        assert body["properties"]["PROP_CONSUME_TYPE"] == "CONSUME_PASSIVELY"
        assert {s["topic"] for s in body["subscriptionSet"]} == {"T", "%RETRY%g"}
        record = next(r for b in cluster.brokers for q in b.queues.values() for r, _ in q)
        direct = await remoting.deliver(RemotingCommand.request(
            RequestCode.CONSUME_MESSAGE_DIRECTLY, {"consumerGroup": "g"}, record))  # fmt: skip
        assert loads(direct.body_bytes())["consumeResult"] == "CR_SUCCESS"
        unknown = await remoting.deliver(RemotingCommand.request(
            RequestCode.GET_CONSUMER_RUNNING_INFO, {"consumerGroup": "nope"}))  # fmt: skip
        assert unknown.code == ResponseCode.SYSTEM_ERROR and "nope" in unknown.remark
    assert b"m0" in got


async def test_heartbeat_carries_the_subscriptions(cluster, autojump_clock):
    async def listener(msgs):
        return None

    async with make(cluster, listener, expr="a||b", heartbeat_interval=30.0):
        await trio.sleep(31)
    beats = [r for b in cluster.brokers for r in b.requests if r.code == RequestCode.HEART_BEAT]
    assert len(beats) >= 4  # at start and after 30 s, to both brokers
    body = loads(beats[0].body_bytes())
    [cd] = body["consumerDataSet"]
    assert cd["consumeType"] == "CONSUME_PASSIVELY" and cd["messageModel"] == "CLUSTERING"
    subs = {s["topic"]: s for s in cd["subscriptionDataSet"]}
    assert subs["T"]["tagsSet"] == ["a", "b"] and subs["%RETRY%g"]["subString"] == "*"


async def test_misuse_is_reported_clearly(cluster):
    c = PushConsumer("g", NS, remoting=FakeRemoting(cluster))
    with pytest.raises(ClientError, match="listener"):
        async with c:
            pass
    c.register_listener(lambda msgs: None)
    with pytest.raises(ClientError, match="subscribe"):
        async with c:
            pass
    with pytest.raises(ClientError, match="group"):
        PushConsumer("", NS)
    assert MessageQueue  # imported for readers of the orderly test


async def test_pulls_follow_the_suggested_slave_without_commit_bit(cluster, autojump_clock):
    slave = cluster.add_broker("broker-a", "127.0.0.1:10912", broker_id=1)
    await produce(cluster, 8)
    # the slave holds the same records (as replication would give it)
    master = cluster.broker("127.0.0.1:10911")
    slave.queues = {k: list(v) for k, v in master.queues.items()}
    slave.topics = dict(master.topics)

    def suggest_slave(broker, req, resp):
        if req.code == RequestCode.PULL_MESSAGE and broker.broker_id == 0:
            resp.ext_fields["suggestWhichBrokerId"] = "1"

    cluster.response_hook = suggest_slave
    got: list[bytes] = []

    async def listener(msgs):
        got.extend(m.body for m in msgs)

    async with make(cluster, listener):
        await wait_for(lambda: len(got) >= 8)
        await trio.sleep(20)  # long polls go on against the slave
    slave_pulls = [r for r in slave.requests if r.code == RequestCode.PULL_MESSAGE]
    assert slave_pulls, "no pull went to the slave the broker suggested"
    assert all(not int(r.ext_fields["sysFlag"]) & 0x1 for r in slave_pulls)


async def test_a_producer_that_opts_in_is_heartbeated_and_unregistered(cluster, autojump_clock):
    class AnnouncedProducer(Producer):
        def heartbeat_producer_group(self):
            return self.group

    async with AnnouncedProducer("pg", NS, remoting=FakeRemoting(cluster)) as p:
        await p.send(Message("T", b"x"))
        await trio.sleep(31)
    beats = [r for b in cluster.brokers for r in b.requests if r.code == RequestCode.HEART_BEAT]
    assert beats and loads(beats[0].body_bytes())["producerDataSet"] == [{"groupName": "pg"}]
    gone = [
        r for b in cluster.brokers for r in b.requests if r.code == RequestCode.UNREGISTER_CLIENT
    ]
    assert gone and gone[0].ext_fields["producerGroup"] == "pg"
    # a plain Producer sends nothing in the background
    before = sum(len(b.requests) for b in cluster.brokers)
    async with Producer("pg2", NS, remoting=FakeRemoting(cluster)):
        await trio.sleep(61)
    assert sum(len(b.requests) for b in cluster.brokers) == before
