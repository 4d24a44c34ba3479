"""SEND_REPLY_MESSAGE(_V2) as RocketMQ's Java client speaks it, against a real broker in
process: a raw 325 with the V2 one-letter header fields from a "replier", and a raw
"requester" connection that announced its client id in HEART_BEAT and receives the
PUSH_REPLY_MESSAGE_TO_CLIENT (326). Codes and remarks as ReplyMessageProcessor answers them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import pytest
import trio

from common.message_properties import decode_properties, encode_properties
from common.model import HeartbeatData, ProducerData
from common.remoting.channel import Channel
from common.remoting.client import RemotingClient, open_remoting_client
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from common.serde import to_json

if TYPE_CHECKING:
    from tests.conftest import InProcessCluster

pytestmark = pytest.mark.timeout(20)

REQUESTER = "10.1.2.3@java-requester"
REPLY_TOPIC = "DefaultCluster_REPLY_TOPIC"


def reply_props(**extra: str) -> dict[str, str]:
    props = {
        "MSG_TYPE": "reply",
        "CORRELATION_ID": "c0ffee-1",
        "REPLY_TO_CLIENT": REQUESTER,
        "TTL": "3000",
        "UNIQ_KEY": "0A0B0C0D000000000000000000000001",
        "WAIT": "true",
    }
    props.update(extra)
    return {k: v for k, v in props.items() if v}


def java_325(
    props: dict[str, str], body: bytes = b"the answer", **header: object
) -> RemotingCommand:
    """SEND_REPLY_MESSAGE_V2 as DefaultMQProducerImpl.sendKernelImpl builds it for a reply."""
    fields: dict[str, object] = {
        "a": "replier-group",
        "b": REPLY_TOPIC,
        "c": "TBW102",
        "d": 4,
        "e": 0,
        "f": 0,
        "g": 1_700_000_000_000,
        "h": 0,
        "i": encode_properties(props),
        "j": 0,
        "k": False,
        "m": False,
    }
    fields.update(header)
    return RemotingCommand.request(
        RequestCode.SEND_REPLY_MESSAGE_V2, {k: v for k, v in fields.items() if v is not None}, body
    )


@asynccontextmanager
async def requester(
    cluster: InProcessCluster, answer: int = ResponseCode.SUCCESS
) -> AsyncIterator[tuple[RemotingClient, list[RemotingCommand]]]:
    """A connection that sent HEART_BEAT as client REQUESTER and records the pushes it gets."""
    pushes: list[RemotingCommand] = []

    async def on_request(cmd: RemotingCommand, channel: Channel) -> RemotingCommand:
        pushes.append(cmd)
        return cmd.response(answer)

    async with open_remoting_client(network=cluster.network) as client:
        client.set_request_handler(on_request)
        hb = HeartbeatData(clientID=REQUESTER, producerDataSet=[ProducerData("req-group")])
        r = await client.invoke(
            cluster.addr(), RemotingCommand.request(RequestCode.HEART_BEAT, None, to_json(hb))
        )
        assert r.code == ResponseCode.SUCCESS
        yield client, pushes


async def replier_send(cluster: InProcessCluster, cmd: RemotingCommand) -> RemotingCommand:
    async with open_remoting_client(network=cluster.network) as client:
        return await client.invoke(cluster.addr(), cmd, timeout=15)


async def test_reply_is_pushed_to_the_requester_and_stored(memory_cluster):
    cluster = memory_cluster
    async with requester(cluster) as (_, pushes):
        r = await replier_send(cluster, java_325(reply_props()))
    assert (r.code, r.remark) == (ResponseCode.SUCCESS, None)
    assert r.ext_fields["MSG_REGION"] == "DefaultRegion" and r.ext_fields["TRACE_ON"] == "true"
    [push] = pushes
    assert push.code == RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT
    h = push.ext_fields
    # ReplyMessageRequestHeader: the send header's fields, long names, plus the hosts and time
    assert (h["producerGroup"], h["topic"], h["defaultTopic"], h["queueId"]) == (
        "replier-group",
        REPLY_TOPIC,
        "TBW102",
        "0",
    )
    assert (h["sysFlag"], h["flag"], h["bornTimestamp"], h["reconsumeTimes"]) == (
        "0",
        "0",
        "1700000000000",
        "0",
    )
    assert h["storeHost"] == cluster.addr() and ":" in h["bornHost"]
    assert int(h["storeTimestamp"]) > 0 and h["unitMode"] == "false"
    props = decode_properties(h["properties"])
    assert props["CORRELATION_ID"] == "c0ffee-1" and int(props["PUSH_REPLY_TIME"]) > 0
    assert push.body_bytes() == b"the answer"
    # storeReplyMessageEnable (default true): stored too, as sent (no PUSH_REPLY_TIME, CLUSTER)
    [stored] = cluster.messages(REPLY_TOPIC, 0)
    assert stored.body == b"the answer" and "PUSH_REPLY_TIME" not in stored.properties
    assert "CLUSTER" not in stored.properties
    assert r.ext_fields["msgId"] == stored.msg_id and r.ext_fields["queueOffset"] == "0"


async def test_long_header_code_324_works_too(memory_cluster):
    cluster = memory_cluster
    fields = {
        "producerGroup": "replier-group",
        "topic": REPLY_TOPIC,
        "defaultTopic": "TBW102",
        "defaultTopicQueueNums": 4,
        "queueId": -1,  # any queue
        "sysFlag": 0,
        "bornTimestamp": 1,
        "flag": 0,
        "properties": encode_properties(reply_props()),
    }
    async with requester(cluster) as (_, pushes):
        r = await replier_send(
            cluster, RemotingCommand.request(RequestCode.SEND_REPLY_MESSAGE, fields, b"x")
        )
    assert r.code == ResponseCode.SUCCESS and len(pushes) == 1


async def test_unknown_requester_is_system_error_but_stored(memory_cluster):
    cluster = memory_cluster
    r = await replier_send(cluster, java_325(reply_props(REPLY_TO_CLIENT="1.1.1.1@gone")))
    assert r.code == ResponseCode.SYSTEM_ERROR
    assert r.remark == "push reply message fail, channel of <1.1.1.1@gone> not found."
    assert len(cluster.messages(REPLY_TOPIC, 0)) == 1


async def test_missing_reply_to_client(memory_cluster):
    r = await replier_send(memory_cluster, java_325(reply_props(REPLY_TO_CLIENT="")))
    assert r.code == ResponseCode.SYSTEM_ERROR
    assert r.remark == "reply message properties[REPLY_TO_CLIENT] is null"


async def test_requester_refusing_the_push(memory_cluster):
    async with requester(memory_cluster, answer=ResponseCode.SYSTEM_ERROR) as (_, pushes):
        r = await replier_send(memory_cluster, java_325(reply_props()))
    assert len(pushes) == 1
    assert (r.code, r.remark) == (
        ResponseCode.SYSTEM_ERROR,
        f"push reply message to {REQUESTER}fail.",
    )


async def test_store_reply_message_disabled(tmp_path, nursery):
    from tests.conftest import InProcessCluster
    from tests.support.memory_network import MemoryNetwork

    cluster = InProcessCluster(MemoryNetwork(), nursery, tmp_path)
    await cluster.start_namesrv()
    await cluster.start_broker(store_reply_message_enable=False)
    async with requester(cluster) as (_, pushes):
        r = await replier_send(cluster, java_325(reply_props()))
    assert r.code == ResponseCode.SUCCESS and len(pushes) == 1
    assert (r.ext_fields["msgId"], r.ext_fields["queueOffset"]) == ("0", "0")
    assert cluster.messages(REPLY_TOPIC, 0) == []


@pytest.mark.parametrize(
    ("header", "remark"),
    [
        ({"a": None}, "the custom field <producerGroup> is null"),
        ({"b": None}, "the custom field <topic> is null"),
        ({"e": None}, "the custom field <queueId> is null"),
        ({"g": "soon"}, "the custom field <bornTimestamp> is not a Java long"),
        ({"e": 99}, "request queueId[99] is illegal"),
        ({"b": "bad topic!"}, "topic"),
    ],
)
async def test_bad_headers_get_a_code_and_remark_and_the_broker_stays_up(
    memory_cluster, header, remark
):
    r = await replier_send(memory_cluster, java_325(reply_props(), **header))
    assert r.code == ResponseCode.SYSTEM_ERROR and remark in (r.remark or "")
    ok = await replier_send(memory_cluster, java_325(reply_props(REPLY_TO_CLIENT="x@y")))
    assert ok.code == ResponseCode.SYSTEM_ERROR and "not found" in (ok.remark or "")


async def test_a_dead_requester_connection_does_not_hang_the_reply(memory_cluster):
    cluster = memory_cluster
    async with requester(cluster) as (client, _):
        client.close()  # gone without UNREGISTER_CLIENT
        await trio.sleep(0.1)
    r = await replier_send(cluster, java_325(reply_props()))
    assert r.code == ResponseCode.SYSTEM_ERROR and "not found" in (r.remark or "")
