"""Producer against the real nameserver and two brokers in process (memory_cluster): routes,
retries, batches; broker faults injected by tests.support.tap.Tap."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest
import trio

from common.errors import (
    BrokerSystemError,
    MessageIllegalError,
    RemotingConnectError,
    RemotingTimeoutError,
    TopicNotExistError,
)
from common.message_properties import decode_properties
from common.model import MessageQueue
from common.remoting.codes import RequestCode, ResponseCode
from common.serde import dumps, loads
from rmq import Message, Producer, SendStatus
from rmq.errors import InvalidMessageError, NoRouteInfoError
from rmq.message import parse_unique_id
from tests.support.tap import SENDS

if TYPE_CHECKING:
    from tests.conftest import InProcessCluster
    from tests.support.tap import Tap


@pytest.fixture
async def cluster(memory_cluster):
    await memory_cluster.start_broker("broker-b", broker_name="broker-b")
    return memory_cluster


@pytest.fixture
def tap(cluster):
    return cluster.tap()


def producer(cluster: InProcessCluster, tap: Tap, **kw: Any) -> Producer:
    return Producer("pg", cluster.namesrv, network=tap, **kw)


def sends(cluster, tap):
    """(broker, request) of every send the producer made."""
    return [(cluster.node_at(addr), r) for addr, r in tap.sent if r.code in SENDS]


def namesrv_requests(cluster, tap):
    return [r for addr, r in tap.sent if addr == cluster.namesrv]


async def test_send_uses_v2_short_header_and_uniq_key(cluster, tap):
    await cluster.create_topic("T", 4)
    async with producer(cluster, tap) as p:
        result = await p.send(Message("T", b"hello", tags="TagA", keys="k1"))
    assert result.status is SendStatus.SEND_OK
    [(name, req)] = sends(cluster, tap)
    assert req.code == RequestCode.SEND_MESSAGE_V2
    h = req.ext_fields
    assert (h["a"], h["b"], h["c"], h["d"], h["m"], h["n"]) == (
        "pg",
        "T",
        "TBW102",
        "4",
        "false",
        name,
    )
    assert int(h["e"]) == result.message_queue.queueId
    props = decode_properties(h["i"])
    assert props["TAGS"] == "TagA" and props["KEYS"] == "k1" and props["WAIT"] == "true"
    assert props["UNIQ_KEY"] == result.msg_id
    parse_unique_id(result.msg_id)  # well-formed
    assert req.body_bytes() == b"hello"
    # offset msgId is the broker's: store host + commitlog offset
    assert len(result.offset_msg_id) == 32 and result.offset_msg_id != result.msg_id
    assert result.queue_offset == 0
    # what the broker stored decodes to the same message
    [stored] = cluster.messages("T", result.message_queue.queueId, name)
    assert stored.body == b"hello" and stored.uniq_key == result.msg_id


async def test_round_robin_spreads_over_both_brokers(cluster, tap):
    await cluster.create_topic("T", 2)
    async with producer(cluster, tap) as p:
        results = [await p.send(Message("T", str(i))) for i in range(8)]
    queues = {(r.message_queue.brokerName, r.message_queue.queueId) for r in results}
    assert len(queues) == 4
    assert [r.queue_offset for r in results].count(1) == 4  # each queue got 2 messages


@pytest.mark.parametrize("code", [17, 14, 1, 16, 204, 205])
async def test_retriable_code_retries_on_the_other_broker(cluster, tap, code):
    await cluster.create_topic("T", 2)
    a = cluster.addr("broker-a")
    async with producer(cluster, tap) as p:
        # make the failing broker be picked first: fail it every time, broker-b never
        tap.fail(a, code)
        for _ in range(4):
            result = await p.send(Message("T", b"x"))
            assert result.message_queue.brokerName == "broker-b"
            tap.fail(a, code)
    failed = [name for name, _ in sends(cluster, tap)]
    assert "broker-a" in failed  # it was tried, and every time the retry went to broker-b


async def test_non_retriable_code_raises_at_once(cluster, tap):
    await cluster.create_topic("T", 2)
    for node in ("broker-a", "broker-b"):
        tap.fail(cluster.addr(node), ResponseCode.MESSAGE_ILLEGAL)
    async with producer(cluster, tap) as p:
        with pytest.raises(MessageIllegalError) as info:
            await p.send(Message("T", b"x"))
    assert info.value.code == 13 and not info.value.retriable
    assert len(sends(cluster, tap)) == 1


async def test_gives_up_after_retry_times_and_raises_last_error(cluster, tap):
    await cluster.create_topic("T", 2)
    for node in ("broker-a", "broker-b"):
        # SYSTEM_ERROR may follow a write that went wrong: it uses up an attempt, unlike the
        # failover refusals (tests/rmq/test_producer_failover.py)
        tap.fail(cluster.addr(node), ResponseCode.SYSTEM_ERROR, forever=True)
    async with Producer("pg", cluster.namesrv, network=tap, retry_times=2) as p:
        with pytest.raises(Exception) as info:
            await p.send(Message("T", b"x"))
    assert getattr(info.value, "code", None) == 1
    names = [r.ext_fields["n"] for r in tap.requests(RequestCode.SEND_MESSAGE_V2)]
    assert len(names) == 3
    assert names[0] != names[1] and names[1] != names[2]  # alternates brokers


async def test_stored_but_not_flushed_codes_map_to_status(cluster, tap):
    await cluster.create_topic("T", 1, nodes=("broker-a",))
    cases = {10: "FLUSH_DISK_TIMEOUT", 12: "FLUSH_SLAVE_TIMEOUT", 11: "SLAVE_NOT_AVAILABLE"}
    async with producer(cluster, tap) as p:
        for code, status in cases.items():
            tap.fail(cluster.addr("broker-a"), code)
            # the tap answers the injected code without headers: still a result, not a retry
            result = await p.send(Message("T", b"x"))
            assert result.status.name == status
    assert len(sends(cluster, tap)) == 3


async def test_connection_refused_retries_elsewhere_then_refreshes_route(cluster, tap):
    await cluster.create_topic("T", 1)
    cluster.network.refused.add(cluster.broker("broker-a").port)
    async with producer(cluster, tap) as p:
        for _ in range(3):
            assert (await p.send(Message("T", b"x"))).message_queue.brokerName == "broker-b"
    # each failure dropped the cached route, so the nameserver was asked again
    routes = [
        r for r in namesrv_requests(cluster, tap) if r.code == RequestCode.GET_ROUTEINFO_BY_TOPIC
    ]
    assert len(routes) >= 2


async def test_every_broker_down_raises_connect_error(cluster, tap, autojump_clock):
    await cluster.create_topic("T", 1)
    for handle in cluster.brokers.values():
        cluster.network.refused.add(handle.port)
    async with producer(cluster, tap) as p:
        with pytest.raises(RemotingConnectError):
            await p.send(Message("T", b"x"))


async def test_timeout_budget_covers_all_attempts(cluster, tap, autojump_clock):
    await cluster.create_topic("T", 1)
    for node in ("broker-a", "broker-b"):
        tap.hang(cluster.addr(node))
    async with producer(cluster, tap) as p:
        start = trio.current_time()
        with pytest.raises(RemotingTimeoutError):
            await p.send(Message("T", b"x"), timeout=2.0)
        assert trio.current_time() - start == pytest.approx(2.0)
    assert len(sends(cluster, tap)) == 1  # the only attempt used up the whole budget


async def test_unknown_topic_goes_through_tbw102_and_is_auto_created(cluster, tap):
    async with producer(cluster, tap) as p:
        result = await p.send(Message("NewTopic", b"x"))
    assert result.status is SendStatus.SEND_OK
    topics = [r.ext_fields["topic"] for r in namesrv_requests(cluster, tap)]
    assert topics[:2] == ["NewTopic", "TBW102"]
    topics = cluster.broker(result.message_queue.brokerName).controller.topic_config_manager
    # min(defaultTopicQueueNums=4, TBW102's 8)
    assert topics.select_topic_config("NewTopic").writeQueueNums == 4
    assert result.message_queue.queueId < 4


async def test_a_failure_drops_the_auto_create_route_its_publish_info_came_from(cluster, tap):
    # The info of a topic the nameserver did not know came from TBW102's route: after a
    # retriable failure the next send must ask the nameserver again, or that route, fresh for
    # 30 s, keeps the failed broker in use (sends would fail for up to 30 s
    # while a new DLedger leader already serves)
    async with producer(cluster, tap, retry_times=1) as p:
        assert (await p.send(Message("NewTopic", b"x"))).status is SendStatus.SEND_OK
        assert [r.ext_fields["topic"] for r in namesrv_requests(cluster, tap)] == [
            "NewTopic",
            "TBW102",
        ]
        for node in ("broker-a", "broker-b"):  # both attempts of the next send fail
            tap.fail(cluster.addr(node), ResponseCode.SYSTEM_ERROR)
        with pytest.raises(BrokerSystemError):
            await p.send(Message("NewTopic", b"y"))
        asked = len(namesrv_requests(cluster, tap))
        assert (await p.send(Message("NewTopic", b"z"))).status is SendStatus.SEND_OK
        assert len(namesrv_requests(cluster, tap)) > asked  # the routes were asked for again


async def test_a_route_without_a_master_is_not_replaced_by_the_auto_create_route(
    cluster, tap, autojump_clock
):
    # A DLedger group between two leaders: the nameserver lists broker-a without a master for
    # a moment, and the auto-create route fetched just after can name the new one.  The send
    # fails (as in Java) rather than take TBW102's queues for T: an info from that route stayed
    # in use as long as the route was fresh, and each refresh kept it fresh
    await cluster.create_topic("T", 3, nodes=("broker-a",))
    masterless = True

    def no_master_in_routes_of_t(resp):
        route = loads(bytes(resp.body))
        if masterless and [q["writeQueueNums"] for q in route["queueDatas"]] == [3]:
            for bd in route["brokerDatas"]:
                bd["brokerAddrs"].pop("0", None)
            resp.body = dumps(route)

    tap.rewrite(cluster.namesrv, RequestCode.GET_ROUTEINFO_BY_TOPIC, no_master_in_routes_of_t)
    async with producer(cluster, tap, retry_times=0) as p:
        with pytest.raises(NoRouteInfoError, match="no writable master"):
            await p.send(Message("T", b"x"))
        assert sends(cluster, tap) == []
        masterless = False  # the new master registered
        result = await p.send(Message("T", b"y"))
    assert result.status is SendStatus.SEND_OK
    assert result.message_queue.brokerName == "broker-a" and result.message_queue.queueId < 3
    assert not p._publish["T"].from_default


async def test_no_route_and_no_auto_create_raises_no_route_info(memory_cluster):
    await memory_cluster.stop_broker("broker-a")
    await memory_cluster.start_broker("broker-x", auto_create_topic_enable=False)
    async with producer(memory_cluster, memory_cluster.tap()) as p:
        with pytest.raises(NoRouteInfoError, match="NewTopic"):
            await p.send(Message("NewTopic", b"x"))


async def test_route_is_cached_then_refetched_after_30s(cluster, tap, autojump_clock):
    await cluster.create_topic("T", 1)
    async with producer(cluster, tap) as p:
        await p.send(Message("T", b"1"))
        await p.send(Message("T", b"2"))
        assert len(namesrv_requests(cluster, tap)) == 1
        await trio.sleep(31)
        await p.send(Message("T", b"3"))
        assert len(namesrv_requests(cluster, tap)) == 2


async def test_namesrv_failover_on_connection_refused(cluster, tap):
    await cluster.create_topic("T", 1)
    # nobody listens on 9877: connection refused, the next nameserver answers
    async with Producer("pg", "127.0.0.1:9877;" + cluster.namesrv, network=tap) as p:
        assert (await p.send(Message("T", b"x"))).status is SendStatus.SEND_OK


async def test_send_to_explicit_queue(cluster, tap):
    await cluster.create_topic("T", 4)
    mq = MessageQueue("T", "broker-b", 3)
    async with producer(cluster, tap) as p:
        result = await p.send(Message("T", b"x"), queue=mq)
    assert result.message_queue == mq


async def test_batch_one_request_consecutive_offsets_own_uniq_keys(cluster, tap):
    await cluster.create_topic("T", 1, nodes=("broker-a",))
    msgs = [Message("T", f"m{i}", tags="A", keys=f"k{i}") for i in range(3)]
    async with producer(cluster, tap) as p:
        result = await p.send_batch(msgs)
        again = await p.send_batch(msgs[:1])
    [(_, req), _second] = sends(cluster, tap)
    assert req.code == RequestCode.SEND_BATCH_MESSAGE and req.ext_fields["m"] == "true"
    assert decode_properties(req.ext_fields["i"]) == {"WAIT": "true"}
    uniq = result.msg_id.split(",")
    assert len(set(uniq)) == 3
    assert result.queue_offset == 0 and again.queue_offset == 3
    assert len(result.offset_msg_id.split(",")) == 3
    stored = cluster.messages("T", 0, "broker-a")
    assert [m.body for m in stored[:3]] == [b"m0", b"m1", b"m2"]
    assert [m.uniq_key for m in stored[:3]] == uniq
    assert [m.keys for m in stored[:3]] == ["k0", "k1", "k2"]


async def test_batch_rejects_mixed_topics_and_delay(cluster, tap):
    async with producer(cluster, tap) as p:
        with pytest.raises(InvalidMessageError, match="same topic"):
            await p.send_batch([Message("A", b"x"), Message("B", b"y")])
        with pytest.raises(InvalidMessageError, match="delay"):
            await p.send_batch([Message("A", b"x", delay_level=2)])
        with pytest.raises(InvalidMessageError, match="empty"):
            await p.send_batch([])
    assert sends(cluster, tap) == []


async def test_oversized_message_is_refused_locally(cluster, tap):
    async with producer(cluster, tap, max_message_size=10) as p:
        with pytest.raises(InvalidMessageError, match="exceeds"):
            await p.send(Message("T", b"x" * 11))


async def test_oneway_sends_flagged_request_without_waiting(cluster, tap):
    await cluster.create_topic("T", 1)
    async with Producer("pg", cluster.namesrv, network=tap) as p:
        await p.send_oneway(Message("T", b"x"))
    [req] = tap.requests(RequestCode.SEND_MESSAGE_V2)
    assert req.is_oneway
    with trio.fail_after(5):  # oneway: stored after the send returned
        while sum(len(cluster.messages("T", 0, n)) for n in cluster.brokers) < 1:  # noqa: ASYNC110
            await trio.sleep(0.01)
    assert sum(len(cluster.messages("T", 0, n)) for n in cluster.brokers) == 1


async def test_user_uniq_key_is_kept(cluster, tap):
    await cluster.create_topic("T", 1)
    async with producer(cluster, tap) as p:
        result = await p.send(Message("T", b"x", properties={"UNIQ_KEY": "ABC"}))
    assert result.msg_id == "ABC"


async def test_topic_not_exist_from_broker_without_auto_create_is_raised_after_retries(
    memory_cluster,
):
    cluster, tap = memory_cluster, memory_cluster.tap()
    await cluster.create_topic("T", 1)
    tap.fail(cluster.addr("broker-a"), 17, 17, 17)
    async with producer(cluster, tap) as p:
        with pytest.raises(TopicNotExistError):
            await p.send(Message("T", b"x"))
    assert len(sends(cluster, tap)) == 3


async def test_use_outside_async_with_is_a_clear_error(cluster, tap):
    p = producer(cluster, tap)
    with pytest.raises(Exception, match="async with"):
        await p.send(Message("T", b"x"))


async def test_fields_assigned_after_construction_are_normalised_when_sent(cluster, tap):
    await cluster.create_topic("T", 1)
    msg = Message("T", b"x")
    # Message converts when it is made, not on assignment (wrong types on purpose) ...
    msg.body = "text"  # type: ignore[assignment]
    msg.keys = ["k1", "k2"]  # type: ignore[assignment]
    async with producer(cluster, tap) as p:
        result = await p.send(msg)
    # ... the producer converts before it sends
    assert (msg.body, msg.keys) == (b"text", "k1 k2")
    [(_, req)] = sends(cluster, tap)
    assert req.body_bytes() == b"text"
    assert decode_properties(req.ext_fields["i"])["KEYS"] == "k1 k2"
    assert result.status is SendStatus.SEND_OK


async def test_prepared_headers_are_per_queue_and_carry_fresh_fields(cluster, tap):
    await cluster.create_topic("T", 2, nodes=("broker-a",))
    async with producer(cluster, tap) as p:
        q0, q1 = (MessageQueue("T", "broker-a", i) for i in (0, 1))
        await p.send(Message("T", b"a", tags="A", flag=5), queue=q0)
        await p.send(Message("T", b"b"), queue=q0)
        await p.send(Message("T", b"c"), queue=q1)
        await p.send_batch([Message("T", b"d")], queue=q1)
    reqs = [r for _, r in sends(cluster, tap)]
    assert [r.ext_fields["e"] for r in reqs] == ["0", "0", "1", "1"]
    assert [r.ext_fields["h"] for r in reqs] == ["5", "0", "0", "0"]
    assert [r.ext_fields["m"] for r in reqs] == ["false", "false", "false", "true"]
    assert [r.code for r in reqs] == [RequestCode.SEND_MESSAGE_V2] * 3 + [
        RequestCode.SEND_BATCH_MESSAGE
    ]
    uniqs = [decode_properties(r.ext_fields["i"]).get("UNIQ_KEY") for r in reqs]
    assert len(set(uniqs[:3])) == 3 and uniqs[3] is None  # a batch's header has no UNIQ_KEY
    assert decode_properties(reqs[0].ext_fields["i"])["TAGS"] == "A"
    assert "TAGS" not in decode_properties(reqs[1].ext_fields["i"])
    for r in reqs:  # same keys and value types as ClientAPI.send_header would give
        assert set(r.ext_fields) == set("abcdefghijkmn")
        assert all(isinstance(v, str) for v in r.ext_fields.values())
        assert abs(int(r.ext_fields["g"]) - time.time() * 1000) < 60_000  # born now, in ms
