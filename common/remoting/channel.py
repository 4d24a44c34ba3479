"""Channel: one remoting connection, used by both the server and the client.

Theory of operation. A connection carries requests and responses in both directions, matched by
``opaque``. :meth:`Channel.run` owns the connection: it opens a nursery, reads bytes into a
:class:`~common.remoting.codec.FrameDecoder`, and for each decoded command either

* completes the waiter of one of *our* requests (a response; unknown opaques are ignored), or
* starts a task for the peer's request, so a slow handler (a long-polling PULL) never delays the
  next request on the same connection. The task's result (or error, mapped to a response code) is
  written back with RESPONSE_FLAG and the request's opaque, unless the request was oneway.

Writes go through one lock held for a whole frame, so frames of concurrent tasks never interleave.
A response body may be a list of parts (memoryviews of mapped files); large ones are written part by
part under the lock instead of being joined.

When the peer closes (EOF), waiters of our requests fail at once with RemotingConnectError; request
tasks already running get a short grace period to finish (a oneway request followed by a close must
still take effect), then are cancelled. An undecodable or oversized frame, or :meth:`close`, cancels
everything at once. Then the ``on_close`` callback runs, and last the stream is closed under a
shielded, bounded scope (so when the peer sees EOF, listeners have already run).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from common.errors import (
    ProtocolError,
    RemotingConnectError,
    RemotingSendError,
    RemotingTimeoutError,
    RequestError,
    unwrap_group,
)
from common.remoting.codec import MAX_FRAME_LENGTH, FrameDecoder, encode_header_and_prefix
from common.remoting.codes import ResponseCode
from common.remoting.command import ONEWAY_FLAG, RESPONSE_FLAG, RemotingCommand

log = logging.getLogger(__name__)

Handler = Callable[[RemotingCommand, "Channel"], Awaitable[RemotingCommand | None]]

RECEIVE_SIZE = 64 * 1024
# Bodies up to this size are joined with their header into one write; larger multi-part bodies are
# written part by part (no copy of mapped-file memoryviews).
JOIN_LIMIT = 64 * 1024
# How long request tasks may keep running after the peer closed its side.
EOF_GRACE = 1.0
CLOSE_TIMEOUT = 1.0


class _Waiter:
    """One of our requests waiting for its response."""

    __slots__ = ("error", "event", "response")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.response: RemotingCommand | None = None
        self.error: BaseException | None = None


class Channel:
    """One connection. ``attrs`` is a free slot for owners (e.g. a broker's client id)."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        remote_addr: str,
        *,
        max_frame_length: int = MAX_FRAME_LENGTH,
    ) -> None:
        self.remote_addr = remote_addr
        self.attrs: dict[str, Any] = {}
        self._stream = stream
        self._max_frame_length = max_frame_length
        # Held for the entire write of one frame: frames never interleave on the wire.
        self._send_lock = trio.Lock()
        # opaque -> waiter, only for requests *we* sent and that are still unanswered.
        self._waiters: dict[int, _Waiter] = {}
        # Opaques we hand out; kept in Java's positive int range.
        self._opaques = itertools.count(1)
        # True once the connection is unusable for new requests (closed by us, peer or error).
        self._closed = False
        # Cancel scope of run()'s nursery; None before run() starts.
        self._scope: trio.CancelScope | None = None

    def __repr__(self) -> str:
        return f"<Channel {self.remote_addr}{' closed' if self._closed else ''}>"

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Close now: in-flight requests on both sides are cancelled/failed."""
        self._closed = True
        if self._scope is not None:
            self._scope.cancel()
        self._fail_waiters(RemotingConnectError(f"channel to {self.remote_addr} closed"))

    # --- writing -------------------------------------------------------------------------------

    async def send(self, cmd: RemotingCommand) -> None:
        """Write one frame; raises RemotingSendError if the connection is gone."""
        if self._closed:
            raise RemotingSendError(f"channel to {self.remote_addr} is closed")
        body = cmd.body
        parts: list[Any]
        if isinstance(body, list | tuple):
            parts = list(body)
            body_len = sum(memoryview(p).nbytes for p in parts)
        else:
            parts = [body] if body else []
            body_len = memoryview(body).nbytes
        prefix = encode_header_and_prefix(cmd, body_len)
        try:
            async with self._send_lock:
                if not parts:
                    await self._stream.send_all(prefix)
                elif body_len <= JOIN_LIMIT:
                    await self._stream.send_all(b"".join([prefix, *parts]))
                else:
                    await self._stream.send_all(prefix)
                    for part in parts:
                        await self._stream.send_all(part)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self.close()
            raise RemotingSendError(f"send to {self.remote_addr} failed: {exc!r}") from exc

    def _next_opaque(self) -> int:
        opaque = next(self._opaques)
        if opaque >= 0x7FFFFFFF:
            self._opaques = itertools.count(1)
            opaque = next(self._opaques)
        return opaque

    async def request(self, cmd: RemotingCommand) -> RemotingCommand:
        """Send ``cmd`` and wait (without a time limit) for the response with its opaque."""
        if self._closed:
            raise RemotingConnectError(f"channel to {self.remote_addr} is closed")
        cmd.opaque = self._next_opaque()
        cmd.flag &= ~(RESPONSE_FLAG | ONEWAY_FLAG)
        waiter = _Waiter()
        self._waiters[cmd.opaque] = waiter
        try:
            await self.send(cmd)
            await waiter.event.wait()
        finally:
            self._waiters.pop(cmd.opaque, None)
        if waiter.error is not None:
            raise waiter.error
        assert waiter.response is not None
        return waiter.response

    async def invoke(self, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        """Request/response with a time limit on Trio's clock."""
        try:
            with trio.fail_after(timeout):
                return await self.request(cmd)
        except trio.TooSlowError:
            raise RemotingTimeoutError(
                f"no response from {self.remote_addr} within {timeout}s (code {cmd.code})"
            ) from None

    async def send_oneway(self, cmd: RemotingCommand) -> None:
        cmd.opaque = self._next_opaque()
        cmd.flag = (cmd.flag | ONEWAY_FLAG) & ~RESPONSE_FLAG
        await self.send(cmd)

    def _fail_waiters(self, error: BaseException) -> None:
        waiters, self._waiters = self._waiters, {}
        for waiter in waiters.values():
            waiter.error = error
            waiter.event.set()

    # --- reading and dispatch ------------------------------------------------------------------

    async def run(
        self,
        handler: Handler,
        on_close: Callable[[Channel], None] | None = None,
    ) -> None:
        """Serve this connection until EOF, a bad frame, :meth:`close` or cancellation.

        Never raises except Cancelled: errors of the connection end the connection.
        """
        try:
            async with trio.open_nursery() as nursery:
                self._scope = nursery.cancel_scope
                if self._closed:
                    nursery.cancel_scope.cancel()
                await self._read_loop(nursery, handler)
        except Exception:  # a bug of ours; keep the server alive
            log.exception("connection %s failed", self.remote_addr)
        finally:
            self._closed = True
            self._fail_waiters(RemotingConnectError(f"connection to {self.remote_addr} closed"))
            # Listeners first: once the peer sees EOF, our tables already reflect the close.
            if on_close is not None:
                try:
                    on_close(self)
                except Exception:
                    log.exception("close listener failed for %s", self.remote_addr)
            with trio.CancelScope(shield=True, deadline=trio.current_time() + CLOSE_TIMEOUT):
                try:
                    await self._stream.aclose()
                except Exception:
                    log.debug("closing %s failed", self.remote_addr, exc_info=True)

    async def _read_loop(self, nursery: trio.Nursery, handler: Handler) -> None:
        decoder = FrameDecoder(self._max_frame_length)
        while True:
            try:
                data = await self._stream.receive_some(RECEIVE_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                data = b""
            if not data:
                # EOF: nothing will answer our requests any more; let the peer's requests finish.
                self._fail_waiters(
                    RemotingConnectError(f"{self.remote_addr} closed the connection")
                )
                nursery.cancel_scope.deadline = min(
                    nursery.cancel_scope.deadline, trio.current_time() + EOF_GRACE
                )
                return
            try:
                commands = decoder.feed(data)
            except ProtocolError as exc:
                log.warning("closing %s: %s", self.remote_addr, exc)
                self.close()
                return
            for cmd in commands:
                if cmd.is_response:
                    waiter = self._waiters.pop(cmd.opaque, None)
                    if waiter is not None:
                        waiter.response = cmd
                        waiter.event.set()
                    else:
                        log.debug("response with unknown opaque %d ignored", cmd.opaque)
                else:
                    nursery.start_soon(self._handle_request, handler, cmd)
            if decoder.error is not None:
                log.warning("closing %s: %s", self.remote_addr, decoder.error)
                self.close()
                return

    async def _handle_request(self, handler: Handler, cmd: RemotingCommand) -> None:
        try:
            response = await handler(cmd, self)
        except Exception as raw:
            exc = unwrap_group(raw)
            if isinstance(exc, RequestError):
                response = cmd.response(exc.code, exc.remark)
            else:
                log.error(
                    "handler for code %d from %s failed",
                    cmd.code,
                    self.remote_addr,
                    exc_info=raw,
                )
                response = cmd.response(ResponseCode.SYSTEM_ERROR, str(exc) or repr(exc))
        if response is None or cmd.is_oneway:
            return
        response.flag |= RESPONSE_FLAG
        response.opaque = cmd.opaque
        try:
            await self.send(response)
        except RemotingSendError:
            log.debug("could not answer %s (code %d)", self.remote_addr, cmd.code)
