"""The files of a store in RocketMQ's DLedger layout, as the rocketmq-store source reads them.

Theory of operation
-------------------
RocketMQ 4.9 in DLedger mode (``store/dledger/DLedgerCommitLog.java``) writes each message once,
as the body of a DLedger entry: a 48-byte entry header, then the CommitLog record, whose
PHYSICALOFFSET is the entry's position + 48.  The files (see
``broker/dledger/broker/dledger_commitlog.py``, which this module reads through):

* ``<storePathRootDir>/dledger-<selfId>/data/`` (or ``storePathDLedgerCommitLog``): the data
  files, named by the position they start at; entries back to back, a file's unused end is
  DLedger's blank (``int -1, int remaining``) or zeros;
* ``dledger-<selfId>/checkpoint``: ``committedIndex``.  Only entries up to it are messages a
  broker serves (``getMaxOffset`` is the committed position), so only those are rows;
* ``<storePathRootDir>/commitlog/``: for a classic store switched to DLedger, the CommitLog
  files below ``dividedCommitlogOffset`` (the first data file's start), read as a classic store
  is read; files at or above it are never read (``DLedgerCommitLog.getMessage``).

:func:`dledger_layout` (on the driver) finds the member from the files and computes the
committed position from the checkpoint and one index unit, without reading the data.  A data
file is cut into byte ranges like a CommitLog segment, up to the committed position only; an
entry belongs to the range its position lies in.  :func:`entry_record_starts` (on an executor) finds the first entry of a range
that does not start at byte 0 with ``commitlog_scan.resync`` looking for the record inside it
(a record whose PHYSICALOFFSET equals its own offset is at an entry's pos + 48, and the entry
header before it must say so), then walks the entries by their ``size`` until the range's end,
the committed position, a blank, zeros or a torn entry (a header DLedger's recovery refuses, or
one running past the file): what was complete before it is returned.  No-op entries (a new
leader's, ``entry_coder.is_noop_body``) are not messages and give no row.

Invariants: every start returned is an entry's ``pos + 48 - file_from_offset`` for an entry
whose whole extent lies below ``committed_pos``; neighbouring ranges share no entry.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

import attrs
import numpy as np

from broker.dledger.broker.dledger_commitlog import committed_position, find_dledger_store
from broker.dledger.driver import entry_coder as ec

if TYPE_CHECKING:  # the driver lists files only; pyarrow is loaded where batches are made
    import pyarrow as pa

__all__ = ["DLedgerLayout", "dledger_layout", "entry_record_starts", "read_entry_range"]

_SEGMENT_NAME = re.compile(r"^\d{20}$")
_NOOP_BODY_LENGTHS = (0, len(ec.NOOP_RECORD))


@attrs.frozen
class DLedgerLayout:
    """What the source reads of a DLedger-layout store: ``(file path, file_from_offset, size)``
    of the classic CommitLog files below ``dividedCommitlogOffset`` and of the data files, and
    the committed position (rows end there)."""

    classic: list[tuple[str, int, int]]
    data: list[tuple[str, int, int]]
    committed_pos: int


def _files(directory: str) -> list[tuple[str, int, int]]:
    if not os.path.isdir(directory):
        return []
    out = [
        (e.path, int(e.name), e.stat().st_size)
        for e in os.scandir(directory)
        if e.is_file() and _SEGMENT_NAME.match(e.name)
    ]
    return sorted(out, key=lambda t: t[1])


def dledger_layout(
    path: str | os.PathLike[str], *, store_path_dledger_commit_log: str | None = None
) -> DLedgerLayout | None:
    """The DLedger member of the store at ``path`` (told from its files), or None for a classic
    store.  ``DLedgerStoreError`` (a ValueError) when the files cannot be one."""
    paths = find_dledger_store(path, store_path_dledger_commit_log=store_path_dledger_commit_log)
    if paths is None:
        return None
    data = [f for f in _files(paths.data_dir) if f[2]]
    classic = _files(paths.commit_log_dir)
    if data:
        # dividedCommitlogOffset: the classic CommitLog answers below it only
        classic = [f for f in classic if f[1] < data[0][1]]
    committed = committed_position(paths)
    # no range past the committed position: a data file is mapped at its full size (1 GiB
    # by default) from its first entry on, and nothing past that position is a row
    data = [
        (p, start, min(size, committed - start)) for p, start, size in data if start < committed
    ]
    return DLedgerLayout(classic, data, committed)


def _entry_before(buf: bytes | memoryview, file_from_offset: int, record_at: int) -> bool:
    """Is ``record_at`` the body of an entry whose header says so (resync found a record)?"""
    at = record_at - ec.BODY_OFFSET
    if at < 0:
        return False
    header = ec.decode_entry_header(buf, at)
    return ec.entry_problem(header, at=file_from_offset + at) is None


def entry_record_starts(
    buf: bytes | memoryview, file_from_offset: int, *, lo: int, hi: int, committed_pos: int
) -> np.ndarray:
    """Record starts (offsets in ``buf``, a data file) of the committed, non-no-op entries whose
    position lies in ``[lo, hi)`` of the file (see the module doc)."""
    from broker.store.commitlog_scan import resync

    n = len(buf)
    at = lo
    if lo:
        # the first record at or after lo + 48 whose PHYSICALOFFSET is its own offset and
        # whose entry header agrees: the first entry starting at or after lo
        search = lo + ec.BODY_OFFSET
        while True:
            found = resync(buf, file_from_offset, search, stop=hi + ec.BODY_OFFSET)
            if found is None:
                return np.zeros(0, dtype=np.int64)
            if _entry_before(buf, file_from_offset, found):
                at = found - ec.BODY_OFFSET
                break
            search = found + 1
    starts: list[int] = []
    while at < hi and file_from_offset + at < committed_pos:
        if ec.classify(buf, at) is not ec.Kind.ENTRY or at + ec.BODY_OFFSET > n:
            break  # DLedger's blank, zeros, or too few bytes: the file's data ends here
        header = ec.decode_entry_header(buf, at)
        if ec.entry_problem(header, at=file_from_offset + at) is not None or at + header.size > n:
            break  # a torn entry: nothing after it is read
        if file_from_offset + at + header.size > committed_pos:
            break
        if header.body_length not in _NOOP_BODY_LENGTHS or not ec.is_noop_body(
            buf[at + ec.BODY_OFFSET : at + header.size]
        ):
            starts.append(at + ec.BODY_OFFSET)
        at += header.size
    return np.asarray(starts, dtype=np.int64)


def read_entry_range(
    path: str,
    file_from_offset: int,
    *,
    lo: int,
    hi: int,
    committed_pos: int,
    broker_name: str,
    batch_size: int,
) -> Iterator[pa.RecordBatch]:
    """Arrow batches of the records of the committed entries starting in ``[lo, hi)`` of the
    data file ``path`` (runs on executors)."""
    from pipeline.record_batch import decode_records

    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0 or lo >= size or file_from_offset + lo >= committed_pos:
            return
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        # the walk takes a buffer view; released before the map is closed below
        with memoryview(mm) as view:
            starts = entry_record_starts(
                view, file_from_offset, lo=lo, hi=hi, committed_pos=committed_pos
            )
        for i in range(0, len(starts), batch_size):
            yield decode_records(mm, broker_name=broker_name, starts=starts[i : i + batch_size])
        del starts
    finally:
        # the batches own copies of the bytes; a view still alive keeps the map until GC
        with contextlib.suppress(BufferError):
            mm.close()
