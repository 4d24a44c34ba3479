"""The gRPC transport (common/grpc) byte for byte: an h2 client writes HTTP/2 frames into an
in-memory stream, the server's frames are read back and checked (statuses, trailers, resets,
GOAWAY), on Trio's virtual clock."""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.settings
import pytest
import trio
import trio.testing

from common.grpc.limits import GrpcServerLimits
from common.grpc.server import GrpcServerLoad, handle_grpc_stream
from common.grpc.service import (
    CallContext,
    Send,
    ServiceTable,
    bidi_streaming,
    server_streaming,
    unary,
)
from common.grpc.v2 import definition_pb2 as pb
from common.grpc.v2 import service_pb2 as spb

pytestmark = pytest.mark.timeout(30)

ECHO = "/test.Echo/Unary"
SLOW = "/test.Echo/Slow"
CHAT = "/test.Echo/Chat"
FLOOD = "/test.Echo/Flood"


async def echo(req: spb.HeartbeatRequest, ctx: CallContext) -> spb.HeartbeatResponse:
    return spb.HeartbeatResponse(status=pb.Status(code=pb.OK, message=req.group.name))


async def slow(req: spb.HeartbeatRequest, ctx: CallContext) -> spb.HeartbeatResponse:
    await trio.sleep(3600)
    return spb.HeartbeatResponse()


async def chat(
    requests: AsyncIterator[spb.TelemetryCommand],
    ctx: CallContext,
    send: Send[spb.TelemetryCommand],
) -> None:
    async for command in requests:
        await send(command)


flood_finished: list[bool] = []


async def flood(
    req: spb.HeartbeatRequest, ctx: CallContext, send: Send[spb.HeartbeatResponse]
) -> None:
    try:
        big = spb.HeartbeatResponse(status=pb.Status(message="x" * 60_000))
        for _ in range(1000):
            await send(big)
    finally:
        flood_finished.append(True)


SERVICES: ServiceTable = {
    ECHO: unary(spb.HeartbeatRequest, echo),
    SLOW: unary(spb.HeartbeatRequest, slow),
    CHAT: bidi_streaming(spb.TelemetryCommand, chat),
    FLOOD: server_streaming(spb.HeartbeatRequest, flood),
}


def frame(payload: bytes, flag: int = 0) -> bytes:
    return struct.pack(">BI", flag, len(payload)) + payload


def grpc_headers(path: str, **extra: str) -> list[tuple[str, str]]:
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "test"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        ("x-mq-client-id", "c1"),
        *extra.items(),
    ]


def _strs(headers: Any) -> dict[str, str]:
    return {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in headers or []
    }


class Client:
    """An HTTP/2 client speaking to one server connection through a memory stream."""

    def __init__(self, stream: trio.abc.Stream, *, window: int | None = None) -> None:
        self.stream = stream
        config = h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        self.h2 = h2.connection.H2Connection(config)
        if window is not None:
            self.h2.local_settings = h2.settings.Settings(
                client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window}
            )
        self.h2.initiate_connection()
        self.events: list[h2.events.Event] = []
        self.data: dict[int, bytearray] = {}
        self.auto_ack = True

    async def flush(self) -> None:
        data = self.h2.data_to_send()
        if data:
            await self.stream.send_all(data)

    async def request(
        self, path: str, *messages: bytes, end: bool = True, headers: dict[str, str] | None = None
    ) -> int:
        sid = self.h2.get_next_available_stream_id()
        self.h2.send_headers(
            sid, grpc_headers(path, **(headers or {})), end_stream=end and not messages
        )
        for i, m in enumerate(messages):
            self.h2.send_data(sid, frame(m), end_stream=end and i == len(messages) - 1)
        await self.flush()
        return sid

    async def pump(self) -> bool:
        """Read once; False at EOF."""
        data = await self.stream.receive_some(65536)
        if not data:
            return False
        for ev in self.h2.receive_data(data):
            self.events.append(ev)
            if isinstance(ev, h2.events.DataReceived):
                self.data.setdefault(ev.stream_id, bytearray()).extend(ev.data)
                if self.auto_ack:
                    self.h2.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                elif ev.flow_controlled_length:
                    # the connection's window only: this stream's stays shut
                    self.h2.increment_flow_control_window(ev.flow_controlled_length)
        await self.flush()
        return True

    async def until(self, done: Callable[[], bool]) -> None:
        while not done():
            if not await self.pump():
                return

    def trailers(self, sid: int) -> dict[str, str] | None:
        for ev in self.events:
            if isinstance(ev, h2.events.TrailersReceived) and ev.stream_id == sid:
                return _strs(ev.headers)
            if (
                isinstance(ev, h2.events.ResponseReceived)
                and ev.stream_id == sid
                and ev.stream_ended is not None
            ):
                return _strs(ev.headers)
        return None

    def reset(self, sid: int) -> h2.events.StreamReset | None:
        for ev in self.events:
            if isinstance(ev, h2.events.StreamReset) and ev.stream_id == sid:
                return ev
        return None

    def goaway(self) -> h2.events.ConnectionTerminated | None:
        for ev in self.events:
            if isinstance(ev, h2.events.ConnectionTerminated):
                return ev
        return None

    def messages(self, sid: int) -> list[bytes]:
        raw = bytes(self.data.get(sid, b""))
        out = []
        while raw:
            _, n = struct.unpack(">BI", raw[:5])
            out.append(raw[5 : 5 + n])
            raw = raw[5 + n :]
        return out


async def served(
    nursery: trio.Nursery,
    limits: GrpcServerLimits | None = None,
    *,
    lockstep: bool = False,
    window: int | None = None,
) -> tuple[Client, GrpcServerLoad, trio.Event]:
    client_stream: trio.abc.Stream
    server_stream: trio.abc.Stream
    if lockstep:
        client_stream, server_stream = trio.testing.lockstep_stream_pair()
    else:
        client_stream, server_stream = trio.testing.memory_stream_pair()
    load = GrpcServerLoad(limits or GrpcServerLimits())
    ended = trio.Event()

    async def serve() -> None:
        try:
            await handle_grpc_stream(server_stream, SERVICES, load, peer="test:1")
        finally:
            ended.set()

    nursery.start_soon(serve)
    client = Client(client_stream, window=window)
    await client.flush()
    return client, load, ended


async def test_unary_call_answers_message_and_ok_trailers(autojump_clock: Any) -> None:
    async with trio.open_nursery() as nursery:
        client, _, _ = await served(nursery)
        req = spb.HeartbeatRequest(group=pb.Resource(name="hello")).SerializeToString()
        sid = await client.request(ECHO, req)
        await client.until(lambda: client.trailers(sid) is not None)
        assert client.trailers(sid) == {"grpc-status": "0"}
        [answer] = client.messages(sid)
        assert spb.HeartbeatResponse.FromString(answer).status.message == "hello"
        headers = next(e for e in client.events if isinstance(e, h2.events.ResponseReceived))
        assert _strs(headers.headers)["content-type"] == "application/grpc"
        nursery.cancel_scope.cancel()


async def test_unknown_method_is_unimplemented_trailers_only(autojump_clock: Any) -> None:
    async with trio.open_nursery() as nursery:
        client, _, _ = await served(nursery)
        sid = await client.request("/test.Echo/Nope", b"")
        await client.until(lambda: client.trailers(sid) is not None)
        trailers = client.trailers(sid)
        assert trailers is not None and trailers["grpc-status"] == "12"
        assert trailers[":status"] == "200"
        nursery.cancel_scope.cancel()


async def test_not_grpc_content_type_is_415(autojump_clock: Any) -> None:
    async with trio.open_nursery() as nursery:
        client, _, _ = await served(nursery)
        sid = client.h2.get_next_available_stream_id()
        client.h2.send_headers(
            sid,
            [(":method", "GET"), (":scheme", "http"), (":path", ECHO), (":authority", "t")],
            end_stream=True,
        )
        await client.flush()
        await client.until(lambda: client.trailers(sid) is not None)
        trailers = client.trailers(sid)
        assert trailers is not None and trailers[":status"] == "415"
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    "bad",
    [
        ("X-Upper", "v"),  # upper case in a name
        ("x-ok", "a\r\nx-injected: 1"),  # CR LF in a value
        ("x-ok", "a\x00b"),  # NUL in a value
        ("connection", "keep-alive"),  # connection-specific
    ],
)
async def test_malformed_header_field_resets_only_its_stream(
    autojump_clock: Any, bad: tuple[str, str]
) -> None:
    # h2's own inbound validation is off (cost); the server's check must refuse these still
    async with trio.open_nursery() as nursery:
        client, _, _ = await served(nursery)
        client.h2.config.validate_outbound_headers = False
        client.h2.config.normalize_outbound_headers = False
        sid = client.h2.get_next_available_stream_id()
        client.h2.send_headers(sid, [*grpc_headers(ECHO), bad], end_stream=True)
        await client.flush()
        await client.until(lambda: client.reset(sid) is not None)
        reset = client.reset(sid)
        assert reset is not None and reset.error_code == h2.errors.ErrorCodes.PROTOCOL_ERROR
        # the connection serves on
        req = spb.HeartbeatRequest(group=pb.Resource(name="next")).SerializeToString()
        ok = await client.request(ECHO, req)
        await client.until(lambda: client.trailers(ok) is not None)
        assert client.trailers(ok) == {"grpc-status": "0"}
        assert client.goaway() is None
        nursery.cancel_scope.cancel()


async def test_bidi_echoes_each_message_then_ends_with_the_client(autojump_clock: Any) -> None:
    async with trio.open_nursery() as nursery:
        client, _, _ = await served(nursery)
        sid = await client.request(CHAT, end=False)
        for i in range(3):
            cmd = spb.TelemetryCommand(status=pb.Status(message=f"m{i}")).SerializeToString()
            client.h2.send_data(sid, frame(cmd))
            await client.flush()
            await client.until(partial(lambda n: len(client.messages(sid)) == n, i + 1))
        assert client.trailers(sid) is None  # still open while the client is
        client.h2.end_stream(sid)
        await client.flush()
        await client.until(lambda: client.trailers(sid) is not None)
        assert client.trailers(sid) == {"grpc-status": "0"}
        got = [spb.TelemetryCommand.FromString(m).status.message for m in client.messages(sid)]
        assert got == ["m0", "m1", "m2"]
        nursery.cancel_scope.cancel()


async def test_deadline_ends_the_call_with_deadline_exceeded(autojump_clock: Any) -> None:
    async with trio.open_nursery() as nursery:
        client, _, _ = await served(nursery)
        start = trio.current_time()
        sid = await client.request(SLOW, b"", headers={"grpc-timeout": "250m"})
        await client.until(lambda: client.trailers(sid) is not None)
        trailers = client.trailers(sid)
        assert trailers is not None and trailers["grpc-status"] == "4"
        assert 0.25 <= trio.current_time() - start < 1
        nursery.cancel_scope.cancel()


async def test_oversized_message_is_resource_exhausted_before_buffering(
    autojump_clock: Any,
) -> None:
    limits = GrpcServerLimits(max_message_size=1000)
    async with trio.open_nursery() as nursery:
        client, _, _ = await served(nursery, limits)
        sid = await client.request(ECHO, end=False)
        # only the prefix: 10 MB declared, none of it sent
        client.h2.send_data(sid, struct.pack(">BI", 0, 10_000_000))
        await client.flush()
        await client.until(lambda: client.trailers(sid) is not None)
        trailers = client.trailers(sid)
        assert trailers is not None and trailers["grpc-status"] == "8"
        # the connection still serves
        ok = await client.request(ECHO, spb.HeartbeatRequest().SerializeToString())
        await client.until(lambda: client.trailers(ok) is not None)
        assert client.trailers(ok) == {"grpc-status": "0"}
        nursery.cancel_scope.cancel()


async def test_compressed_message_and_bad_protobuf_are_refused(autojump_clock: Any) -> None:
    async with trio.open_nursery() as nursery:
        client, _, _ = await served(nursery)
        sid = await client.request(ECHO, end=False)
        client.h2.send_data(sid, frame(b"\x1f\x8b", flag=1), end_stream=True)
        await client.flush()
        await client.until(lambda: client.trailers(sid) is not None)
        trailers = client.trailers(sid)
        assert trailers is not None and trailers["grpc-status"] == "13"
        bad = await client.request(ECHO, b"\xff\xff\xff")
        await client.until(lambda: client.trailers(bad) is not None)
        trailers = client.trailers(bad)
        assert trailers is not None and trailers["grpc-status"] == "13"
        # a stream that ends inside a message
        cut = await client.request(ECHO, end=False)
        client.h2.send_data(cut, struct.pack(">BI", 0, 10) + b"abc", end_stream=True)
        await client.flush()
        await client.until(lambda: client.trailers(cut) is not None)
        trailers = client.trailers(cut)
        assert trailers is not None and trailers["grpc-status"] == "13"
        nursery.cancel_scope.cancel()


async def test_garbage_instead_of_http2_closes_the_connection(autojump_clock: Any) -> None:
    async with trio.open_nursery() as nursery:
        client_stream, server_stream = trio.testing.memory_stream_pair()
        load = GrpcServerLoad()
        ended = trio.Event()

        async def serve() -> None:
            await handle_grpc_stream(server_stream, SERVICES, load)
            ended.set()

        nursery.start_soon(serve)
        await client_stream.send_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 10)
        with trio.fail_after(5):
            await ended.wait()
        assert len(load.connections) == 0


async def test_huge_header_list_ends_the_connection_with_goaway(autojump_clock: Any) -> None:
    limits = GrpcServerLimits(max_header_list_size=4096)
    async with trio.open_nursery() as nursery:
        client, _, ended = await served(nursery, limits)
        await client.until(
            lambda: any(isinstance(e, h2.events.RemoteSettingsChanged) for e in client.events)
        )
        headers = grpc_headers(ECHO) + [(f"x-big-{i}", "v" * 1000) for i in range(20)]
        sid = client.h2.get_next_available_stream_id()
        client.h2.send_headers(sid, headers, end_stream=True)
        await client.flush()
        with trio.fail_after(5):
            await client.until(lambda: client.goaway() is not None)
            await ended.wait()
        goaway = client.goaway()
        assert goaway is not None and goaway.error_code != 0


async def test_stream_flood_past_max_concurrent_streams_is_refused(autojump_clock: Any) -> None:
    limits = GrpcServerLimits(max_concurrent_streams=4)
    async with trio.open_nursery() as nursery:
        client, _, ended = await served(nursery, limits)
        await client.until(lambda: client.h2.remote_settings.max_concurrent_streams == 4)
        # ignore the announced limit, as a hostile client would
        client.h2.remote_settings = h2.settings.Settings(
            client=False, initial_values={h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 1000}
        )
        for _ in range(50):
            sid = client.h2.get_next_available_stream_id()
            client.h2.send_headers(sid, grpc_headers(SLOW), end_stream=False)
        await client.flush()
        with trio.fail_after(5):
            await client.until(lambda: client.goaway() is not None)
            await ended.wait()
        goaway = client.goaway()
        assert goaway is not None and goaway.error_code != 0


async def test_client_that_never_grants_window_gets_its_stream_reset(
    autojump_clock: Any,
) -> None:
    flood_finished.clear()
    limits = GrpcServerLimits(send_timeout=5.0)
    async with trio.open_nursery() as nursery:
        # the client's stream window: 100 KB, and it never acknowledges what it reads
        client, _, _ = await served(nursery, limits, window=100_000)
        client.auto_ack = False
        start = trio.current_time()
        sid = await client.request(FLOOD, b"")
        await client.until(lambda: client.reset(sid) is not None)
        assert trio.current_time() - start >= 5.0
        assert len(client.data.get(sid, b"")) <= 100_000
        await trio.sleep(0.1)
        assert flood_finished == [True]
        # the connection still serves other calls
        ok = await client.request(ECHO, spb.HeartbeatRequest().SerializeToString())
        await client.until(lambda: client.trailers(ok) is not None)
        assert client.trailers(ok) == {"grpc-status": "0"}
        nursery.cancel_scope.cancel()


async def test_client_that_reads_nothing_at_all_loses_its_connection(
    autojump_clock: Any,
) -> None:
    flood_finished.clear()
    limits = GrpcServerLimits(send_timeout=5.0, outbound_high_water=64 * 1024)
    async with trio.open_nursery() as nursery:
        # lockstep: a write completes only when the peer reads, as on a full TCP socket
        client, _, ended = await served(nursery, limits, lockstep=True, window=2**31 - 1)
        await client.request(FLOOD, b"")
        # read until the server's settings are in, then never again
        await client.until(lambda: client.h2.remote_settings.max_concurrent_streams == 100)
        client.h2.increment_flow_control_window(2**31 - 1 - 65535)
        await client.flush()
        with trio.fail_after(30):
            await ended.wait()
        assert flood_finished == [True]


async def test_idle_connection_is_closed(autojump_clock: Any) -> None:
    limits = GrpcServerLimits(idle_timeout=60.0)
    async with trio.open_nursery() as nursery:
        client, load, ended = await served(nursery, limits)
        await client.pump()
        start = trio.current_time()
        with trio.fail_after(120):
            await client.until(lambda: client.goaway() is not None)
            await ended.wait()
        assert 60 <= trio.current_time() - start <= 90
        assert len(load.connections) == 0


async def test_connections_past_the_limit_are_closed_at_once(autojump_clock: Any) -> None:
    load = GrpcServerLoad(GrpcServerLimits(max_connections=1))
    async with trio.open_nursery() as nursery:
        a_client, a_server = trio.testing.memory_stream_pair()
        nursery.start_soon(handle_grpc_stream, a_server, SERVICES, load)
        await trio.sleep(0.1)
        b_client, b_server = trio.testing.memory_stream_pair()
        with trio.fail_after(1):
            await handle_grpc_stream(b_server, SERVICES, load)
        assert load.refused_connections == 1 and len(load.connections) == 1
        nursery.cancel_scope.cancel()


async def test_a_peer_that_never_finishes_the_preface_is_closed(autojump_clock: Any) -> None:
    limits = GrpcServerLimits(handshake_timeout=10.0)
    async with trio.open_nursery() as nursery:
        client_stream, server_stream = trio.testing.memory_stream_pair()
        load = GrpcServerLoad(limits)
        ended = trio.Event()

        async def serve() -> None:
            await handle_grpc_stream(server_stream, SERVICES, load)
            ended.set()

        nursery.start_soon(serve)
        start = trio.current_time()
        await client_stream.send_all(b"PRI * HTTP/2.0")  # and nothing more
        with trio.fail_after(30):
            await ended.wait()
        assert 10 <= trio.current_time() - start < 12


async def test_a_frame_announced_larger_than_max_frame_size_ends_the_connection(
    autojump_clock: Any,
) -> None:
    async with trio.open_nursery() as nursery:
        client, _, ended = await served(nursery)
        await client.pump()
        # a HEADERS frame header announcing 16 MB, and only 100 bytes of it
        await client.stream.send_all(b"\xff\xff\xff\x01\x04\x00\x00\x00\x01" + b"x" * 100)
        with trio.fail_after(5):
            await client.until(lambda: client.goaway() is not None)
            await ended.wait()
        goaway = client.goaway()
        assert goaway is not None and goaway.error_code == h2.errors.ErrorCodes.FRAME_SIZE_ERROR
