"""A grpcio client that compresses its requests (gzip, as any gRPC client may) is served by
the broker's gRPC port: the message it sends is stored and read back whole."""

from __future__ import annotations

import uuid
from pathlib import Path

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from common.grpc.v2 import definition_pb2 as pb
from common.grpc.v2 import method_path
from common.grpc.v2 import service_pb2 as spb
from tests.broker.grpc.support import create_topic, grpc_broker, metadata, run_sync

pytestmark = pytest.mark.timeout(60)


async def test_gzip_compressed_requests_are_served(tmp_path: Path) -> None:
    async with grpc_broker(tmp_path) as b:
        await create_topic(b, "Zipped", queues=1)
        channel = grpc.insecure_channel(
            f"127.0.0.1:{b.grpc_port}", compression=grpc.Compression.Gzip
        )
        body = b"compressible " * 50_000  # 650 KB that gzip makes a few KB
        request = spb.SendMessageRequest(
            messages=[
                pb.Message(
                    topic=pb.Resource(name="Zipped"),
                    body=body,
                    system_properties=pb.SystemProperties(
                        message_id=uuid.uuid4().hex, body_encoding=pb.IDENTITY
                    ),
                )
            ]
        )
        send = channel.unary_unary(
            method_path("SendMessage"),
            request_serializer=spb.SendMessageRequest.SerializeToString,
            response_deserializer=spb.SendMessageResponse.FromString,
        )
        try:
            answer = await run_sync(
                lambda: send(request, timeout=10, metadata=metadata("zip@1@0@test"))
            )
            assert answer.status.code == pb.OK, answer.status
            receive = channel.unary_stream(
                method_path("ReceiveMessage"),
                request_serializer=spb.ReceiveMessageRequest.SerializeToString,
                response_deserializer=spb.ReceiveMessageResponse.FromString,
            )
            request_receive = spb.ReceiveMessageRequest(
                group=pb.Resource(name="G"),
                message_queue=pb.MessageQueue(topic=pb.Resource(name="Zipped"), id=-1),
                filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"),
                batch_size=1,
                invisible_duration=Duration(seconds=20),
                long_polling_timeout=Duration(seconds=1),
            )
            answers = await run_sync(
                lambda: list(
                    receive(request_receive, timeout=10, metadata=metadata("zip@1@0@test"))
                )
            )
            got = [a.message for a in answers if a.HasField("message")]
            assert [m.body for m in got] == [body]
        finally:
            channel.close()
