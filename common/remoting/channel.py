"""Channel: one remoting connection, used by both the server and the client.

Theory of operation. A connection carries requests and responses in both directions, matched by
``opaque``. :meth:`Channel.run` owns the connection: it opens a nursery, reads bytes into a
:class:`~common.remoting.codec.FrameDecoder`, and for each decoded command either

* completes the waiter of one of *our* requests (a response; unknown opaques are ignored), or
* starts a task for the peer's request, so a slow handler (a long-polling PULL) never delays the
  next request on the same connection. The task's result (or error, mapped to a response code) is
  written back with RESPONSE_FLAG and the request's opaque, unless the request was oneway.

Senders queue whole frames and one of them, holding the write lock, writes everything queued in as
few ``send_all`` calls as possible, so frames never interleave and busy connections need far fewer
syscalls than frames. A response body may be a list of parts (memoryviews of mapped files); large
parts are written as they are instead of being copied into the frame.

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
        # Held while writing; frames are queued whole into _outbox, so they never interleave.
        self._send_lock = trio.Lock()
        # Encoded pieces (prefix, body parts) queued but not yet written, in frame order.
        self._outbox: list[Any] = []
        # Frames queued so far / frames known written; a sender returns once its ticket is written.
        self._queued = 0
        self._written = 0
        # opaque -> waiter, only for requests *we* sent and that are still unanswered.
        self._waiters: dict[int, _Waiter] = {}
        # Opaques we hand out; kept in Java's positive int range.
        self._opaques = itertools.count(1)
        # True once the connection is unusable for new requests (closed by us, peer or error).
        self._closed = False
        # True once the peer's EOF was read: no new requests of ours (nothing would answer),
        # while answers to the peer's own in-flight requests may still be written.
        self._eof = False
        # Cancel scope of run()'s nursery; None before run() starts.
        self._scope: trio.CancelScope | None = None

    def __repr__(self) -> str:
        return f"<Channel {self.remote_addr}{' closed' if self._closed else ''}>"

    @property
    def closed(self) -> bool:
        return self._closed or self._eof

    def close(self) -> None:
        """Close now: in-flight requests on both sides are cancelled/failed."""
        self._closed = True
        if self._scope is not None:
            self._scope.cancel()
        self._fail_waiters(RemotingConnectError(f"channel to {self.remote_addr} closed"))

    # --- writing -------------------------------------------------------------------------------

    async def send(self, cmd: RemotingCommand) -> None:
        """Write one frame; raises RemotingSendError if the connection is gone.

        Frames of concurrent senders are coalesced: each sender queues its pieces and takes a
        ticket; whoever holds the lock writes everything queued so far, so the others usually
        find their ticket already written and return without a syscall of their own.
        """
        if self._closed:
            raise RemotingSendError(f"channel to {self.remote_addr} is closed")
        body = cmd.body
        if isinstance(body, list | tuple):
            parts = [p for p in body if memoryview(p).nbytes]
            body_len = sum(memoryview(p).nbytes for p in parts)
        else:
            body_len = memoryview(body).nbytes
            parts = [body] if body_len else []
        self._outbox.append(encode_header_and_prefix(cmd, body_len))
        self._outbox.extend(parts)
        self._queued += 1
        ticket = self._queued
        async with self._send_lock:
            if self._written >= ticket:
                return
            if self._closed:
                raise RemotingSendError(f"channel to {self.remote_addr} is closed")
            batch, self._outbox = self._outbox, []
            upto = self._queued
            try:
                await self._write(batch)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                self.close()
                raise RemotingSendError(f"send to {self.remote_addr} failed: {exc!r}") from exc
            self._written = upto

    async def _write(self, pieces: list[Any]) -> None:
        # Small pieces are joined into one write; large ones (mapped-file memoryviews of PULL
        # answers) are written as they are, never copied.
        pending: list[Any] = []
        pending_len = 0
        for piece in pieces:
            size = memoryview(piece).nbytes
            if size > JOIN_LIMIT:
                if pending:
                    await self._stream.send_all(b"".join(pending))
                    pending, pending_len = [], 0
                await self._stream.send_all(piece)
            else:
                pending.append(piece)
                pending_len += size
                if pending_len > JOIN_LIMIT:
                    await self._stream.send_all(b"".join(pending))
                    pending, pending_len = [], 0
        if pending:
            await self._stream.send_all(pending[0] if len(pending) == 1 else b"".join(pending))

    def _next_opaque(self) -> int:
        opaque = next(self._opaques)
        if opaque >= 0x7FFFFFFF:
            self._opaques = itertools.count(1)
            opaque = next(self._opaques)
        return opaque

    async def request(self, cmd: RemotingCommand) -> RemotingCommand:
        """Send ``cmd`` and wait (without a time limit) for the response with its opaque."""
        if self._closed or self._eof:
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
                self._eof = True
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
