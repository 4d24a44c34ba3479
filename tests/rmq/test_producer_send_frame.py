"""The SEND_MESSAGE_V2 frame `Producer.send` writes, byte for byte (issue 28).

`Producer.send` goes straight to `_send` when `send_prepared` would only forward, and the
channel queues a small frame as one piece (header and body joined). Against a stub broker on
127.0.0.1 that keeps the raw bytes of every request, each frame of `Producer.send` is compared
with the frame the general request path writes (`ClientAPI.send_message`: the header built by
`ClientAPI.send_header`, through `RemotingCommand.request`) for the same header values, opaque
aside: messages with and without keys, tags and user properties, a flag, and a body near
`JOIN_MAX`. The header carries the RocketMQ 4.x names (SendMessageRequestHeaderV2's one-letter
fields, the JSON header's field names), in the order Java's fastjson writes them.
"""

from __future__ import annotations

import functools
import struct
from typing import Any

import pytest
import trio

from common.message_properties import decode_properties
from common.remoting.channel import JOIN_MAX
from common.remoting.codec import decode_frame, encode
from common.remoting.codes import RequestCode
from common.remoting.command import RESPONSE_FLAG, RemotingCommand
from common.serde import to_json
from rmq import Message, Producer
from rmq.client_api import ClientAPI

pytestmark = pytest.mark.timeout(60)

TOPIC = "FrameTopic"
GROUP = "frame_group"


class _Stub:
    """Nameserver and broker at one address: a route of one broker, every send answered."""

    def __init__(self) -> None:
        self.port = 0
        self.sends: list[bytes] = []  # raw SEND_MESSAGE_V2 frames, length prefix included

    def _route(self) -> bytes:
        return to_json(
            {
                "brokerDatas": [
                    {
                        "cluster": "C",
                        "brokerName": "broker-a",
                        "brokerAddrs": {"0": f"127.0.0.1:{self.port}"},
                    }
                ],
                "queueDatas": [
                    {
                        "brokerName": "broker-a",
                        "readQueueNums": 4,
                        "writeQueueNums": 4,
                        "perm": 6,
                        "topicSysFlag": 0,
                    }
                ],
            }
        )

    def _answer(self, raw: bytes) -> bytes:
        req = decode_frame(raw[4:])
        ext: dict[str, str] = {}
        body = b""
        if req.code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_MESSAGE):
            self.sends.append(raw)
            ext = {"msgId": "00", "queueId": req.ext_fields["e"], "queueOffset": "0"}
        elif req.code == RequestCode.GET_ROUTEINFO_BY_TOPIC:
            body = self._route()
        return encode(
            RemotingCommand(
                code=0, opaque=req.opaque, flag=RESPONSE_FLAG, ext_fields=ext, body=body
            )
        )

    async def serve(self, stream: trio.SocketStream) -> None:
        buf = b""
        try:
            while data := await stream.receive_some(1 << 16):
                buf += data
                while len(buf) >= 4:
                    (n,) = struct.unpack_from(">i", buf)
                    if len(buf) < 4 + n:
                        break
                    raw, buf = buf[: 4 + n], buf[4 + n :]
                    if not decode_frame(raw[4:]).flag & 2:  # not oneway
                        await stream.send_all(self._answer(raw))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass


def _general_frame(raw: bytes, producer: Producer, opaque: int) -> RemotingCommand:
    """The command the general path builds for the header values `raw` carries."""
    cmd = decode_frame(raw[4:])
    ext = cmd.ext_fields
    header = ClientAPI.send_header(
        group=GROUP,
        topic=TOPIC,
        queue_id=int(ext["e"]),
        properties=decode_properties(ext["i"]),
        born_timestamp=int(ext["g"]),
        flag=int(ext["h"]),
        default_topic=producer.create_topic_key,
        default_topic_queue_nums=producer.default_topic_queue_nums,
        broker_name="broker-a",
    )
    general = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, header, cmd.body_bytes())
    general.opaque = opaque
    return general


MESSAGES: list[tuple[str, dict[str, Any]]] = [
    ("plain", {}),
    ("tags", {"tags": "TagA"}),
    ("keys", {"keys": "k1"}),
    ("key list", {"keys": ["k1", "k2"]}),
    ("properties", {"properties": {"color": "blue", "ünï": "çödé"}}),
    ("all", {"tags": "T", "keys": ["a b", "c"], "properties": {"p": "1"}, "flag": 7}),
    ("no wait", {"wait_store_ok": False}),
]


@pytest.mark.parametrize("body_len", [1, 1024, JOIN_MAX, JOIN_MAX + 1])
async def test_send_writes_the_general_paths_frame(body_len: int) -> None:
    stub = _Stub()
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, stub.serve, 0, host="127.0.0.1")
        )
        stub.port = listeners[0].socket.getsockname()[1]
        addr = f"127.0.0.1:{stub.port}"
        async with Producer(GROUP, addr, send_timeout=10) as p:
            for _, kwargs in MESSAGES:
                await p.send(Message(TOPIC, b"b" * body_len, **kwargs))
            fast = list(stub.sends)
            assert len(fast) == len(MESSAGES)
            # the same header values through ClientAPI.send_message (RemotingCommand.request)
            for raw in fast:
                general = _general_frame(raw, p, 0)
                await p.client.api.send_message(
                    addr, general.ext_fields, general.body_bytes(), timeout=10
                )
        nursery.cancel_scope.cancel()
    generals = stub.sends[len(MESSAGES) :]
    for (name, kwargs), raw, general_raw in zip(MESSAGES, fast, generals, strict=True):
        cmd = decode_frame(raw[4:])
        # the general path's bytes with this frame's opaque (assigned per request on the wire)
        other = decode_frame(general_raw[4:])
        other.opaque = cmd.opaque
        assert raw == encode(other), name
        assert raw == encode(_general_frame(raw, p, cmd.opaque)), name
        # RocketMQ 4.x names: the JSON header's fields and SendMessageRequestHeaderV2's
        header_len = struct.unpack_from(">I", raw, 4)[0] & 0xFFFFFF
        header = raw[8 : 8 + header_len]
        positions = [
            header.index(f'"{f}":'.encode())
            for f in ("code", "extFields", "flag", "language", "opaque")
        ]
        assert positions == sorted(positions), name
        assert b'"serializeTypeCurrentRPC":"JSON"' in header
        assert list(cmd.ext_fields) == list("abcdefghijkmn"), name
        assert cmd.code == RequestCode.SEND_MESSAGE_V2
        assert (cmd.ext_fields["a"], cmd.ext_fields["b"]) == (GROUP, TOPIC)
        assert cmd.ext_fields["h"] == str(kwargs.get("flag", 0))
        assert cmd.body == b"b" * body_len
        props = decode_properties(cmd.ext_fields["i"])
        assert "UNIQ_KEY" in props
        if "tags" in kwargs:
            assert props["TAGS"] == kwargs["tags"]
        if "keys" in kwargs:
            keys = kwargs["keys"]
            assert props["KEYS"] == (keys if isinstance(keys, str) else " ".join(keys))
        for k, v in kwargs.get("properties", {}).items():
            assert props[k] == v
        assert props.get("WAIT", "true") == ("false" if name == "no wait" else "true")
