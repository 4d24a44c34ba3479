"""The remoting server: a request dispatcher over TCP (or any Trio stream).

Theory of operation. :func:`serve_remoting` binds, reports the bound port through ``task_status``,
and serves every accepted connection with :func:`handle_stream`, which wraps it in a
:class:`~common.remoting.channel.Channel` (one nursery per connection, one task per request; see
``channel.py``). Requests are routed by code through a :class:`RequestDispatcher`:

* a registered handler answers with a command, or ``None`` for no answer (forced for oneway requests);
* a handler raising :class:`common.errors.RequestError` answers with its code and remark;
* any other exception answers SYSTEM_ERROR (1) with ``str(exc)`` and is logged;
* an unknown code goes to the default handler, else REQUEST_CODE_NOT_SUPPORTED (3) with remark
  ``" request type <code> not supported"`` (4.9.7 brokers and 5.x nameservers; set
  ``unknown_code_policy = "ignore"`` for the 4.9.7 nameserver's silence).

Close listeners run when a connection ends for any reason; the nameserver uses them to drop brokers.
``handle_stream`` never raises (except Cancelled), so one bad connection cannot stop the server.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Literal

import attrs
import trio

from common.remoting.channel import Channel, Handler
from common.remoting.codec import MAX_FRAME_LENGTH
from common.remoting.codes import ResponseCode
from common.remoting.command import RemotingCommand

__all__ = [
    "Channel",
    "Handler",
    "RemotingServerHandle",
    "RequestDispatcher",
    "handle_stream",
    "serve_remoting",
]

log = logging.getLogger(__name__)


class RequestDispatcher:
    def __init__(self) -> None:
        # code -> handler; looked up for every request.
        self._handlers: dict[int, Handler] = {}
        self._default: Handler | None = None
        self._close_listeners: list[Callable[[Channel], None]] = []
        self.unknown_code_policy: Literal["reply", "ignore"] = "reply"

    def register(self, code: int, handler: Handler) -> None:
        self._handlers[int(code)] = handler

    def set_default(self, handler: Handler | None) -> None:
        self._default = handler

    def add_close_listener(self, fn: Callable[[Channel], None]) -> None:
        self._close_listeners.append(fn)

    async def dispatch(self, cmd: RemotingCommand, channel: Channel) -> RemotingCommand | None:
        handler = self._handlers.get(cmd.code, self._default)
        if handler is None:
            if self.unknown_code_policy == "ignore":
                return None
            return cmd.response(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f" request type {cmd.code} not supported"
            )
        return await handler(cmd, channel)

    def notify_closed(self, channel: Channel) -> None:
        for fn in self._close_listeners:
            try:
                fn(channel)
            except Exception:
                log.exception("close listener %r failed for %s", fn, channel.remote_addr)


@attrs.frozen
class RemotingServerHandle:
    host: str
    port: int


async def handle_stream(
    stream: trio.abc.Stream,
    dispatcher: RequestDispatcher,
    *,
    remote_addr: str = "memory",
    max_frame_length: int = MAX_FRAME_LENGTH,
) -> None:
    """Serve one connection until it ends; returns the Channel's lifetime, never raises."""
    channel = Channel(stream, remote_addr, max_frame_length=max_frame_length)
    await channel.run(dispatcher.dispatch, on_close=dispatcher.notify_closed)


def _peer_addr(stream: trio.SocketStream) -> str:
    try:
        peer = stream.socket.getpeername()
        return f"{peer[0]}:{peer[1]}"
    except OSError:
        return "unknown"


async def serve_remoting(
    dispatcher: RequestDispatcher,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    max_frame_length: int = MAX_FRAME_LENGTH,
    task_status: trio.TaskStatus[RemotingServerHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Bind ``host:port`` (0 = any free port), report it, serve until cancelled."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()[1]

    async def on_connection(stream: trio.SocketStream) -> None:
        await handle_stream(
            stream, dispatcher, remote_addr=_peer_addr(stream), max_frame_length=max_frame_length
        )

    task_status.started(RemotingServerHandle(host=host, port=bound))
    await trio.serve_listeners(on_connection, listeners)
