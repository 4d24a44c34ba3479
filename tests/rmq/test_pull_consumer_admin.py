"""PullConsumer and Admin against the real nameserver, a master/slave broker-a and broker-b in
process (memory_cluster): pull outcomes, decoding, offsets; odd answers made by tests.support.tap.Tap."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio

from common.errors import ProtocolError, TopicNotExistError
from common.model import MessageQueue
from common.remoting.codes import RequestCode
from rmq import Admin, Message, Producer, PullConsumer, PullStatus
from rmq.client_api import PULL_SUBSCRIPTION, PULL_SUSPEND
from rmq.errors import BrokerNotFoundError, ClientError

if TYPE_CHECKING:
    from tests.conftest import InProcessCluster


@pytest.fixture
async def cluster(memory_cluster):
    await memory_cluster.start_broker(
        "broker-a-s", broker_name="broker-a", broker_id=1, store=dict(broker_role="SLAVE")
    )
    await memory_cluster.start_broker("broker-b", broker_name="broker-b")
    await memory_cluster.create_topic("T", 2)
    return memory_cluster


async def fill(
    cluster: InProcessCluster, mq: MessageQueue, *bodies_tags: tuple[str, str | None]
) -> None:
    async with Producer("pg", cluster.namesrv, network=cluster.network) as p:
        for body, tags in bodies_tags:
            await p.send(Message(mq.topic, body, tags=tags), queue=mq)


async def test_fetch_queues_lists_readable_queues_of_every_broker(cluster):
    async with PullConsumer("cg", cluster.namesrv, network=cluster.network) as c:
        queues = await c.fetch_queues("T")
        with pytest.raises(TopicNotExistError):
            await c.fetch_queues("Nope")
    assert queues == [
        MessageQueue("T", "broker-a", 0),
        MessageQueue("T", "broker-a", 1),
        MessageQueue("T", "broker-b", 0),
        MessageQueue("T", "broker-b", 1),
    ]


async def test_pull_found_then_no_new_then_offset_illegal(cluster):
    mq = MessageQueue("T", "broker-b", 1)
    await fill(cluster, mq, ("m0", None), ("m1", None), ("m2", None))
    tap = cluster.tap()
    async with PullConsumer("cg", cluster.namesrv, network=tap) as c:
        r = await c.pull(mq, 0, max_nums=2)
        assert r.status is PullStatus.FOUND
        assert [m.body for m in r.messages] == [b"m0", b"m1"]
        assert [m.queue_offset for m in r.messages] == [0, 1]
        assert all(m.queue_id == 1 and m.topic == "T" for m in r.messages)
        assert (r.next_begin_offset, r.min_offset, r.max_offset) == (2, 0, 3)
        r = await c.pull(mq, r.next_begin_offset)
        assert [m.body for m in r.messages] == [b"m2"]
        r = await c.pull(mq, 3)
        assert (r.status, r.next_begin_offset, r.messages) == (PullStatus.NO_NEW_MSG, 3, [])
        r = await c.pull(mq, 10)
        # past the end: the broker corrects to the queue's min offset when that is 0 (Java's
        # nextOffsetCorrection on a master)
        assert r.status is PullStatus.OFFSET_ILLEGAL and r.next_begin_offset == 0
    pulls = tap.requests(RequestCode.PULL_MESSAGE)
    h = pulls[0].ext_fields
    assert (h["consumerGroup"], h["topic"], h["queueId"], h["maxMsgNums"]) == ("cg", "T", "1", "2")
    assert int(h["sysFlag"]) == PULL_SUBSCRIPTION and h["subscription"] == "*"
    assert [a for a, req in tap.sent if req.code == RequestCode.PULL_MESSAGE] == [
        cluster.addr("broker-b")
    ] * 4


async def test_pull_with_tags_filters_on_broker_and_client(cluster):
    mq = MessageQueue("T", "broker-a", 0)
    await fill(cluster, mq, ("a", "TagA"), ("b", "TagB"), ("c", "TagC"), ("n", None))
    async with PullConsumer("cg", cluster.namesrv, network=cluster.network) as c:
        r = await c.pull(mq, 0, tags="TagA || TagC")
        assert [m.body for m in r.messages] == [b"a", b"c"]
        assert r.next_begin_offset == 4  # the broker scanned every unit
        r = await c.pull(mq, 1, tags="TagA")
        assert r.status is PullStatus.NO_MATCHED_MSG and r.next_begin_offset == 4


async def test_client_drops_tag_hash_collisions_the_broker_lets_through(cluster):
    # "Aa" and "BB" have the same Java hashCode, which is all the broker's queue filter sees
    mq = MessageQueue("T", "broker-a", 1)
    await fill(cluster, mq, ("x", "Aa"), ("y", "BB"))
    async with PullConsumer("cg", cluster.namesrv, network=cluster.network) as c:
        r = await c.pull(mq, 0, tags="Aa")
    assert r.status is PullStatus.FOUND
    assert [m.body for m in r.messages] == [b"x"]
    assert r.next_begin_offset == 2


async def test_long_poll_sets_suspend_flag_and_extends_timeout(cluster, autojump_clock):
    mq = MessageQueue("T", "broker-a", 0)
    tap = cluster.tap()
    async with PullConsumer("cg", cluster.namesrv, network=tap) as c:
        start = trio.current_time()
        r = await c.pull(mq, 0, suspend=15.0)
        # the broker held the pull for the suspend time (beyond the 3 s request timeout)
        assert r.status is PullStatus.NO_NEW_MSG and trio.current_time() - start >= 14
    [req] = tap.requests(RequestCode.PULL_MESSAGE)
    assert int(req.ext_fields["sysFlag"]) == PULL_SUBSCRIPTION | PULL_SUSPEND
    assert req.ext_fields["suspendTimeoutMillis"] == "15000"


async def test_pull_goes_to_suggested_slave_and_back(cluster, autojump_clock):
    mq = MessageQueue("T", "broker-a", 0)
    await fill(cluster, mq, ("m0", None))
    slave_store = cluster.broker("broker-a-s").store
    with trio.fail_after(30):  # replicated by the real HA connection
        while slave_store.get_max_offset_in_queue("T", 0) < 1:  # noqa: ASYNC110
            await trio.sleep(0.1)
    master, slave = cluster.addr("broker-a"), cluster.addr("broker-a-s")
    tap = cluster.tap()

    def suggest_slave(resp):
        resp.ext_fields["suggestWhichBrokerId"] = "1"

    tap.rewrite(master, RequestCode.PULL_MESSAGE, suggest_slave)
    async with PullConsumer("cg", cluster.namesrv, network=tap) as c:
        await c.pull(mq, 0)
        await c.pull(mq, 1)
        await c.pull(mq, 1)
    addrs = [a for a, r in tap.sent if r.code == RequestCode.PULL_MESSAGE]
    assert addrs == [master, slave, master]


async def test_pull_response_without_next_offset_is_a_protocol_error(cluster):
    mq = MessageQueue("T", "broker-a", 0)

    def broken(resp):
        resp.ext_fields.pop("nextBeginOffset", None)

    tap = cluster.tap()
    tap.rewrite(cluster.addr("broker-a"), RequestCode.PULL_MESSAGE, broken)
    async with PullConsumer("cg", cluster.namesrv, network=tap) as c:
        with pytest.raises(ProtocolError, match="nextBeginOffset"):
            await c.pull(mq, 0)


async def test_bad_pull_arguments(cluster):
    async with PullConsumer("cg", cluster.namesrv, network=cluster.network) as c:
        with pytest.raises(ClientError):
            await c.pull(MessageQueue("T", "broker-a", 0), -1)
        with pytest.raises(BrokerNotFoundError):
            await c.pull(MessageQueue("T", "broker-zz", 0), 0)


async def test_offsets_query_commit_max_min(cluster):
    mq = MessageQueue("T", "broker-b", 0)
    await fill(cluster, mq, ("m0", None), ("m1", None))
    tap = cluster.tap()
    async with PullConsumer("cg", cluster.namesrv, network=tap) as c:
        # no offset yet, and the queue still starts at 0: the broker answers 0 (as Java's)
        assert await c.query_offset(mq) == 0
        # a broker that answers QUERY_NOT_FOUND (the queue's head was deleted): -1
        tap.fail(cluster.addr("broker-b"), 22, requests={RequestCode.QUERY_CONSUMER_OFFSET})
        assert await c.query_offset(mq) == -1
        await c.commit_offset(mq, 2)
        assert await c.query_offset(mq) == 2
        assert await c.max_offset(mq) == 2
        assert await c.min_offset(mq) == 0
    async with Admin(cluster.namesrv, network=tap) as admin:
        assert await admin.consumer_offset("cg", mq) == 2
        assert await admin.consumer_offset("other", mq) == 0
        tap.fail(cluster.addr("broker-b"), 22, requests={RequestCode.QUERY_CONSUMER_OFFSET})
        assert await admin.consumer_offset("other", mq) == -1
        await admin.update_consumer_offset("cg", mq, 1)
        assert await admin.consumer_offset("cg", mq) == 1
        offsets = await admin.topic_offsets("T")
    assert [(o.queue.brokerName, o.queue.queueId, o.max_offset) for o in offsets] == [
        ("broker-a", 0, 0),
        ("broker-a", 1, 0),
        ("broker-b", 0, 2),
        ("broker-b", 1, 0),
    ]


async def test_admin_cluster_topics_route_and_create(cluster):
    async with Admin(cluster.namesrv, network=cluster.network) as admin:
        info = await admin.cluster_info()
        assert info.clusterAddrTable == {"DefaultCluster": ["broker-a", "broker-b"]}
        assert info.brokerAddrTable["broker-a"].brokerAddrs == {
            0: cluster.addr("broker-a"),
            1: cluster.addr("broker-a-s"),
        }
        assert "T" in await admin.topic_list()
        addrs = await admin.create_topic("New", queues=3)
        assert addrs == [cluster.addr("broker-a"), cluster.addr("broker-b")]
        route = await admin.topic_route("New")
        assert sorted((q.brokerName, q.writeQueueNums) for q in route.queueDatas) == [
            ("broker-a", 3),
            ("broker-b", 3),
        ]
        b = cluster.addr("broker-b")
        assert await admin.create_topic("One", broker_addr=b) == [b]
        with pytest.raises(ClientError, match="cluster 'Nope'"):
            await admin.create_topic("X", cluster="Nope")
        with pytest.raises(ClientError):
            await admin.create_topic("bad topic")
        with pytest.raises(TopicNotExistError):
            await admin.topic_route("Missing")
    topics = cluster.broker("broker-b").controller.topic_config_manager
    assert topics.select_topic_config("One").writeQueueNums == 8


async def test_admin_needs_cluster_name_when_several(memory_cluster):
    c = memory_cluster
    await c.stop_broker("broker-a")
    await c.start_broker("broker-a", broker_cluster_name="C1")
    await c.start_broker("broker-b", broker_name="broker-b", broker_cluster_name="C2")
    async with Admin(c.namesrv, network=c.network) as admin:
        with pytest.raises(ClientError, match="C1, C2"):
            await admin.create_topic("X")
        assert await admin.create_topic("X", cluster="C2") == [c.addr("broker-b")]


async def test_user_exception_leaves_async_with_unwrapped(cluster):
    with pytest.raises(KeyError):
        async with Admin(cluster.namesrv, network=cluster.network):
            raise KeyError("mine")


def test_bad_namesrv_address_is_a_client_error():
    with pytest.raises(ClientError, match="host:port"):
        Admin("localhost")
    with pytest.raises(ClientError, match="no nameserver"):
        Admin(" ; ")
