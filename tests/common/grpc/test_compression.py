"""Compressed gRPC messages (common/grpc/framing.py): gzip and deflate accepted, other encodings
UNIMPLEMENTED, and the message-size limit applied to the inflated size, zip bombs included;
the codec alone, then byte for byte through an h2 client on Trio's virtual clock."""

from __future__ import annotations

import gzip
import struct
import tracemalloc
import zlib
from functools import partial
from typing import Any

import h2.events
import pytest
import trio

from common.grpc.framing import ACCEPT_ENCODING, CompressedMessage, MessageDecoder, inflate
from common.grpc.limits import GrpcServerLimits
from common.grpc.status import GrpcError, StatusCode
from common.grpc.v2 import definition_pb2 as pb
from common.grpc.v2 import service_pb2 as spb
from tests.common.grpc.test_transport import CHAT, ECHO, SLOW, _strs, frame, served

pytestmark = pytest.mark.timeout(30)


def hello(name: str = "hello") -> bytes:
    return spb.HeartbeatRequest(group=pb.Resource(name=name)).SerializeToString()


# -- the codec ----------------------------------------------------------------------------


def test_gzip_and_deflate_inflate_back() -> None:
    data = b"rocketmq " * 1000
    assert inflate(gzip.compress(data), "gzip", 10_000) == data
    assert inflate(zlib.compress(data), "deflate", 10_000) == data
    # gzip members one after another (RFC 1952) read as one message
    assert inflate(gzip.compress(b"ab") + gzip.compress(b"cd"), "gzip", 100) == b"abcd"
    # exactly at the limit is allowed
    assert inflate(gzip.compress(b"x" * 500), "gzip", 500) == b"x" * 500


@pytest.mark.parametrize(
    ("payload", "encoding", "code"),
    [
        # (mtime=0: the gzip header's time would make the test ids differ between the
        # collections of pytest-xdist's workers)
        (gzip.compress(b"x" * 501, mtime=0), "gzip", StatusCode.RESOURCE_EXHAUSTED),
        (gzip.compress(b"x" * 300, mtime=0)[:-12], "gzip", StatusCode.INTERNAL),  # truncated
        (b"not gzip at all", "gzip", StatusCode.INTERNAL),
        (zlib.compress(b"abc") + b"tail", "deflate", StatusCode.INTERNAL),
        (gzip.compress(b"abc", mtime=0), "deflate", StatusCode.INTERNAL),  # wrong format
        (b"", "gzip", StatusCode.INTERNAL),
    ],
    ids=["oversized", "truncated", "not-gzip", "deflate-tail", "gzip-as-deflate", "empty"],
)
def test_bad_or_oversized_compressed_messages_are_errors(
    payload: bytes, encoding: str, code: StatusCode
) -> None:
    with pytest.raises(GrpcError) as info:
        inflate(payload, encoding, 500)
    assert info.value.code == code


def test_a_zip_bomb_stops_at_the_limit_without_inflating_it() -> None:
    bomb = gzip.compress(bytes(200 * 1024 * 1024))  # 200 MiB of zeros in ~200 KB
    assert len(bomb) < 300 * 1024
    limit = 1024 * 1024
    tracemalloc.start()
    try:
        with pytest.raises(GrpcError) as info:
            inflate(bomb, "gzip", limit)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.code == StatusCode.RESOURCE_EXHAUSTED
    # a few times the limit at most (the output so far, one step, a copy), never 200 MiB
    assert peak < 4 * limit, peak


def test_the_decoder_passes_compressed_messages_on_unopened() -> None:
    gz = gzip.compress(b"payload")
    decoder = MessageDecoder(1000, "gzip")
    [plain, packed] = decoder.feed(frame(b"raw") + frame(gz, flag=1))
    assert plain == b"raw" and not isinstance(plain, CompressedMessage)
    assert isinstance(packed, CompressedMessage) and packed == gz
    assert decoder.inflate(plain) == b"raw"
    assert decoder.inflate(packed) == b"payload"
    # one byte at a time: the same
    decoder = MessageDecoder(1000, "gzip")
    out = []
    for b in frame(gz, flag=1):
        out += decoder.feed(bytes([b]))
    assert [decoder.inflate(m) for m in out] == [b"payload"]
    # a set flag on a call without grpc-encoding is a protocol error
    with pytest.raises(GrpcError) as info:
        MessageDecoder(1000).feed(frame(gz, flag=1))
    assert info.value.code == StatusCode.INTERNAL
    # the compressed size is bounded before buffering too
    with pytest.raises(GrpcError) as info:
        MessageDecoder(1000, "gzip").feed(struct.pack(">BI", 1, 5000))
    assert info.value.code == StatusCode.RESOURCE_EXHAUSTED


# -- over HTTP/2 --------------------------------------------------------------------------


async def test_gzip_and_deflate_calls_are_served(autojump_clock: Any) -> None:
    async with trio.open_nursery() as nursery:
        client, _, _ = await served(nursery)
        answers = {}
        for encoding, pack in (("gzip", gzip.compress), ("deflate", zlib.compress)):
            sid = await client.request(ECHO, end=False, headers={"grpc-encoding": encoding})
            client.h2.send_data(sid, frame(pack(hello(encoding)), flag=1), end_stream=True)
            await client.flush()
            await client.until(partial(lambda s: client.trailers(s) is not None, sid))
            assert client.trailers(sid) == {"grpc-status": "0"}
            [answer] = client.messages(sid)
            answers[encoding] = spb.HeartbeatResponse.FromString(answer).status.message
        assert answers == {"gzip": "gzip", "deflate": "deflate"}
        first = next(e for e in client.events if isinstance(e, h2.events.ResponseReceived))
        assert _strs(first.headers)["grpc-accept-encoding"] == ACCEPT_ENCODING
        assert set(ACCEPT_ENCODING.split(",")) == {"identity", "gzip", "deflate"}
        nursery.cancel_scope.cancel()


async def test_a_stream_mixes_compressed_and_plain_messages(autojump_clock: Any) -> None:
    async with trio.open_nursery() as nursery:
        client, _, _ = await served(nursery)
        sid = await client.request(CHAT, end=False, headers={"grpc-encoding": "gzip"})
        for i in range(4):
            cmd = spb.TelemetryCommand(status=pb.Status(message=f"m{i}")).SerializeToString()
            client.h2.send_data(sid, frame(gzip.compress(cmd), flag=1) if i % 2 else frame(cmd))
        client.h2.end_stream(sid)
        await client.flush()
        await client.until(lambda: client.trailers(sid) is not None)
        assert client.trailers(sid) == {"grpc-status": "0"}
        got = [spb.TelemetryCommand.FromString(m).status.message for m in client.messages(sid)]
        assert got == ["m0", "m1", "m2", "m3"]
        nursery.cancel_scope.cancel()


async def test_an_unknown_encoding_is_unimplemented_naming_what_is_accepted(
    autojump_clock: Any,
) -> None:
    async with trio.open_nursery() as nursery:
        client, _, _ = await served(nursery)
        sid = await client.request(ECHO, hello(), headers={"grpc-encoding": "snappy"})
        await client.until(lambda: client.trailers(sid) is not None)
        trailers = client.trailers(sid)
        assert trailers is not None and trailers["grpc-status"] == "12"
        assert trailers["grpc-accept-encoding"] == ACCEPT_ENCODING
        assert "snappy" in trailers["grpc-message"]
        nursery.cancel_scope.cancel()


async def test_zip_bombs_and_broken_gzip_end_their_call_and_the_connection_serves_on(
    autojump_clock: Any,
) -> None:
    limits = GrpcServerLimits(max_message_size=64 * 1024)
    async with trio.open_nursery() as nursery:
        client, load, _ = await served(nursery, limits)
        bomb = gzip.compress(bytes(50 * 1024 * 1024))  # 50 MiB in ~50 KB: under the limit
        assert len(bomb) < limits.max_message_size
        sids = []
        for _ in range(5):  # a flood of them on one connection, one after another
            sid = await client.request(ECHO, end=False, headers={"grpc-encoding": "gzip"})
            data = frame(bomb, flag=1)
            for at in range(0, len(data), 16384):  # HTTP/2's default largest frame
                client.h2.send_data(sid, data[at : at + 16384])
            client.h2.end_stream(sid)
            await client.flush()
            sids.append(sid)
            await client.until(partial(lambda s: client.trailers(s) is not None, sid))
        for sid in sids:
            trailers = client.trailers(sid)
            assert trailers is not None and trailers["grpc-status"] == "8", trailers
            assert "inflates past the limit" in trailers["grpc-message"]
        broken = await client.request(ECHO, end=False, headers={"grpc-encoding": "gzip"})
        client.h2.send_data(broken, frame(b"\x1f\x8b\x08garbage", flag=1), end_stream=True)
        await client.flush()
        await client.until(lambda: client.trailers(broken) is not None)
        trailers = client.trailers(broken)
        assert trailers is not None and trailers["grpc-status"] == "13"
        ok = await client.request(ECHO, hello())
        await client.until(lambda: client.trailers(ok) is not None)
        assert client.trailers(ok) == {"grpc-status": "0"}
        assert client.goaway() is None
        nursery.cancel_scope.cancel()


async def test_what_calls_hold_decompressed_is_bounded_per_connection(autojump_clock: Any) -> None:
    """Each stream's bomb is within the message limit, but together they would hold far more
    than the bytes sent: past max_buffered_inbound a call is refused, and a call's end frees
    its share."""
    limits = GrpcServerLimits(max_message_size=64 * 1024, max_buffered_inbound=256 * 1024)
    big = gzip.compress(hello("x" * 60_000))  # ~60 KB inflated from a few hundred bytes
    assert len(big) < 1000
    async with trio.open_nursery() as nursery:
        client, _, _ = await served(nursery, limits)

        async def call(path: str) -> int:
            sid = await client.request(path, end=False, headers={"grpc-encoding": "gzip"})
            client.h2.send_data(sid, frame(big, flag=1), end_stream=True)
            await client.flush()
            return sid

        held = [await call(SLOW) for _ in range(4)]  # 4 x 60 KB: within the 256 KB
        refused = await call(SLOW)
        await client.until(lambda: client.trailers(refused) is not None)
        trailers = client.trailers(refused)
        assert trailers is not None and trailers["grpc-status"] == "8", trailers
        assert "decompressed" in trailers["grpc-message"]
        assert all(client.trailers(sid) is None for sid in held)  # still running
        # one held call ends (the client cancels it): its share is free again
        client.h2.reset_stream(held[0])
        await client.flush()
        await trio.sleep(1)
        ok = await call(ECHO)
        await client.until(lambda: client.trailers(ok) is not None)
        assert client.trailers(ok) == {"grpc-status": "0"}
        [answer] = client.messages(ok)
        assert spb.HeartbeatResponse.FromString(answer).status.message == "x" * 60_000
        nursery.cancel_scope.cancel()
