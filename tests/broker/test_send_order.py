"""Pipelined sends on one connection are stored in arrival order.

DESIGN.md: "no await between receiving a send and appending it, so order is arrival order". Trio
may run a batch of new tasks in any order (it reverses batches at random), so a server that
starts one task per request and appends inside it stores pipelined sends out of order at random.
These tests write many SEND_MESSAGE / SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE frames in one go on one
raw TCP connection and check that the queue offsets and the stored bodies follow request order.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from broker.config import BrokerConfig
from broker.service import run_broker
from broker.store import MessageStoreConfig, run_memory_store
from common.batch_body import encode_batch_body
from common.message import decode_records
from common.message_properties import encode_properties
from common.remoting.client import open_remoting_client
from common.remoting.codec import FrameDecoder, encode
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand

TOPIC = "OrderTopic"


def _config(tmp_path: Path, flush: str) -> BrokerConfig:
    store = MessageStoreConfig(
        store_path_root_dir=tmp_path / "store",
        mapped_file_size_commit_log=64 * 1024 * 1024,
        mapped_file_size_consume_queue=300 * 20,
        flush_disk_type=flush,
    )
    return BrokerConfig(listen_port=0, store=store)


def _send(i: int, kind: str) -> tuple[RemotingCommand, list[bytes]]:
    props = encode_properties({"UNIQ_KEY": f"U{i:08d}", "WAIT": "true"})
    if kind == "v1":
        body = b"m%06d" % i
        ext = {
            "producerGroup": "pg",
            "topic": TOPIC,
            "defaultTopic": "TBW102",
            "defaultTopicQueueNums": 1,
            "queueId": 0,
            "sysFlag": 0,
            "bornTimestamp": 1700000000000,
            "flag": 0,
            "properties": props,
            "reconsumeTimes": 0,
        }
        return RemotingCommand.request(RequestCode.SEND_MESSAGE, ext, body), [body]
    ext = {
        "a": "pg",
        "b": TOPIC,
        "c": "TBW102",
        "d": 1,
        "e": 0,
        "f": 0,
        "g": 1700000000000,
        "h": 0,
        "i": props,
        "j": 0,
    }
    if kind == "v2":
        body = b"m%06d" % i
        return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, ext, body), [body]
    bodies = [b"m%06d-%d" % (i, k) for k in range(3)]
    ext["m"] = "true"
    batch = encode_batch_body((0, b, {"UNIQ_KEY": f"U{i:08d}-{k}"}) for k, b in enumerate(bodies))
    return RemotingCommand.request(RequestCode.SEND_BATCH_MESSAGE, ext, batch), bodies


@pytest.mark.parametrize(
    ("store", "flush"),
    [("memory", "ASYNC_FLUSH"), ("file", "ASYNC_FLUSH"), ("file", "SYNC_FLUSH")],
)
async def test_pipelined_sends_keep_arrival_order(tmp_path, nursery, store, flush):
    factory = run_memory_store if store == "memory" else None
    handle = await nursery.start(
        lambda task_status: run_broker(
            _config(tmp_path, flush), store_factory=factory, task_status=task_status
        )
    )
    n = 300
    kinds = ["v1", "v2", "batch"]
    frames, expected = [], []
    for i in range(n):
        cmd, bodies = _send(i, kinds[i % 3] if i else "v2")  # the first creates the topic
        cmd.opaque = i + 1
        frames.append(encode(cmd))
        expected.append(bodies)

    stream = await trio.open_tcp_stream("127.0.0.1", handle.port)
    async with stream:
        # The first send creates the topic; the rest go in one write, many per received chunk.
        await stream.send_all(frames[0])
        decoder = FrameDecoder()
        answers: dict[int, RemotingCommand] = {}

        async def read(count: int) -> None:
            while len(answers) < count:
                data = await stream.receive_some(65536)
                assert data, "broker closed the connection"
                for resp in decoder.feed(data):
                    answers[resp.opaque] = resp

        with trio.fail_after(60):
            await read(1)
            await stream.send_all(b"".join(frames[1:]))
            await read(n)

    offsets = []
    for i in range(n):
        resp = answers[i + 1]
        assert resp.code == ResponseCode.SUCCESS, resp.remark
        assert resp.ext_fields["queueId"] == "0"
        offsets.append(int(resp.ext_fields["queueOffset"]))
    want, next_offset = [], 0
    for bodies in expected:
        want.append(next_offset)
        next_offset += len(bodies)
    assert offsets == want, "queue offsets do not follow request order"

    # What was stored, in queue order, is every body in request order.
    async with open_remoting_client() as client:
        stored: list[bytes] = []
        while len(stored) < next_offset:
            ext = {
                "consumerGroup": "cg",
                "topic": TOPIC,
                "queueId": 0,
                "queueOffset": len(stored),
                "maxMsgNums": 32,
                "sysFlag": 4,
                "commitOffset": -1,
                "suspendTimeoutMillis": 0,
                "subscription": "*",
                "subVersion": 0,
            }
            req = RemotingCommand.request(RequestCode.PULL_MESSAGE, ext)
            resp = await client.invoke(handle.addr, req, timeout=20)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            stored.extend(m.body for m in decode_records(resp.body_bytes()))
    assert stored == [b for bodies in expected for b in bodies]
