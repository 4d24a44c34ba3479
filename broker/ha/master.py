"""The master side of classic HA (RocketMQ ``HAService.AcceptSocketService`` + ``HAConnection``).

Theory of operation
-------------------
Every accepted slave connection is served by :meth:`HAMaster.serve_slave`: one nursery holding
a *read task* (``ReadSocketService``) and a *write task* (``WriteSocketService``); when either
ends, the connection closes and the other is cancelled.  Nothing outlives the connection.

Read task: receives 8-byte reports (``protocol.ReportDecoder`` keeps only the newest complete
word).  The first report is the slave's ``slaveRequestOffset``; every report is its ack offset
and raises the shared :class:`~broker.ha.watermark.ReplicaWatermark` (push2SlaveMaxOffset),
releasing SYNC_MASTER sends.  The connection closes when nothing at all was read for
``haHousekeepingInterval`` (20 s), on EOF, on garbage, and when a report is beyond the master's
own max offset (a slave ahead of its master is not ours to feed; Java checks this only from the
second report on, we also refuse it on the first, so such an offset never reaches the
watermark).

Write task: writes nothing until the first report.  Then it starts at the reported offset, or,
when the slave reported 0 (an empty slave), at the start of the master's *last* CommitLog file
(``maxOffset - maxOffset % mappedFileSizeCommitLog``).  Loop: ``store.get_commit_log_data(next)``
gives the written bytes of one file from ``next``; send a 12-byte header + at most
``haTransferBatchSize`` (32 KiB) of them, so a chunk never crosses a file (BLANK fillers
included).  With nothing to send for ``haSendHeartbeatInterval`` (5 s) since the last write it
sends a size-0 header carrying ``next`` (the heartbeat).  Idle writers park on a parking lot
woken by :meth:`HAMaster.notify_data` (the store's arrival listener and every SYNC_MASTER
wait call it), with a 100 ms poll as a safety net like Java's ``waitForRunning(100)``.

Inline transfer: a parked writer costs the loop a wake-up per send (unpark, reschedule, a new
timeout scope, park again), a third of a one-at-a-time SYNC_MASTER send's overhead.  So while a
connection's writer is parked and has nothing unsent, :meth:`HAMaster.notify_data` (called by
the put path; once per received chunk of requests, at its end, through the channel's flush
batch, so 32 pipelined sends still leave as one transfer) writes the new bytes itself, up to
``INLINE_MAX`` and across a file boundary, straight to the socket without blocking; what the
kernel does not take becomes the connection's ``unsent`` tail and the writer is woken to send
it before anything else.  Streams without a socket (tests' in-memory ones) always go through
the writer.

Send before dispatch: the store calls :meth:`HAMaster.notify_written` (its write listener) as
soon as a put's bytes are in the CommitLog, before it writes their ConsumeQueue and index
units.  That transfers them inline at once, so the slave receives, appends and acknowledges
while the master dispatches, and the dispatch leaves a one-at-a-time SYNC_MASTER send's
critical path (issue 28).  A chunk of pipelined sends is one grouped put (``send_run``), so it
still leaves as one transfer; the arrival listener's batched call then finds nothing new.

Invariants: ``next_transfer`` only grows and every byte below it was handed to the stream in
order (by the writer's ``send_all`` or by an inline write, never both at once: inline writes
happen only while the writer is parked with ``unsent`` empty); a connection counts in
``watermark.connections`` exactly while it is registered in ``HAMaster.connections``.
"""

from __future__ import annotations

import logging
import os

import attrs
import trio

from broker.ha.protocol import HAProtocolError, ReportDecoder, encode_header
from broker.ha.receive import Receiver
from broker.ha.watermark import ReplicaWatermark
from broker.store import MessageStoreConfig
from broker.store.api import MessageStore
from common.remoting.deferred_answer import flush_in_batch

log = logging.getLogger(__name__)

READ_SIZE = 64 * 1024
# bytes of CommitLog handed to one send_all at most (a multiple of haTransferBatchSize)
SEND_SIZE = 1024 * 1024
# Java's WriteSocketService waits at most 100 ms for new data before looking again
POLL_INTERVAL = 0.1
# more new bytes than this (a catch-up) are left to the writer task (see "Inline transfer")
INLINE_MAX = 256 * 1024

_CLOSED = (trio.BrokenResourceError, trio.ClosedResourceError, HAProtocolError)


def transfer_frames(offset: int, data: bytes | memoryview, total: int, batch: int) -> bytes:
    """The first ``total`` bytes of ``data`` (CommitLog bytes from ``offset``, within one file)
    as transfers of at most ``batch`` bytes each, in one buffer (a copy out of the map)."""
    parts: list[bytes | memoryview] = []
    for pos in range(0, total, batch):
        size = min(batch, total - pos)
        parts.append(encode_header(offset + pos, size))
        parts.append(data[pos : pos + size])
    return b"".join(parts)


@attrs.define(eq=False)
class SlaveConnection:
    """What the master knows about one connected slave (``HAConnection``)."""

    addr: str
    connected_at: float
    # slaveRequestOffset: the first report; -1 until it arrived
    request_offset: int = -1
    # slaveAckOffset: the newest report; -1 until the first one
    ack_offset: int = -1
    # nextTransferFromWhere: the next byte to send; -1 until the first report
    next_transfer: int = -1
    # Trio time of the last byte read from this slave
    last_read: float = 0.0
    # Trio time the slave was last known to hold everything the master had
    caught_up_at: float = 0.0
    bytes_sent: int = 0
    first_report: trio.Event = attrs.field(factory=trio.Event)
    # the socket, for inline transfers; -1: none (not a socket stream)
    fd: int = -1
    # True while the writer task is parked (then notify_data may write inline)
    parked: bool = False
    # bytes handed to no one yet: an inline write's tail the kernel did not take
    unsent: bytes = b""
    # Trio time of the last transfer or heartbeat written
    last_write: float = 0.0


@attrs.define(eq=False)
class HAMaster:
    store: MessageStore
    config: MessageStoreConfig
    watermark: ReplicaWatermark
    # every connection being served, in connect order
    connections: list[SlaveConnection] = attrs.field(factory=list)
    # idle write tasks park here; notify_data wakes them all
    _lot: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)
    # _send_new_data is queued at the end of the open flush batch
    _send_due: bool = False

    def notify_data(self, *_args: object) -> None:
        """New CommitLog bytes may exist: send them inline where a parked writer allows, else
        wake idle write tasks (cheap when none is idle).  Inside a flush batch (a channel's
        chunk of requests) this happens once, at its end: one transfer for the chunk's puts."""
        if not len(self._lot) or self._send_due:
            return
        if flush_in_batch(self._send_new_data):
            self._send_due = True
        else:
            self._send_new_data()

    def notify_written(self) -> None:
        """A put's bytes are in the CommitLog: send them inline now, not at the end of the
        flush batch (see "Send before dispatch")."""
        if len(self._lot):
            self._transfer_now()

    def _send_new_data(self) -> None:
        self._send_due = False
        if len(self._lot):
            self._transfer_now()

    def _transfer_now(self) -> None:
        try:
            self._send_or_wake()
        except Exception:  # a flush-batch callback must not raise; the writers still poll
            log.exception("HA inline transfer failed")
            self._lot.unpark_all()

    def _send_or_wake(self) -> None:
        wake = False
        end = -1
        for conn in self.connections:
            if not conn.parked:
                continue
            if conn.fd < 0 or conn.unsent:
                wake = True
                continue
            if end < 0:
                end = self.store.get_max_phy_offset()
            if conn.next_transfer < end and not self._write_inline(conn, end):
                wake = True
        if wake:
            self._lot.unpark_all()

    def _write_inline(self, conn: SlaveConnection, end: int) -> bool:
        """Send the bytes from ``next_transfer`` to ``end`` on the writer's behalf (one write
        per CommitLog file they lie in); False if the writer has to be woken (too much, bytes
        not readable, or a tail the kernel did not take)."""
        if end - conn.next_transfer > INLINE_MAX:
            return False
        batch = self.config.ha_transfer_batch_size
        while conn.next_transfer < end:
            nxt = conn.next_transfer
            data = self.store.get_commit_log_data(nxt)
            if data is None or not len(data):
                return False
            total = len(data)
            frame = transfer_frames(nxt, data, total, batch)
            del data
            try:
                n = os.write(conn.fd, frame)
            except BlockingIOError:
                n = 0
            except OSError:
                n = 0  # the writer's send_all meets the same error and closes the connection
            conn.next_transfer = nxt + total
            conn.bytes_sent += total
            conn.last_write = trio.current_time()
            if n < len(frame):
                conn.unsent = frame[n:]
                return False
        return True

    async def serve_slave(self, stream: trio.abc.Stream, addr: str) -> None:
        """Serve one slave until the connection ends; always closes ``stream``."""
        now = trio.current_time()
        conn = SlaveConnection(addr=addr, connected_at=now, last_read=now)
        if isinstance(stream, trio.SocketStream):
            try:
                conn.fd = stream.socket.fileno()
            except OSError:
                conn.fd = -1
        self.connections.append(conn)
        self.watermark.connections += 1
        log.info("HA slave %s connected", addr)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read_loop, stream, conn, nursery.cancel_scope)
                nursery.start_soon(self._write_loop, stream, conn, nursery.cancel_scope)
        finally:
            self.connections.remove(conn)
            self.watermark.connections -= 1
            await trio.aclose_forcefully(stream)
            log.info("HA slave %s disconnected (acked %d)", addr, conn.ack_offset)

    async def _read_loop(
        self, stream: trio.abc.Stream, conn: SlaveConnection, scope: trio.CancelScope
    ) -> None:
        decoder = ReportDecoder()
        housekeeping = self.config.ha_housekeeping_interval
        receiver = Receiver(stream, READ_SIZE)
        try:
            # one deadline, moved on by every read (not a scope per read: see receive.py)
            with trio.CancelScope(deadline=trio.current_time() + housekeeping) as timer:
                while True:
                    data = await receiver.receive()
                    if not data:
                        return
                    conn.last_read = now = trio.current_time()
                    timer.deadline = now + housekeeping
                    offset = decoder.feed(data)
                    if offset is not None and not self._on_report(conn, offset):
                        return
            log.warning("HA slave %s silent for %.0f s; closing", conn.addr, housekeeping)
        except _CLOSED as exc:
            log.info("HA slave %s read failed: %s", conn.addr, exc)
        finally:
            scope.cancel()

    def _on_report(self, conn: SlaveConnection, offset: int) -> bool:
        master_max = self.store.get_max_phy_offset()
        if offset > master_max:
            log.warning(
                "HA slave %s reported offset %d beyond the master's max %d; closing",
                conn.addr,
                offset,
                master_max,
            )
            return False
        conn.ack_offset = offset
        if conn.request_offset < 0:
            conn.request_offset = offset
            conn.first_report.set()
        if offset >= master_max:
            conn.caught_up_at = trio.current_time()
        self.watermark.advance(offset)
        return True

    def start_offset(self, request_offset: int) -> int:
        """Where the transfer starts for a slave whose first report was ``request_offset``."""
        if request_offset != 0:
            return request_offset
        max_offset = self.store.get_max_phy_offset()
        return max_offset - max_offset % self.config.mapped_file_size_commit_log

    async def _write_loop(
        self, stream: trio.abc.Stream, conn: SlaveConnection, scope: trio.CancelScope
    ) -> None:
        try:
            await conn.first_report.wait()
            nxt = conn.next_transfer = self.start_offset(conn.request_offset)
            batch = self.config.ha_transfer_batch_size
            heartbeat = self.config.ha_send_heartbeat_interval
            conn.last_write = trio.current_time()
            while True:
                if conn.unsent:
                    tail, conn.unsent = conn.unsent, b""
                    await stream.send_all(tail)
                nxt = conn.next_transfer  # inline writes may have moved it
                data = self.store.get_commit_log_data(nxt)
                if data is not None and len(data):
                    # Several frames per write when there is a backlog (catch-up): each frame
                    # still holds at most `batch` bytes of one file, as the protocol demands;
                    # one send of up to SEND_SIZE saves a loop turn and a syscall per frame.
                    # One copy out of the map before any await: the file may be unmapped later.
                    total = min(len(data), max(batch, SEND_SIZE // batch * batch))
                    frame = transfer_frames(nxt, data, total, batch)
                    del data
                    await stream.send_all(frame)
                    conn.next_transfer = nxt + total
                    conn.bytes_sent += total
                    conn.last_write = trio.current_time()
                    continue
                del data
                idle = trio.current_time() - conn.last_write
                if idle >= heartbeat:
                    await stream.send_all(encode_header(nxt, 0))
                    conn.last_write = trio.current_time()
                    continue
                conn.parked = True
                try:
                    with trio.move_on_after(min(heartbeat - idle, POLL_INTERVAL)):
                        await self._lot.park()
                finally:
                    conn.parked = False
        except _CLOSED as exc:
            log.info("HA slave %s write failed: %s", conn.addr, exc)
        finally:
            scope.cancel()


__all__ = ["HAMaster", "SlaveConnection"]
