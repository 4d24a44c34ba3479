"""LinkProxy's faults on real loopback sockets: a delayed link keeps the stream's order and
adds its latency; a lossy link delivers every byte, late (a stall), or resets the connection;
healing ends both."""

from __future__ import annotations

import pytest
import trio

from cli.chaos.link_proxy import LinkFault, LinkProxy

pytestmark = pytest.mark.timeout(30)


async def _echo(stream: trio.SocketStream) -> None:
    try:
        while data := await stream.receive_some(65536):
            await stream.send_all(data)
    except trio.BrokenResourceError:
        pass


async def _close_on_cancel(stream: trio.SocketStream) -> None:
    try:
        await trio.sleep_forever()
    finally:
        stream.socket.close()


async def _proxied(nursery: trio.Nursery) -> LinkProxy:
    listeners = await nursery.start(trio.serve_tcp, _echo, 0)
    proxy = LinkProxy(listeners[0].socket.getsockname()[1])
    await nursery.start(proxy.serve)
    return proxy


async def _round_trips(stream: trio.SocketStream, n: int) -> tuple[bytes, list[float]]:
    """Send n numbered lines one at a time; what came back, and each one's round trip."""
    got, times = b"", []
    for i in range(n):
        line = b"%05d\n" % i
        t = trio.current_time()
        await stream.send_all(line)
        while len(got) < 6 * (i + 1):
            got += await stream.receive_some(65536)
        times.append(trio.current_time() - t)
    return got, times


async def test_a_delayed_link_adds_latency_and_keeps_order():
    async with trio.open_nursery() as nursery:
        proxy = await _proxied(nursery)
        stream = await trio.open_tcp_stream("127.0.0.1", proxy.port)
        nursery.start_soon(_close_on_cancel, stream)
        proxy.degrade(LinkFault(delay=0.05, jitter=0.05, seed=1))
        # a burst: the chunks' jitter must not reorder them
        burst = b"".join(b"%05d\n" % i for i in range(2000))
        for i in range(0, len(burst), 600):
            await stream.send_all(burst[i : i + 600])
        got = b""
        while len(got) < len(burst):
            got += await stream.receive_some(65536)
        assert got == burst
        _, times = await _round_trips(stream, 5)
        # each round trip crosses the proxy twice: 2 x 50 ms at least, 2 x 100 ms at most
        assert all(0.1 <= t < 0.5 for t in times), times
        proxy.unblock()
        _, times = await _round_trips(stream, 5)
        # healed: most trips are fast (one preempted trip on a busy host is not the proxy's)
        assert sorted(times)[2] < 0.05, times
        nursery.cancel_scope.cancel()


async def test_a_lossy_link_stalls_without_losing_bytes_or_resets():
    async with trio.open_nursery() as nursery:
        proxy = await _proxied(nursery)
        stream = await trio.open_tcp_stream("127.0.0.1", proxy.port)
        nursery.start_soon(_close_on_cancel, stream)
        # every chunk lost once: each direction stalls 0.1 s, the bytes all arrive in order
        proxy.degrade(LinkFault(loss=1.0, stall=(0.1, 0.1), reset=0.0, seed=2))
        got, times = await _round_trips(stream, 3)
        assert got == b"".join(b"%05d\n" % i for i in range(3))
        assert all(t >= 0.2 for t in times), times
        # a loss that ends in a reset: the peer sees the connection aborted
        proxy.degrade(LinkFault(loss=1.0, reset=1.0, seed=3))
        with pytest.raises(trio.BrokenResourceError):
            with trio.fail_after(5):
                await stream.send_all(b"x\n")
                while await stream.receive_some(65536):
                    pass
                await stream.send_all(b"x\n")  # EOF would be a clean close, not a reset
        proxy.unblock()
        stream = await trio.open_tcp_stream("127.0.0.1", proxy.port)
        nursery.start_soon(_close_on_cancel, stream)
        got, times = await _round_trips(stream, 5)
        assert sorted(times)[2] < 0.05, times  # healed (as above)
        nursery.cancel_scope.cancel()
