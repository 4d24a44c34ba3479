"""Bad input against both servers: each gets a clear code or a closed connection, never a crash.

Garbage, oversized frames, undecodable headers, unknown codes, missing required header fields
and bodies over 4 MiB go to a real nameserver and a real broker (file store) on loopback. After
all of it, other connections are still served and every message stored before is still there.
"""

from __future__ import annotations

import json
import struct

import pytest
import trio

from common.message import decode_records
from common.remoting.client import open_remoting_client
from common.remoting.codec import encode
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand

pytestmark = pytest.mark.integration

TOPIC = "BadInputTopic"


async def _closed_or_reply(stream: trio.SocketStream, timeout: float = 5.0) -> bytes:
    """What the server sends back before closing: b'' means it closed without a reply."""
    data = b""
    with trio.move_on_after(timeout) as scope:
        while True:
            chunk = await stream.receive_some(65536)
            if not chunk:
                return data
            data += chunk
    assert not scope.cancelled_caught, f"server neither answered nor closed: {data[:100]!r}"
    return data


def _raw_frame(header: bytes, body: bytes = b"", *, serialize_type: int = 0) -> bytes:
    return (
        struct.pack(">ii", 4 + len(header) + len(body), (serialize_type << 24) | len(header))
        + header
        + body
    )


def _decode_response(data: bytes) -> dict:
    (length, mark) = struct.unpack_from(">ii", data)
    header_len = mark & 0xFFFFFF
    return json.loads(data[8 : 8 + header_len])


async def _send_raw_expect_close(port: int, payload: bytes) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        try:
            await stream.send_all(payload)
        except trio.BrokenResourceError:
            return  # closed while we were still writing: that is a close
        try:
            data = await _closed_or_reply(stream)
        except trio.BrokenResourceError:
            return
        assert data == b"", f"expected a closed connection, got {data[:200]!r}"


async def _send_frame_expect_code(port: int, cmd: RemotingCommand) -> dict:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(encode(cmd))
        buf = b""
        with trio.fail_after(10):
            while len(buf) < 4 or len(buf) < 4 + struct.unpack_from(">i", buf)[0]:
                chunk = await stream.receive_some(65536)
                assert chunk, "server closed instead of answering"
                buf += chunk
        return _decode_response(buf)


BAD_PAYLOADS = {
    "garbage": b"\xde\xad\xbe\xef" * 64,
    "oversized_frame": struct.pack(">ii", 17 * 1024 * 1024, 20) + b"x" * 1024,
    "negative_length": struct.pack(">ii", -5, 0),
    "header_longer_than_frame": struct.pack(">ii", 10, 500) + b"{}" + b"x" * 4,
    "bad_json_header": _raw_frame(b'{"code":105,"opaque":1,'),
    "json_header_not_object": _raw_frame(b"[1,2,3]"),
    "bad_binary_header": _raw_frame(b"\x00\x69\x00", serialize_type=1),
}


async def _check_server(port: int, requests: dict[str, RemotingCommand]) -> None:
    for payload in BAD_PAYLOADS.values():
        with trio.fail_after(15):
            await _send_raw_expect_close(port, payload)
    unknown = await _send_frame_expect_code(port, RemotingCommand.request(9999, {}))
    assert unknown["code"] == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert unknown["flag"] & 1
    for name, cmd in requests.items():
        cmd.opaque = 77
        answer = await _send_frame_expect_code(port, cmd)
        assert answer["opaque"] == 77, name
        assert answer["code"] != ResponseCode.SUCCESS, (name, answer)
        assert answer.get("remark"), (name, answer)


async def test_both_servers_survive_bad_input(ns_and_broker, nursery):
    ns, broker = ns_and_broker
    async with open_remoting_client() as client:
        baddr = f"127.0.0.1:{broker.port}"
        create = RemotingCommand.request(
            RequestCode.UPDATE_AND_CREATE_TOPIC,
            {
                "topic": TOPIC,
                "defaultTopic": "TBW102",
                "readQueueNums": 1,
                "writeQueueNums": 1,
                "perm": 6,
                "topicFilterType": "SINGLE_TAG",
                "topicSysFlag": 0,
                "order": False,
            },
        )
        assert (await client.invoke(baddr, create)).code == ResponseCode.SUCCESS

        def send(body: bytes) -> RemotingCommand:
            return RemotingCommand.request(
                RequestCode.SEND_MESSAGE,
                {
                    "producerGroup": "pg",
                    "topic": TOPIC,
                    "defaultTopic": "TBW102",
                    "defaultTopicQueueNums": 4,
                    "queueId": 0,
                    "sysFlag": 0,
                    "bornTimestamp": 0,
                    "flag": 0,
                    "properties": "",
                },
                body,
            )

        for i in range(10):
            r = await client.invoke(baddr, send(b"kept-%d" % i))
            assert r.code == ResponseCode.SUCCESS, r.remark

        await _check_server(
            ns.port,
            {
                "route_without_topic": RemotingCommand.request(
                    RequestCode.GET_ROUTEINFO_BY_TOPIC, {}
                ),
                "register_without_fields": RemotingCommand.request(
                    RequestCode.REGISTER_BROKER, {"brokerName": "x"}, b"\x00" * (5 << 20)
                ),
                "kv_without_key": RemotingCommand.request(
                    RequestCode.PUT_KV_CONFIG, {"namespace": "n"}
                ),
            },
        )
        no_topic = send(b"x")
        del no_topic.ext_fields["topic"]
        bad_name = send(b"z")
        bad_name.ext_fields["topic"] = "no spaces allowed!"
        await _check_server(
            broker.port,
            {
                "send_without_topic": no_topic,
                "send_body_over_4mib": send(b"y" * (4 * 1024 * 1024 + 1)),
                "pull_without_queue": RemotingCommand.request(
                    RequestCode.PULL_MESSAGE, {"consumerGroup": "g", "topic": TOPIC}
                ),
                "send_bad_topic_name": bad_name,
                "reset_without_timestamp": RemotingCommand.request(
                    RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, {"topic": TOPIC, "group": "g"}
                ),
                "reset_unknown_group": RemotingCommand.request(
                    RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
                    {"topic": TOPIC, "group": "nobody", "timestamp": 0, "isForce": True},
                ),
                "status_of_offline_group": RemotingCommand.request(
                    RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS, {"topic": TOPIC, "group": "g"}
                ),
                "running_info_of_unknown_client": RemotingCommand.request(
                    RequestCode.GET_CONSUMER_RUNNING_INFO, {"consumerGroup": "g", "clientId": "x"}
                ),
                "direct_consume_bad_msg_id": RemotingCommand.request(
                    RequestCode.CONSUME_MESSAGE_DIRECTLY,
                    {"consumerGroup": "g", "clientId": "x", "msgId": "zz"},
                ),
                "update_broker_config_unknown_key": RemotingCommand.request(
                    RequestCode.UPDATE_BROKER_CONFIG, None, b"noSuchKey=1"
                ),
                "update_broker_config_huge_body": RemotingCommand.request(
                    RequestCode.UPDATE_BROKER_CONFIG, None, b"k=v\n" * (2 << 20)
                ),
                "producer_connections_without_group": RemotingCommand.request(
                    RequestCode.GET_PRODUCER_CONNECTION_LIST, {}
                ),
                "stats_without_key": RemotingCommand.request(
                    RequestCode.VIEW_BROKER_STATS_DATA, {"statsName": "TOPIC_PUT_NUMS"}
                ),
                "query_cq_bad_queue": RemotingCommand.request(
                    RequestCode.QUERY_CONSUME_QUEUE,
                    {"topic": TOPIC, "queueId": "x", "index": 0, "count": 1},
                ),
                "acl_update_without_acl": RemotingCommand.request(
                    RequestCode.UPDATE_AND_CREATE_ACL_CONFIG, {"accessKey": "abcdefgh"}
                ),
            },
        )

        # Still serving, and nothing stored was lost.
        route = await client.invoke(
            f"127.0.0.1:{ns.port}",
            RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"}),
        )
        assert route.code == ResponseCode.SUCCESS
        maxoff = await client.invoke(
            baddr,
            RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": 0}),
        )
        assert maxoff.code == ResponseCode.SUCCESS
        assert int(maxoff.ext_fields["offset"]) == 10
        pull = await client.invoke(
            baddr,
            RemotingCommand.request(
                RequestCode.PULL_MESSAGE,
                {
                    "consumerGroup": "g",
                    "topic": TOPIC,
                    "queueId": 0,
                    "queueOffset": 0,
                    "maxMsgNums": 32,
                    "sysFlag": 4,
                    "commitOffset": 0,
                    "suspendTimeoutMillis": 0,
                    "subscription": "*",
                    "subVersion": 0,
                },
            ),
        )
        assert pull.code == ResponseCode.SUCCESS
        bodies = [m.body for m in decode_records(pull.body_bytes())]
        assert bodies == [b"kept-%d" % i for i in range(10)]
    nursery.cancel_scope.cancel()
