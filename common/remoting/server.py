"""The remoting server: a request dispatcher over TCP (or any Trio stream).

Theory of operation. :func:`serve_remoting` binds, reports the bound port through ``task_status``,
and serves every accepted connection with :func:`handle_stream`, which wraps it in a
:class:`~common.remoting.channel.Channel` (one nursery per connection; see ``channel.py``).
Requests are routed by code through a :class:`RequestDispatcher`:

* a handler registered normally is an async function run in a task of its own per request; it
  answers with a command, or ``None`` for no answer (forced for oneway requests);
* a handler registered with ``inline=True`` is a plain function the connection's read loop calls
  in arrival order; it answers with a command or ``None``, or returns an awaitable for the rest of
  the work (run in a task, its result is the answer). Order-sensitive requests (SEND) and quick
  ones that never wait (no task to spawn, no scheduling: the cheapest path) go this way;
* codes registered with :meth:`RequestDispatcher.register_run` (they also have an inline handler)
  are handed to the run handler together when one read delivers several in a row (the SEND
  codes: one store write for the run); it returns one inline answer per request, in order, or
  the exception that request's handling raised, which answers that request alone;
* a handler raising :class:`common.errors.RequestError` answers with its code and remark;
* any other exception answers SYSTEM_ERROR (1) with ``str(exc)`` and is logged;
* an unknown code goes to the default handler, else REQUEST_CODE_NOT_SUPPORTED (3) with remark
  ``" request type <code> not supported"`` (4.9.7 brokers and 5.x nameservers; set
  ``unknown_code_policy = "ignore"`` for the 4.9.7 nameserver's silence).

Close listeners run when a connection ends for any reason; the nameserver uses them to drop brokers.
What clients can make the server hold is bounded (``limits``, server_limits.py): connections,
requests held, unread answers, idle connections (closed by a sweep task here).
``handle_stream`` never raises (except Cancelled), so one bad connection cannot stop the server.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, Literal

import attrs
import trio

from common.remoting.channel import NOT_INLINE, Channel, Handler, InlineHandler, InlineRunHandler
from common.remoting.codec import MAX_FRAME_LENGTH
from common.remoting.codes import ResponseCode
from common.remoting.command import RemotingCommand
from common.remoting.deferred_answer import DeferredAnswer
from common.remoting.network import TCP, Network
from common.remoting.server_limits import ServerLimits, ServerLoad
from common.tls import PLAIN, TlsPolicy, accept_stream

__all__ = [
    "Channel",
    "NOT_INLINE",
    "Handler",
    "InlineHandler",
    "InlineRunHandler",
    "RemotingServerHandle",
    "RequestDispatcher",
    "handle_stream",
    "serve_remoting",
]

log = logging.getLogger(__name__)


class RequestDispatcher:
    def __init__(self) -> None:
        # code -> async handler (a task per request); looked up for every request.
        self._handlers: dict[int, Handler] = {}
        # code -> inline handler (called by the read loop); a code is in one of the two maps.
        self._inline: dict[int, InlineHandler] = {}
        self._default: Handler | None = None
        # the handler of runs of requests whose codes are in run_codes (register_run)
        self._run: InlineRunHandler | None = None
        self.run_codes: frozenset[int] = frozenset()
        self._close_listeners: list[Callable[[Channel], None]] = []
        self.unknown_code_policy: Literal["reply", "ignore"] = "reply"
        # run before any handler sees a request (RocketMQ's RPCHook.doBeforeRequest, e.g. the
        # broker's ACL); raising RequestError answers the request with its code instead
        self.guard: Callable[[RemotingCommand, Channel], None] | None = None

    def register(
        self, code: int, handler: Handler | InlineHandler, *, inline: bool = False
    ) -> None:
        """Route ``code`` to ``handler``; ``inline=True``: a plain function (see module doc)."""
        code = int(code)
        self.run_codes = self.run_codes - {code}  # a new handler: not the run handler's
        if inline:
            self._inline[code] = handler
            self._handlers.pop(code, None)
        else:
            self._handlers[code] = handler
            self._inline.pop(code, None)

    def register_run(self, codes: Iterable[int], handler: InlineRunHandler) -> None:
        """Hand runs of requests with ``codes`` (in one read, in a row) to ``handler`` together:
        ``handler(requests, channel)`` returns, per request and in order, what the code's
        inline handler would (registered first, it still serves single requests and
        :meth:`dispatch`), or the exception that request raised."""
        codes = frozenset(int(c) for c in codes)
        missing = codes - self._inline.keys()
        if missing:
            raise ValueError(f"codes {sorted(missing)} have no inline handler")
        self._run = handler
        self.run_codes = codes

    def set_default(self, handler: Handler | None) -> None:
        self._default = handler

    def add_close_listener(self, fn: Callable[[Channel], None]) -> None:
        self._close_listeners.append(fn)

    def dispatch_inline(self, cmd: RemotingCommand, channel: Channel) -> Any:
        """The read loop's entry: NOT_INLINE unless ``cmd.code`` has an inline handler; the
        guard runs here for every request (the task then runs ``dispatch_guarded``)."""
        if self.guard is not None:
            self.guard(cmd, channel)
        handler = self._inline.get(cmd.code)
        if handler is None:
            return NOT_INLINE
        return handler(cmd, channel)

    def dispatch_inline_run(self, cmds: list[RemotingCommand], channel: Channel) -> list[Any]:
        """The read loop's entry for a run of ``run_codes`` requests: the guard per request (one
        it refuses gets the exception, and the run handler does not see it), then the run
        handler over the others, in order."""
        run = self._run
        assert run is not None
        guard = self.guard
        if guard is None:
            return run(cmds, channel)
        out: list[Any] = [None] * len(cmds)
        passed: list[int] = []
        for i, cmd in enumerate(cmds):
            try:
                guard(cmd, channel)
            except Exception as exc:
                out[i] = exc
            else:
                passed.append(i)
        if passed:
            for i, result in zip(passed, run([cmds[i] for i in passed], channel), strict=True):
                out[i] = result
        return out

    async def dispatch(self, cmd: RemotingCommand, channel: Channel) -> RemotingCommand | None:
        """Answer ``cmd`` whatever kind its handler is (also used by tests and clients)."""
        if self.guard is not None:
            self.guard(cmd, channel)
        return await self.dispatch_guarded(cmd, channel)

    async def dispatch_guarded(
        self, cmd: RemotingCommand, channel: Channel
    ) -> RemotingCommand | None:
        """:meth:`dispatch` of a request the guard already passed."""
        inline = self._inline.get(cmd.code)
        if inline is not None:
            result = inline(cmd, channel)
            if result is None or isinstance(result, RemotingCommand):
                return result
            if isinstance(result, DeferredAnswer):
                # an answer set later with no task waiting (a SYNC_MASTER send's replica wait)
                return await result.wait()
            return await result
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
    # what its clients make it hold now
    load: ServerLoad = attrs.field(factory=ServerLoad, eq=False)


async def handle_stream(
    stream: trio.abc.Stream,
    dispatcher: RequestDispatcher,
    *,
    remote_addr: str = "memory",
    max_frame_length: int = MAX_FRAME_LENGTH,
    load: ServerLoad | None = None,
) -> None:
    """Serve one connection until it ends; returns the Channel's lifetime, never raises."""
    if load is None:
        load = ServerLoad()
    if load.connections >= load.limits.max_connections:
        await _refuse(stream, load, remote_addr)
        return
    channel = Channel(stream, remote_addr, max_frame_length=max_frame_length, load=load)
    channel.last_active = trio.current_time()
    load.channels.add(channel)
    try:
        await channel.run(
            dispatcher.dispatch_guarded,
            on_close=dispatcher.notify_closed,
            inline=dispatcher.dispatch_inline,
            inline_run=dispatcher.dispatch_inline_run if dispatcher.run_codes else None,
            run_codes=dispatcher.run_codes,
        )
    finally:
        load.channels.discard(channel)


async def _refuse(stream: trio.abc.Stream, load: ServerLoad, remote_addr: str) -> None:
    """Close a connection over ``max_connections`` (logged once per 1000)."""
    load.refused_connections += 1
    if load.refused_connections % 1000 == 1:
        log.warning(
            "closing the connection from %s: %d connections is the limit (%d refused)",
            remote_addr,
            load.limits.max_connections,
            load.refused_connections,
        )
    with trio.CancelScope(shield=True):
        await trio.aclose_forcefully(stream)


async def sweep_idle_channels(load: ServerLoad) -> None:
    """Close connections idle for ``channel_max_idle`` (RocketMQ closes them after 120 s)."""
    limits = load.limits
    while True:
        await trio.sleep(limits.idle_sweep_interval)
        cutoff = trio.current_time() - limits.channel_max_idle
        idle = [c for c in load.channels if c.last_active < cutoff and c.idle and not c.closed]
        if idle:
            log.info("closing %d connections idle for %.0f s", len(idle), limits.channel_max_idle)
        for channel in idle:
            channel.close()


async def serve_remoting(
    dispatcher: RequestDispatcher,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    max_frame_length: int = MAX_FRAME_LENGTH,
    network: Network = TCP,
    limits: ServerLimits | None = None,
    tls: TlsPolicy = PLAIN,
    task_status: trio.TaskStatus[RemotingServerHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Bind ``host:port`` (0 = any free port) on ``network``, report it, serve until cancelled;
    each connection is first given to ``tls`` (common/tls.py: plain, TLS, or either)."""
    bound = await network.listen(host, port)
    load = ServerLoad(limits or ServerLimits())

    async def on_connection(stream: trio.abc.Stream) -> None:
        peer = network.peer_addr(stream)
        served: trio.abc.Stream | None = stream
        if tls.enabled:
            # a connection still deciding or shaking hands counts against max_connections too,
            # so a flood of clients that never finish holds at most that many tasks
            if load.connections + load.handshaking >= load.limits.max_connections:
                await _refuse(stream, load, peer)
                return
            load.handshaking += 1
            try:
                served = await accept_stream(stream, tls, peer=peer)
            finally:
                load.handshaking -= 1
        if served is None:
            return
        await handle_stream(
            served,
            dispatcher,
            remote_addr=peer,
            max_frame_length=max_frame_length,
            load=load,
        )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sweep_idle_channels, load)
        task_status.started(RemotingServerHandle(host=host, port=bound.port, load=load))
        await trio.serve_listeners(on_connection, bound.listeners)
