"""Producer: selectors and send_orderly, send_async callbacks, delay/props,
retry-when-not-stored, route refresh after a failed selected send; against the real servers
(memory_cluster), broker answers injected by tests.support.tap.Tap."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import trio

from common.errors import BrokerSystemError, MessageIllegalError
from common.message_properties import decode_properties
from common.model import MessageQueue
from common.remoting.codes import RequestCode, ResponseCode
from common.string_hash import java_string_hash
from rmq import Message, Producer, SendResult, SendStatus
from rmq.errors import InvalidMessageError
from rmq.producer import select_by_hash
from tests.support.tap import SENDS

if TYPE_CHECKING:
    from tests.conftest import InProcessCluster
    from tests.support.tap import Tap

BROKERS = ("broker-a", "broker-b")


@pytest.fixture
async def cluster(memory_cluster):
    await memory_cluster.start_broker("broker-b", broker_name="broker-b")
    await memory_cluster.create_topic("T", 4)
    return memory_cluster


@pytest.fixture
def tap(cluster):
    return cluster.tap()


def producer(cluster: InProcessCluster, tap: Tap, **kw: Any) -> Producer:
    return Producer("pg", cluster.namesrv, network=tap, **kw)


def send_requests(cluster, tap):
    return [(cluster.node_at(addr), r) for addr, r in tap.sent if r.code in SENDS]


def route_requests(tap: Tap) -> int:
    return len(tap.requests(RequestCode.GET_ROUTEINFO_BY_TOPIC))


# select_by_hash looks at the key only
ANY_MSG = Message("T", b"x")
ALL_QUEUES = [MessageQueue("T", b, i) for b in ("broker-a", "broker-b") for i in range(4)]


def test_select_by_hash_is_javas_string_hashcode_mod_queue_count():
    # Java: "hello".hashCode() == 99162322
    assert select_by_hash(ALL_QUEUES, ANY_MSG, "hello") is ALL_QUEUES[99162322 % 8]
    # a negative hash uses its absolute value (not Python's floor modulo of the negative)
    key = next(
        k
        for k in (f"key-{i}" for i in range(1000))
        if java_string_hash(k) % 8 != 0 and java_string_hash(k) < 0
    )
    neg = java_string_hash(key)
    assert select_by_hash(ALL_QUEUES, ANY_MSG, key) is ALL_QUEUES[abs(neg) % 8]
    assert abs(neg) % 8 != neg % 8


async def test_send_orderly_same_key_same_queue_in_send_order(cluster, tap):
    async with producer(cluster, tap) as p:
        results: dict[str, list[SendResult]] = {}
        for i in range(40):
            key = f"order-{i % 5}"
            r = await p.send_orderly(Message("T", f"{key}:{i}"), key)
            assert r.status is SendStatus.SEND_OK
            results.setdefault(key, []).append(r)
    for key, rs in results.items():
        assert {r.message_queue for r in rs} == {select_by_hash(ALL_QUEUES, ANY_MSG, key)}
        # consecutive offsets on that queue, in the order they were sent
        offsets = [r.queue_offset for r in rs]
        assert offsets == sorted(offsets)
    # the bodies stored on each queue are in send order per key
    for node in BROKERS:
        for qid in range(4):
            recs = cluster.messages("T", qid, node)
            by_key: dict[str, list[int]] = {}
            for m in recs:
                key, _, i = m.body.decode().partition(":")
                by_key.setdefault(key, []).append(int(i))
            assert all(v == sorted(v) for v in by_key.values())


async def test_custom_selector_gets_queues_message_and_arg(cluster, tap):
    seen = []

    def selector(mqs, msg, arg):
        seen.append((list(mqs), msg.body, arg))
        return mqs[arg]

    async with producer(cluster, tap) as p:
        r = await p.send(Message("T", b"x"), selector=selector, arg=5)
    assert r.message_queue == ALL_QUEUES[5]
    assert seen == [(ALL_QUEUES, b"x", 5)]


async def test_bad_selector_result_and_queue_plus_selector_are_refused(cluster, tap):
    async with producer(cluster, tap) as p:
        with pytest.raises(InvalidMessageError, match="selector returned"):
            await p.send(Message("T", b"x"), selector=lambda mqs, m, a: None)  # type: ignore[arg-type, return-value]  # a bad selector on purpose
        with pytest.raises(InvalidMessageError, match="selector returned"):
            await p.send(Message("T", b"x"), selector=lambda mqs, m, a: MessageQueue("U", "a", 0))
        with pytest.raises(InvalidMessageError, match="either"):
            await p.send(Message("T", b"x"), queue=ALL_QUEUES[0], selector=select_by_hash)
        with pytest.raises(InvalidMessageError, match="sharding_key"):
            await p.send_orderly(Message("T", b"x"), 42)  # type: ignore[arg-type]  # a bad key on purpose
    assert send_requests(cluster, tap) == []


async def test_selected_send_is_not_retried_elsewhere_but_refreshes_the_route(cluster, tap):
    target = select_by_hash(ALL_QUEUES, ANY_MSG, "k")
    async with producer(cluster, tap) as p:
        await p.send_orderly(Message("T", b"warm"), "k")
        before = route_requests(tap)
        tap.fail(cluster.addr(target.brokerName), ResponseCode.SYSTEM_ERROR)
        with pytest.raises(BrokerSystemError) as info:
            await p.send_orderly(Message("T", b"x"), "k")
        assert info.value.retriable
        # exactly one attempt for the failed send, on the selected broker
        assert [n for n, _ in send_requests(cluster, tap)] == [target.brokerName] * 2
        r = await p.send_orderly(Message("T", b"y"), "k")
        assert r.message_queue == target
        assert route_requests(tap) > before  # the failure dropped the cached route


async def test_selected_send_waits_out_a_refusal_on_the_same_queue(cluster, tap):
    # SERVICE_NOT_AVAILABLE stores nothing (a member not yet the leader says it): the send
    # asks the nameserver again and retries the same queue, so the order is kept
    target = select_by_hash(ALL_QUEUES, ANY_MSG, "k")
    async with producer(cluster, tap) as p:
        await p.send_orderly(Message("T", b"warm"), "k")
        before = route_requests(tap)
        tap.fail(cluster.addr(target.brokerName), ResponseCode.SERVICE_NOT_AVAILABLE)
        r = await p.send_orderly(Message("T", b"x"), "k")
        assert r.message_queue == target
        assert [n for n, _ in send_requests(cluster, tap)] == [target.brokerName] * 3
        assert route_requests(tap) > before


async def test_send_async_calls_on_result_from_a_nursery_task(cluster, tap):
    results: list[SendResult] = []
    errors: list[BaseException] = []
    async with producer(cluster, tap) as p:
        async with trio.open_nursery() as nursery:
            for i in range(5):
                p.send_async(Message("T", f"m{i}"), results.append, errors.append, nursery=nursery)
            assert results == []  # started, not yet run: send_async does not block
    assert errors == [] and len(results) == 5
    assert all(r.status is SendStatus.SEND_OK for r in results)
    assert len({r.msg_id for r in results}) == 5


async def test_send_async_reports_errors_to_on_error_and_accepts_async_callbacks(cluster, tap):
    for node in BROKERS:
        tap.fail(cluster.addr(node), ResponseCode.MESSAGE_ILLEGAL)
    got = []

    async def on_error(exc):
        await trio.lowlevel.checkpoint()
        got.append(exc)

    async with producer(cluster, tap) as p:
        async with trio.open_nursery() as nursery:
            p.send_async(Message("T", b"x"), got.append, on_error, nursery=nursery)
    [exc] = got
    assert isinstance(exc, MessageIllegalError)


async def test_send_async_without_on_error_raises_into_the_nursery(cluster, tap):
    for node in BROKERS:
        tap.fail(cluster.addr(node), ResponseCode.MESSAGE_ILLEGAL)
    async with producer(cluster, tap) as p:
        with pytest.RaisesGroup(MessageIllegalError):
            async with trio.open_nursery() as nursery:
                p.send_async(Message("T", b"x"), lambda r: None, nursery=nursery)


async def test_send_async_validates_in_the_caller(cluster, tap):
    async with producer(cluster, tap) as p:
        async with trio.open_nursery() as nursery:
            with pytest.raises(InvalidMessageError):
                p.send_async(Message("T", b""), lambda r: None, nursery=nursery)


async def test_delay_level_tags_keys_and_user_properties_reach_the_broker(
    cluster, tap, autojump_clock
):
    msg = Message(
        "T",
        "héllo".encode(),
        tags="TagA",
        keys=["k1", "k2"],
        properties={"color": "red", "ü": "ö"},
        delay_level=3,
    )
    async with producer(cluster, tap) as p:
        r = await p.send(msg)
    [(_, req)] = send_requests(cluster, tap)
    props = decode_properties(req.ext_fields["i"])
    assert props["DELAY"] == "3" and props["TAGS"] == "TagA" and props["KEYS"] == "k1 k2"
    assert props["color"] == "red" and props["ü"] == "ö"
    await trio.sleep(11)  # delay level 3 is 10 s: then the broker puts it on T, on the queue
    # the producer chose (the answer's queueId is the schedule queue's: a broker deviation)
    [stored] = cluster.messages("T", int(req.ext_fields["e"]), r.message_queue.brokerName)
    assert stored.body == "héllo".encode() and stored.properties["color"] == "red"


@pytest.mark.parametrize("code", [10, 11, 12])
async def test_not_stored_ok_is_returned_unless_asked_to_retry(cluster, tap, code):
    for node in BROKERS:
        tap.fail(cluster.addr(node), code)
    async with producer(cluster, tap) as p:
        r = await p.send(Message("T", b"x"))
    assert r.status is not SendStatus.SEND_OK
    assert len(send_requests(cluster, tap)) == 1

    tap = cluster.tap()
    for node in BROKERS:
        tap.fail(cluster.addr(node), code)  # each broker answers `code` once
    async with Producer(
        "pg", cluster.namesrv, network=tap, retry_another_broker_when_not_store_ok=True
    ) as p:
        r = await p.send(Message("T", b"x"))
    assert r.status is SendStatus.SEND_OK
    names = [req.ext_fields["n"] for req in tap.requests(310)]
    assert len(names) == 3 and names[0] != names[1] != names[2]


async def test_not_stored_ok_everywhere_returns_the_last_status(cluster, tap):
    for node in BROKERS:
        tap.fail(cluster.addr(node), *[ResponseCode.FLUSH_SLAVE_TIMEOUT] * 3)
    async with producer(cluster, tap, retry_another_broker_when_not_store_ok=True) as p:
        r = await p.send(Message("T", b"x"))
    assert r.status is SendStatus.FLUSH_SLAVE_TIMEOUT
    assert len(send_requests(cluster, tap)) == 3
