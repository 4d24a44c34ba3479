"""LinkProxy: a TCP proxy on one link between two servers, which a test or the chaos harness
can cut (``block``), slow down or make lossy (``degrade``), and restore, without network
namespaces or root.

A node is told to reach its peer at the proxy's port; the proxy copies bytes both ways.  Each
direction of a connection is a reader and a writer joined by a small queue of chunks (as many
bytes as one ``receive_some`` returned), each stamped with the time it may leave.

* ``block`` shuts every live connection down and closes new ones at once, which is what a
  peer behind a partition looks like to both sides once their connections time out or reset.
* **delay** (:class:`LinkFault` ``delay``, ``jitter``): a chunk leaves ``delay + U(0, jitter)``
  seconds after it arrived, but never before the chunk ahead of it (the stamps only grow), so
  the stream keeps its order, as TCP does, and latency is added without capping throughput.
* **drop** (``loss``, ``stall``, ``reset``): TCP never loses bytes silently inside a
  connection, so the proxy does not either: dropping a chunk would hand the peer a stream with
  a hole, which no real network can produce.  What a lossy path does to a TCP connection is
  make it wait for a retransmission, and, when losses go on, give up.  So a chunk is "lost"
  with probability ``loss``: the direction then stalls for a retransmission timeout drawn from
  ``stall`` (everything behind the chunk waits too) and delivers it after; and with probability
  ``reset`` a loss ends the connection abortively instead (SO_LINGER 0, so both peers see a
  RST, as after a retransmission limit or a middlebox dropping the flow state).  The peers
  then reconnect through the proxy, as they would through a real network.

The random draws of a fault come from ``random.Random(fault.seed)``, so a schedule's seed fixes
a link's parameters; when each draw lands still depends on the traffic.
"""

from __future__ import annotations

import contextlib
import math
import random
import socket
import struct
import sys
from typing import Any

import attrs
import trio

# chunks queued per direction before the reader stops reading (backpressure to the sender)
_QUEUED_CHUNKS = 64


@attrs.frozen
class LinkFault:
    """How a degraded link treats each chunk (module docstring)."""

    delay: float = 0.0  # seconds added to every chunk
    jitter: float = 0.0  # plus U(0, jitter), never reordering
    loss: float = 0.0  # probability a chunk is lost: its direction stalls
    stall: tuple[float, float] = (0.2, 1.0)  # a loss waits U(lo, hi) seconds (retransmission)
    reset: float = 0.0  # probability a loss resets the connection instead of stalling
    seed: int = 0


@attrs.define(eq=False)
class LinkProxy:
    """Copies bytes between a listening port and one target; ``blocked`` drops every
    connection and refuses new ones (closes them at once); ``fault`` delays or loses
    chunks (module docstring)."""

    target_port: int
    port: int = 0
    blocked: bool = False
    fault: LinkFault | None = None
    # the fault's draws (delay jitter, losses, stall lengths); reseeded by degrade()
    _rng: random.Random = attrs.Factory(random.Random)
    # the streams of live connections, closed on block()
    _live: set[trio.SocketStream] = attrs.Factory(set)

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, client: trio.SocketStream) -> None:
        if self.blocked:
            client.socket.close()
            return
        try:
            server = await trio.open_tcp_stream("127.0.0.1", self.target_port)
        except BaseException:
            client.socket.close()
            if isinstance(sys.exc_info()[1], OSError):
                return
            raise
        self._live.update((client, server))
        try:
            async with trio.open_nursery() as nursery:
                for src, dst in ((client, server), (server, client)):
                    send, receive = trio.open_memory_channel[tuple[float, bytes]](_QUEUED_CHUNKS)
                    nursery.start_soon(self._read, src, send, nursery.cancel_scope)
                    nursery.start_soon(self._write, receive, dst, (client, server), nursery)
        finally:
            for s in (client, server):
                self._live.discard(s)
                s.socket.close()  # synchronous: a cancelled aclose() would skip the other one

    async def _read(
        self, src: trio.SocketStream, out: trio.MemorySendChannel[tuple[float, bytes]], scope: Any
    ) -> None:
        due = -math.inf
        with out:
            try:
                while data := await src.receive_some(65536):
                    now = trio.current_time()
                    fault = self.fault
                    if fault is None:
                        due = max(due, now)
                    else:
                        # never before the chunk ahead: the stream keeps its order
                        due = max(due, now + fault.delay + self._rng.uniform(0, fault.jitter))
                    await out.send((due, data))
                return  # EOF: the writer drains the queue, then ends the connection
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass
        scope.cancel()

    async def _write(
        self,
        queue: trio.MemoryReceiveChannel[tuple[float, bytes]],
        dst: trio.SocketStream,
        both: tuple[trio.SocketStream, trio.SocketStream],
        nursery: trio.Nursery,
    ) -> None:
        try:
            async for due, data in queue:
                await trio.sleep_until(due)
                fault = self.fault
                if fault is not None and fault.loss and self._rng.random() < fault.loss:
                    if self._rng.random() < fault.reset:
                        _abort(both)
                        break
                    await trio.sleep(self._rng.uniform(*fault.stall))
                await dst.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        nursery.cancel_scope.cancel()

    def block(self) -> None:
        self.blocked = True
        for s in list(self._live):
            with contextlib.suppress(Exception):
                # nothing more crosses; the pumps see it and close both ends
                s.socket.shutdown(socket.SHUT_RDWR)

    def unblock(self) -> None:
        """Heal: new connections are accepted and no fault applies any more."""
        self.blocked = False
        self.fault = None

    def degrade(self, fault: LinkFault) -> None:
        """Delay or lose chunks of every connection, live and new, until ``unblock``."""
        self._rng = random.Random(fault.seed)
        self.fault = fault


def _abort(streams: tuple[trio.SocketStream, ...]) -> None:
    """Close with SO_LINGER 0: each peer gets a RST, not an orderly FIN."""
    for s in streams:
        with contextlib.suppress(OSError):
            s.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.socket.close()
