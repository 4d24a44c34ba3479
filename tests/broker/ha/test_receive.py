"""Receiver: receive_some's contract over a real socket, without its per-call costs."""

from __future__ import annotations

import socket

import trio
import trio.testing

from broker.ha.receive import SMALL_READ, Receiver


def _pair() -> tuple[trio.SocketStream, socket.socket]:
    a, b = socket.socketpair()
    b.setblocking(True)
    return trio.SocketStream(trio.socket.from_stdlib_socket(a)), b


async def test_reads_what_arrived_then_eof() -> None:
    stream, peer = _pair()
    r = Receiver(stream, 8)
    with trio.fail_after(10):
        peer.sendall(b"abc")
        assert await r.receive() == b"abc"  # short: the next call waits first
        peer.sendall(b"0123456789")
        assert await r.receive() == b"01234567"  # full: the next reads first
        assert await r.receive() == b"89"
        peer.close()
        assert await r.receive() == b""
    await stream.aclose()


async def test_a_backlog_is_read_in_growing_sizes_and_a_pause_shrinks_them() -> None:
    stream, peer = _pair()
    r = Receiver(stream, 16 * SMALL_READ)
    backlog = bytes(range(256)) * (5 * SMALL_READ // 256)
    sizes: list[int] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as n:

            async def send() -> None:
                await trio.to_thread.run_sync(peer.sendall, backlog)

            n.start_soon(send)
            got = bytearray()
            while len(got) < len(backlog):
                data = await r.receive()
                sizes.append(len(data))
                got += data
        assert got == backlog
        # the first read fills SMALL_READ and the next may ask for four times as much
        assert sizes[0] == SMALL_READ and max(sizes) > SMALL_READ
        peer.sendall(b"x")
        assert await r.receive() == b"x"
        peer.sendall(b"y" * (2 * SMALL_READ))
        assert len(await r.receive()) == SMALL_READ  # back to the small size after a pause
    peer.close()
    await stream.aclose()


async def test_waits_until_bytes_come() -> None:
    stream, peer = _pair()
    r = Receiver(stream, 1024)
    got: list[bytes] = []
    async with trio.open_nursery() as n:
        n.start_soon(lambda: _append(got, r))
        await trio.sleep(0.05)
        assert got == []  # nothing yet: parked in wait_readable
        peer.sendall(b"late")
    assert got == [b"late"]
    peer.close()
    await stream.aclose()


async def _append(got: list[bytes], r: Receiver) -> None:
    got.append(bytes(await r.receive()))


async def test_a_close_by_another_task_wakes_the_reader() -> None:
    stream, peer = _pair()
    r = Receiver(stream, 1024)
    outcome: list[BaseException] = []

    async def read() -> None:
        try:
            await r.receive()
        except trio.ClosedResourceError as exc:
            outcome.append(exc)

    with trio.fail_after(10):
        async with trio.open_nursery() as n:
            n.start_soon(read)
            await trio.sleep(0.05)
            await stream.aclose()  # another task closes the connection under the reader
    assert len(outcome) == 1
    peer.close()


async def test_memory_streams_go_through_receive_some() -> None:
    a, b = trio.testing.memory_stream_pair()
    r = Receiver(a, 4)
    await b.send_all(b"hello")
    assert await r.receive() == b"hell"
