"""Request-reply (RocketMQ 4.6+) with our client on both ends, through a real nameserver and
broker in process; and our client's answer to PUSH_REPLY_MESSAGE_TO_CLIENT as a Java broker
sends it."""

from __future__ import annotations

import zlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, cast

import pytest
import trio

from common.message import MessageExt
from common.message_properties import encode_properties
from common.remoting.channel import Channel
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from rmq import (
    ConsumeFromWhere,
    Message,
    Producer,
    PushConsumer,
    create_reply_message,
)
from rmq.errors import CreateReplyMessageError, RequestTimeoutError
from rmq.trace.encoder import TraceType

if TYPE_CHECKING:
    from tests.conftest import InProcessCluster

pytestmark = pytest.mark.timeout(30)


def responder(cluster: InProcessCluster, replier: Producer, seen: list[MessageExt]) -> PushConsumer:
    """A consumer of "Req" that answers every request with its body upper-cased."""

    async def listener(msgs: list[MessageExt]) -> None:
        for m in msgs:
            seen.append(m)
            await replier.send(create_reply_message(m, m.body.upper()))

    c = PushConsumer(
        "responders",
        cluster.namesrv,
        network=cluster.network,
        consume_from=ConsumeFromWhere.FIRST_OFFSET,
    )
    c.subscribe("Req")
    c.register_listener(listener)
    return c


async def test_request_gets_its_reply(memory_cluster, autojump_clock):
    cluster = memory_cluster
    await cluster.create_topic("Req", 2)
    seen: list[MessageExt] = []
    async with (
        Producer("replier", cluster.namesrv, network=cluster.network) as replier,
        responder(cluster, replier, seen),
        Producer("requester", cluster.namesrv, network=cluster.network) as p,
    ):
        reply = await p.request(Message("Req", b"ping"), timeout=10)
        again = await p.request(Message("Req", b"second"), timeout=10)
        assert p._replies.waiting == {}
    assert (reply.body, again.body) == (b"PING", b"SECOND")
    req = seen[0]
    # the request carried what Java's prepareSendRequest puts on it
    assert req.properties["REPLY_TO_CLIENT"] == p.client_id
    assert req.properties["TTL"] == "10000" and req.properties["CLUSTER"] == "DefaultCluster"
    # the reply: same correlation id, pushed (PUSH_REPLY_TIME) and received (ARRIVE_TIME)
    props = reply.properties
    assert props["CORRELATION_ID"] == req.properties["CORRELATION_ID"]
    assert props["MSG_TYPE"] == "reply" and props["REPLY_TO_CLIENT"] == p.client_id
    assert int(props["PUSH_REPLY_TIME"]) > 0 and int(props["ARRIVE_TIME"]) > 0
    assert reply.topic == "DefaultCluster_REPLY_TOPIC"
    # stored in the reply topic as well (storeReplyMessageEnable)
    assert sorted(m.body for m in cluster.messages("DefaultCluster_REPLY_TOPIC", 0)) == [
        b"PING",
        b"SECOND",
    ]


async def test_no_reply_times_out(memory_cluster, autojump_clock):
    cluster = memory_cluster
    await cluster.create_topic("Req", 1)
    async with Producer("requester", cluster.namesrv, network=cluster.network) as p:
        t0 = trio.current_time()
        with pytest.raises(RequestTimeoutError, match="wait reply message timeout, 2000 ms"):
            await p.request(Message("Req", b"anyone?"), timeout=2)
        assert trio.current_time() - t0 == pytest.approx(2, abs=0.01)
        assert p._replies.waiting == {}
    assert len(cluster.messages("Req", 0)) == 1  # the request itself was sent


def test_create_reply_message_needs_a_request() -> None:
    with pytest.raises(CreateReplyMessageError, match=r"property\[CLUSTER\] is null"):
        create_reply_message(Message("T", b"not from a broker"), b"x")


def java_push(props: dict[str, str], body: bytes, sys_flag: int = 0) -> RemotingCommand:
    """PUSH_REPLY_MESSAGE_TO_CLIENT as ReplyMessageProcessor.pushReplyMessage builds it."""
    return RemotingCommand.request(
        RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT,
        {
            "producerGroup": "replier",
            "topic": "DefaultCluster_REPLY_TOPIC",
            "defaultTopic": "TBW102",
            "defaultTopicQueueNums": 4,
            "queueId": 0,
            "sysFlag": sys_flag,
            "bornTimestamp": 1_700_000_000_000,
            "flag": 0,
            "properties": encode_properties(props),
            "reconsumeTimes": 0,
            "unitMode": False,
            "bornHost": "10.0.0.7:53211",
            "storeHost": "10.0.0.1:10911",
            "storeTimestamp": 1_700_000_000_005,
        },
        body,
    )


async def test_push_as_a_java_broker_sends_it(memory_cluster):
    cluster = memory_cluster
    async with Producer("requester", cluster.namesrv, network=cluster.network) as p:
        waiting = p._replies.open("cid-1")
        chan = cast(Channel, None)
        props = {"CORRELATION_ID": "cid-1", "MSG_TYPE": "reply", "PUSH_REPLY_TIME": "1"}
        # compressed bodies (sysFlag bit 0) are inflated, as receiveReplyMessage does
        r = await p.client.handle_request(java_push(props, zlib.compress(b"big"), 1), chan)
        assert r is not None and r.code == ResponseCode.SUCCESS
        assert waiting.reply is not None and waiting.reply.body == b"big"
        assert waiting.reply.born_host == ("10.0.0.7", 53211)
        assert waiting.reply.store_timestamp == 1_700_000_000_005
        # a late reply (nobody waits): answered SUCCESS, counted, dropped
        props["CORRELATION_ID"] = "late"
        r = await p.client.handle_request(java_push(props, b"x"), chan)
        assert r is not None and r.code == ResponseCode.SUCCESS and p._replies.unmatched == 1
        # unreadable: SYSTEM_ERROR "process reply message fail"
        bad = java_push(props, b"x")
        del bad.ext_fields["sysFlag"]
        r = await p.client.handle_request(bad, cast(Channel, _FakeChannel()))
        assert r is not None
        assert (r.code, r.remark) == (ResponseCode.SYSTEM_ERROR, "process reply message fail")


class _FakeChannel:
    remote_addr = "10.0.0.1:10911"


def test_sync_request(portal_cluster: InProcessCluster) -> None:
    from rmq import sync

    cluster = portal_cluster
    cluster.call(cluster.create_topic, "Req", 1)
    seen: list[MessageExt] = []

    async def serve() -> None:
        async with (
            Producer("replier", cluster.namesrv, network=cluster.network) as replier,
            responder(cluster, replier, seen),
        ):
            await trio.sleep_forever()

    scope = cluster.call(_start_in_cluster, cluster, serve)
    try:
        with sync.Producer("requester", cluster.namesrv, network=cluster.network) as p:
            assert p.request(Message("Req", b"sync"), timeout=10).body == b"SYNC"
    finally:
        cluster.call(scope.cancel)


async def _start_in_cluster(
    cluster: InProcessCluster, fn: Callable[[], Awaitable[None]]
) -> trio.CancelScope:
    scope = trio.CancelScope()

    async def run() -> None:
        with scope:
            await fn()

    cluster.nursery.start_soon(run)
    return scope


def test_aio_request_reply_and_trace(portal_cluster: InProcessCluster) -> None:
    import asyncio

    from rmq import aio

    cluster = portal_cluster
    cluster.call(cluster.create_topic, "Req", 1)

    async def main() -> tuple[MessageExt, list[TraceType]]:
        net = cluster.network
        async with aio.Producer("replier", cluster.namesrv, network=net) as replier:

            async def listener(msgs: list[MessageExt]) -> None:
                for m in msgs:
                    await replier.send(aio.create_reply_message(m, b"pong"))

            c = aio.PushConsumer(
                "responders",
                cluster.namesrv,
                network=net,
                consume_from=ConsumeFromWhere.FIRST_OFFSET,
            )
            c.subscribe("Req")
            c.register_listener(listener)
            async with (
                c,
                aio.Producer("requester", cluster.namesrv, network=net, enable_trace=True) as p,
            ):
                reply = await p.request(Message("Req", b"ping"), timeout=10)
        [request] = cluster.call(cluster.messages, "Req", 0)
        async with aio.Admin(cluster.namesrv, network=net) as admin:
            # the traced requester wrote a Pub for its request
            views = await admin.query_trace(request.uniq_key or "")
        return reply, [v.trace_type for v in views]

    reply, kinds = asyncio.run(main())
    assert reply.body == b"pong"
    assert kinds == [TraceType.Pub]
