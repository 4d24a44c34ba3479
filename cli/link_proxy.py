"""LinkProxy: a TCP proxy on one link between two servers, which a test or the chaos harness
can cut (``block``) and restore (``unblock``) to make a partition without network namespaces.

A node is told to reach its peer at the proxy's port; the proxy copies bytes both ways.
``block`` shuts every live connection down and closes new ones at once, which is what a peer
behind a partition looks like to both sides once their connections time out or reset.
"""

from __future__ import annotations

import contextlib
import socket
import sys
from typing import Any

import attrs
import trio


@attrs.define(eq=False)
class LinkProxy:
    """Copies bytes between a listening port and one target; ``blocked`` drops every
    connection and refuses new ones (closes them at once)."""

    target_port: int
    port: int = 0
    blocked: bool = False
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
                nursery.start_soon(self._pump, client, server, nursery.cancel_scope)
                nursery.start_soon(self._pump, server, client, nursery.cancel_scope)
        finally:
            for s in (client, server):
                self._live.discard(s)
                s.socket.close()  # synchronous: a cancelled aclose() would skip the other one

    async def _pump(self, src: trio.SocketStream, dst: trio.SocketStream, scope: Any) -> None:
        try:
            while data := await src.receive_some(65536):
                await dst.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        scope.cancel()

    def block(self) -> None:
        self.blocked = True
        for s in list(self._live):
            with contextlib.suppress(Exception):
                # nothing more crosses; the pumps see it and close both ends
                s.socket.shutdown(socket.SHUT_RDWR)

    def unblock(self) -> None:
        self.blocked = False
