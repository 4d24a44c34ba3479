"""The remoting client: one multiplexed, pipelined connection per address.

Theory of operation. :func:`open_remoting_client` opens a nursery that owns every connection the
client makes; leaving the ``async with`` closes them all. :meth:`RemotingClient.invoke` finds (or
opens, under a per-address lock so concurrent callers share one connect) the
:class:`~common.remoting.channel.Channel` for an address, sends the request with a fresh opaque, and
waits for the response with that opaque, failing with RemotingTimeoutError ``timeout`` seconds
(Trio's clock) after the call, connecting included.
Many requests can be in flight on one connection; responses may come back in any order.

A connection that drops fails its waiting requests with :class:`RemotingConnectError`, and is
forgotten, so the next call to that address reconnects. Requests the *server* sends us (e.g.
NOTIFY_CONSUMER_IDS_CHANGED) go to the handler set with :meth:`RemotingClient.set_request_handler`;
without one they are answered REQUEST_CODE_NOT_SUPPORTED (unless oneway).

How an address is reached is the ``network``'s business (``common.remoting.network``: TCP, or the
in-memory network of tests); a bare ``connect`` function can be given instead.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import trio

from common.errors import (
    RemotingConnectError,
    RemotingConnectFailedError,
    RemotingTimeoutError,
    unwrapping_groups,
)
from common.remoting.channel import Channel, Handler
from common.remoting.codes import ResponseCode
from common.remoting.command import RemotingCommand
from common.remoting.network import TCP, Network, parse_addr

__all__ = ["RemotingClient", "open_remoting_client", "parse_addr"]

log = logging.getLogger(__name__)

Connect = Callable[[str], Awaitable[trio.abc.Stream]]


class RemotingClient:
    def __init__(
        self,
        nursery: trio.Nursery,
        *,
        connect_timeout: float,
        connect: Connect | None,
        sign: Callable[[RemotingCommand], None] | None = None,
    ) -> None:
        self._nursery = nursery
        # called on every request before it is sent (ACL credentials: SessionCredentials.sign)
        self._sign = sign
        self._connect_timeout = connect_timeout
        self._connect = connect or TCP.connect
        # addr -> the live channel for it; a closed channel is replaced on the next call.
        self._channels: dict[str, Channel] = {}
        # addr -> lock held while connecting, so concurrent callers share one connection.
        self._connect_locks: dict[str, trio.Lock] = {}
        self._handler: Handler | None = None
        self._closed = False

    def set_request_handler(self, handler: Handler | None) -> None:
        self._handler = handler

    async def _dispatch(self, cmd: RemotingCommand, channel: Channel) -> RemotingCommand | None:
        if self._handler is None:
            return cmd.response(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f" request type {cmd.code} not supported"
            )
        return await self._handler(cmd, channel)

    async def get_channel(self, addr: str) -> Channel:
        """The connected channel for ``addr`` (connecting if needed)."""
        if self._closed:
            raise RemotingConnectError("client is closed")
        channel = self._channels.get(addr)
        if channel is not None and not channel.closed:
            return channel
        lock = self._connect_locks.setdefault(addr, trio.Lock())
        async with lock:
            channel = self._channels.get(addr)
            if channel is not None and not channel.closed:
                return channel
            try:
                with trio.fail_after(self._connect_timeout):
                    stream = await self._connect(addr)
            except trio.TooSlowError:
                raise RemotingConnectFailedError(
                    f"connect to {addr} timed out after {self._connect_timeout}s"
                ) from None
            except OSError as exc:
                raise RemotingConnectFailedError(f"connect to {addr} failed: {exc}") from exc
            channel = Channel(stream, addr)
            self._channels[addr] = channel
            self._nursery.start_soon(self._run_channel, channel)
            return channel

    async def _run_channel(self, channel: Channel) -> None:
        await channel.run(self._dispatch, on_close=self._forget)

    def _forget(self, channel: Channel) -> None:
        if self._channels.get(channel.remote_addr) is channel:
            del self._channels[channel.remote_addr]

    async def invoke(
        self, addr: str, cmd: RemotingCommand, timeout: float = 3.0
    ) -> RemotingCommand:
        """Send a request and return the response (any code; callers check it).

        Raises RemotingConnectError / RemotingTimeoutError / RemotingSendError.
        """
        if self._sign is not None:
            self._sign(cmd)
        deadline = trio.current_time() + timeout
        # the live channel without a coroutine of get_channel's (the common case: one frame
        # less to create per request); connecting, or a closed client, goes through it
        channel = self._channels.get(addr)
        if channel is None or channel.closed or self._closed:
            # connecting has its own limit too (connect_timeout); the shorter one wins
            with trio.move_on_at(deadline):
                channel = await self.get_channel(addr)
            if channel is None or channel.closed:
                raise RemotingTimeoutError(
                    f"no response from {addr} within {timeout}s (code {cmd.code})"
                )
        # The wait for the response has no cancel scope of its own: the channel's sweeper keeps
        # its deadline (channel.py, "Deadlines"). A cancel scope per request was 7-11 us of a
        # send's client CPU (issue 28, docs/benchmarks.md).
        return await channel.invoke_at(cmd, deadline, timeout)

    async def invoke_oneway(self, addr: str, cmd: RemotingCommand, timeout: float = 3.0) -> None:
        if self._sign is not None:
            self._sign(cmd)
        try:
            with trio.fail_after(timeout):
                channel = await self.get_channel(addr)
                await channel.send_oneway(cmd)
        except trio.TooSlowError:
            raise RemotingTimeoutError(f"oneway send to {addr} took over {timeout}s") from None

    def close_channel(self, addr: str) -> None:
        channel = self._channels.pop(addr, None)
        if channel is not None:
            channel.close()

    def close(self) -> None:
        self._closed = True
        for addr in list(self._channels):
            self.close_channel(addr)


@asynccontextmanager
async def open_remoting_client(
    *,
    connect_timeout: float = 3.0,
    connect: Connect | None = None,
    network: Network | None = None,
    sign: Callable[[RemotingCommand], None] | None = None,
) -> AsyncIterator[RemotingClient]:
    """A client whose connections live in this ``async with``; ``network`` (default TCP) or a
    bare ``connect`` function decides how an address is reached."""
    if connect is None and network is not None:
        connect = network.connect
    with unwrapping_groups():
        async with trio.open_nursery() as nursery:
            client = RemotingClient(
                nursery, connect_timeout=connect_timeout, connect=connect, sign=sign
            )
            try:
                yield client
            finally:
                client.close()
                nursery.cancel_scope.cancel()
