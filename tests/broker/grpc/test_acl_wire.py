"""The plain ACL on a broker's gRPC port, end to end with a generic gRPC client (grpcio): signed
calls go through, a wrong secret is UNAUTHORIZED, a missing permission FORBIDDEN, in the
response's Status (gRPC status OK) of unary, server-streaming and Telemetry calls alike."""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from broker.grpc.auth import sign
from common.grpc.v2 import definition_pb2 as pb
from common.grpc.v2 import method_path
from common.grpc.v2 import service_pb2 as spb
from common.remoting.client import open_remoting_client
from common.remoting.codes import RequestCode
from common.remoting.command import RemotingCommand
from common.session_credentials import SessionCredentials
from tests.broker.grpc.support import RESPONSES, grpc_broker, run_sync
from tests.support.wire import topic_fields

pytestmark = pytest.mark.timeout(60)

ACL = """
accounts:
  - accessKey: admin-key
    secretKey: admin-secret
    admin: true
  - accessKey: producer-key
    secretKey: producer-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - Orders=PUB|SUB
      - ReadOnly=SUB
"""


class SignedClient:
    """A 5.x client's calls, signed as rocketmq-python-client signs them."""

    def __init__(self, target: str, ak: str, sk: str) -> None:
        self.channel = grpc.insecure_channel(target)
        self.ak, self.sk = ak, sk

    def metadata(self) -> list[tuple[str, str]]:
        now = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
        auth = (
            f"MQv2-HMAC-SHA1 Credential={self.ak}, SignedHeaders=x-mq-date-time, "
            f"Signature={sign(self.sk, now)}"
        )
        return [
            ("x-mq-client-id", "acl@1@0@test"),
            ("x-mq-request-id", str(uuid.uuid4())),
            ("x-mq-date-time", now),
            ("authorization", auth),
        ]

    def unary(self, name: str, request: Any) -> Any:
        call = self.channel.unary_unary(
            method_path(name),
            request_serializer=type(request).SerializeToString,
            response_deserializer=RESPONSES[name].FromString,
        )
        return call(request, timeout=5, metadata=self.metadata())

    def receive(self, request: spb.ReceiveMessageRequest) -> list[Any]:
        call = self.channel.unary_stream(
            method_path("ReceiveMessage"),
            request_serializer=spb.ReceiveMessageRequest.SerializeToString,
            response_deserializer=spb.ReceiveMessageResponse.FromString,
        )
        return list(call(request, timeout=10, metadata=self.metadata()))

    def telemetry(self, commands: list[spb.TelemetryCommand], answers: int) -> list[Any]:
        call = self.channel.stream_stream(
            method_path("Telemetry"),
            request_serializer=spb.TelemetryCommand.SerializeToString,
            response_deserializer=spb.TelemetryCommand.FromString,
        )

        def requests() -> Iterator[spb.TelemetryCommand]:
            yield from commands

        stream = call(requests(), timeout=10, metadata=self.metadata())
        out = []
        for answer in stream:
            out.append(answer)
            if len(out) == answers:
                stream.cancel()
                break
        return out

    def close(self) -> None:
        self.channel.close()


def send_request(topic: str) -> spb.SendMessageRequest:
    return spb.SendMessageRequest(
        messages=[
            pb.Message(
                topic=pb.Resource(name=topic),
                body=b"hello",
                system_properties=pb.SystemProperties(
                    message_id=uuid.uuid4().hex, body_encoding=pb.IDENTITY
                ),
            )
        ]
    )


async def create_topic(addr: str, topic: str) -> None:
    cmd = RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, topic_fields(topic))
    SessionCredentials("admin-key", "admin-secret").sign(cmd)
    async with open_remoting_client() as client:
        answer = await client.invoke(addr, cmd)
    assert answer.code == 0, answer.remark


async def test_signed_calls_pass_and_refusals_carry_rocketmq_5_codes(tmp_path: Path) -> None:
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL)
    async with grpc_broker(tmp_path / "store", acl_enable=True, acl_file=str(acl)) as b:
        for topic in ("Orders", "ReadOnly"):
            await create_topic(b.addr, topic)
        target = f"127.0.0.1:{b.grpc_port}"
        good = SignedClient(target, "producer-key", "producer-secret")
        wrong = SignedClient(target, "producer-key", "not-the-secret")
        try:
            sent = await run_sync(lambda: good.unary("SendMessage", send_request("Orders")))
            assert sent.status.code == pb.OK, sent.status
            assert sent.entries[0].status.code == pb.OK

            refused = await run_sync(lambda: wrong.unary("SendMessage", send_request("Orders")))
            assert refused.status.code == pb.UNAUTHORIZED == 40100
            assert "Check signature failed for accessKey=producer-key" in refused.status.message
            assert not refused.entries

            forbidden = await run_sync(lambda: good.unary("SendMessage", send_request("ReadOnly")))
            assert forbidden.status.code == pb.FORBIDDEN == 40300
            assert forbidden.status.message == "No default permission for topic:ReadOnly"
            # QueryRoute needs ANY: SUB is enough
            route = await run_sync(
                lambda: good.unary(
                    "QueryRoute", spb.QueryRouteRequest(topic=pb.Resource(name="ReadOnly"))
                )
            )
            assert route.status.code == pb.OK

            # a server-streaming call: one response carrying the refusal, then the end
            receive = spb.ReceiveMessageRequest(
                group=pb.Resource(name="G"),
                message_queue=pb.MessageQueue(topic=pb.Resource(name="Elsewhere")),
                batch_size=1,
            )
            answers = await run_sync(lambda: good.receive(receive))
            assert [a.status.code for a in answers] == [pb.FORBIDDEN]
            assert answers[0].status.message == "No default permission for topic:Elsewhere"

            # Telemetry: a refused settings command is answered and dropped, the stream
            # stays; the next, allowed one is served
            def settings(topic: str) -> spb.TelemetryCommand:
                return spb.TelemetryCommand(
                    settings=pb.Settings(
                        client_type=pb.PRODUCER,
                        publishing=pb.Publishing(topics=[pb.Resource(name=topic)]),
                        user_agent=pb.UA(language=pb.PYTHON, version="5.1.2"),
                    )
                )

            talk = await run_sync(
                lambda: good.telemetry([settings("ReadOnly"), settings("Orders")], answers=2)
            )
            assert [t.status.code for t in talk] == [pb.FORBIDDEN, pb.OK]
            assert talk[1].settings.publishing.max_body_size > 0
            # an unauthenticated Telemetry stream: the refusal, then the call ends
            talk = await run_sync(lambda: wrong.telemetry([settings("Orders")], answers=2))
            assert [t.status.code for t in talk] == [pb.UNAUTHORIZED]
            assert b.controller.acl is not None and b.controller.acl.denied >= 4

            # the file is the one of the remoting port: a change reloads for both
            acl.write_text(ACL.replace("ReadOnly=SUB", "ReadOnly=PUB|SUB"))  # another size
            assert await b.controller.acl.reload_if_changed()
            allowed = await run_sync(lambda: good.unary("SendMessage", send_request("ReadOnly")))
            assert allowed.status.code == pb.OK
        finally:
            good.close()
            wrong.close()
