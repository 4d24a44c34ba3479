"""How servers and clients reach each other: real TCP, or an in-memory network in tests.

Every listening socket and every outgoing connection of the nameserver, the broker (remoting,
VIP and HA ports) and the clients goes through a :class:`Network`.  Production code uses
:data:`TCP`; tests hand ``tests.support.memory_network.MemoryNetwork`` to ``run_namesrv``, ``run_broker`` and
``open_remoting_client`` so that the real servers and the real client run in one process under
``autojump_clock``, with faults (refused connects, partitions) injected by the network.

A network answers three questions: bind ``host:port`` (0 = any free port) and return listeners
plus the bound port; connect to ``"host:port"`` (``OSError`` when nobody listens, as TCP's
ECONNREFUSED); and name the peer of an accepted stream (for logs and the broker's client tables).
"""

from __future__ import annotations

from typing import Protocol

import attrs
import trio

from common.errors import RemotingConnectError

__all__ = ["TCP", "Bound", "Network", "TcpNetwork", "parse_addr"]


def parse_addr(addr: str) -> tuple[str, int]:
    """``"host:port"`` (IPv6 as ``"[::1]:9876"`` or bare ``"::1:9876"``) -> (host, port)."""
    host, sep, port = addr.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise RemotingConnectError(f"bad address {addr!r}, expected host:port")
    return host.strip("[]"), int(port)


@attrs.frozen
class Bound:
    """What :meth:`Network.listen` bound: the listeners to serve and the port they got."""

    listeners: list[trio.abc.Listener[trio.abc.Stream]]
    port: int


class Network(Protocol):
    async def listen(self, host: str, port: int) -> Bound:
        """Bind ``host:port``; port 0 picks a free one (reported in ``Bound.port``)."""
        ...

    async def connect(self, addr: str) -> trio.abc.Stream:
        """A stream to whoever listens on ``addr``; OSError when nobody does."""
        ...

    def peer_addr(self, stream: trio.abc.Stream) -> str:
        """``"host:port"`` of the other end of an accepted stream."""
        ...


class TcpNetwork:
    """The real one: trio's TCP listeners and streams."""

    async def listen(self, host: str, port: int) -> Bound:
        listeners = await trio.open_tcp_listeners(port, host=host)
        return Bound(list(listeners), listeners[0].socket.getsockname()[1])

    async def connect(self, addr: str) -> trio.abc.Stream:
        host, port = parse_addr(addr)
        return await trio.open_tcp_stream(host or "127.0.0.1", port)

    def peer_addr(self, stream: trio.abc.Stream) -> str:
        if not isinstance(stream, trio.SocketStream):
            return "unknown"
        try:
            peer = stream.socket.getpeername()
        except OSError:
            return "unknown"
        return f"{peer[0]}:{peer[1]}"


TCP: Network = TcpNetwork()
