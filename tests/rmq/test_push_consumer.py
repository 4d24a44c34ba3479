"""PushConsumer against the real nameserver and brokers in process (memory_cluster, autojump):
delivery, tags, retry/DLQ through the broker's schedule service, orderly locks, flow control,
broadcasting offsets, shutdown, broker->client requests; odd answers injected by tests.support.tap.Tap."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import pytest
import trio

from common.model import MessageQueue
from common.mq_map import parse_value
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

if TYPE_CHECKING:
    from common.message import MessageExt
    from common.remoting.network import Network
    from tests.conftest import InProcessCluster

NODES = ("broker-a", "broker-b")
SEND_BACK = RequestCode.CONSUMER_SEND_MSG_BACK


async def ignore(msgs: list[MessageExt]) -> None:
    """A listener for consumers that never get a message (or whose messages do not matter)."""


@pytest.fixture
async def cluster(memory_cluster):
    await memory_cluster.start_broker("broker-b", broker_name="broker-b")
    await memory_cluster.create_topic("T", 2)
    return memory_cluster


@pytest.fixture
def tap(cluster):
    return cluster.tap()


async def produce(
    cluster: InProcessCluster,
    n: int,
    *,
    tags: list[str] | None = None,
    topic: str = "T",
    prefix: str = "m",
    network: Network | None = None,
) -> None:
    async with Producer("pg", cluster.namesrv, network=network or cluster.network) as p:
        for i in range(n):
            tag = tags[i % len(tags)] if tags else None
            await p.send(Message(topic, f"{prefix}{i}".encode(), tags=tag))


def make(cluster, tap, listener, *, expr="*", orderly=False, name="c1", topic="T", **kw):
    kw.setdefault("consume_from", ConsumeFromWhere.FIRST_OFFSET)
    c = PushConsumer("g", cluster.namesrv, network=tap, instance_name=name, **kw)
    c.subscribe(topic, expr)
    if orderly:
        c.register_orderly_listener(listener)
    else:
        c.register_listener(listener)
    return c


def stored(cluster: InProcessCluster, topic: str, queue_id: int = 0) -> list[MessageExt]:
    """What every broker stored in ``topic``'s queue (decoded), broker-a's first."""
    return [m for node in NODES for m in cluster.messages(topic, queue_id, node)]


def committed(
    cluster: InProcessCluster, group: str = "g", topic: str = "T"
) -> dict[tuple[str, int], int]:
    """(node, queue id) -> the offset the broker holds for ``group``."""
    return {(n, q): o for n in NODES for q, o in cluster.offsets(group, topic, n).items()}


async def wait_for(pred: Callable[[], object], limit: float = 60.0) -> None:
    with trio.fail_after(limit):
        while not pred():  # noqa: ASYNC110 (polling a plain predicate)
            await trio.sleep(0.1)


async def test_every_message_once_and_offsets_committed(cluster, tap, autojump_clock):
    await produce(cluster, 40)
    got: list[bytes] = []

    async def listener(msgs):
        got.extend(m.body for m in msgs)

    async with make(cluster, tap, listener, consume_batch_max_size=3) as c:
        await wait_for(lambda: len(got) >= 40)
        await produce(cluster, 10, prefix="late")  # long polling wakes up for these
        await wait_for(lambda: len(got) >= 50)
        await trio.sleep(6)  # a persist round
        assert len(c.assigned_queues()) == 6  # 4 of T + the retry queue of each broker
    assert sorted(got) == sorted(
        [f"m{i}".encode() for i in range(40)] + [f"late{i}".encode() for i in range(10)]
    )
    assert sum(committed(cluster).values()) == 50  # every queue committed to its end
    # pulls after consumption carry the consumed offset (COMMIT_OFFSET bit, as Java)
    assert any(
        int(r.ext_fields["sysFlag"]) & 0x1 and int(r.ext_fields["commitOffset"]) > 0
        for r in tap.requests(RequestCode.PULL_MESSAGE)
    )
    # shutdown said goodbye: the group is empty on the brokers
    assert [cluster.members("g", n) for n in NODES] == [[], []]


async def test_tag_expression_filters_on_both_sides(cluster, tap, autojump_clock):
    await produce(cluster, 30, tags=["a", "b", "c"])
    got: list[str] = []

    async def listener(msgs):
        got.extend(m.tags for m in msgs)

    async with make(cluster, tap, listener, expr="a || c"):
        await wait_for(lambda: len(got) >= 20)
        await trio.sleep(2)
    assert sorted(set(got)) == ["a", "c"] and len(got) == 20
    pulls = tap.requests(RequestCode.PULL_MESSAGE)
    assert any(r.ext_fields["subscription"] == "a || c" for r in pulls)


async def test_failures_are_retried_with_the_original_topic_then_go_to_the_dlq(
    cluster, tap, autojump_clock
):
    await produce(cluster, 1)
    seen: list[tuple[str, int]] = []

    async def listener(msgs):
        for m in msgs:
            seen.append((m.topic, m.reconsume_times))
        return ConsumeStatus.RECONSUME_LATER

    async with make(cluster, tap, listener, max_reconsume_times=2):
        await wait_for(lambda: len(tap.requests(SEND_BACK)) >= 3)
        await trio.sleep(2)
    # first delivery, then two redeliveries from %RETRY%g (after the broker's delay levels 3
    # and 4) shown under topic T
    assert seen == [("T", 0), ("T", 1), ("T", 2)]
    back = tap.requests(SEND_BACK)
    assert {r.ext_fields["delayLevel"] for r in back} == {"0"}
    assert {r.ext_fields["maxReconsumeTimes"] for r in back} == {"2"}
    # two went to the retry topic, the third to the DLQ
    assert [m.body for m in stored(cluster, "%RETRY%g")] == [b"m0", b"m0"]
    assert [m.body for m in stored(cluster, "%DLQ%g")] == [b"m0"]


async def test_an_exception_counts_as_reconsume_later(cluster, tap, autojump_clock):
    await produce(cluster, 1)
    calls = 0

    async def listener(msgs):
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("boom")

    async with make(cluster, tap, listener):
        await wait_for(lambda: calls >= 2)
    assert len(tap.requests(SEND_BACK)) == 1
    assert [m.body for m in stored(cluster, "%RETRY%g")] == [b"m0"]
    assert stored(cluster, "%DLQ%g") == []


async def test_send_back_failure_reconsumes_locally_and_holds_the_offset(
    cluster, tap, autojump_clock
):
    await produce(cluster, 1)
    calls: list[float] = []

    async def listener(msgs):
        calls.append(trio.current_time())
        return ConsumeStatus.RECONSUME_LATER if len(calls) == 1 else None

    for node in NODES:
        tap.fail(cluster.addr(node), ResponseCode.SYSTEM_ERROR, requests={SEND_BACK}, forever=True)
    async with make(cluster, tap, listener):
        await wait_for(lambda: len(calls) >= 2)
        await trio.sleep(3)
        assert len(calls) == 2  # not delivered again from a retry topic
        # while the message waited for its local retry, the queue's offset did not pass it
        assert calls[1] - calls[0] >= 5.0
        await trio.sleep(6)
    [(node, queue_id)] = [(n, q) for n in NODES for q in (0, 1) if cluster.messages("T", q, n)]
    assert cluster.offsets("g", "T", node)[queue_id] == 1
    assert stored(cluster, "%RETRY%g") == []


async def test_flow_control_pauses_pulling_until_consumption_drains(cluster, tap, autojump_clock):
    await cluster.create_topic("F", 1, nodes=("broker-a",))
    await produce(cluster, 100, topic="F")
    release = trio.Event()
    started = 0

    async def listener(msgs):
        nonlocal started
        started += 1
        await release.wait()

    c = make(
        cluster,
        tap,
        listener,
        topic="F",
        pull_batch_size=8,
        pull_threshold_for_queue=10,
        consume_concurrency=100,
    )
    async with c:
        await trio.sleep(5)
        pq = next(pq for mq, pq in c.rebalance.process_queue_table.items() if mq.topic == "F")
        # 16 cached (two pulls), then it stopped: above the threshold of 10
        assert pq.msg_count == 16
        assert started == 16
        release.set()
        await wait_for(lambda: started >= 100)


def locked_by(
    cluster: InProcessCluster, client_id: str, mqs: Iterable[MessageQueue]
) -> set[MessageQueue]:
    """The queues of ``mqs`` whose broker holds the rebalance lock of group g for ``client_id``."""
    return {
        mq
        for mq in mqs
        if cluster.broker(mq.brokerName).controller.lock_manager.is_locked("g", mq, client_id)
    }


async def test_orderly_consumes_in_order_and_locks_its_queues(cluster, tap, autojump_clock):
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

    async with make(cluster, tap, listener, orderly=True) as c:
        await wait_for(lambda: sum(map(len, order.values())) >= 40)
        mine = c.assigned_queues()
        assert locked_by(cluster, c.client_id, mine) == mine
        # a second member cannot take a queue the first one holds
        other = make(cluster, cluster.network, listener, orderly=True, name="c2")
        async with other:
            await trio.sleep(1)
            mine, theirs = c.assigned_queues(), other.assigned_queues()
            assert not mine & theirs
            every = mine | theirs
        ids = (c.client_id, other.client_id)
    for offsets in order.values():
        assert offsets == sorted(offsets)
    assert attempts == 2
    # every lock was released on shutdown
    assert [locked_by(cluster, cid, every) for cid in ids] == [set(), set()]


async def test_orderly_gives_up_after_max_reconsume_times_into_the_dlq(
    cluster, tap, autojump_clock
):
    await produce(cluster, 2)
    seen: list[bytes] = []

    async def listener(msgs):
        seen.extend(m.body for m in msgs)
        if msgs[0].body == b"m0":
            return OrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return OrderlyStatus.SUCCESS

    async with make(cluster, tap, listener, orderly=True, max_reconsume_times=3):
        await wait_for(lambda: b"m1" in seen and tap.requests(SEND_BACK))
        await trio.sleep(2)
    assert seen.count(b"m0") == 4  # first try + 3 local retries
    [back] = tap.requests(SEND_BACK)
    assert back.ext_fields["delayLevel"] == "-1"  # straight to the DLQ
    assert [m.body for m in stored(cluster, "%DLQ%g")] == [b"m0"]
    assert stored(cluster, "%RETRY%g") == []


async def test_broadcasting_keeps_offsets_in_a_local_file(cluster, tap, autojump_clock, tmp_path):
    await produce(cluster, 8)
    got_a: list[bytes] = []
    got_b: list[bytes] = []

    async def la(msgs):
        got_a.extend(m.body for m in msgs)

    async def lb(msgs):
        got_b.extend(m.body for m in msgs)
        return ConsumeStatus.RECONSUME_LATER  # dropped with a log line in broadcasting

    kw = dict(message_model=MessageModel.BROADCASTING, offset_store_dir=tmp_path)
    a = make(cluster, tap, la, name="a", **kw)
    async with a, make(cluster, tap, lb, name="b", **kw):
        await wait_for(lambda: len(got_a) >= 8 and len(got_b) >= 8)
        await trio.sleep(1)
    assert len(got_a) == len(got_b) == 8  # each gets everything; no retries
    assert tap.requests(SEND_BACK) == []
    assert committed(cluster) == {}  # nothing kept on the brokers
    offsets = (tmp_path / a.client_id / "g" / "offsets.json").read_text()
    assert '"offset": 2' in offsets or '"offset":2' in offsets
    # a restart of `a` resumes from its file: nothing is delivered twice
    await produce(cluster, 1, prefix="new")
    async with make(cluster, tap, la, name="a", **kw):
        await wait_for(lambda: len(got_a) >= 9)
        await trio.sleep(2)
    assert got_a[8:] == [b"new0"]


async def test_consume_from_last_offset_skips_history(cluster, tap, autojump_clock):
    await produce(cluster, 10)
    got: list[bytes] = []

    async def listener(msgs):
        got.extend(m.body for m in msgs)

    # the brokers have no offset for the group and say so (QUERY_NOT_FOUND, as once a queue's
    # head was cleaned up): LAST_OFFSET starts at the end. Against queues that still start at
    # 0 they answer 0 instead, and the group reads from 0 (test_push_start_offset.py)
    query = {RequestCode.QUERY_CONSUMER_OFFSET}
    for node in NODES:
        tap.fail(cluster.addr(node), ResponseCode.QUERY_NOT_FOUND, requests=query, forever=True)
    async with make(cluster, tap, listener, consume_from=ConsumeFromWhere.LAST_OFFSET):
        await trio.sleep(1)
        await produce(cluster, 3, prefix="new")
        await wait_for(lambda: len(got) >= 3)
        await trio.sleep(1)
    assert sorted(got) == [b"new0", b"new1", b"new2"]


async def test_consumer_answers_broker_requests(cluster, tap, autojump_clock):
    await produce(cluster, 1)
    got: list[bytes] = []

    async def listener(msgs):
        got.extend(m.body for m in msgs)

    [(node, queue_id)] = [(n, q) for n in NODES for q in (0, 1) if cluster.messages("T", q, n)]
    store = cluster.broker(node).store
    record = store.select_one_message_by_offset(
        store.get_commit_log_offset_in_queue("T", queue_id, 0)
    )
    c = make(cluster, tap, listener, name="x")
    async with c:
        await wait_for(lambda: got)
        addr = cluster.addr(node)
        info = await tap.deliver(
            addr,
            RemotingCommand.request(
                RequestCode.GET_CONSUMER_RUNNING_INFO, {"consumerGroup": "g", "clientId": "x"}
            ),
        )
        assert info.code == ResponseCode.SUCCESS
        body = parse_value(info.body_bytes())  # mqTable has MessageQueue keys, as fastjson's
        assert body["properties"]["PROP_CONSUME_TYPE"] == "CONSUME_PASSIVELY"
        assert {s["topic"] for s in body["subscriptionSet"]} == {"T", "%RETRY%g"}
        direct = await tap.deliver(
            addr,
            RemotingCommand.request(
                RequestCode.CONSUME_MESSAGE_DIRECTLY, {"consumerGroup": "g"}, bytes(record)
            ),
        )
        assert loads(direct.body_bytes())["consumeResult"] == "CR_SUCCESS"
        unknown = await tap.deliver(
            addr,
            RemotingCommand.request(
                RequestCode.GET_CONSUMER_RUNNING_INFO, {"consumerGroup": "nope"}
            ),
        )
        assert unknown.code == ResponseCode.SYSTEM_ERROR and "nope" in unknown.remark
    assert got == [b"m0", b"m0"]  # pulled, then handed over directly


async def test_heartbeat_carries_the_subscriptions(cluster, tap, autojump_clock):
    async def listener(msgs):
        return None

    async with make(cluster, tap, listener, expr="a||b", heartbeat_interval=30.0):
        await trio.sleep(31)
    beats = tap.requests(RequestCode.HEART_BEAT)
    assert len(beats) >= 4  # at start and after 30 s, to both brokers
    assert {a for a, r in tap.sent if r.code == RequestCode.HEART_BEAT} == {
        cluster.addr(n) for n in NODES
    }
    body = loads(beats[0].body_bytes())
    [cd] = body["consumerDataSet"]
    assert cd["consumeType"] == "CONSUME_PASSIVELY" and cd["messageModel"] == "CLUSTERING"
    subs = {s["topic"]: s for s in cd["subscriptionDataSet"]}
    assert subs["T"]["tagsSet"] == ["a", "b"] and subs["%RETRY%g"]["subString"] == "*"


async def test_misuse_is_reported_clearly(cluster):
    c = PushConsumer("g", cluster.namesrv, network=cluster.network)
    with pytest.raises(ClientError, match="listener"):
        async with c:
            pass
    c.register_listener(ignore)
    with pytest.raises(ClientError, match="subscribe"):
        async with c:
            pass
    with pytest.raises(ClientError, match="group"):
        PushConsumer("", cluster.namesrv)


async def test_pulls_follow_the_suggested_slave_without_commit_bit(cluster, tap, autojump_clock):
    await cluster.start_broker(
        "broker-a-s", broker_name="broker-a", broker_id=1, store=dict(broker_role="SLAVE")
    )
    await produce(cluster, 8)
    # the slave holds the same records once HA replication caught up
    master, slave = cluster.broker("broker-a").store, cluster.broker("broker-a-s").store
    with trio.fail_after(30):
        while slave.get_max_phy_offset() < master.get_max_phy_offset():  # noqa: ASYNC110
            await trio.sleep(0.1)

    def suggest_slave(resp):
        resp.ext_fields["suggestWhichBrokerId"] = "1"

    tap.rewrite(cluster.addr("broker-a"), RequestCode.PULL_MESSAGE, suggest_slave)
    got: list[bytes] = []

    async def listener(msgs):
        got.extend(m.body for m in msgs)

    async with make(cluster, tap, listener):
        await wait_for(lambda: len(got) >= 8)
        await trio.sleep(20)  # long polls go on against the slave
    slave_pulls = tap.requests(RequestCode.PULL_MESSAGE, cluster.addr("broker-a-s"))
    assert slave_pulls, "no pull went to the slave the broker suggested"
    assert all(not int(r.ext_fields["sysFlag"]) & 0x1 for r in slave_pulls)
    assert sorted(got) == [f"m{i}".encode() for i in range(8)]


async def test_a_producer_that_opts_in_is_heartbeated_and_unregistered(
    cluster, tap, autojump_clock
):
    class AnnouncedProducer(Producer):
        def heartbeat_producer_group(self):
            return self.group

    async with AnnouncedProducer("pg", cluster.namesrv, network=tap) as p:
        await p.send(Message("T", b"x"))
        await trio.sleep(31)
    beats = tap.requests(RequestCode.HEART_BEAT)
    assert beats and loads(beats[0].body_bytes())["producerDataSet"] == [{"groupName": "pg"}]
    gone = tap.requests(RequestCode.UNREGISTER_CLIENT)
    assert gone and gone[0].ext_fields["producerGroup"] == "pg"
    # a plain Producer sends nothing to the brokers in the background
    quiet = cluster.tap()
    async with Producer("pg2", cluster.namesrv, network=quiet):
        await trio.sleep(61)
    assert [a for a, _ in quiet.sent if a != cluster.namesrv] == []
