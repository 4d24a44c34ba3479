"""The remoting server's bounds (common/remoting/server_limits.py), on memory streams."""

from __future__ import annotations

import trio
import trio.testing

from common.remoting.codes import ResponseCode
from common.remoting.server import RequestDispatcher, handle_stream, sweep_idle_channels
from common.remoting.server_limits import OVERLOAD_REMARK, ServerLimits, ServerLoad

from .test_server import Peer


def dispatcher(release: trio.Event) -> RequestDispatcher:
    async def slow(cmd, channel):  # a request the server holds (a parked long poll, say)
        await release.wait()
        return cmd.response()

    async def quick(cmd, channel):
        return cmd.response()

    d = RequestDispatcher()
    d.register(1000, slow)
    d.register(1001, quick)
    return d


async def connect(nursery, d, load, addr="peer"):
    client_side, server_side = trio.testing.memory_stream_pair()
    nursery.start_soon(lambda: handle_stream(server_side, d, remote_addr=addr, load=load))
    # served before the next connection comes (trio runs new tasks in any order)
    await trio.testing.wait_all_tasks_blocked()
    return Peer(client_side)


async def test_requests_held_past_the_limits_get_system_busy_before_any_handler(autojump_clock):
    release = trio.Event()
    d = dispatcher(release)
    load = ServerLoad(ServerLimits(max_requests_held=3, max_requests_held_total=5, fair_share=2))
    async with trio.open_nursery() as nursery:
        greedy = await connect(nursery, d, load, "greedy")
        for _ in range(4):
            await greedy.send(1000)
        busy = await greedy.receive()  # the 4th: over this connection's 3
        assert busy.code == ResponseCode.SYSTEM_BUSY and busy.remark == OVERLOAD_REMARK
        other = await connect(nursery, d, load, "other")
        for _ in range(2):
            await other.send(1000)  # the process reaches its 5
        await trio.testing.wait_all_tasks_blocked()
        assert load.requests_held == 5
        third = await connect(nursery, d, load, "third")
        await third.send(1001)  # holds nothing: under the fair share, still served
        assert (await third.receive()).code == ResponseCode.SUCCESS
        await other.send(1001)  # holds 2 = the fair share while the process is full
        assert (await other.receive()).code == ResponseCode.SYSTEM_BUSY
        release.set()
        answers = [await greedy.receive() for _ in range(3)]
        assert all(a.code == ResponseCode.SUCCESS for a in answers)
        await trio.testing.wait_all_tasks_blocked()
        assert load.requests_held == 0 and load.refused_requests == 2
        for peer in (greedy, other, third):
            await peer.stream.aclose()


async def test_connections_past_the_limit_are_closed(autojump_clock):
    d = dispatcher(trio.Event())
    load = ServerLoad(ServerLimits(max_connections=2))
    async with trio.open_nursery() as nursery:
        peers = [await connect(nursery, d, load, f"p{i}") for i in range(3)]
        assert await peers[2].receive() is None  # closed at once
        await peers[0].send(1001)
        assert (await peers[0].receive()).code == ResponseCode.SUCCESS
        assert load.connections == 2 and load.refused_connections == 1
        for peer in peers[:2]:
            await peer.stream.aclose()


async def test_idle_connections_are_closed_after_channel_max_idle(autojump_clock):
    d = dispatcher(trio.Event())
    load = ServerLoad(ServerLimits(channel_max_idle=120, idle_sweep_interval=10))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sweep_idle_channels, load)
        idle = await connect(nursery, d, load, "idle")
        busy = await connect(nursery, d, load, "busy")
        start = trio.current_time()
        for _ in range(14):  # the busy one talks every 10 s
            await busy.send(1001)
            assert (await busy.receive()).code == ResponseCode.SUCCESS
            await trio.sleep(10)
        assert await idle.receive() is None  # closed by the sweep
        assert 120 <= trio.current_time() - start <= 150
        assert load.connections == 1
        nursery.cancel_scope.cancel()


async def test_a_peer_that_does_not_read_stops_being_read(autojump_clock):
    """Answers past the outbox high water pause the reading, request by request."""
    from common.remoting import channel as channel_mod

    big = b"x" * (1 << 20)

    async def large(cmd, ch):
        return cmd.response(body=big)

    d = RequestDispatcher()
    d.register(1002, large, inline=False)
    load = ServerLoad()
    async with trio.open_nursery() as nursery:
        client_side, server_side = trio.testing.lockstep_stream_pair()
        nursery.start_soon(lambda: handle_stream(server_side, d, remote_addr="x", load=load))
        peer = Peer(client_side)
        with trio.move_on_after(5):
            for _ in range(64):  # 64 MiB of answers asked for, none read
                await peer.send(1002)
        await trio.testing.wait_all_tasks_blocked()
        assert load.outbox_bytes <= channel_mod.OUTBOX_HIGH_WATER + 2 * len(big)
        nursery.cancel_scope.cancel()
