"""A broker with its gRPC endpoint, and a generic gRPC client (grpcio, run in a thread) speaking
the MessagingService with the metadata the official 5.x clients send."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import trio

from broker.config import BrokerConfig
from broker.service import BrokerHandle, run_broker
from broker.store import MessageStoreConfig, run_memory_store
from common.grpc.v2 import method_path
from common.grpc.v2 import service_pb2 as spb
from common.remoting.client import open_remoting_client
from common.remoting.codes import RequestCode
from common.remoting.command import RemotingCommand

RESPONSES: dict[str, Any] = {
    "QueryRoute": spb.QueryRouteResponse,
    "Heartbeat": spb.HeartbeatResponse,
    "SendMessage": spb.SendMessageResponse,
    "QueryAssignment": spb.QueryAssignmentResponse,
    "AckMessage": spb.AckMessageResponse,
    "EndTransaction": spb.EndTransactionResponse,
    "NotifyClientTermination": spb.NotifyClientTerminationResponse,
    "ChangeInvisibleDuration": spb.ChangeInvisibleDurationResponse,
    "GetOffset": spb.GetOffsetResponse,
    "QueryOffset": spb.QueryOffsetResponse,
    "UpdateOffset": spb.UpdateOffsetResponse,
    "ForwardMessageToDeadLetterQueue": spb.ForwardMessageToDeadLetterQueueResponse,
}


def metadata(client_id: str) -> list[tuple[str, str]]:
    return [
        ("x-mq-language", "PYTHON"),
        ("x-mq-protocol", "GRPC_V2"),
        ("x-mq-client-version", "5.1.2"),
        ("x-mq-request-id", str(uuid.uuid4())),
        ("x-mq-client-id", client_id),
        ("x-mq-namespace", ""),
        ("authorization", "MQv2-HMAC-SHA1 Credential=, SignedHeaders=x-mq-date-time, Signature=0"),
    ]


class GrpcClient:
    """Blocking calls (run them with ``trio.to_thread.run_sync``)."""

    def __init__(self, target: str, client_id: str = "host@1@0@test") -> None:
        self.channel = grpc.insecure_channel(target)
        self.client_id = client_id

    def close(self) -> None:
        self.channel.close()

    def unary(self, name: str, request: Any, timeout: float = 5.0) -> Any:
        call = self.channel.unary_unary(
            method_path(name),
            request_serializer=type(request).SerializeToString,
            response_deserializer=RESPONSES[name].FromString,
        )
        return call(request, timeout=timeout, metadata=metadata(self.client_id))

    def receive(self, request: spb.ReceiveMessageRequest, timeout: float = 10.0) -> list[Any]:
        call = self.channel.unary_stream(
            method_path("ReceiveMessage"),
            request_serializer=spb.ReceiveMessageRequest.SerializeToString,
            response_deserializer=spb.ReceiveMessageResponse.FromString,
        )
        return list(call(request, timeout=timeout, metadata=metadata(self.client_id)))

    def telemetry(self, commands: Iterator[spb.TelemetryCommand], timeout: float = 10.0) -> Any:
        call = self.channel.stream_stream(
            method_path("Telemetry"),
            request_serializer=spb.TelemetryCommand.SerializeToString,
            response_deserializer=spb.TelemetryCommand.FromString,
        )
        return call(commands, timeout=timeout, metadata=metadata(self.client_id))


async def run_sync(fn: Callable[[], Any]) -> Any:
    return await trio.to_thread.run_sync(fn)


async def start_broker(nursery: trio.Nursery, tmp_path: Path, **kw: Any) -> BrokerHandle:
    config = BrokerConfig(
        listen_port=0, store=MessageStoreConfig(store_path_root_dir=str(tmp_path)), **kw
    )
    handle: BrokerHandle = await nursery.start(
        lambda task_status: run_broker(
            config, store_factory=run_memory_store, task_status=task_status
        )
    )
    return handle


@contextlib.asynccontextmanager
async def grpc_broker(tmp_path: Path, **kw: Any) -> AsyncIterator[BrokerHandle]:
    async with trio.open_nursery() as nursery:
        yield await start_broker(nursery, tmp_path, **kw)
        nursery.cancel_scope.cancel()


async def create_topic(
    handle: BrokerHandle, topic: str, queues: int = 4, attributes: str = ""
) -> None:
    fields: dict[str, object] = {
        "topic": topic,
        "defaultTopic": "TBW102",
        "readQueueNums": queues,
        "writeQueueNums": queues,
        "perm": 6,
        "topicFilterType": "SINGLE_TAG",
        "topicSysFlag": 0,
        "order": False,
    }
    if attributes:
        fields["attributes"] = attributes
    async with open_remoting_client() as client:
        answer = await client.invoke(
            handle.addr, RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, fields)
        )
        assert answer.code == 0, answer.remark
