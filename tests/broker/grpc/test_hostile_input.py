"""Hostile input on the broker's gRPC port: the connection is closed, the broker keeps serving
both its gRPC and its 4.x remoting port."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import trio

from common.grpc.v2 import definition_pb2 as pb
from common.grpc.v2 import service_pb2 as spb
from common.remoting.client import open_remoting_client
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from tests.broker.grpc.support import GrpcClient, create_topic, grpc_broker, run_sync

pytestmark = pytest.mark.timeout(60)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


async def test_garbage_and_broken_frames_close_only_their_connections(tmp_path: Path) -> None:
    async with grpc_broker(tmp_path) as b:
        await create_topic(b, "Safe")
        payloads = [
            b"\x00" * 4096,
            b"GET / HTTP/1.1\r\nHost: broker\r\n\r\n",
            PREFACE + b"\x00\x00\x04\x04\x00\x00\x00\x00\x00abcd",  # SETTINGS of 4 bytes
            PREFACE + b"\xff\xff\xff\x01\x05\x00\x00\x00\x01" + b"x" * 100,  # a 16 MB HEADERS
        ]
        assert b.grpc_port is not None
        for payload in payloads * 5:
            stream = await trio.open_tcp_stream("127.0.0.1", b.grpc_port)
            await stream.send_all(payload)
            with trio.fail_after(5):
                while await stream.receive_some(65536):
                    pass  # the server answers (GOAWAY) and closes
            await stream.aclose()
        assert len(b.controller.producer_manager.groups) == 0
        async with open_remoting_client() as remoting:
            answer = await remoting.invoke(
                b.addr, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO)
            )
            assert answer.code == ResponseCode.SUCCESS
        client = GrpcClient(f"127.0.0.1:{b.grpc_port}")
        try:
            route = await run_sync(
                partial(
                    client.unary,
                    "QueryRoute",
                    spb.QueryRouteRequest(topic=pb.Resource(name="Safe")),
                )
            )
            assert route.status.code == pb.OK
        finally:
            client.close()
