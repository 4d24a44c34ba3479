"""The same server and client over real loopback TCP (port 0): no autojump clock here."""

import contextlib
import os
import struct
from collections.abc import AsyncIterator

import trio

from common.remoting.channel import Channel
from common.remoting.client import open_remoting_client
from common.remoting.codec import FrameDecoder, encode
from common.remoting.codes import SerializeType
from common.remoting.command import RemotingCommand
from common.remoting.deferred_answer import DeferredAnswer, flush_batch, flush_in_batch
from common.remoting.server import RequestDispatcher, serve_remoting


async def test_tcp_round_trip_large_body_and_oversized_frame():
    d = RequestDispatcher()
    closed: list[Channel] = []
    d.add_close_listener(closed.append)

    async def echo(cmd, channel):
        view = memoryview(cmd.body)
        return cmd.response(ext_fields={"len": len(cmd.body)}, body=[view[:10], view[10:]])

    d.register(1000, echo)
    big = bytes(range(256)) * 4096  # 1 MiB
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            handle = await nursery.start(serve_remoting, d, "127.0.0.1", 0)
            assert handle.port > 0
            addr = f"127.0.0.1:{handle.port}"
            async with open_remoting_client() as client:
                resp = await client.invoke(addr, RemotingCommand.request(1000, body=big), 10)
                assert resp.ext_fields == {"len": str(len(big))} and resp.body == big
                cmd = RemotingCommand.request(1000, body=b"bin")
                cmd.serialize_type = SerializeType.ROCKETMQ
                resp = await client.invoke(addr, cmd, 10)
                assert resp.serialize_type == SerializeType.ROCKETMQ and resp.body == b"bin"
                unknown = await client.invoke(addr, RemotingCommand.request(4242), 10)
                assert unknown.code == 3

                raw = await trio.open_tcp_stream("127.0.0.1", handle.port)
                await raw.send_all(struct.pack(">i", 0x7FFFFFF0))
                assert await raw.receive_some(10) == b""  # closed by the server
                await raw.aclose()

                again = await client.invoke(addr, RemotingCommand.request(1000, body=b"x"), 10)
                assert again.body == b"x"
            nursery.cancel_scope.cancel()
    assert len(closed) >= 2


async def test_tcp_answers_larger_than_the_socket_buffer_to_a_slow_reader(monkeypatch):
    # Inline answers are written by the read loop with non-blocking writev; what the kernel does
    # not take waits for a writer task. A peer that reads slowly still gets every byte, in order.
    from common.remoting.channel import Channel

    writers = []
    real_writer = Channel._writer

    async def counting_writer(self):
        writers.append(self)
        await real_writer(self)

    monkeypatch.setattr(Channel, "_writer", counting_writer)

    d = RequestDispatcher()
    blob = bytes(range(256)) * 8192  # 2 MiB

    def big(cmd, channel):
        i = int(cmd.ext_fields["i"])
        view = memoryview(blob)
        return cmd.response(ext_fields={"i": i}, body=[view[:i], view[i:], b"%d" % i])

    d.register(1001, big, inline=True)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            handle = await nursery.start(serve_remoting, d, "127.0.0.1", 0)
            stream = await trio.open_tcp_stream("127.0.0.1", handle.port)
            frames = []
            for i in range(6):
                cmd = RemotingCommand.request(1001, {"i": i})
                cmd.opaque = i + 1
                frames.append(encode(cmd))
            await stream.send_all(b"".join(frames))
            await trio.sleep(0.2)  # let the server fill the socket buffers
            decoder = FrameDecoder()
            got: list[RemotingCommand] = []
            while len(got) < 6:
                data = await stream.receive_some(32768)
                assert data
                got.extend(decoder.feed(data))
                await trio.sleep(0.001)
            assert [c.opaque for c in got] == [1, 2, 3, 4, 5, 6]
            for c in got:
                assert c.body == blob + b"%d" % (c.opaque - 1)
            await stream.aclose()
            nursery.cancel_scope.cancel()
    assert writers, "the socket buffer never filled up: the writer task was not exercised"


@contextlib.asynccontextmanager
async def parked_requests(
    n: int, *, likely: bool = False
) -> AsyncIterator[tuple[trio.SocketStream, list[tuple[RemotingCommand, DeferredAnswer]]]]:
    """A server whose inline handler parks a DeferredAnswer per request, and a client stream
    that sent it ``n`` requests (opaque i + 1, extField i); yields (stream, parked).  With
    ``likely``, each DeferredAnswer's likely response is ``cmd.response(ext_fields={"i": i})``."""
    d = RequestDispatcher()
    parked: list[tuple[RemotingCommand, DeferredAnswer]] = []

    def park(cmd, channel):
        guess = cmd.response(ext_fields={"i": cmd.ext_fields["i"]}) if likely else None
        answer = DeferredAnswer(likely=guess)
        parked.append((cmd, answer))
        return answer

    d.register(1002, park, inline=True)
    async with trio.open_nursery() as nursery:
        handle = await nursery.start(serve_remoting, d, "127.0.0.1", 0)
        stream = await trio.open_tcp_stream("127.0.0.1", handle.port)
        frames = []
        for i in range(n):
            cmd = RemotingCommand.request(1002, {"i": i})
            cmd.opaque = i + 1
            frames.append(encode(cmd))
        await stream.send_all(b"".join(frames))
        while len(parked) < n:  # noqa: ASYNC110 - the server parses on its own schedule
            await trio.sleep(0.01)
        yield stream, parked
        await stream.aclose()
        nursery.cancel_scope.cancel()


@contextlib.contextmanager
def counted_writev():
    """The number of buffers of every os.writev call made inside the block."""
    writes: list[int] = []
    real_writev = os.writev

    def counting_writev(fd, buffers):
        writes.append(len(buffers))
        return real_writev(fd, buffers)

    os.writev = counting_writev
    try:
        yield writes
    finally:
        os.writev = real_writev


def _root_tasks() -> int:
    root = trio.lowlevel.current_root_task()
    assert root is not None
    return len(root.child_nurseries[0].child_tasks)


async def read_frames(stream: trio.abc.ReceiveStream, n: int) -> list[RemotingCommand]:
    decoder = FrameDecoder()
    got: list[RemotingCommand] = []
    while len(got) < n:
        data = await stream.receive_some(65536)
        assert data
        got.extend(decoder.feed(data))
    return got


async def test_deferred_answers_need_no_task_and_leave_together():
    """An inline handler's DeferredAnswer is answered when set, from whatever sets it; the
    answers one wake-up sets leave in one write, and no task is started per request."""
    with trio.fail_after(30):
        async with parked_requests(8) as (stream, parked):
            tasks_before = _root_tasks()
            with counted_writev() as writes:
                for cmd, answer in reversed(parked):  # any order: opaques match them up
                    answer.set(cmd.response(ext_fields={"i": cmd.ext_fields["i"]}))
                got = await read_frames(stream, 8)
            assert sorted(c.opaque for c in got) == list(range(1, 9))
            assert all(c.ext_fields["i"] == str(c.opaque - 1) for c in got)
            assert writes == [8]  # eight answers, one writev
            tasks_after = _root_tasks()
            assert tasks_after == tasks_before


async def test_answers_set_in_a_flush_batch_leave_when_it_ends():
    """Set inside ``flush_batch`` (what the replica watermark does on an ack), the answers
    are written when the block ends: one writev, and no run_sync_soon (whose wake-up socket
    costs the loop a send, an epoll event and a recv per released batch)."""
    with trio.fail_after(30):
        async with parked_requests(4) as (stream, parked):
            token = trio.lowlevel.current_trio_token()
            soon = []
            real_soon = type(token).run_sync_soon
            type(token).run_sync_soon = lambda self, *a, **k: soon.append(a)  # type: ignore[method-assign]
            try:
                with counted_writev() as writes:
                    with flush_batch():
                        for cmd, answer in parked:
                            answer.set(cmd.response())
                        assert writes == []  # nothing leaves inside the block
                    assert writes == [4]  # all four in one writev, before the block returned
                assert soon == []
            finally:
                type(token).run_sync_soon = real_soon  # type: ignore[method-assign]
            got = await read_frames(stream, 4)
            assert sorted(c.opaque for c in got) == [1, 2, 3, 4]


async def test_a_likely_answer_is_encoded_before_it_is_set(monkeypatch):
    """The likely response leaves as the bytes made when the request was parked (no encode
    when it is set); any other response is encoded when set.  Both decode to what was set."""
    from common.remoting import channel as channel_module

    with trio.fail_after(30):
        async with parked_requests(4, likely=True) as (stream, parked):
            encodes = []
            real = channel_module.encode_header_and_prefix

            def counting(cmd, body_len):
                encodes.append(cmd.opaque)
                return real(cmd, body_len)

            monkeypatch.setattr(channel_module, "encode_header_and_prefix", counting)
            for _cmd, answer in parked[:2]:
                assert answer.likely is not None
                answer.set(answer.likely)
            for cmd, answer in parked[2:]:
                answer.set(cmd.response(17, "not the likely one"))
            got = {c.opaque: c for c in await read_frames(stream, 4)}
            assert encodes == [3, 4]  # the two likely ones were made before
            for i in (1, 2):
                assert got[i].code == 0 and got[i].ext_fields == {"i": str(i - 1)}
            for i in (3, 4):
                assert got[i].code == 17 and got[i].remark == "not the likely one"
            assert all(c.flag & 1 for c in got.values())  # responses


def test_a_failing_flush_does_not_skip_the_ones_after_it(caplog):
    """Every flush queued in a batch runs at its end, even after one that raised (logged)."""
    ran: list[str] = []

    def boom() -> None:
        raise RuntimeError("boom")

    with flush_batch():
        assert flush_in_batch(lambda: ran.append("first"))
        assert flush_in_batch(boom)
        assert flush_in_batch(lambda: ran.append("last"))
        with flush_batch():  # nested: the outer block flushes
            assert flush_in_batch(lambda: ran.append("nested"))
        assert ran == []
    assert ran == ["first", "last", "nested"]
    assert "boom" in caplog.text
    assert not flush_in_batch(lambda: None)  # no batch open any more
