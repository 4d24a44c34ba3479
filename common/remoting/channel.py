"""Channel: one remoting connection, used by both the server and the client.

Theory of operation. A connection carries requests and responses in both directions, matched by
``opaque``. :meth:`Channel.run` owns the connection: it opens a nursery, reads bytes into a
:class:`~common.remoting.codec.FrameDecoder`, and for each decoded command either

* completes the waiter of one of *our* requests (a response; unknown opaques are ignored), or
* offers the peer's request to the ``inline`` handler, if one was given: a plain function that the
  read loop calls synchronously, in arrival order, with no task and no scheduling in between. It
  returns the answer (queued at once), ``None`` (no answer), :data:`NOT_INLINE` (not handled
  inline: go on as below) or an awaitable for the rest of the work (e.g. a SYNC_FLUSH send that
  was appended in arrival order and now waits for its flush), which a task awaits to get the
  answer. Trio may start a batch of new tasks in any order, so anything order-sensitive (pipelined
  SEND requests reaching the store in arrival order) must happen inline. Requests of
  ``run_codes`` that one chunk delivers in a row go to ``inline_run`` together (the SEND codes:
  one store write for the run), before any later request of the chunk; each still gets its own
  answer, or its own error.
* otherwise starts a task running ``handler``, so a slow handler (a long-polling PULL) never
  delays the next request on the same connection.

Answers (or errors, mapped to a response code) go back with RESPONSE_FLAG and the request's
opaque, unless the request was oneway.

Writing. A frame is encoded into the outbox (a FIFO of pieces: length prefix + header, then the
body parts) synchronously, so frames never interleave and nobody takes a lock. On a TCP stream the
outbox is then written at once with non-blocking ``writev`` calls: no task switch, no copy of large
mapped-file memoryviews, and all the answers the read loop queued for one received chunk leave in
one syscall. Whatever the kernel does not take is written by a writer task, which waits until the
socket is writable and exits when the outbox is empty. Other streams (in-memory streams in tests)
are always written by that writer task with ``send_all``. :meth:`send` returns once the outbox has
moved past its frame. The read loop never waits for its answers to be written, except while more
than :data:`OUTBOX_HIGH_WATER` bytes are queued: a peer that sends requests but does not read the
answers stops being read.

The request flusher. :meth:`Channel.invoke_at` with other requests of ours in flight on a TCP
stream does not write its frame itself: it wakes one parked task per channel (a reschedule,
no syscall), which runs in Trio's next batch of tasks, after every task of this
batch (the senders one read of answers woke) has queued its frame, and writes them all with one
``writev`` (issue 28: one syscall and one pass of the outbox bookkeeping per batch instead of
per request). One request alone writes at once as before (nothing to wait for). A deferred
request does not wait for its write: its answer cannot come first, and a write that fails closes
the channel, which fails the request with the RemotingSendError its own wait would have raised.
A batch is not held whole: the request that finds :data:`FLUSH_AFTER` pieces queued (a frame up
to 16 KiB is one piece) writes them itself, so the server starts on the first requests of a batch while this process builds the
rest. Holding 20-30 frames for one write left the broker idle meanwhile and then this process
idle while the broker worked through them; at 32 in flight that overlap is ~19 % more sends/s
for a few more writes (docs/benchmarks.md, "Sixth round").

Deadlines. :meth:`Channel.invoke_at` (behind :meth:`Channel.invoke` and
``RemotingClient.invoke``) does not wrap its wait in a cancel scope: entering and leaving one cost
7-11 us of a send's client CPU (issue 28). The request's waiter carries its deadline instead, and
one sweeper task per channel, started with its first timed request, fails the waiters whose
deadline passed with RemotingTimeoutError (on Trio's clock, as a cancel scope would) and sleeps
until the earliest deadline left. Nearly every request of a channel has the same timeout, so the
deadlines arrive in order: they are a FIFO of waiters (``_deadlines``), O(1) to add and to drop.
A deadline earlier than the FIFO's last one (a shorter timeout after a longer one) goes to a heap
(``_late``) instead, O(log n). A request that ends (answered, failed, timed out, or cancelled by
its caller's own scope) marks its waiter done; it drops the done entries at the front of the FIFO
and the heap, so a channel answering in order keeps one entry per request in flight, not one per
request of the last ``timeout`` seconds (the lesson of broker/ha/watermark.py's replica
deadlines). Entries answered out of order wait behind a live front until it ends, or are dropped
in bulk once the FIFO or the heap holds more than twice the channel's waiters. The sweeper wakes
at the front's deadline; under a steady load that front has been answered by then, so it wakes
about once per timeout, not once per request. Until ``run()`` has started (a new connection's
first request) there is no nursery for the sweeper, and the request keeps its own cancel scope.

Invariants: ``_deadlines`` is in nondecreasing deadline order; every live waiter of
``invoke_at`` has exactly one entry, in ``_deadlines`` or ``_late``; ``_sweep_at`` is never later
than the earliest live deadline while the sweeper runs (adding an earlier one wakes it); the
entries number at most about twice the channel's waiters plus 64; a waiter is settled once
(response, connection error or timeout, whichever comes first).

When the peer closes (EOF), waiters of our requests fail at once with RemotingConnectError; request
tasks already running get a short grace period to finish (a oneway request followed by a close must
still take effect), then are cancelled. An undecodable or oversized frame, a failed write, or
:meth:`close`, cancels everything at once. Then the ``on_close`` callback runs, and last the stream
is closed under a shielded, bounded scope (so when the peer sees EOF, listeners have already run).
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import itertools
import logging
import math
import os
from collections import deque
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
from common.remoting.deferred_answer import DeferredAnswer, flush_batch, flush_soon
from common.remoting.server_limits import OVERLOAD_REMARK, UNCOUNTED, ServerLoad

log = logging.getLogger(__name__)
# a response-only chunk (a client's) opens no flush batch
_NO_BATCH = contextlib.nullcontext()

Handler = Callable[[RemotingCommand, "Channel"], Awaitable[RemotingCommand | None]]


class _NotInline:
    def __repr__(self) -> str:
        return "NOT_INLINE"


#: What an inline handler returns for a request it leaves to the (task-based) handler.
NOT_INLINE: Any = _NotInline()

#: ``(request, channel) -> answer | None | NOT_INLINE | Awaitable[answer | None]``, called by the
#: read loop itself; it must not block.
InlineHandler = Callable[[RemotingCommand, "Channel"], Any]

#: ``(requests, channel) -> [what the inline handler would answer, or the exception it raised,
#: per request]``: a run of requests one read delivered in a row, handled together in order.
InlineRunHandler = Callable[[list[RemotingCommand], "Channel"], list[Any]]

RECEIVE_SIZE = 64 * 1024
# On non-socket streams, small pieces are joined into one send_all; larger ones (mapped-file
# memoryviews of PULL answers) are written as they are, never copied.
JOIN_LIMIT = 64 * 1024
# At most this many pieces per writev (Linux IOV_MAX is 1024).
WRITEV_MAX = 512
# A bytes body up to this size is queued joined to its header: a frame is then one piece
JOIN_MAX = 16 * 1024
# The read loop stops reading while more than this many bytes wait to be written.
OUTBOX_HIGH_WATER = 4 * 1024 * 1024
# How long request tasks may keep running after the peer closed its side.
EOF_GRACE = 1.0
# requests of one chunk served before the read loop lets other tasks run (fairness under floods;
# a benchmark pipelining 32 never reaches it)
FAIR_RUN = 128
CLOSE_TIMEOUT = 1.0
# the request flusher's batch is written as soon as the outbox holds this many pieces (module doc)
FLUSH_AFTER = 8


class _Waiter:
    """One of our requests waiting for its response.

    The waiting task parks with ``wait_task_rescheduled`` and ``settle`` reschedules it: what
    ``trio.Event`` does, without its ParkingLot (an attrs object and an OrderedDict per request,
    and their calls on the way from the answer to the sender; issue 28)."""

    __slots__ = (
        "_task",
        "callback",
        "code",
        "deadline",
        "done",
        "error",
        "opaque",
        "response",
        "settled",
        "timeout",
    )

    # Set by Channel.invoke_at only, for the deadline sweeper (unset on other waiters): the key in
    # Channel._waiters, when it times out (Trio's clock), and what the timeout error says
    opaque: int
    deadline: float
    timeout: float
    code: int

    def __init__(self) -> None:
        # the task parked in wait(), until settle() reschedules it or its wait is cancelled
        self._task: trio.lowlevel.Task | None = None
        # the response or error is in
        self.settled = False
        self.response: RemotingCommand | None = None
        self.error: BaseException | None = None
        # called (by the read loop, or by whoever fails the channel) instead of a task waking
        self.callback: Callable[[RemotingCommand | BaseException], None] | None = None
        # settled, or given up by its caller: the deadline sweeper skips and drops it
        self.done = False

    def outcome(self) -> RemotingCommand | BaseException:
        if self.error is not None:
            return self.error
        assert self.response is not None
        return self.response

    async def wait(self) -> None:
        """Until settled; a checkpoint in any case, as ``trio.Event.wait``."""
        if self.settled:
            await trio.lowlevel.checkpoint()
            return
        self._task = trio.lowlevel.current_task()

        def abort(_: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
            self._task = None
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    def settle(self) -> None:
        """The response or error is in: wake the waiting task, or run the callback."""
        self.done = True
        self.settled = True
        task, self._task = self._task, None
        if task is not None:
            trio.lowlevel.reschedule(task)
        callback, self.callback = self.callback, None
        if callback is not None:
            try:
                callback(self.outcome())
            except Exception:
                log.exception("response callback failed")


class PendingResponse:
    """A request queued by :meth:`Channel.request_nowait`, waiting for its response."""

    __slots__ = ("_opaque", "_waiter", "_waiters")

    def __init__(self, waiters: dict[int, _Waiter], opaque: int, waiter: _Waiter) -> None:
        self._waiters = waiters
        self._opaque = opaque
        self._waiter = waiter

    async def wait(self) -> RemotingCommand:
        """The response (no time limit: callers use a cancel scope); RemotingConnectError
        when the connection ends first."""
        try:
            await self._waiter.wait()
        finally:
            self._waiters.pop(self._opaque, None)
        if self._waiter.error is not None:
            raise self._waiter.error
        assert self._waiter.response is not None
        return self._waiter.response

    def when_done(self, fn: Callable[[RemotingCommand | BaseException], None]) -> None:
        """Call ``fn(response or error)`` once the outcome is in, from
        the channel's read loop (or at once if it is in already), with no task waiting: for
        callers with many requests in flight, who bound each one's time themselves."""
        waiter = self._waiter
        if waiter.settled:
            fn(waiter.outcome())
        else:
            waiter.callback = fn

    def cancel(self) -> None:
        """Forget the request (timed out): a late response is ignored, no callback runs."""
        self._waiter.callback = None
        self._waiters.pop(self._opaque, None)


def _nbytes(piece: Any) -> int:
    t = type(piece)
    if t is bytes:
        return len(piece)
    if t is memoryview:
        return piece.nbytes
    return memoryview(piece).nbytes


def _unencodable(cmd: RemotingCommand, exc: Exception) -> RemotingCommand:
    """The answer sent instead of one that cannot be encoded (a value the request carried
    and the answer echoes, say): the request still gets an answer, the connection lives."""
    log.debug("the answer to code %d cannot be encoded: %r", cmd.code, exc)
    response = cmd.response(
        ResponseCode.SYSTEM_ERROR, f"the answer could not be encoded: {type(exc).__name__}"
    )
    response.flag |= RESPONSE_FLAG
    response.opaque = cmd.opaque
    return response


def _error_response(cmd: RemotingCommand, raw: BaseException, addr: str) -> RemotingCommand:
    """The answer to a request whose handler raised ``raw``."""
    exc = unwrap_group(raw)
    if isinstance(exc, RequestError):
        return cmd.response(exc.code, exc.remark)
    log.error("handler for code %d from %s failed", cmd.code, addr, exc_info=raw)
    return cmd.response(ResponseCode.SYSTEM_ERROR, str(exc) or repr(exc))


# Channel.attrs key: the protocol of a client that is not a remoting connection (a RocketMQ 5
# gRPC client seen through broker/grpc/client_channel.py), for what the admin calls report
PROTOCOL_ATTR = "protocol"


class Channel:
    """One connection. ``attrs`` is a free slot for owners (e.g. a broker's client id)."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        remote_addr: str,
        *,
        max_frame_length: int = MAX_FRAME_LENGTH,
        load: ServerLoad = UNCOUNTED,
    ) -> None:
        self.remote_addr = remote_addr
        self.attrs: dict[str, Any] = {}
        # the server's counts this connection adds to (server_limits.py); UNCOUNTED for ours
        self._load = load
        # the peer's requests we hold (a task runs for it, or its answer is deferred)
        self._held = 0
        # trio time of the last bytes read (the server's idle sweep)
        self.last_active = 0.0
        self._stream = stream
        self._max_frame_length = max_frame_length
        # The socket's fd if the stream is a TCP socket stream (then written with os.writev from
        # any task, synchronously), else None (written with send_all by the writer task only).
        self._fd: int | None = None
        if isinstance(stream, trio.SocketStream):
            try:
                self._fd = stream.socket.fileno()
            except OSError:
                self._fd = None
        # Encoded pieces not yet written, in frame order; the first may be the unwritten tail of
        # a partially written piece.
        self._outbox: deque[Any] = deque()
        # Bytes in _outbox.
        self._out_bytes = 0
        # Bytes ever queued / ever written: a frame is out once _sent reaches its end.
        self._queued = 0
        self._sent = 0
        # True while a writer task exists; it drains _outbox, clears this and exits.
        self._writer_running = False
        # Set and replaced when bytes were written or the channel failed, if anyone waits on it.
        self._progress = trio.Event()
        # Tasks waiting on _progress.
        self._progress_waiters = 0
        # opaque -> waiter, only for requests *we* sent and that are still unanswered.
        self._waiters: dict[int, _Waiter] = {}
        # Opaques we hand out; kept in Java's positive int range.
        self._opaques = itertools.count(1)
        # True once the connection is unusable for new requests (closed by us, peer or error).
        self._closed = False
        # True once the peer's EOF was read: no new requests of ours (nothing would answer),
        # while answers to the peer's own in-flight requests may still be written.
        self._eof = False
        # run()'s nursery (for the writer and request tasks) and its cancel scope; None before
        # run() starts.
        self._nursery: trio.Nursery | None = None
        self._scope: trio.CancelScope | None = None
        # True while a flush of deferred answers is scheduled (flush_soon) and not yet run:
        # the answers one wake-up releases leave in one writev
        self._flush_scheduled = False
        # The deadline sweeper's entries (module doc, "Deadlines"): the waiters of invoke_at in
        # nondecreasing deadline order, and (deadline, opaque, waiter) of those that came out of
        # that order. Both may hold done waiters, at most about as many as there are live ones.
        self._deadlines: deque[_Waiter] = deque()
        self._late: list[tuple[float, int, _Waiter]] = []
        # When the sweeper wakes next (inf: asleep until a deadline is added, or not started).
        self._sweep_at = math.inf
        # Set to wake the sleeping sweeper early; None until the sweeper task starts.
        self._sweep_wake: trio.Event | None = None
        # The request flusher (module doc, "Writing"): its task while parked, whether it was
        # started, and whether it was woken to write and has not yet written
        self._flusher: trio.lowlevel.Task | None = None
        self._flusher_started = False
        self._flush_due = False

    def __repr__(self) -> str:
        return f"<Channel {self.remote_addr}{' closed' if self._closed else ''}>"

    @property
    def closed(self) -> bool:
        return self._closed or self._eof

    @property
    def deadlines_held(self) -> int:
        """Entries the deadline sweeper holds, done ones included (bounded: module doc)."""
        return len(self._deadlines) + len(self._late)

    @property
    def idle(self) -> bool:
        """No request of the peer held and no answer unwritten (the server's idle sweep)."""
        return self._held == 0 and self._out_bytes == 0

    def close(self) -> None:
        """Close now: in-flight requests on both sides are cancelled/failed."""
        self._closed = True
        if self._scope is not None:
            self._scope.cancel()
        self._fail_waiters(RemotingConnectError(f"channel to {self.remote_addr} closed"))
        self._outbox.clear()
        self._load.outbox_bytes -= self._out_bytes
        self._out_bytes = 0
        self._wake_progress()

    # --- writing -------------------------------------------------------------------------------

    async def send(self, cmd: RemotingCommand) -> None:
        """Write one frame; raises RemotingSendError if the connection is gone.

        Returns as soon as the frame is out, which on a TCP stream with room in the socket
        buffer is before any scheduling at all.
        """
        if self._closed:
            raise RemotingSendError(f"channel to {self.remote_addr} is closed")
        end = self._enqueue(cmd)
        self._kick()
        while self._sent < end:
            if self._closed:
                raise RemotingSendError(f"channel to {self.remote_addr} is closed")
            self._progress_waiters += 1
            try:
                await self._progress.wait()
            finally:
                self._progress_waiters -= 1

    def _enqueue(self, cmd: RemotingCommand) -> int:
        """Queue one frame; returns the byte count (of _queued) at which it ends."""
        body = cmd.body
        out = self._outbox
        if type(body) is bytes:
            body_len = len(body)
            head = encode_header_and_prefix(cmd, body_len)
            if body_len > JOIN_MAX:
                out.append(head)
                out.append(body)
            else:
                # one piece: os.write rather than writev of a list, one piece to account for
                # when it is written (a send's client CPU, issue 28); the copy is small
                out.append(head + body if body_len else head)
        else:
            parts = body if isinstance(body, list | tuple) else (body,)
            sizes = [_nbytes(p) for p in parts]
            body_len = sum(sizes)
            head = encode_header_and_prefix(cmd, body_len)
            out.append(head)
            out.extend(p for p, n in zip(parts, sizes, strict=True) if n)
        return self._count_queued(len(head) + body_len)

    def _enqueue_frame(self, frame: bytes) -> None:
        """Queue a frame encoded beforehand (``_likely_frame``)."""
        self._outbox.append(frame)
        self._count_queued(len(frame))

    def _count_queued(self, size: int) -> int:
        """Account for ``size`` bytes just queued; the byte count at which they end."""
        self._out_bytes += size
        self._load.outbox_bytes += size
        self._queued += size
        return self._queued

    def _kick(self) -> None:
        """Write the outbox now as far as possible; leave the rest to a writer task."""
        if self._writer_running or not self._outbox:
            return
        if self._fd is not None:
            try:
                self._write_nowait()
            except OSError as exc:
                self._write_failed(exc)
                return
            if not self._outbox:
                return
        if self._nursery is None:
            return  # run() starts the writer when it starts
        self._writer_running = True
        self._nursery.start_soon(self._writer)

    def _write_nowait(self) -> None:
        """Write what the kernel takes without blocking (socket streams); raises OSError."""
        out = self._outbox
        fd = self._fd
        assert fd is not None
        written = 0
        while out:
            if len(out) == 1:
                want = _nbytes(out[0])
                try:
                    n = os.write(fd, out[0])
                except BlockingIOError:
                    break
            else:
                batch = list(itertools.islice(out, WRITEV_MAX))
                want = sum(_nbytes(p) for p in batch)
                try:
                    n = os.writev(fd, batch)
                except BlockingIOError:
                    break
            self._consume(n)
            written += n
            if n < want:
                break  # the socket buffer is full
        if written:
            self._wake_progress()

    def _consume(self, n: int) -> None:
        """Drop ``n`` written bytes from the front of the outbox."""
        self._sent += n
        self._out_bytes -= n
        self._load.outbox_bytes -= n
        out = self._outbox
        while n:
            size = _nbytes(out[0])
            if size <= n:
                out.popleft()
                n -= size
            else:
                out[0] = memoryview(out[0]).cast("B")[n:]
                n = 0

    async def _writer(self) -> None:
        try:
            while self._outbox and not self._closed:
                if self._fd is not None:
                    await trio.lowlevel.wait_writable(self._fd)
                    self._write_nowait()
                else:
                    pieces = list(self._outbox)
                    size = self._out_bytes
                    await self._send_all(pieces)
                    if self._closed:
                        return
                    for _ in pieces:
                        self._outbox.popleft()
                    self._out_bytes -= size
                    self._load.outbox_bytes -= size
                    self._sent += size
                    self._wake_progress()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self._write_failed(exc)
        finally:
            self._writer_running = False

    async def _send_all(self, pieces: list[Any]) -> None:
        # Non-socket streams: small pieces joined into one write, large ones written as they are.
        pending: list[Any] = []
        pending_len = 0
        for piece in pieces:
            size = _nbytes(piece)
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

    def _write_failed(self, exc: BaseException) -> None:
        log.debug("write to %s failed: %r", self.remote_addr, exc)
        self.close()

    def _wake_progress(self) -> None:
        if self._progress_waiters:
            ev, self._progress = self._progress, trio.Event()
            ev.set()

    def _next_opaque(self) -> int:
        opaque = next(self._opaques)
        if opaque >= 0x7FFFFFFF:
            self._opaques = itertools.count(1)
            opaque = next(self._opaques)
        return opaque

    def request_nowait(self, cmd: RemotingCommand) -> PendingResponse:
        """Queue ``cmd`` now and return the wait for its response.

        No checkpoint: frames queued by successive calls leave in that order, which pipelined
        callers that must keep their order (DLedger's pushes) rely on.  Unlike :meth:`request`
        it does not wait for the frame to be written; the caller bounds what it queues."""
        if self._closed or self._eof:
            raise RemotingConnectError(f"channel to {self.remote_addr} is closed")
        cmd.opaque = self._next_opaque()
        cmd.flag &= ~(RESPONSE_FLAG | ONEWAY_FLAG)
        waiter = _Waiter()
        self._waiters[cmd.opaque] = waiter
        self._enqueue(cmd)
        self._kick()
        return PendingResponse(self._waiters, cmd.opaque, waiter)

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
            await waiter.wait()
        finally:
            self._waiters.pop(cmd.opaque, None)
        if waiter.error is not None:
            raise waiter.error
        assert waiter.response is not None
        return waiter.response

    async def invoke(self, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        """Request/response with a time limit on Trio's clock."""
        return await self.invoke_at(cmd, trio.current_time() + timeout, timeout)

    def _timeout_error(self, timeout: float, code: int) -> RemotingTimeoutError:
        return RemotingTimeoutError(
            f"no response from {self.remote_addr} within {timeout}s (code {code})"
        )

    async def invoke_at(
        self, cmd: RemotingCommand, deadline: float, timeout: float
    ) -> RemotingCommand:
        """Send ``cmd`` and return its response; RemotingTimeoutError at ``deadline`` (Trio's
        clock), saying ``timeout``, the time limit the caller was given.

        The deadline is kept by the channel's sweeper task, not by a cancel scope of this task
        (module doc, "Deadlines"); a cancel scope of the caller's still cancels the request.
        """
        if self._closed or self._eof:
            raise RemotingConnectError(f"channel to {self.remote_addr} is closed")
        nursery = self._nursery
        if nursery is None:
            # run() has not started yet (the first request of a new connection): no task of the
            # channel's can keep the deadline, this one does
            with trio.move_on_at(deadline):
                return await self.request(cmd)
            raise self._timeout_error(timeout, cmd.code)
        opaque = cmd.opaque = self._next_opaque()
        cmd.flag &= ~(RESPONSE_FLAG | ONEWAY_FLAG)
        waiter = _Waiter()
        waiter.opaque = opaque
        waiter.deadline = deadline
        waiter.timeout = timeout
        waiter.code = cmd.code
        self._waiters[opaque] = waiter
        fifo = self._deadlines
        while fifo and fifo[-1].done:
            fifo.pop()  # a request given up behind the live ones (it may be far in the future)
        if not fifo or fifo[-1].deadline <= deadline:
            fifo.append(waiter)
        else:
            heapq.heappush(self._late, (deadline, opaque, waiter))
        if deadline < self._sweep_at:
            self._sweep_at = deadline
            if self._sweep_wake is None:
                self._sweep_wake = trio.Event()
                nursery.start_soon(self._sweep)
            else:
                self._sweep_wake.set()
        try:
            end = self._enqueue(cmd)
            deferred = (
                len(self._waiters) > 1
                and self._fd is not None
                and len(self._outbox) < FLUSH_AFTER
                and self._defer_write()
            )
            if not deferred:
                self._kick()
            # Channel.send's wait, which also ends when the sweeper timed the request out; a
            # deferred frame is not waited for: its answer cannot come before it is written, and
            # a failed write closes the channel, which fails this waiter (checked below)
            while not deferred and self._sent < end:
                if self._closed:
                    raise RemotingSendError(f"channel to {self.remote_addr} is closed")
                if waiter.done:
                    break
                self._progress_waiters += 1
                try:
                    await self._progress.wait()
                finally:
                    self._progress_waiters -= 1
            await waiter.wait()
            if deferred and self._sent < end and self._closed:
                # what the wait for the write above says when the channel closed first
                raise RemotingSendError(f"channel to {self.remote_addr} is closed")
        finally:
            waiter.done = True
            self._waiters.pop(opaque, None)
            # this request's entry is done: drop the done ones from the front now, so answered
            # requests leave nothing behind them; the rest goes when the front is done, or in
            # bulk (_compact_deadlines)
            while fifo and fifo[0].done:
                fifo.popleft()
            if len(fifo) > 64 and len(fifo) > 2 * len(self._waiters):
                self._compact_deadlines()
            late = self._late
            if late:
                while late and late[0][2].done:
                    heapq.heappop(late)
                if len(late) > 64 and len(late) > 2 * len(self._waiters):
                    self._compact_deadlines()
        if waiter.error is not None:
            raise waiter.error
        assert waiter.response is not None
        return waiter.response

    def _defer_write(self) -> bool:
        """Leave the outbox to the request flusher, woken to write it in Trio's next batch of
        tasks (module doc, "Writing"); False when there is no flusher parked to wake (then
        the caller writes now, and the flusher is started for next time)."""
        if self._flush_due:
            return True  # woken already: it writes this frame too
        task = self._flusher
        if task is None:
            if not self._flusher_started and self._nursery is not None:
                self._flusher_started = True
                self._nursery.start_soon(self._flush_requests)
            return False
        self._flusher = None
        self._flush_due = True
        trio.lowlevel.reschedule(task)
        return True

    async def _flush_requests(self) -> None:
        """The request flusher: parked until a request is deferred to it, then writes the
        outbox (what every task of the batch queued) in one go. Ends with the channel."""
        while True:
            self._flusher = trio.lowlevel.current_task()
            await trio.lowlevel.wait_task_rescheduled(self._unpark_flusher)
            self._flush_due = False
            if not self._closed:
                self._kick()

    def _unpark_flusher(self, _raise_cancel: Any) -> trio.lowlevel.Abort:
        # the channel's nursery is cancelled (it ends): no flusher from now on; requests that
        # find none write their frames themselves (_defer_write)
        self._flusher = None
        return trio.lowlevel.Abort.SUCCEEDED

    def _compact_deadlines(self) -> None:
        """Drop the sweeper's entries of done requests in bulk (they outnumber the live ones)."""
        live = [w for w in self._deadlines if not w.done]
        self._deadlines.clear()
        self._deadlines.extend(live)
        self._late = [e for e in self._late if not e[2].done]
        heapq.heapify(self._late)

    async def _sweep(self) -> None:
        """The deadline sweeper: fail the requests of invoke_at whose deadline passed, sleep
        until the earliest deadline left (module doc, "Deadlines"). Ends with the channel."""
        fifo = self._deadlines
        while not (self._closed or self._eof):
            now = trio.current_time()
            expired = False
            while fifo and (fifo[0].done or fifo[0].deadline <= now):
                waiter = fifo.popleft()
                if not waiter.done:
                    self._expire(waiter)
                    expired = True
            late = self._late
            while late and (late[0][2].done or late[0][0] <= now):
                waiter = heapq.heappop(late)[2]
                if not waiter.done:
                    self._expire(waiter)
                    expired = True
            if expired:
                self._wake_progress()  # a request still waiting to write its frame gives up
            wake_at = fifo[0].deadline if fifo else math.inf
            if late and late[0][0] < wake_at:
                wake_at = late[0][0]
            self._sweep_at = wake_at
            self._sweep_wake = wake = trio.Event()
            # one cancel scope per wake-up, not per request: under a steady load the front
            # entry is answered before its deadline, so this wakes about once per timeout
            with trio.move_on_at(wake_at):
                await wake.wait()

    def _expire(self, waiter: _Waiter) -> None:
        """Time ``waiter`` out; a late response to it is then ignored (unknown opaque)."""
        if self._waiters.get(waiter.opaque) is waiter:
            del self._waiters[waiter.opaque]
        waiter.error = self._timeout_error(waiter.timeout, waiter.code)
        waiter.settle()

    async def send_oneway(self, cmd: RemotingCommand) -> None:
        cmd.opaque = self._next_opaque()
        cmd.flag = (cmd.flag | ONEWAY_FLAG) & ~RESPONSE_FLAG
        await self.send(cmd)

    def _fail_waiters(self, error: BaseException) -> None:
        waiters, self._waiters = self._waiters, {}
        for waiter in waiters.values():
            waiter.error = error
            waiter.settle()
        # every waiter is done: the sweeper has nothing left, and ends (the channel is closed)
        self._deadlines.clear()
        self._late.clear()
        if self._sweep_wake is not None:
            self._sweep_wake.set()

    # --- reading and dispatch ------------------------------------------------------------------

    async def run(
        self,
        handler: Handler,
        on_close: Callable[[Channel], None] | None = None,
        *,
        inline: InlineHandler | None = None,
        inline_run: InlineRunHandler | None = None,
        run_codes: frozenset[int] = frozenset(),
    ) -> None:
        """Serve this connection until EOF, a bad frame, :meth:`close` or cancellation.

        Never raises except Cancelled: errors of the connection end the connection.
        """
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._scope = nursery.cancel_scope
                if self._closed:
                    nursery.cancel_scope.cancel()
                self._kick()  # frames queued before run() started
                await self._read_loop(
                    nursery, handler, inline, inline_run if inline is not None else None, run_codes
                )
        except Exception:  # a bug of ours; keep the server alive
            log.exception("connection %s failed", self.remote_addr)
        finally:
            self._closed = True
            self._outbox.clear()
            self._load.outbox_bytes -= self._out_bytes
            self._out_bytes = 0
            # the request tasks have ended (the nursery is closed): what is left is deferred
            # answers nobody will read
            self._load.requests_held -= self._held
            self._held = 0
            self._wake_progress()
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

    async def _read_loop(
        self,
        nursery: trio.Nursery,
        handler: Handler,
        inline: InlineHandler | None,
        inline_run: InlineRunHandler | None = None,
        run_codes: frozenset[int] = frozenset(),
    ) -> None:
        decoder = FrameDecoder(self._max_frame_length)
        receive = self._stream.receive_some
        fd = self._fd
        # True when this task was scheduled since the last chunk it processed.
        waited = True
        # True after a read that did not fill RECEIVE_SIZE: the peer has paused, so the next
        # read would find nothing; wait for readability first and save that read's syscall
        # (the answer a client waits for is read and handed over one syscall sooner)
        short = False
        while True:
            if fd is None:
                try:
                    data = await receive(RECEIVE_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    data = b""
            else:
                # TCP: read the socket directly and wait for readability only when it is empty.
                # A request that arrives while we wait is served without the extra scheduling
                # pass trio's receive_some makes after every read; when data is already there
                # we still yield once per chunk, so a busy connection cannot starve the others.
                data = None
                if short:
                    short = False
                    waited = True
                    try:
                        await trio.lowlevel.wait_readable(fd)
                    except trio.ClosedResourceError:
                        data = b""  # (the descriptor may be another socket's by now)
                if data is None:
                    try:
                        data = os.read(fd, RECEIVE_SIZE)
                    except BlockingIOError:
                        try:
                            await trio.lowlevel.wait_readable(fd)
                        except trio.ClosedResourceError:
                            data = b""
                        else:
                            waited = True
                            continue
                    except OSError:
                        data = b""
                    else:
                        if not waited:
                            await trio.lowlevel.checkpoint()
                        waited = False
                        short = len(data) < RECEIVE_SIZE
            self.last_active = trio.current_time()
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
            i, n = 0, len(commands)
            while True:
                # a run ends after FAIR_RUN requests: a client pipelining thousands per chunk
                # lets the other connections in between (their tail latency under a flood)
                run_end = min(n, i + FAIR_RUN)
                # one flush batch per run of requests: what they ask to flush (answers set at
                # once, the HA master's transfer of their bytes) happens once, at the end
                with flush_batch() if inline is not None else _NO_BATCH:
                    # requests of run_codes in a row, served together (inline_run) before the
                    # next other request or the end of the run: arrival order is kept
                    grouped: list[RemotingCommand] = []
                    while i < run_end:
                        cmd = commands[i]
                        i += 1
                        if cmd.flag & RESPONSE_FLAG:
                            waiter = self._waiters.pop(cmd.opaque, None)
                            if waiter is not None:
                                waiter.response = cmd
                                waiter.settle()
                            else:
                                log.debug("response with unknown opaque %d ignored", cmd.opaque)
                            continue
                        held = self._held + len(grouped)
                        if held >= self._load.limits.max_requests_held or (
                            self._load.requests_held + len(grouped)
                            >= self._load.limits.max_requests_held_total
                            and held >= self._load.limits.fair_share
                        ):
                            self._refuse(cmd)
                        elif inline is None:
                            self._start_request(nursery, cmd, handler, None)
                        elif inline_run is not None and cmd.code in run_codes:
                            grouped.append(cmd)
                            continue  # answered with its run
                        else:
                            if grouped and inline_run is not None:
                                self._serve_run(nursery, grouped, handler, inline, inline_run)
                                grouped = []
                            self._serve_inline(nursery, cmd, handler, inline)
                        if self._out_bytes and self._backed_up():
                            break  # not one more answer until the peer reads some
                    if grouped:
                        assert inline is not None and inline_run is not None
                        self._serve_run(nursery, grouped, handler, inline, inline_run)
                if self._outbox:
                    self._kick()  # every answer of this run in one write
                while self._out_bytes and self._backed_up() and not self._closed:
                    self._progress_waiters += 1
                    try:
                        await self._progress.wait()
                    finally:
                        self._progress_waiters -= 1
                if i >= n or self._closed:
                    break
                await trio.lowlevel.checkpoint()
            if decoder.error is not None:
                log.warning("closing %s: %s", self.remote_addr, decoder.error)
                self.close()
                return

    def _backed_up(self) -> bool:
        """Too many answers unwritten: this connection's, or all connections' together."""
        load = self._load
        return (
            self._out_bytes > OUTBOX_HIGH_WATER
            or load.outbox_bytes > load.limits.max_outbox_bytes_total
        )

    def _refuse(self, cmd: RemotingCommand) -> None:
        """The answer to a request over the held-requests limits (server_limits.py)."""
        load = self._load
        load.refused_requests += 1
        if load.refused_requests % 1000 == 1:
            log.warning(
                "refusing requests of %s: it holds %d, the server %d (%d refused so far)",
                self.remote_addr,
                self._held,
                load.requests_held,
                load.refused_requests,
            )
        self._queue_answer(
            cmd, cmd.response(ResponseCode.SYSTEM_BUSY, OVERLOAD_REMARK), self.last_active
        )

    def _start_request(
        self,
        nursery: trio.Nursery,
        cmd: RemotingCommand,
        handler: Handler | None,
        pending: Awaitable[RemotingCommand | None] | None,
    ) -> None:
        self._held += 1
        self._load.requests_held += 1
        nursery.start_soon(self._handle_request, cmd, handler, pending, self.last_active)

    def _serve_inline(
        self,
        nursery: trio.Nursery,
        cmd: RemotingCommand,
        handler: Handler,
        inline: InlineHandler,
    ) -> None:
        try:
            result = inline(cmd, self)
        except Exception as raw:
            result = _error_response(cmd, raw, self.remote_addr)
        self._serve_result(nursery, cmd, handler, result)

    def _serve_run(
        self,
        nursery: trio.Nursery,
        cmds: list[RemotingCommand],
        handler: Handler,
        inline: InlineHandler,
        inline_run: InlineRunHandler,
    ) -> None:
        """Requests of the run codes that arrived in a row: one call of ``inline_run`` for
        them (a lone one goes to ``inline``), then each its own answer."""
        if len(cmds) == 1:
            self._serve_inline(nursery, cmds[0], handler, inline)
            return
        try:
            results = inline_run(cmds, self)
        except Exception as raw:  # (a bug: the handler answers its own requests' errors)
            results = [raw] * len(cmds)
        for cmd, result in zip(cmds, results, strict=True):
            if isinstance(result, Exception):
                result = _error_response(cmd, result, self.remote_addr)
            self._serve_result(nursery, cmd, handler, result)

    def _serve_result(
        self, nursery: trio.Nursery, cmd: RemotingCommand, handler: Handler, result: Any
    ) -> None:
        """What an inline handler gave for ``cmd``: answered, held or left to a task."""
        if result is NOT_INLINE:
            self._start_request(nursery, cmd, handler, None)
        elif result is None or isinstance(result, RemotingCommand):
            self._queue_answer(cmd, result, self.last_active)
        elif isinstance(result, DeferredAnswer):
            self._held += 1
            self._load.requests_held += 1
            likely = result.likely
            frame = None
            if likely is not None and not result.done:
                frame = self._likely_frame(cmd, likely)
            result.subscribe(
                functools.partial(self._answer_deferred, cmd, self.last_active, likely, frame)
            )
        else:
            self._start_request(nursery, cmd, None, result)

    def _likely_frame(self, cmd: RemotingCommand, likely: RemotingCommand) -> bytes | None:
        """The frame of a DeferredAnswer's likely response to ``cmd``, made now; None when it
        is not one piece of bytes (then it is encoded when set, as any answer)."""
        body = likely.body
        if cmd.flag & ONEWAY_FLAG or type(body) is not bytes or len(body) > JOIN_MAX:
            return None
        likely.flag |= RESPONSE_FLAG
        likely.opaque = cmd.opaque
        try:
            head = encode_header_and_prefix(likely, len(body))
        except Exception:
            return None  # encoded again when set, which answers what cannot be encoded
        return head + body if body else head

    def _answer_deferred(
        self,
        cmd: RemotingCommand,
        read_at: float,
        likely: RemotingCommand | None,
        frame: bytes | None,
        response: RemotingCommand,
    ) -> None:
        """A DeferredAnswer was set: queue it, and flush once for all set in this wake-up."""
        if self._held > 0:  # else the channel ended and gave its count back already
            self._held -= 1
            self._load.requests_held -= 1
        if frame is not None and response is likely and not self._closed:
            self._enqueue_frame(frame)
            observe = self._load.rpc_observer
            if observe is not None:
                observe(cmd.code, response.code, trio.current_time() - read_at)
        else:
            self._queue_answer(cmd, response, read_at)
        if self._outbox and not self._flush_scheduled and not self._closed:
            self._flush_scheduled = True
            flush_soon(self._flush_deferred)

    def _flush_deferred(self) -> None:
        # a flush_soon callback (maybe run_sync_soon's): an exception here would crash the loop
        self._flush_scheduled = False
        try:
            if not self._closed:
                self._kick()
        except Exception:
            log.exception("writing deferred answers to %s failed", self.remote_addr)

    def _queue_answer(
        self, cmd: RemotingCommand, response: RemotingCommand | None, read_at: float = -1.0
    ) -> None:
        """Queue the answer to ``cmd`` (written by the caller's next _kick); ``read_at``: the
        trio time the request was read (the latency the server's ``rpc_observer`` sees)."""
        if response is None or cmd.flag & ONEWAY_FLAG or self._closed:
            return
        response.flag |= RESPONSE_FLAG
        response.opaque = cmd.opaque
        try:
            self._enqueue(response)
        except Exception as exc:
            self._enqueue(_unencodable(cmd, exc))
        observe = self._load.rpc_observer
        if observe is not None and read_at >= 0:
            observe(cmd.code, response.code, trio.current_time() - read_at)

    async def _handle_request(
        self,
        cmd: RemotingCommand,
        handler: Handler | None,
        pending: Awaitable[RemotingCommand | None] | None,
        read_at: float,
    ) -> None:
        """Run ``handler`` (or await what an inline handler left ``pending``), then answer."""
        try:
            await self._answer_request(cmd, handler, pending, read_at)
        finally:
            self._held -= 1
            self._load.requests_held -= 1

    async def _answer_request(
        self,
        cmd: RemotingCommand,
        handler: Handler | None,
        pending: Awaitable[RemotingCommand | None] | None,
        read_at: float,
    ) -> None:
        try:
            if pending is None:
                assert handler is not None
                pending = handler(cmd, self)
            response = await pending
        except Exception as raw:
            response = _error_response(cmd, raw, self.remote_addr)
        if response is None or cmd.is_oneway:
            return
        # queued, not awaited: once answered a request is no longer held (a peer that does not
        # read its answers is bounded by the outbox, server_limits.py)
        self._queue_answer(cmd, response, read_at)
        if self._outbox:
            self._kick()
