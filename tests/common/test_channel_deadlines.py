"""The channel's deadline sweeper (common/remoting/channel.py, "Deadlines"): the time limit of
``RemotingClient.invoke`` / ``Channel.invoke`` without a cancel scope per request.

Real client and server over the in-memory network, under ``autojump_clock``: every time below is
Trio's, exact, and no test sleeps for real.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from common.errors import RemotingConnectError, RemotingTimeoutError
from common.remoting.channel import Channel
from common.remoting.client import RemotingClient, open_remoting_client
from common.remoting.command import RemotingCommand
from common.remoting.server import RequestDispatcher, serve_remoting
from tests.support.memory_network import MemoryNetwork

pytestmark = pytest.mark.timeout(60)

SLOW = 1  # request code: answered after ext_fields["delay"] seconds


def _dispatcher() -> RequestDispatcher:
    d = RequestDispatcher()

    async def slow(cmd: RemotingCommand, channel: Channel) -> RemotingCommand:
        await trio.sleep(float(cmd.ext_fields["delay"]))
        return cmd.response(remark=cmd.ext_fields["delay"])

    d.register(SLOW, slow)
    return d


def _slow(delay: float) -> RemotingCommand:
    return RemotingCommand.request(SLOW, {"delay": repr(delay)})


@asynccontextmanager
async def _client() -> AsyncIterator[tuple[RemotingClient, MemoryNetwork, str, Channel]]:
    """A server and a client connected to it, past the connection's first request (which
    runs before the channel's nursery exists, with its own cancel scope)."""
    net = MemoryNetwork()
    async with trio.open_nursery() as nursery:
        handle = await nursery.start(
            lambda task_status: serve_remoting(_dispatcher(), network=net, task_status=task_status)
        )
        addr = f"127.0.0.1:{handle.port}"
        async with open_remoting_client(network=net) as client:
            assert (await client.invoke(addr, _slow(0), 1.0)).remark == "0"
            channel = await client.get_channel(addr)
            yield client, net, addr, channel
        nursery.cancel_scope.cancel()


async def test_timeout_fires_at_the_deadline_and_not_before(autojump_clock: object) -> None:
    async with _client() as (client, _, addr, channel):
        start = trio.current_time()
        with pytest.raises(RemotingTimeoutError) as caught:
            await client.invoke(addr, _slow(60), 2.0)
        assert trio.current_time() - start == pytest.approx(2.0, abs=1e-9)
        # the message of the cancel scope it replaces
        assert str(caught.value) == f"no response from {addr} within 2.0s (code {SLOW})"
        assert channel.deadlines_held == 0
        # Channel.invoke keeps the same deadline
        start = trio.current_time()
        with pytest.raises(RemotingTimeoutError, match="within 0.5s"):
            await channel.invoke(_slow(60), 0.5)
        assert trio.current_time() - start == pytest.approx(0.5, abs=1e-9)
        # the late answers are ignored, the connection still serves
        await trio.sleep(70)
        assert (await client.invoke(addr, _slow(0.25), 1.0)).remark == "0.25"
        assert channel.deadlines_held == 0


async def test_a_response_just_before_the_deadline_wins(autojump_clock: object) -> None:
    async with _client() as (client, _, addr, channel):
        start = trio.current_time()
        resp = await client.invoke(addr, _slow(1.999), 2.0)
        assert resp.remark == "1.999"
        assert trio.current_time() - start == pytest.approx(1.999, abs=1e-9)
        # the sweeper still wakes at that deadline: it finds nothing to fail
        await trio.sleep(5)
        assert channel.deadlines_held == 0
        assert (await client.invoke(addr, _slow(0), 1.0)).remark == "0"


async def test_timeouts_in_flight_fire_each_at_its_own_deadline(autojump_clock: object) -> None:
    """Different timeouts on one channel, out of deadline order (the heap's path)."""
    async with _client() as (client, _, addr, channel):
        start = trio.current_time()
        fired: dict[float, float] = {}

        async def call(timeout: float) -> None:
            with pytest.raises(RemotingTimeoutError, match=f"within {timeout}s"):
                await client.invoke(addr, _slow(100), timeout)
            fired[timeout] = trio.current_time() - start

        timeouts = [30.0, 3.0, 10.0, 1.0, 3.0, 20.0]
        async with trio.open_nursery() as calls:
            for timeout in timeouts:
                calls.start_soon(call, timeout)
            await trio.testing.wait_all_tasks_blocked()
            assert channel.deadlines_held == len(timeouts)
        assert fired == {t: pytest.approx(t, abs=1e-9) for t in timeouts}
        assert channel.deadlines_held == 0


async def test_answered_requests_leave_nothing_behind(autojump_clock: object) -> None:
    async with _client() as (client, _, addr, channel):
        # one at a time: each request drops its own entry
        for _ in range(2000):
            await client.invoke(addr, _slow(0), 3.0)
            assert channel.deadlines_held == 0
        # 32 in flight, answered out of order, with two timeouts: the held entries stay within
        # twice the requests in flight (+64), and none is left at the end
        rng = random.Random(28)
        most = 0
        left = 5000

        async def worker(timeout: float) -> None:
            nonlocal most, left
            while left > 0:
                left -= 1
                await client.invoke(addr, _slow(rng.choice((0, 0.001, 0.01, 0.1))), timeout)
                most = max(most, channel.deadlines_held)

        async with trio.open_nursery() as workers:
            for i in range(32):
                workers.start_soon(worker, 3.0 if i % 4 else 30.0)
        assert left <= 0
        assert 0 < most <= 2 * 32 + 64
        assert channel.deadlines_held == 0


async def test_a_live_front_does_not_hold_the_answered_ones(autojump_clock: object) -> None:
    """A request that is never answered, and thousands answered behind it before its deadline:
    their entries do not pile up until it times out."""
    async with _client() as (client, _, addr, channel):
        async with trio.open_nursery() as nursery:
            start = trio.current_time()

            async def stuck() -> None:
                with pytest.raises(RemotingTimeoutError):
                    await client.invoke(addr, _slow(60), 10.0)
                assert trio.current_time() - start == pytest.approx(10.0, abs=1e-9)

            nursery.start_soon(stuck)
            await trio.testing.wait_all_tasks_blocked()
            rng = random.Random(28)
            most = 0
            left = 5000

            async def worker() -> None:
                nonlocal most, left
                while left > 0:
                    left -= 1
                    # answered out of order: done entries between live ones
                    await client.invoke(addr, _slow(rng.choice((0, 0.001, 0.01))), 10.0)
                    most = max(most, channel.deadlines_held)

            async with trio.open_nursery() as workers:
                for _ in range(32):
                    workers.start_soon(worker)
            assert trio.current_time() - start < 10.0
            assert most <= 2 * 33 + 64
        assert channel.deadlines_held == 0


async def test_outside_cancellation_removes_the_request(autojump_clock: object) -> None:
    async with _client() as (client, _, addr, channel):
        start = trio.current_time()
        with trio.move_on_after(1.0) as scope:
            await client.invoke(addr, _slow(60), 10.0)
        assert scope.cancelled_caught
        assert trio.current_time() - start == pytest.approx(1.0, abs=1e-9)
        # neither the waiter nor its deadline is kept
        assert not channel._waiters
        assert channel.deadlines_held == 0
        # past its deadline and its late answer: nothing fires, the connection serves
        await trio.sleep(70)
        assert (await client.invoke(addr, _slow(0), 1.0)).remark == "0"
        # cancelled behind a live front (the entry is dropped when the front ends)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.invoke, addr, _slow(2), 10.0)
            await trio.testing.wait_all_tasks_blocked()
            with trio.move_on_after(1.0):
                await client.invoke(addr, _slow(60), 10.0)
            assert channel.deadlines_held == 2
        assert channel.deadlines_held == 0
        assert not channel._waiters


async def test_channel_close_fails_every_request_at_once(autojump_clock: object) -> None:
    async with _client() as (client, _, addr, channel):
        errors: list[tuple[type[BaseException], float]] = []
        start = trio.current_time()

        async def call(timeout: float) -> None:
            try:
                await client.invoke(addr, _slow(100), timeout)
            except (RemotingConnectError, RemotingTimeoutError) as exc:
                errors.append((type(exc), trio.current_time()))

        async with trio.open_nursery() as calls:
            for timeout in (5.0, 30.0, 2.0, 5.0):
                calls.start_soon(call, timeout)
            await trio.sleep(1.0)
            client.close_channel(addr)
        assert errors == [(RemotingConnectError, start + 1.0)] * 4
        assert channel.deadlines_held == 0


async def test_peer_eof_fails_every_request_and_ends_the_channel(autojump_clock: object) -> None:
    async with _client() as (client, net, addr, channel):
        errors: list[tuple[type[BaseException], float]] = []
        start = trio.current_time()

        async def call() -> None:
            try:
                await client.invoke(addr, _slow(100), 5.0)
            except (RemotingConnectError, RemotingTimeoutError) as exc:
                errors.append((type(exc), trio.current_time()))

        async with trio.open_nursery() as calls:
            for _ in range(3):
                calls.start_soon(call)
            await trio.sleep(1.0)
            await net.cut(int(addr.rsplit(":", 1)[1]))
        assert errors == [(RemotingConnectError, start + 1.0)] * 3
        # the sweeper ended with the channel: run() did not wait for it (EOF_GRACE)
        await trio.testing.wait_all_tasks_blocked()
        assert trio.current_time() == errors[0][1]
        assert addr not in client._channels
        assert channel.deadlines_held == 0


async def test_a_request_whose_frame_cannot_be_written_times_out(autojump_clock: object) -> None:
    """The sweeper also ends the wait for the frame to be written (a peer that stopped
    reading, a full socket)."""

    async def stall() -> None:
        await trio.sleep_forever()

    send = trio.testing.MemorySendStream(send_all_hook=stall)
    channel = Channel(trio.StapledStream(send, trio.testing.MemoryReceiveStream()), "stuck:1")

    async def handler(cmd: RemotingCommand, ch: Channel) -> None:
        return None

    async with trio.open_nursery() as nursery:
        nursery.start_soon(channel.run, handler)
        await trio.testing.wait_all_tasks_blocked()
        start = trio.current_time()
        with pytest.raises(RemotingTimeoutError, match="no response from stuck:1 within 3.0s"):
            await channel.invoke(_slow(0), 3.0)
        assert trio.current_time() - start == pytest.approx(3.0, abs=1e-9)
        assert channel.deadlines_held == 0
        channel.close()
