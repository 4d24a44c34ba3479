"""A loopback without sockets for the real servers and clients in one process.

:class:`MemoryNetwork` is a :class:`common.remoting.network.Network` made of in-memory streams:
hand it to ``run_namesrv``, ``run_broker`` and ``open_remoting_client`` and the real servers and
the real client run in one process, under ``autojump_clock``, with no socket.  It can refuse
connections to a port (a dead or partitioned node) and cut the open ones.
"""

from __future__ import annotations

import errno
import weakref

import attrs
import trio
import trio.testing

from common.remoting.network import Bound, parse_addr


@attrs.define(eq=False)
class _MemoryListener(trio.abc.Listener[trio.abc.Stream]):
    network: MemoryNetwork
    port: int
    # server ends of new connections, handed out by accept()
    _send: trio.MemorySendChannel[trio.abc.Stream]
    _recv: trio.MemoryReceiveChannel[trio.abc.Stream]

    async def accept(self) -> trio.abc.Stream:
        try:
            return await self._recv.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise trio.ClosedResourceError("listener closed") from None

    async def aclose(self) -> None:
        self.network._unbind(self)
        self._send.close()
        self._recv.close()
        await trio.lowlevel.checkpoint()


@attrs.define(eq=False)
class MemoryNetwork:
    """Loopback without sockets: ``listen``/``connect`` by port, any host name.

    Invariants: a port has at most one listener; ``connect`` to a port with none, or to a refused
    one, raises ``ConnectionRefusedError`` (what TCP's ECONNREFUSED looks like to our code); every
    connection's two ends are kept until closed so :meth:`cut` can end them.
    """

    first_port: int = 30000
    _next_port: int = attrs.field(init=False)
    _listeners: dict[int, _MemoryListener] = attrs.field(factory=dict)
    # ports whose connects are refused although something listens (a partition)
    refused: set[int] = attrs.field(factory=set)
    # port -> both ends of every connection made to it (weak: closed streams go away)
    _open: dict[int, weakref.WeakSet[trio.abc.Stream]] = attrs.field(factory=dict)
    # accepted stream -> the peer address the server sees
    _peers: weakref.WeakKeyDictionary[trio.abc.Stream, str] = attrs.field(
        factory=weakref.WeakKeyDictionary
    )
    connects: int = 0

    def __attrs_post_init__(self) -> None:
        self._next_port = self.first_port

    def _free_port(self) -> int:
        while self._next_port in self._listeners:
            self._next_port += 1
        port, self._next_port = self._next_port, self._next_port + 1
        return port

    async def listen(self, host: str, port: int) -> Bound:
        await trio.lowlevel.checkpoint()
        if port == 0:
            port = self._free_port()
        if port in self._listeners:
            raise OSError(errno.EADDRINUSE, f"address already in use: {host}:{port}")
        send, recv = trio.open_memory_channel[trio.abc.Stream](1000)
        listener = _MemoryListener(self, port, send, recv)
        self._listeners[port] = listener
        return Bound([listener], port)

    def _unbind(self, listener: _MemoryListener) -> None:
        if self._listeners.get(listener.port) is listener:
            del self._listeners[listener.port]

    async def connect(self, addr: str) -> trio.abc.Stream:
        await trio.lowlevel.checkpoint()
        _, port = parse_addr(addr)
        listener = self._listeners.get(port)
        if listener is None or port in self.refused:
            raise ConnectionRefusedError(errno.ECONNREFUSED, f"connection refused: {addr}")
        client_end, server_end = trio.testing.memory_stream_pair()
        self.connects += 1
        self._peers[server_end] = f"127.0.0.1:{40000 + self.connects}"
        ends = self._open.setdefault(port, weakref.WeakSet())
        ends.add(client_end)
        ends.add(server_end)
        try:
            listener._send.send_nowait(server_end)
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            raise ConnectionRefusedError(
                errno.ECONNREFUSED, f"connection refused: {addr}"
            ) from None
        return client_end

    def peer_addr(self, stream: trio.abc.Stream) -> str:
        return self._peers.get(stream, "unknown")

    def listening(self, port: int) -> bool:
        return port in self._listeners

    async def cut(self, port: int) -> None:
        """End every open connection to ``port`` at once: both ends read EOF, as after the
        peer's process died (each end's sending half is closed)."""
        for stream in list(self._open.pop(port, ())):
            assert isinstance(stream, trio.StapledStream)
            await trio.aclose_forcefully(stream.send_stream)
