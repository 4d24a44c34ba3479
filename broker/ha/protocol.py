"""The classic RocketMQ 4.x HA wire format, sans-I/O (``HAConnection`` / ``HAClient`` framing).

Theory of operation
-------------------
HA runs on its own plain TCP port (listenPort + 1), no remoting frames.  Two streams:

* **slave -> master**: a sequence of 8-byte big-endian signed longs, each the slave's CommitLog
  max physical offset ("report" / "ack").  Only the newest report matters, so the master reads
  whatever arrived and takes the *last complete 8-byte word* (Java:
  ``pos - pos % 8``); a trailing partial word waits for its remaining bytes.  Words are aligned
  to the start of the stream, never re-synchronised.
* **master -> slave**: frames of a 12-byte header ``long masterPhyOffset, int bodySize``
  followed by ``bodySize`` raw CommitLog bytes.  ``bodySize == 0`` is a heartbeat carrying the
  master's next transfer offset.  A body never crosses a CommitLog file and is at most
  ``haTransferBatchSize`` (32 KiB) from our master; we accept up to ``MAX_BODY_SIZE`` from any
  master (the Java slave's read buffer is 4 MiB, so a bigger body could never complete there).

Invariants of the decoders (checked by the hypothesis tests for every split of the stream):
feeding the same bytes in any split yields the same frames in the same order; no frame is
yielded before all of its bytes arrived; leftover bytes are kept, never dropped.  Malformed
input (negative size or offset, body too large) raises :class:`HAProtocolError`; the caller
closes the connection.
"""

from __future__ import annotations

import struct

import attrs

from common.errors import ProtocolError

REPORT_SIZE = 8
HEADER_SIZE = 12
MAX_BODY_SIZE = 4 * 1024 * 1024 - HEADER_SIZE

_REPORT = struct.Struct(">q")
_HEADER = struct.Struct(">qi")


class HAProtocolError(ProtocolError):
    """The HA peer sent bytes that are not a valid report or transfer frame."""


def encode_report(offset: int) -> bytes:
    """The slave's 8-byte max-offset report."""
    return _REPORT.pack(offset)


def encode_header(offset: int, size: int) -> bytes:
    """The master's 12-byte transfer header (size 0 = heartbeat)."""
    return _HEADER.pack(offset, size)


@attrs.frozen
class Transfer:
    """One master -> slave frame: ``body`` starts at physical ``offset`` (empty = heartbeat)."""

    offset: int
    # a memoryview of the read it came in, or bytes (see TransferDecoder.feed)
    body: bytes | memoryview

    @property
    def is_heartbeat(self) -> bool:
        return not self.body


@attrs.define(eq=False)
class ReportDecoder:
    """Master side: the newest complete 8-byte report in the slave's stream."""

    # bytes of an incomplete report word (0..7 bytes), aligned to the stream start
    _partial: bytes = b""
    # how many complete reports were decoded so far (the first one is slaveRequestOffset)
    count: int = 0

    def feed(self, data: bytes | bytearray) -> int | None:
        """Feed received bytes; the last complete report in them (None if none completed)."""
        buf = self._partial + bytes(data) if self._partial else bytes(data)
        whole = len(buf) - len(buf) % REPORT_SIZE
        self._partial = buf[whole:]
        if not whole:
            return None
        self.count += whole // REPORT_SIZE
        (offset,) = _REPORT.unpack_from(buf, whole - REPORT_SIZE)
        if offset < 0:
            raise HAProtocolError(f"slave reported a negative offset {offset}")
        return offset


@attrs.define(eq=False)
class TransferDecoder:
    """Slave side: incremental decoder of 12-byte header + body frames."""

    max_body_size: int = MAX_BODY_SIZE
    # undecoded bytes; always starts at a frame boundary
    _buf: bytearray = attrs.field(factory=bytearray)

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def reset(self) -> None:
        self._buf.clear()

    def feed(self, data: bytes | bytearray) -> list[Transfer]:
        """Complete frames of what was buffered plus ``data``.

        Bodies found whole inside an immutable ``data`` are memoryview slices of it (no copy:
        a slave's reads are megabytes, and copying every body again cost a fifth of its loop
        while it caught up); other bodies are copies."""
        zero_copy = not self._buf and type(data) is bytes
        if self._buf:
            self._buf += data
            view = memoryview(self._buf)
        else:
            # fast path (the common case with large reads): parse straight from `data`, keep
            # only an incomplete tail
            view = memoryview(data)
        out: list[Transfer] = []
        pos = 0
        end = len(view)
        try:
            while end - pos >= HEADER_SIZE:
                offset, size = _HEADER.unpack_from(view, pos)
                if size < 0 or size > self.max_body_size:
                    raise HAProtocolError(
                        f"transfer body size {size} at offset {offset} is invalid"
                    )
                if offset < 0:
                    raise HAProtocolError(f"transfer offset {offset} is negative")
                if end - pos - HEADER_SIZE < size:
                    break
                start = pos + HEADER_SIZE
                body = view[start : start + size]
                out.append(Transfer(offset, body if zero_copy else bytes(body)))
                pos = start + size
            rest = bytes(view[pos:]) if pos < end else b""
        finally:
            if not zero_copy:
                view.release()
        self._buf = bytearray(rest)
        return out


__all__ = [
    "HEADER_SIZE",
    "MAX_BODY_SIZE",
    "REPORT_SIZE",
    "HAProtocolError",
    "ReportDecoder",
    "Transfer",
    "TransferDecoder",
    "encode_header",
    "encode_report",
]
