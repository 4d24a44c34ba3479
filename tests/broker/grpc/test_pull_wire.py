"""PullMessage, GetOffset, QueryOffset and UpdateOffset on a real broker, spoken as any gRPC
client speaks them (grpcio with the generated stubs' messages): no official 5.x client calls
them, so the wire is what the proto defines (broker/grpc/offsets.py)."""

from __future__ import annotations

import uuid
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import pytest
import trio
from google.protobuf.duration_pb2 import Duration

from common.grpc.v2 import definition_pb2 as pb
from common.grpc.v2 import method_path
from common.grpc.v2 import service_pb2 as spb
from tests.broker.grpc.support import GrpcClient, create_topic, grpc_broker, metadata, run_sync

pytestmark = pytest.mark.timeout(60)

TOPIC = "PullMe"


def message(body: bytes, tag: str) -> pb.Message:
    return pb.Message(
        topic=pb.Resource(name=TOPIC),
        body=body,
        system_properties=pb.SystemProperties(
            message_id=uuid.uuid4().hex, body_encoding=pb.IDENTITY, tag=tag
        ),
    )


def queue(topic: str = TOPIC, queue_id: int = 0) -> pb.MessageQueue:
    return pb.MessageQueue(topic=pb.Resource(name=topic), id=queue_id)


class Puller:
    def __init__(self, target: str) -> None:
        self.channel = grpc.insecure_channel(target)
        self.call = self.channel.unary_stream(
            method_path("PullMessage"),
            request_serializer=spb.PullMessageRequest.SerializeToString,
            response_deserializer=spb.PullMessageResponse.FromString,
        )

    def pull(
        self,
        offset: int,
        *,
        topic: str = TOPIC,
        queue_id: int = 0,
        batch: int = 32,
        tag: str = "*",
        poll_s: int = 0,
        timeout: float = 20,
    ) -> tuple[int, list[pb.Message], int | None]:
        """(status code, messages, next_offset) of one pull; the stream's shape is checked."""
        request = spb.PullMessageRequest(
            group=pb.Resource(name="pull-group"),
            message_queue=queue(topic, queue_id),
            offset=offset,
            batch_size=batch,
            filter_expression=pb.FilterExpression(type=pb.TAG, expression=tag),
        )
        if poll_s:
            request.long_polling_timeout.CopyFrom(Duration(seconds=poll_s))
        answers = list(self.call(request, timeout=timeout, metadata=metadata("pull@1@0@t")))
        kinds = [a.WhichOneof("content") for a in answers]
        # the shape: one status first, then messages, then at most one next_offset, last
        assert kinds[0] == "status", kinds
        assert kinds.count("status") == 1 and kinds.count("next_offset") <= 1, kinds
        if "next_offset" in kinds:
            assert kinds[-1] == "next_offset", kinds
        messages = [a.message for a in answers if a.HasField("message")]
        nexts = [a.next_offset for a in answers if a.WhichOneof("content") == "next_offset"]
        return answers[0].status.code, messages, nexts[0] if nexts else None

    def close(self) -> None:
        self.channel.close()


async def test_pull_by_offset_with_filters_bounds_and_long_polling(tmp_path: Path) -> None:
    async with grpc_broker(tmp_path) as b:
        await create_topic(b, TOPIC, queues=1)
        target = f"127.0.0.1:{b.grpc_port}"
        client = GrpcClient(target)
        puller = Puller(target)
        try:
            for i in range(6):
                request = spb.SendMessageRequest(
                    messages=[message(b"m%d" % i, "a" if i % 2 == 0 else "b")]
                )
                sent = await run_sync(partial(client.unary, "SendMessage", request))
                assert sent.status.code == pb.OK
                assert sent.entries[0].offset == i

            # from an offset, in batches
            code, got, nxt = await run_sync(lambda: puller.pull(0, batch=4))
            assert code == pb.OK
            assert [m.body for m in got] == [b"m0", b"m1", b"m2", b"m3"]
            assert [m.system_properties.queue_offset for m in got] == [0, 1, 2, 3]
            assert got[0].system_properties.tag == "a" and got[0].topic.name == TOPIC
            assert nxt == 4
            code, got, nxt = await run_sync(lambda: puller.pull(4))
            assert (code, [m.body for m in got], nxt) == (pb.OK, [b"m4", b"m5"], 6)

            # a tag filter: the others are skipped, next_offset past them
            code, got, nxt = await run_sync(lambda: puller.pull(0, tag="b"))
            assert (code, [m.body for m in got], nxt) == (pb.OK, [b"m1", b"m3", b"m5"], 6)
            code, got, nxt = await run_sync(lambda: puller.pull(5, tag="a"))
            assert (code, got, nxt) == (pb.MESSAGE_NOT_FOUND, [], 6)

            # at the end: nothing yet, go on from there; past it: ILLEGAL_OFFSET, and where to
            # go on (RocketMQ's store: the queue's start while it still holds message 0)
            code, got, nxt = await run_sync(lambda: puller.pull(6))
            assert (code, got, nxt) == (pb.MESSAGE_NOT_FOUND, [], 6)
            code, got, nxt = await run_sync(lambda: puller.pull(100))
            assert (code, got, nxt) == (pb.ILLEGAL_OFFSET, [], 0)

            # what has no queue to read: the status alone
            code, got, nxt = await run_sync(lambda: puller.pull(0, topic="NoSuchTopic"))
            assert (code, got, nxt) == (pb.TOPIC_NOT_FOUND, [], None)
            code, got, nxt = await run_sync(lambda: puller.pull(0, queue_id=3))
            assert (code, got, nxt) == (pb.BAD_REQUEST, [], None)
            code, got, nxt = await run_sync(lambda: puller.pull(-1))
            assert (code, got, nxt) == (pb.ILLEGAL_OFFSET, [], None)

            # long polling: a pull at the end waits for the next message
            results: list[Any] = []

            async def poll() -> None:
                results.append(await run_sync(lambda: puller.pull(6, poll_s=15)))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(poll)
                with trio.fail_after(10):
                    while not b.controller.pull_hold.waiting_count(TOPIC, 0):  # noqa: ASYNC110
                        await trio.sleep(0.05)
                request = spb.SendMessageRequest(messages=[message(b"late", "a")])
                sent = await run_sync(partial(client.unary, "SendMessage", request))
                assert sent.status.code == pb.OK
            [(code, got, nxt)] = results
            assert (code, [m.body for m in got], nxt) == (pb.OK, [b"late"], 7)
        finally:
            client.close()
            puller.close()


async def test_update_then_get_offset_and_query_offset_by_policy(tmp_path: Path) -> None:
    async with grpc_broker(tmp_path) as b:
        await create_topic(b, TOPIC, queues=2)
        client = GrpcClient(f"127.0.0.1:{b.grpc_port}")
        group = pb.Resource(name="offset-group")
        try:
            for i in range(3):
                request = spb.SendMessageRequest(messages=[message(b"m%d" % i, "a")])
                sent = await run_sync(partial(client.unary, "SendMessage", request))
                assert sent.status.code == pb.OK
            counts = {0: 0, 1: 0}
            for qid in counts:
                end = await run_sync(
                    partial(
                        client.unary,
                        "QueryOffset",
                        spb.QueryOffsetRequest(
                            message_queue=queue(queue_id=qid), query_offset_policy=pb.END
                        ),
                    )
                )
                assert end.status.code == pb.OK
                counts[qid] = end.offset
            assert sum(counts.values()) == 3
            qid = max(counts, key=lambda q: counts[q])
            begin = await run_sync(
                partial(
                    client.unary,
                    "QueryOffset",
                    spb.QueryOffsetRequest(
                        message_queue=queue(queue_id=qid), query_offset_policy=pb.BEGINNING
                    ),
                )
            )
            assert (begin.status.code, begin.offset) == (pb.OK, 0)

            update = await run_sync(
                partial(
                    client.unary,
                    "UpdateOffset",
                    spb.UpdateOffsetRequest(
                        group=group, message_queue=queue(queue_id=qid), offset=counts[qid]
                    ),
                )
            )
            assert update.status.code == pb.OK
            got = await run_sync(
                partial(
                    client.unary,
                    "GetOffset",
                    spb.GetOffsetRequest(group=group, message_queue=queue(queue_id=qid)),
                )
            )
            assert (got.status.code, got.offset) == (pb.OK, counts[qid])
            negative = await run_sync(
                partial(
                    client.unary,
                    "UpdateOffset",
                    spb.UpdateOffsetRequest(group=group, message_queue=queue(), offset=-5),
                )
            )
            assert negative.status.code == pb.ILLEGAL_OFFSET
        finally:
            client.close()
