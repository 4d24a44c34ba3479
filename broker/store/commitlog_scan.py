"""Pure scan of one CommitLog segment: where its records start and why the valid part ends.

Theory of operation
-------------------
A CommitLog segment (``store/CommitLog.java``; the record layout is ``common.message``'s) is a run
of length-prefixed records; the first 8 bytes of each are TOTALSIZE and MAGIC.  The writer never
lets a record cross a segment end: when the next put does not fit (``length + 8 > remaining``) it
writes an 8-byte BLANK filler (TOTALSIZE = remaining, MAGIC = BLANK_MAGIC_CODE) and moves on to the
next file, so a segment ends in one of four ways, reported as :class:`ScanEnd`:

* ``BLANK``: the filler; the rest of the file is not data (a full segment that rolled over).
* ``END_OF_FILE``: the last record ends exactly at the end of the buffer.
* ``ZEROS``: eight zero bytes where a record would start: the unwritten part of the segment
  that is still being appended to (files are preallocated and sparse).
* ``TORN``: anything else: a bad magic, an impossible size, a record that would run past the
  end of the buffer, or a record whose PHYSICALOFFSET is not its own position.  A crash mid-write
  (or a truncated copy) leaves this; RocketMQ's recovery stops at the same place.

Only TOTALSIZE, MAGIC and PHYSICALOFFSET are looked at: this is the cheap walk over the 4-byte
sizes that finds record starts for the vectorized decoder (``pipeline.record_batch``) and that
``rmq store verify`` uses to compare two logs record by record.  The walk is a tight Python
loop (one ``unpack_from`` per record) only where it must be: ``chain_starts`` finds the records
of a window of bytes with numpy (MESSAGE magics, each record's size pointing at the next one's
start), or with a compiled walk the pipeline plugs in (``use_compiled_chain``), and
the loop takes over where that chain breaks, at BLANK filler, zeros or a torn record.

``resync`` finds the first record start at or after an arbitrary position without walking from
the beginning of the file: a position ``p`` is a record start when the MAGIC is at ``p + 4`` and
the PHYSICALOFFSET at ``p + 28`` equals ``file_from_offset + p``.  This lets a large segment be
split into byte ranges that executors decode independently (a body would have to contain that
self-referencing 12-byte pattern at exactly its own offset to fool it).

``first_damaged`` checks records found that way the way RocketMQ's abnormal recovery does
(``checkMessageAndReturnSize`` with ``checkCRCOnRecover``, ``store/CommitLog.java``): field
lengths against TOTALSIZE and the body against BODYCRC, plus a zero byte ending TOPIC or
PROPERTIES (those fields have no CRC; a lost write leaves zeros).  The fields are gathered for
all records at once with numpy, and ``zlib.crc32`` runs over each body from a ``map`` chain, so
no Python bytecode runs per record.  With the walk that finds the records, 1 KiB messages still
cost ~1 s per GiB on a 2-core machine: zlib itself does ~4 GB/s, the Python call per body is
the rest.

``check_records`` is what recovery runs over the CommitLog below the checkpoint after a crash
(recovery.py: at least the whole last segment): the walk and the checks together, in C
(``_record_check.c``, built by setup.py, the GIL released, the CRC folded with PCLMULQDQ where
the CPU has it) when it was built, ~0.1 s per GiB of 1 KiB messages on one thread; else
``scan_segment`` + ``first_damaged``.  Both give the same answer, word for word
(tests/broker/store/test_record_check.py).

Nothing here does I/O; ``buf`` is anything with the buffer protocol (bytes, memoryview, mmap).
The broker's recovery of the records after the checkpoint keeps its own, stricter loop (it also
checks field lengths and decodes what dispatch needs).
"""

from __future__ import annotations

import enum
import struct
import zlib
from collections.abc import Callable

import attrs
import numpy as np
from numpy.typing import NDArray

from broker.store.results import Buffer
from common.message import (
    BLANK_MAGIC_CODE,
    BODY_CRC_POSITION,
    MESSAGE_MAGIC_CODE,
    SYSFLAG_POSITION,
    MessageSysFlag,
    record_size,
)

try:  # built by setup.py where a compiler is at hand; the numpy path is the fallback
    from broker.store import _record_check
except ImportError:  # an install without a compiler
    _record_check = None  # type: ignore[assignment]

# A compiled chain walk (numba, `pipeline._kernels.chain`) is plugged in by the pipeline when it
# is imported (`use_compiled_chain`): the broker never imports the pipeline (layering), and
# without it the numpy chain below finds the same starts.
# (bytes, pos, limit, file_from_offset or -1, check_offset) -> (starts, after)
ChainWalk = Callable[[NDArray[np.uint8], int, int, int, bool], tuple[NDArray[np.int64], int]]
_compiled_chain: ChainWalk | None = None


def use_compiled_chain(fn: ChainWalk | None) -> None:
    """Install ``fn(arr, pos, limit, file_from_offset_or_-1, check_offset) -> (starts, after)``
    as the chain walk (None: back to numpy)."""
    global _compiled_chain
    _compiled_chain = fn


# TOTALSIZE MAGIC, and PHYSICALOFFSET at +28
_HEAD = struct.Struct(">ii")
_PHYS = struct.Struct(">q")
_PHYS_POSITION = 28
# the smallest record there is (IPv4 hosts, empty body/topic/properties)
MIN_RECORD_SIZE = record_size(0, 0, 0, 0)
_BLANK_MIN = 8
_MAGIC_BYTES = struct.pack(">i", MESSAGE_MAGIC_CODE)


# the vectorized chain looks at this many bytes at a time (bounded temporary arrays)
_WINDOW = 8 << 20


def chain_starts(
    buf: Buffer, pos: int, limit: int, file_from_offset: int | None = None
) -> tuple[NDArray[np.int64], int]:
    """Records from ``pos`` found without a Python loop: ``(starts, next position)``.

    Candidates are MESSAGE magics (numpy over the raw bytes) whose size is possible and fits in
    the buffer (and, with ``file_from_offset``, whose PHYSICALOFFSET is their own position).
    The walk from ``pos`` is then followed through them: a candidate is kept only when the one
    before it in the walk ends exactly where it starts, so a magic inside a body is never taken
    for a record.  The chain stops where the walk meets something that is not a candidate
    (BLANK filler, zeros, a torn record, ``limit``): the caller's one-record-at-a-time loop takes
    over there, so the result is exactly what that loop would have found.
    """
    if _compiled_chain is not None:
        # compiled: one hop per record, the walk itself (the numpy chain may stop earlier)
        starts, after = _compiled_chain(
            np.frombuffer(buf, dtype=np.uint8),
            pos,
            limit,
            -1 if file_from_offset is None else file_from_offset,
            file_from_offset is not None,
        )
        return starts, int(after)
    return _chain_numpy(buf, pos, limit, file_from_offset)


def _chain_numpy(
    buf: Buffer, pos: int, limit: int, file_from_offset: int | None = None
) -> tuple[NDArray[np.int64], int]:
    """:func:`chain_starts` without numba."""
    arr = np.frombuffer(buf, dtype=np.uint8)
    n = len(arr)
    last = min(limit, n - MIN_RECORD_SIZE + 1)  # candidates start in [pos, last)
    empty = np.empty(0, dtype=np.int64)
    if last <= pos:
        return empty, pos
    window = arr[pos + 4 : last + 7]
    c = np.flatnonzero(window[: last - pos] == _MAGIC_BYTES[0])
    c = c[
        (window[c + 1] == _MAGIC_BYTES[1])
        & (window[c + 2] == _MAGIC_BYTES[2])
        & (window[c + 3] == _MAGIC_BYTES[3])
    ]
    c += pos
    if not len(c) or c[0] != pos:
        return empty, pos
    size = np.ndarray((n - 3,), dtype=">i4", buffer=arr, strides=(1,))[c].astype(np.int64)
    nxt = c + size
    ok = (size >= MIN_RECORD_SIZE) & (nxt <= n)
    if file_from_offset is not None:
        phys = np.ndarray((n - 7,), dtype=">i8", buffer=arr, strides=(1,))[c + _PHYS_POSITION]
        ok &= phys == file_from_offset + c
    if not ok.all():
        c, nxt = c[ok], nxt[ok]
        if not len(c) or c[0] != pos:
            return empty, pos
    if bool((nxt[:-1] == c[1:]).all()):
        return c, int(nxt[-1])
    # follow the walk: the successor of each candidate is the candidate at its end, if any
    succ = np.searchsorted(c, nxt)
    linked = succ < len(c)
    linked[linked] = c[succ[linked]] == nxt[linked]
    pointed = np.zeros(len(c), dtype=bool)
    pointed[succ[linked]] = True
    pointed[0] = True
    kept = np.flatnonzero(pointed)
    good = linked[kept[:-1]] & (succ[kept[:-1]] == kept[1:])
    broken = np.flatnonzero(~good)
    cut = int(broken[0]) + 1 if len(broken) else len(kept)
    kept = kept[:cut]
    return c[kept], int(nxt[kept[-1]])


class ScanEnd(enum.Enum):
    BLANK = "blank"
    END_OF_FILE = "end_of_file"
    ZEROS = "zeros"
    TORN = "torn"
    RANGE_END = "range_end"  # stopped at the caller's ``stop`` (a byte-range scan)


@attrs.frozen
class SegmentScan:
    """Result of :func:`scan_segment`.

    ``starts`` are positions of complete records inside the scanned buffer (not absolute
    offsets); ``end`` is the position just after the last of them (or of the BLANK filler), so
    ``file_from_offset + end`` is the absolute valid end.  ``detail`` says why a TORN scan
    stopped.
    """

    file_from_offset: int
    starts: NDArray[np.int64]  # positions in the buffer, increasing
    end: int
    reason: ScanEnd
    blank_at: int | None = None  # position of the BLANK filler when reason is BLANK
    detail: str = ""

    @property
    def end_offset(self) -> int:
        return self.file_from_offset + self.end

    @property
    def count(self) -> int:
        return len(self.starts)


def scan_segment(
    buf: Buffer, file_from_offset: int, *, start: int = 0, stop: int | None = None
) -> SegmentScan:
    """Walk the records of one segment from ``start`` (a record start) to the first end.

    With ``stop``, records starting at or after ``stop`` are not included and the reason is
    RANGE_END (the byte-range split of a large segment); a record that starts before ``stop``
    is included whole even when it ends after it.
    """
    n = len(buf)
    limit = n if stop is None else min(stop, n)
    unpack = _HEAD.unpack_from
    phys = _PHYS.unpack_from
    chunks: list[NDArray[np.int64]] = []
    starts: list[int] = []
    add = starts.append
    pos = start
    reason = ScanEnd.END_OF_FILE
    detail = ""
    blank_at = None
    # below ``vector_from`` the loop goes one record at a time (after a chain broke in a window)
    vector_from = pos
    while True:
        if pos >= limit:
            reason = ScanEnd.RANGE_END if pos < n else ScanEnd.END_OF_FILE
            break
        if pos >= vector_from:
            window_end = min(limit, pos + _WINDOW)
            chain, after = chain_starts(buf, pos, window_end, file_from_offset)
            if len(chain):
                if starts:
                    chunks.append(np.array(starts, dtype=np.int64))
                    starts.clear()
                chunks.append(chain)
                pos = after
            vector_from = window_end
            continue
        if pos + 8 > n:
            reason, detail = ScanEnd.TORN, f"{n - pos} bytes left, less than a record header"
            if not any(bytes(buf[pos:n])):
                reason, detail = ScanEnd.ZEROS, ""
            break
        size, magic = unpack(buf, pos)
        if magic == MESSAGE_MAGIC_CODE:
            if size < MIN_RECORD_SIZE:
                reason, detail = ScanEnd.TORN, f"record size {size} is impossible"
                break
            if pos + size > n:
                reason = ScanEnd.TORN
                detail = f"record of {size} bytes crosses the end ({n - pos} bytes left)"
                break
            (poff,) = phys(buf, pos + _PHYS_POSITION)
            if poff != file_from_offset + pos:
                reason = ScanEnd.TORN
                detail = f"record claims physical offset {poff}"
                break
            add(pos)
            pos += size
        elif magic == BLANK_MAGIC_CODE:
            if size < _BLANK_MIN or pos + size != n:
                reason = ScanEnd.TORN
                detail = f"BLANK filler of {size} bytes does not reach the end of the file"
                break
            reason, blank_at = ScanEnd.BLANK, pos
            pos = n
            break
        elif size == 0 and magic == 0:
            reason = ScanEnd.ZEROS
            break
        else:
            reason, detail = ScanEnd.TORN, f"bad magic {magic & 0xFFFFFFFF:#010x}"
            break
    chunks.append(np.fromiter(starts, dtype=np.int64, count=len(starts)))
    return SegmentScan(
        file_from_offset=file_from_offset,
        starts=np.concatenate(chunks) if len(chunks) > 1 else chunks[0],
        end=pos,
        reason=reason,
        blank_at=blank_at,
        detail=detail,
    )


def resync(buf: Buffer, file_from_offset: int, pos: int, *, stop: int | None = None) -> int | None:
    """First record start at or after ``pos`` (and before ``stop``), or None.

    A candidate is a MESSAGE magic at ``p + 4`` whose PHYSICALOFFSET equals its own absolute
    offset; searched with numpy over the raw bytes, so no walk from the start of the file.
    """
    n = len(buf)
    limit = n if stop is None else min(stop, n)
    if pos >= limit:
        return None
    arr = np.frombuffer(buf, dtype=np.uint8)
    # search magic positions in [pos + 4, limit + 4) in windows: bounded memory on huge files
    window = 1 << 24
    lo = pos
    while lo < limit:
        hi = min(limit, lo + window)
        seg = arr[lo + 4 : min(n, hi + 4 + 3)]
        if len(seg) < 4:
            return None
        cand = np.flatnonzero(
            (seg[:-3] == _MAGIC_BYTES[0])
            & (seg[1:-2] == _MAGIC_BYTES[1])
            & (seg[2:-1] == _MAGIC_BYTES[2])
            & (seg[3:] == _MAGIC_BYTES[3])
        )
        for c in cand:
            p = lo + int(c)
            if p >= hi:
                break
            if p + _PHYS_POSITION + 8 <= n:
                (poff,) = _PHYS.unpack_from(buf, p + _PHYS_POSITION)
                if poff == file_from_offset + p:
                    return p
        lo = hi
    return None


# from a record's start to BODYLENGTH with IPv4 hosts (BORNHOST at 48, 8 bytes, STORETIMESTAMP 8,
# STOREHOST 8, RECONSUMETIMES 4, PREPAREDTRANSACTIONOFFSET 8); an IPv6 host is 12 bytes longer
_BODY_LENGTH_V4 = 84
_V6_EXTRA = 12


def first_damaged(buf: Buffer, starts: NDArray[np.int64]) -> tuple[int, str] | None:
    """(index into ``starts``, why) of the first record that is not intact, or None.

    ``starts`` are complete records of ``buf`` as :func:`scan_segment` finds them (magic, size
    and PHYSICALOFFSET already hold).  A record is intact when its field lengths add up to
    TOTALSIZE (RocketMQ's ``checkMessageAndReturnSize``), its body matches BODYCRC, and neither
    its TOPIC nor its PROPERTIES (when not empty) ends in a zero byte: a topic name or property
    never holds NUL, and the fields after the body have no CRC, so a tail a lost write left
    zeroed shows there.
    """
    if not len(starts):
        return None
    arr = np.frombuffer(buf, dtype=np.uint8)
    n = len(arr)
    i4 = np.ndarray((n - 3,), dtype=">i4", buffer=arr, strides=(1,))
    i2 = np.ndarray((n - 1,), dtype=">i2", buffer=arr, strides=(1,))
    ends = starts + i4[starts].astype(np.int64)
    flag = i4[starts + SYSFLAG_POSITION]
    at = (
        starts
        + _BODY_LENGTH_V4
        + _V6_EXTRA * ((flag & MessageSysFlag.BORNHOST_V6) != 0)
        + _V6_EXTRA * ((flag & MessageSysFlag.STOREHOSTADDRESS_V6) != 0)
    )
    # every gather index is clipped into the buffer; the masks below reject what was clipped
    length = i4[np.minimum(at, n - 4)].astype(np.int64)
    body = at + 4
    body_end = body + length
    topic_len = arr[np.clip(body_end, 0, n - 1)].astype(np.int64)
    props_at = body_end + 1 + topic_len
    props_len = i2[np.clip(props_at, 0, n - 2)].astype(np.int64)
    fields = (length >= 0) & (body_end + 3 <= ends) & (props_at + 2 + props_len == ends)
    last_topic = arr[np.clip(props_at - 1, 0, n - 1)]
    last_prop = arr[np.clip(ends - 1, 0, n - 1)]
    zeroed = ((topic_len > 0) & (last_topic == 0)) | ((props_len > 0) & (last_prop == 0))
    broken = np.flatnonzero(~fields | zeroed)
    count = int(broken[0]) if len(broken) else len(starts)
    if count:
        want = i4[starts[:count] + BODY_CRC_POSITION].astype(np.uint32)
        with memoryview(buf) as view:
            bodies = map(
                view.__getitem__, map(slice, body[:count].tolist(), body_end[:count].tolist())
            )
            got = np.fromiter(map(zlib.crc32, bodies), dtype=np.uint32, count=count)
        bad = np.flatnonzero((got & 0x7FFFFFFF) != want)
        if len(bad):
            return int(bad[0]), "body CRC mismatch"
    if not len(broken):
        return None
    why = "field lengths disagree with TOTALSIZE" if not fields[count] else "a zeroed tail"
    return count, why


def check_implementation() -> str:
    """Which record check :func:`check_records` runs by default: "compiled" or "numpy"."""
    return "numpy" if _record_check is None else "compiled"


def check_records(
    buf: Buffer, file_from_offset: int, start: int, stop: int, *, compiled: bool | None = None
) -> tuple[int, str | None]:
    """Check the records of ``buf`` from ``start`` (a record start) up to ``stop``: ``(position,
    why)`` of the first record that is not intact (:func:`first_damaged`) or of where the
    records end before ``stop`` (:func:`scan_segment`: a torn record, zeros; BLANK filler is a
    proper end), or ``(where the walk ended, None)`` when every record is intact up to ``stop``.

    The compiled check (broker/store/_record_check.c) gives the same answer as the numpy path
    without a Python call per record, the GIL released; ``compiled`` forces one or the other
    (default: the compiled one when it was built).
    """
    if compiled is None:
        compiled = _record_check is not None
    if not compiled:
        return _check_numpy(buf, file_from_offset, start, stop)
    if _record_check is None:
        raise RuntimeError("broker.store._record_check was not built")
    return _check_compiled(buf, file_from_offset, start, stop)


def _check_numpy(
    buf: Buffer, file_from_offset: int, start: int, stop: int
) -> tuple[int, str | None]:
    scan = scan_segment(buf, file_from_offset, start=start, stop=stop)
    bad = first_damaged(buf, scan.starts)
    if bad is not None:
        return int(scan.starts[bad[0]]), bad[1]
    if scan.end < stop and scan.reason is not ScanEnd.BLANK:
        return scan.end, scan.detail or f"the records end ({scan.reason.value})"
    return scan.end, None


def _check_compiled(
    buf: Buffer, file_from_offset: int, start: int, stop: int
) -> tuple[int, str | None]:
    rc = _record_check
    assert rc is not None
    pos, code, value = rc.walk(buf, file_from_offset, start, stop)
    if code == rc.WALK_BLANK or pos >= stop:
        return pos, None
    # the words scan_segment and first_damaged use for the same stops
    why = {
        rc.WALK_END_OF_FILE: "the records end (end_of_file)",
        rc.WALK_ZEROS: "the records end (zeros)",
        rc.WALK_SHORT: f"{value} bytes left, less than a record header",
        rc.WALK_BAD_SIZE: f"record size {value} is impossible",
        rc.WALK_CROSSES_END: f"record of {value} bytes crosses the end ({len(buf) - pos} bytes left)",
        rc.WALK_BAD_OFFSET: f"record claims physical offset {value}",
        rc.WALK_BAD_BLANK: f"BLANK filler of {value} bytes does not reach the end of the file",
        rc.WALK_BAD_MAGIC: f"bad magic {value:#010x}",
        rc.WALK_FIELDS: "field lengths disagree with TOTALSIZE",
        rc.WALK_ZEROED: "a zeroed tail",
        rc.WALK_BODY_CRC: "body CRC mismatch",
    }[code]
    return pos, why
