"""One HTTP/2 connection serving gRPC calls: ``h2`` (sans-I/O) driven by Trio tasks.

Theory of operation
-------------------
``h2.H2Connection`` is a pure state machine: bytes in, events out, bytes to send buffered. Three
kinds of task drive it, all in the connection's nursery, all on one Trio thread (so the state
machine needs no lock: no ``await`` happens between touching it and leaving it consistent):

* the **reader** feeds received bytes to h2 and acts on its events: a new stream (headers) starts a
  call task, DATA goes to that call's :class:`~common.grpc.framing.MessageDecoder`, a reset cancels
  the call, a WINDOW_UPDATE wakes senders. A protocol error (garbage, a header list too large, a
  stream past MAX_CONCURRENT_STREAMS) makes h2 queue a GOAWAY; the reader stops and the connection
  ends after flushing it. A request whose header fields are malformed (checked here, see
  ``_FIELD_NAMES``; h2's own per-field validation is off for its cost) has its stream reset;
* the **writer** takes whatever h2 has buffered and writes it. A write that does not finish within
  ``send_timeout`` (a peer that reads nothing) ends the connection. It is woken only when h2
  holds bytes that no call task is about to write itself (each wakeup is a scheduling round);
* a **call task** per stream runs the handler inside a cancel scope whose deadline is the
  request's ``grpc-timeout``, then ends the stream with ``grpc-status``/``grpc-message`` trailers
  (headers+trailers in one frame, "trailers-only", when no message was sent).

Flow control, both ways, is what bounds memory (limits.py). Inbound, received DATA is
acknowledged to h2 (reopening the client's window) only while the connection holds less than
``max_buffered_inbound`` bytes its handlers have not taken; otherwise the acknowledgement waits
until a handler takes a message. Outbound, a call hands h2 at most the peer's window and waits
while the connection has more than ``outbound_high_water`` bytes unwritten; a call that cannot send
for ``send_timeout`` (the peer's window stays shut) is reset with CANCEL and its handler ends.

The per-call path is kept short, as the broker pays it for every 5.x send and ack (profiles in
docs/benchmarks.md): whole request messages wait in a deque (a unary request is usually complete
before its task first runs), and an answer that fits the peer's window, one frame and the
outbound budget is handed to h2 at once, with no lock, timer or wait; a unary call's answer and
trailers then leave in the call's own write (``_flush_now``). Only a send that has to wait takes
the call's lock, so sends stay in order, and another task (the broker pushing a telemetry
command) may send on a stream while its handler also does. HPACK is ``hpack_codec.py``'s.
"""

from __future__ import annotations

import collections
import itertools
import logging
import re
from collections.abc import AsyncIterator

import attrs
import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import trio
from google.protobuf.message import DecodeError, Message

from common.grpc.deadline import parse_grpc_timeout
from common.grpc.framing import (
    ACCEPT_ENCODING,
    ENCODINGS,
    IDENTITY,
    PREFIX,
    CompressedMessage,
    MessageDecoder,
    encode_message,
)
from common.grpc.hpack_codec import GrpcHpackDecoder, GrpcHpackEncoder
from common.grpc.limits import GrpcServerLimits
from common.grpc.service import CallContext, Method, MethodKind, Send, ServiceTable
from common.grpc.status import GrpcError, StatusCode, encode_grpc_message

log = logging.getLogger(__name__)

_connection_ids = itertools.count(1)


# What h2's own inbound header validation (off: it cost a third of h2's work per request, see
# docs/benchmarks.md) refused that a gRPC server must still refuse (RFC 9113 8.2): a field name
# with upper-case or non-token characters, a value with NUL, CR or LF, a connection-specific
# field. Such a request is malformed: its stream is reset with PROTOCOL_ERROR. The names are
# checked joined by LF (one line a name), the values concatenated: one regex call each.
_FIELD_NAMES = re.compile(rb"(?::?[a-z0-9!#$%&'*+\-.^_`|~]+\n)*:?[a-z0-9!#$%&'*+\-.^_`|~]+")
_BAD_VALUE = re.compile(rb"[\x00\r\n]")
_CONNECTION_SPECIFIC = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"}
)
_RESPONSE_HEADERS = [
    (b":status", b"200"),
    (b"content-type", b"application/grpc"),
    (b"grpc-accept-encoding", ACCEPT_ENCODING.encode()),
]
_OK_TRAILERS = [(b"grpc-status", b"0")]


class _StreamGone(Exception):
    """The stream was reset, or the connection is closing: nothing more can be sent on it."""


@attrs.define(eq=False)
class _Call:
    stream_id: int
    method: Method
    context: CallContext
    decoder: MessageDecoder
    # whole request messages the handler has not taken yet, and the event a handler waiting
    # for the next one parks on (a deque and an event cost less per call than a memory channel,
    # and a unary request is usually complete before its task first runs: no wait at all)
    inbox: collections.deque[bytes] = attrs.Factory(collections.deque)
    waiting: trio.Event | None = None
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    # taken by a send that has to wait (the peer's window, the outbound budget); made then
    send_lock: trio.Lock | None = None
    headers_sent: bool = False
    remote_ended: bool = False
    reset: bool = False
    finished: bool = False
    # bytes received but not yet acknowledged to h2 (the connection was over its inbound budget)
    unacked: int = 0
    # bytes of the call's latest inflated (decompressed) request, counted in the connection's
    # _inflated until the next one or the call's end (a handler holds the request it is on)
    inflated: int = 0


class GrpcConnection:
    def __init__(
        self,
        stream: trio.abc.Stream,
        services: ServiceTable,
        limits: GrpcServerLimits,
        *,
        peer: str = "unknown",
    ) -> None:
        self.id = next(_connection_ids)
        self.peer = peer
        self._stream = stream
        self._services = services
        self._limits = limits
        self._h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(
                client_side=False,
                header_encoding=None,
                # outbound headers are ours (constants and status trailers); inbound ones are
                # checked by _start_call, far cheaper than h2's per-field generator chain
                validate_outbound_headers=False,
                normalize_outbound_headers=False,
                validate_inbound_headers=False,
                normalize_inbound_headers=False,
            )
        )
        # hpack's decoder, leaner for the raw blocks h2 asks it for, and an encoder that keeps
        # the blocks of our constant headers (hpack_codec.py)
        decoder = GrpcHpackDecoder(self._h2.decoder.max_header_list_size)
        decoder.max_allowed_table_size = self._h2.decoder.max_allowed_table_size
        self._h2.decoder = decoder
        self._h2.encoder = GrpcHpackEncoder((_RESPONSE_HEADERS, _OK_TRAILERS))
        self._calls: dict[int, _Call] = {}
        self._wake_writer = trio.Event()
        self._progress = trio.Event()
        self._queued = 0  # bytes handed to h2 since the writer last took them
        self._unsent = 0  # bytes the writer is writing now
        self._sending = False  # a write is under way (the writer's or a call's _flush_now)
        self._inbound = 0  # bytes received that handlers have not taken
        self._withheld = 0  # the sum of the calls' `unacked`
        self._inflated = 0  # sum of the calls' `inflated`: at most max_buffered_inbound
        self._closing = False
        self._writer_done = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._reader_scope = trio.CancelScope()
        self._greeted = False  # the client's preface and first SETTINGS are in
        self.last_active = trio.current_time()

    @property
    def open_calls(self) -> int:
        return len(self._calls)

    def close(self) -> None:
        """Send GOAWAY and end the connection (running calls are cancelled)."""
        if self._closing:
            return
        try:
            self._h2.close_connection()
        except h2.exceptions.ProtocolError:
            pass
        self._closing = True
        self._kick()

    async def run(self) -> None:
        """Serve until the peer leaves or the connection is closed; never raises but Cancelled."""
        limits = self._limits
        self._h2.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: limits.max_concurrent_streams,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: limits.max_header_list_size,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: limits.initial_window_size,
            },
        )
        self._h2.decoder.max_header_list_size = limits.max_header_list_size
        self._h2.initiate_connection()
        # the connection's own window starts at 65535 whatever SETTINGS say: widen it
        extra = limits.initial_window_size - self._h2.inbound_flow_control_window
        if extra > 0:
            self._h2.increment_flow_control_window(extra)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._writer)
                nursery.start_soon(self._idle_watch)
                nursery.start_soon(self._handshake_watch)
                await self._read_loop()
                # flush what h2 still holds (a GOAWAY, the last trailers), briefly
                self._closing = True
                self._kick()
                with trio.move_on_after(1.0):
                    await self._writer_done.wait()
                nursery.cancel_scope.cancel()
        except Exception:
            log.exception("gRPC connection from %s failed", self.peer)
        finally:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(self._stream)

    # --- the writer ------------------------------------------------------------------------

    def _kick(self) -> None:
        self._wake_writer.set()

    def _notify_progress(self) -> None:
        self._progress.set()
        self._progress = trio.Event()

    async def _writer(self) -> None:
        try:
            while True:
                if self._sending:
                    # a call task is writing its own answer (_flush_now)
                    await self._progress.wait()
                    continue
                data = self._h2.data_to_send()
                if not data:
                    if self._closing:
                        return
                    await self._wake_writer.wait()
                    self._wake_writer = trio.Event()
                    continue
                if not await self._write(data):
                    return
        finally:
            self._writer_done.set()

    async def _write(self, data: bytes) -> bool:
        """Write bytes h2 gave us; False (and the connection ends) if the peer does not take
        them within send_timeout or is gone."""
        self._sending = True
        self._unsent, self._queued = len(data), 0
        try:
            with trio.move_on_after(self._limits.send_timeout) as timer:
                await self._stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._abort()
            return False
        finally:
            self._sending = False
            self._unsent = 0
            self._notify_progress()
        if timer.cancelled_caught:
            log.warning(
                "closing the gRPC connection from %s: it read nothing for %.0f s",
                self.peer,
                self._limits.send_timeout,
            )
            self._abort()
            return False
        return True

    async def _flush_now(self) -> None:
        """Write what h2 holds from this task when no write is under way: a call's answer
        leaves without waiting for the writer task's turn (one scheduling round less)."""
        if self._sending or self._closing:
            self._kick()
            return
        data = self._h2.data_to_send()
        if data:
            await self._write(data)

    def _abort(self) -> None:
        self._closing = True
        self._notify_progress()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    async def _idle_watch(self) -> None:
        idle = self._limits.idle_timeout
        while True:
            await trio.sleep(max(idle / 4, 0.01))
            if not self._calls and trio.current_time() - self.last_active > idle:
                log.info("closing the gRPC connection from %s: idle for %.0f s", self.peer, idle)
                self.close()
                self._abort_reader()
                return

    async def _handshake_watch(self) -> None:
        await trio.sleep(self._limits.handshake_timeout)
        if not self._greeted:
            log.info("closing the gRPC connection from %s: no HTTP/2 preface in time", self.peer)
            self.close()
            self._abort_reader()

    def _abort_reader(self) -> None:
        self._reader_scope.cancel()

    # --- the reader ------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        with self._reader_scope:
            while not self._closing:
                try:
                    data = await self._stream.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return
                if not data:
                    return
                self.last_active = trio.current_time()
                try:
                    events = self._h2.receive_data(data)
                except h2.exceptions.ProtocolError as exc:
                    # h2 queued a GOAWAY with the error's code; the writer flushes it
                    log.info("gRPC connection from %s: protocol error: %s", self.peer, exc)
                    self._closing = True
                    self._kick()
                    return
                for event in events:
                    self._on_event(event)
                if self._frame_too_large():
                    return
                if self._h2_has_output():
                    # (most reads make h2 answer nothing: a request's answer comes from its
                    # call; waking the writer for nothing would cost a scheduling round)
                    self._kick()

    def _h2_has_output(self) -> bool:
        """Whether h2 holds bytes to send (a peek into its buffer: `data_to_send` would take
        them); True when that buffer is not where this h2 version keeps it."""
        return bool(getattr(self._h2, "_data_to_send", True))

    def _frame_too_large(self) -> bool:
        """h2 checks a frame's length only once the whole frame is buffered: a header that
        announces more than our SETTINGS_MAX_FRAME_SIZE ends the connection at once instead
        (FRAME_SIZE_ERROR), so a peer cannot make us buffer 16 MB of a frame we will refuse."""
        # (h2's FrameBuffer keeps the unparsed bytes, after the client preface, in `_data`)
        frames = self._h2.incoming_buffer
        pending = frames._data
        if frames._preamble_len or len(pending) < 3:
            return False
        length = int.from_bytes(pending[:3], "big")
        if length <= self._h2.max_inbound_frame_size:
            return False
        log.info("gRPC connection from %s: a frame of %d bytes announced", self.peer, length)
        self._h2.close_connection(h2.errors.ErrorCodes.FRAME_SIZE_ERROR)
        self._closing = True
        self._kick()
        return True

    def _on_event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            self._start_call(event.stream_id, event.headers or [])
            if event.stream_ended is not None:
                self._on_remote_end(event.stream_id)
        elif isinstance(event, h2.events.DataReceived):
            self._on_data(event.stream_id, event.data or b"", event.flow_controlled_length or 0)
            if event.stream_ended is not None:
                self._on_remote_end(event.stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            self._on_remote_end(event.stream_id)
        elif isinstance(event, h2.events.StreamReset):
            call = self._calls.get(event.stream_id)
            if call is not None:
                call.reset = True
                call.scope.cancel()
        elif isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
            self._greeted = True
            self._notify_progress()
        elif isinstance(event, h2.events.ConnectionTerminated):
            self._closing = True
        elif isinstance(event, h2.events.TrailersReceived):
            # a client sends no trailers in gRPC; h2 reports the end separately
            pass

    def _start_call(self, stream_id: int, raw_headers: list[tuple[bytes, bytes]]) -> None:
        names = [bytes(name) for name, _ in raw_headers]
        values = [bytes(value) for _, value in raw_headers]
        joined_names = b"\n".join(names)
        if (
            _FIELD_NAMES.fullmatch(joined_names) is None
            or _BAD_VALUE.search(b"".join(values)) is not None
            or not _CONNECTION_SPECIFIC.isdisjoint(names)
        ):
            log.info("gRPC connection from %s: malformed header fields %r", self.peer, names)
            self._reset(stream_id, h2.errors.ErrorCodes.PROTOCOL_ERROR)
            return
        # (no value holds a LF now: decode all at once, then split)
        headers = dict(
            zip(
                joined_names.decode("latin-1").split("\n"),
                b"\n".join(values).decode("latin-1").split("\n"),
                strict=True,
            )
        )
        path = headers.get(":path", "")
        content_type = headers.get("content-type", "")
        if headers.get(":method") != "POST" or not content_type.startswith("application/grpc"):
            self._reject(stream_id, "415", "application/grpc POST expected")
            return
        method = self._services.get(path)
        if method is None:
            self._send_trailers_only(
                stream_id, StatusCode.UNIMPLEMENTED, f"Method not found: {path}"
            )
            return
        encoding = headers.get("grpc-encoding", IDENTITY)
        if encoding not in ENCODINGS:
            # gRPC's compression spec: UNIMPLEMENTED, naming what we accept
            self._send_trailers_only(
                stream_id,
                StatusCode.UNIMPLEMENTED,
                f"grpc-encoding {encoding} is not supported",
                [("grpc-accept-encoding", ACCEPT_ENCODING)],
            )
            return
        timeout = parse_grpc_timeout(headers["grpc-timeout"]) if "grpc-timeout" in headers else None
        metadata = {k: v for k, v in headers.items() if not k.startswith(":")}
        call = _Call(
            stream_id=stream_id,
            method=method,
            context=CallContext(
                path=path, metadata=metadata, peer=self.peer, connection_id=self.id, timeout=timeout
            ),
            decoder=MessageDecoder(self._limits.max_message_size, encoding),
        )
        if timeout is not None:
            call.scope.deadline = trio.current_time() + timeout
        self._calls[stream_id] = call
        assert self._nursery is not None
        self._nursery.start_soon(self._run_call, call)

    def _reset(self, stream_id: int, code: h2.errors.ErrorCodes) -> None:
        try:
            self._h2.reset_stream(stream_id, code)
        except h2.exceptions.ProtocolError:
            pass

    def _reject(self, stream_id: int, http_status: str, why: str) -> None:
        try:
            self._h2.send_headers(
                stream_id, [(":status", http_status), ("grpc-message", why)], end_stream=True
            )
        except h2.exceptions.ProtocolError:
            pass

    def _send_trailers_only(
        self,
        stream_id: int,
        code: StatusCode,
        message: str,
        extra: list[tuple[str, str]] | None = None,
    ) -> None:
        headers = [(":status", "200"), ("content-type", "application/grpc")]
        headers += extra or []
        headers += self._status_headers(code, message)
        try:
            self._h2.send_headers(stream_id, headers, end_stream=True)
        except h2.exceptions.ProtocolError:
            pass

    @staticmethod
    def _status_headers(code: StatusCode, message: str) -> list[tuple[str, str]]:
        headers = [("grpc-status", str(int(code)))]
        if message:
            headers.append(("grpc-message", encode_grpc_message(message)))
        return headers

    def _on_data(self, stream_id: int, data: bytes, flow_length: int) -> None:
        call = self._calls.get(stream_id)
        if call is None or call.finished:
            # a stream we answered already: its bytes only count against the windows
            self._acknowledge(stream_id, flow_length)
            return
        self._inbound += len(data)
        try:
            messages = call.decoder.feed(data)
        except GrpcError as exc:
            self._fail_call(call, exc)
            self._acknowledge(stream_id, flow_length)
            return
        if messages:
            call.inbox.extend(messages)
            self._wake(call)
        if self._inbound < self._limits.max_buffered_inbound:
            self._acknowledge(stream_id, flow_length)
        else:
            call.unacked += flow_length
            self._withheld += flow_length

    def _acknowledge(self, stream_id: int, flow_length: int) -> None:
        if flow_length <= 0:
            return
        try:
            self._h2.acknowledge_received_data(flow_length, stream_id)
        except (h2.exceptions.ProtocolError, KeyError):
            pass

    def _took(self, call: _Call, nbytes: int) -> None:
        """A handler took a message of ``nbytes``: acknowledge what waited for room."""
        self._inbound -= nbytes
        if not self._withheld or self._inbound >= self._limits.max_buffered_inbound:
            return
        for waiting in list(self._calls.values()):
            if waiting.unacked:
                self._acknowledge(waiting.stream_id, waiting.unacked)
                self._withheld -= waiting.unacked
                waiting.unacked = 0
        self._kick()

    def _on_remote_end(self, stream_id: int) -> None:
        call = self._calls.get(stream_id)
        if call is None:
            return
        call.remote_ended = True
        if not call.decoder.finished_cleanly():
            self._fail_call(call, GrpcError(StatusCode.INTERNAL, "stream ended inside a message"))
        self._wake(call)

    @staticmethod
    def _wake(call: _Call) -> None:
        if call.waiting is not None:
            call.waiting.set()
            call.waiting = None

    def _fail_call(self, call: _Call, error: GrpcError) -> None:
        """End a call from the reader (bad input): its handler is cancelled, the error sent."""
        if call.finished:
            return
        call.finished = True
        call.scope.cancel()
        self._end_stream(call, error.code, error.message)

    # --- calls -------------------------------------------------------------------------------

    async def _run_call(self, call: _Call) -> None:
        method = call.method
        code, message = StatusCode.OK, ""
        try:
            with call.scope:
                if method.kind is MethodKind.UNARY:
                    request = await self._single_request(call)
                    response = await method.handler(request, call.context)
                    await self._send_message(call, response)
                else:
                    send: Send[Message] = Send(lambda m: self._send_message(call, m))
                    if method.kind is MethodKind.BIDI_STREAMING:
                        await method.handler(self._requests(call), call.context, send)
                    else:
                        request = await self._single_request(call)
                        await method.handler(request, call.context, send)
        except GrpcError as exc:
            code, message = exc.code, exc.message
        except _StreamGone:
            call.finished = True
        except Exception as exc:
            log.exception("gRPC handler of %s failed", call.context.path)
            code, message = StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}"
        finally:
            self._forget(call)
        if call.scope.cancelled_caught and not call.finished and not call.reset:
            code, message = StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"
        if not call.finished and not call.reset:
            call.finished = True
            self._end_stream(call, code, message, kick=False)
        await self._flush_now()

    def _forget(self, call: _Call) -> None:
        self._calls.pop(call.stream_id, None)
        self._inflated -= call.inflated
        call.inflated = 0
        # (a message's prefix counted in _inbound as well: _next_message gives back the same)
        leftover = call.decoder.buffered + sum(len(m) + PREFIX.size for m in call.inbox)
        call.inbox.clear()
        if call.unacked:
            self._acknowledge(call.stream_id, call.unacked)
            self._withheld -= call.unacked
            call.unacked = 0
            self._kick()
        self._took(call, leftover)

    def _end_stream(
        self, call: _Call, code: StatusCode, message: str, *, kick: bool = True
    ) -> None:
        """Send the call's trailers; `kick=False` when the caller writes them itself at once
        (_run_call's _flush_now, which wakes the writer if it cannot)."""
        if call.reset:
            return
        try:
            if call.headers_sent:
                trailers = (
                    _OK_TRAILERS
                    if code is StatusCode.OK and not message
                    else self._status_headers(code, message)
                )
                self._h2.send_headers(call.stream_id, trailers, end_stream=True)
            else:
                self._send_trailers_only(call.stream_id, code, message)
                return
        except h2.exceptions.ProtocolError:
            return
        finally:
            if kick:
                self._kick()
        if not call.remote_ended:
            # the client is still sending (a bidi call we ended): tell it to stop
            try:
                self._h2.reset_stream(call.stream_id, h2.errors.ErrorCodes.NO_ERROR)
            except h2.exceptions.ProtocolError:
                pass

    async def _next_message(self, call: _Call) -> bytes | None:
        while not call.inbox:
            if call.remote_ended:
                return None
            if call.waiting is None:
                call.waiting = trio.Event()
            await call.waiting.wait()
        data = call.inbox.popleft()
        self._took(call, len(data) + PREFIX.size)
        return data

    def _parse(self, call: _Call, data: bytes) -> Message:
        request = call.method.request_type()
        if isinstance(data, CompressedMessage):
            data = call.decoder.inflate(data)  # GrpcError: bad or too large once inflated
            # a few compressed bytes make up to max_message_size: what the connection's calls
            # hold inflated is bounded like its buffered input (a flood of zip bombs on many
            # streams is refused, not held)
            self._inflated += len(data) - call.inflated
            call.inflated = len(data)
            if self._inflated > self._limits.max_buffered_inbound:
                raise GrpcError(
                    StatusCode.RESOURCE_EXHAUSTED,
                    "the connection holds too many decompressed bytes",
                )
        try:
            request.ParseFromString(data)
        except DecodeError as exc:
            raise GrpcError(StatusCode.INTERNAL, f"bad request message: {exc}") from None
        return request

    async def _single_request(self, call: _Call) -> Message:
        data = await self._next_message(call)
        if data is None:
            raise GrpcError(StatusCode.UNIMPLEMENTED, "no request message")
        # a unary request is complete when the client ends its side (grpc: exactly one message)
        extra = await self._next_message(call)
        if extra is not None:
            raise GrpcError(StatusCode.UNIMPLEMENTED, "more than one request message")
        return self._parse(call, data)

    async def _requests(self, call: _Call) -> AsyncIterator[Message]:
        while True:
            data = await self._next_message(call)
            if data is None:
                return
            yield self._parse(call, data)

    async def _send_message(self, call: _Call, message: Message) -> None:
        data = encode_message(message.SerializeToString())
        if (call.send_lock is None or not call.send_lock.locked()) and self._send_at_once(
            call, data
        ):
            # handed to h2 whole without waiting: the writer (or the call's _flush_now) writes
            # it; a streaming handler's next send, or its end, comes with it in one write
            return
        if call.send_lock is None:
            call.send_lock = trio.Lock()
        async with call.send_lock:
            if not call.headers_sent:
                self._send_response_headers(call)
            await self._send_data(call, memoryview(data))

    def _send_response_headers(self, call: _Call) -> None:
        self._ensure_open(call)
        self._h2.send_headers(call.stream_id, _RESPONSE_HEADERS)
        call.headers_sent = True

    def _send_at_once(self, call: _Call, data: bytes) -> bool:
        """Hand a message to h2 now if it fits the peer's window, one frame and the outbound
        budget (the common case): no lock, no timer, no wait. False: take the slow path."""
        self._ensure_open(call)
        if (
            len(data) > self._h2.max_outbound_frame_size
            or self._queued + self._unsent + len(data) >= self._limits.outbound_high_water
        ):
            return False
        try:
            window = self._h2.local_flow_control_window(call.stream_id)
        except h2.exceptions.ProtocolError:
            raise _StreamGone from None
        if window < len(data):
            return False
        if not call.headers_sent:
            self._send_response_headers(call)
        self._h2.send_data(call.stream_id, data)
        self._queued += len(data)
        if call.method.kind is not MethodKind.UNARY:
            # (a unary answer leaves with its trailers in _run_call's _flush_now)
            self._kick()
        return True

    def _ensure_open(self, call: _Call) -> None:
        if call.reset or call.finished or self._closing:
            raise _StreamGone

    async def _send_data(self, call: _Call, view: memoryview) -> None:
        limits = self._limits
        with trio.move_on_after(limits.send_timeout) as timer:
            while view:
                self._ensure_open(call)
                try:
                    window = self._h2.local_flow_control_window(call.stream_id)
                except h2.exceptions.ProtocolError:
                    raise _StreamGone from None
                if window <= 0 or self._queued + self._unsent >= limits.outbound_high_water:
                    await self._progress.wait()
                    continue
                n = min(window, len(view), self._h2.max_outbound_frame_size)
                self._h2.send_data(call.stream_id, bytes(view[:n]))
                self._queued += n
                view = view[n:]
                self._kick()
            return
        if timer.cancelled_caught:
            log.warning(
                "gRPC call %s from %s: the peer's window stayed shut for %.0f s; resetting it",
                call.context.path,
                self.peer,
                limits.send_timeout,
            )
            call.reset = True
            try:
                self._h2.reset_stream(call.stream_id, h2.errors.ErrorCodes.CANCEL)
            except h2.exceptions.ProtocolError:
                pass
            self._kick()
            raise _StreamGone
