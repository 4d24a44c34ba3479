"""Spark data source "rocketmq-store": read CommitLog segment files straight from a store dir.

Theory of operation
-------------------
``spark.read.format("rocketmq-store").load(path)`` with ``path`` a broker's storePathRootDir
(holding ``commitlog/``) or the ``commitlog/`` directory itself.  Segment files are named after
their first physical offset (20 digits, ``UtilAll.offset2FileName`` in RocketMQ 4.9).  Offline: no
broker is contacted, so this serves audits and backfills, and reads a stopped broker's (or a copy's)
files.

* ``partitions()`` on the driver only lists the files and their sizes: one partition per segment,
  or per byte range of ``maxBytesPerPartition`` (default 128 MiB) for big segments.  No file is
  read on the driver.
* ``read()`` on an executor mmaps its segment read-only.  A range that does not start at byte 0
  finds its first record with ``commitlog_scan.resync`` (MAGIC plus a PHYSICALOFFSET equal to the
  position), then ``scan_segment`` walks TOTALSIZEs to the end of the range; a record belongs to
  the range its start lies in, so neighbouring ranges meet exactly.  The walk stops at BLANK
  filler (rest of the file is not data), at the zeros of a segment still being written, and at a
  torn tail (a record crossing the end of a truncated file, a bad magic): what was complete
  before it is returned, nothing after it.
* Records are decoded ``batchSize`` (default 65536) at a time by ``pipeline.record_batch`` into
  Arrow batches of the fixed schema; queueId/queueOffset come from the records themselves.

Options: ``brokerName`` (default: the store directory's name, or its parent's when it is called
``store``; "unknown" when neither helps), ``maxBytesPerPartition``, ``batchSize``.

A store in RocketMQ's DLedger layout (a ``dledger-<selfId>/`` member directory in it, told from
the files: an Apache RocketMQ 4.9 DLedger store, a classic store switched to DLedger, ours) is
read through ``pipeline.dledger_segments``: the classic CommitLog files below
``dividedCommitlogOffset`` as above, then the records of the committed entries of the DLedger
data files, cut into byte ranges the same way; the rows are the same.  Option
``storePathDLedgerCommitLog``: where the data files are when not in ``dledger-<selfId>/data``.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from pipeline.dledger_segments import dledger_layout, read_entry_range
from pipeline.schema import SPARK_SCHEMA_DDL

if TYPE_CHECKING:  # the driver lists files only; pyarrow is loaded where batches are made
    import pyarrow as pa

DEFAULT_MAX_BYTES_PER_PARTITION = 128 * 1024 * 1024
DEFAULT_BATCH_SIZE = 65536
_SEGMENT_NAME = re.compile(r"^\d{20}$")


class StoreSourceError(ValueError):
    """A bad path or option of the rocketmq-store source (the message names it)."""


def commitlog_dir(path: str | os.PathLike) -> Path:
    """The directory holding the segment files for a store root or a commitlog/ path."""
    p = Path(path)
    if (p / "commitlog").is_dir():
        return p / "commitlog"
    if p.is_dir():
        return p
    raise StoreSourceError(f"path {str(p)!r} is not a directory (want storePathRootDir)")


def default_broker_name(path: str | os.PathLike) -> str:
    """Name the rows after the store directory (its parent when it is called "store")."""
    root = Path(path).resolve()
    if root.name == "commitlog" or root.name.startswith("dledger-"):
        root = root.parent
    for candidate in (root.name, root.parent.name):
        if candidate and candidate not in ("store", "commitlog"):
            return candidate
    return "unknown"


def list_segments(path: str | os.PathLike) -> list[tuple[str, int, int]]:
    """``(file path, file_from_offset, size)`` of every segment, by offset."""
    d = commitlog_dir(path)
    out = []
    for entry in os.scandir(d):
        if entry.is_file() and _SEGMENT_NAME.match(entry.name):
            out.append((entry.path, int(entry.name), entry.stat().st_size))
    out.sort(key=lambda t: t[1])
    return out


class StoreRange(InputPartition):
    """Bytes ``[lo, hi)`` of one segment file: records starting there are this partition's."""

    def __init__(self, path: str, file_from_offset: int, lo: int, hi: int):
        super().__init__(value=(path, file_from_offset, lo, hi))
        self.path = path
        self.file_from_offset = file_from_offset
        self.lo = lo
        self.hi = hi


class DLedgerRange(StoreRange):
    """Bytes ``[lo, hi)`` of one DLedger data file: the committed entries starting there."""

    def __init__(self, path: str, file_from_offset: int, lo: int, hi: int, committed_pos: int):
        super().__init__(path, file_from_offset, lo, hi)
        self.committed_pos = committed_pos


def _positive_int(options: Mapping[str, str], name: str, default: int) -> int:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise StoreSourceError(f"option {name}: {raw!r} is not an integer") from None
    if value <= 0:
        raise StoreSourceError(f"option {name}: must be positive, got {value}")
    return value


def plan_ranges(segments: Iterable[tuple[str, int, int]], max_bytes: int) -> list[StoreRange]:
    """Split segments into byte ranges of at most ``max_bytes`` (empty files give none)."""
    parts = []
    for path, start, size in segments:
        lo = 0
        while lo < size:
            hi = min(size, lo + max_bytes)
            parts.append(StoreRange(path, start, lo, hi))
            lo = hi
    return parts


def read_range(part: StoreRange, *, broker_name: str, batch_size: int) -> Iterator[pa.RecordBatch]:
    """Yield Arrow batches of the records starting inside ``part`` (runs on executors)."""
    from broker.store.commitlog_scan import resync, scan_segment
    from pipeline.record_batch import decode_records

    with open(part.path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0 or part.lo >= size:
            return
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        # the scan takes a buffer view; released before the map is closed below
        with memoryview(mm) as view:
            start = part.lo
            if start:
                found = resync(view, part.file_from_offset, start, stop=part.hi)
                if found is None:
                    return
                start = found
            scan = scan_segment(view, part.file_from_offset, start=start, stop=part.hi)
        starts = scan.starts
        for i in range(0, len(starts), batch_size):
            yield decode_records(mm, broker_name=broker_name, starts=starts[i : i + batch_size])
        del scan, starts
    finally:
        # the batches own copies of the bytes; a view still alive keeps the map until GC
        with contextlib.suppress(BufferError):
            mm.close()


def plan_store(
    path: str | os.PathLike, max_bytes: int, *, store_path_dledger_commit_log: str | None = None
) -> list[StoreRange]:
    """The ranges of a store: its CommitLog segments, or, for a store in the DLedger layout, its
    classic segments below ``dividedCommitlogOffset`` and its data files' committed entries."""
    try:
        layout = dledger_layout(path, store_path_dledger_commit_log=store_path_dledger_commit_log)
    except ValueError as exc:  # DLedgerStoreError: files that cannot be a DLedger store
        raise StoreSourceError(f"path {str(path)!r}: {exc}") from None
    if layout is None:
        return plan_ranges(list_segments(path), max_bytes)
    parts = plan_ranges(layout.classic, max_bytes)
    for r in plan_ranges(layout.data, max_bytes):
        parts.append(DLedgerRange(r.path, r.file_from_offset, r.lo, r.hi, layout.committed_pos))
    return parts


def read_store_range(
    part: StoreRange, *, broker_name: str, batch_size: int
) -> Iterator[pa.RecordBatch]:
    """Arrow batches of a range :func:`plan_store` made (runs on executors)."""
    if isinstance(part, DLedgerRange):
        yield from read_entry_range(
            part.path,
            part.file_from_offset,
            lo=part.lo,
            hi=part.hi,
            committed_pos=part.committed_pos,
            broker_name=broker_name,
            batch_size=batch_size,
        )
    else:
        yield from read_range(part, broker_name=broker_name, batch_size=batch_size)


class RocketMQStoreReader(DataSourceReader):
    def __init__(
        self,
        path: str,
        broker_name: str,
        max_bytes: int,
        batch_size: int,
        store_path_dledger_commit_log: str | None = None,
    ):
        self.path = path
        self.broker_name = broker_name
        self.max_bytes = max_bytes
        self.batch_size = batch_size
        self.store_path_dledger_commit_log = store_path_dledger_commit_log

    def partitions(self) -> list[StoreRange]:
        parts = plan_store(
            self.path,
            self.max_bytes,
            store_path_dledger_commit_log=self.store_path_dledger_commit_log,
        )
        # Spark needs at least one partition; an empty range reads nothing
        return parts or [StoreRange("", 0, 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, StoreRange):  # Spark hands back what partitions() made
            raise TypeError(f"not a rocketmq-store partition: {partition!r}")
        if not partition.path:
            return
        yield from read_store_range(
            partition, broker_name=self.broker_name, batch_size=self.batch_size
        )


class RocketMQStoreDataSource(DataSource):
    """``spark.read.format("rocketmq-store").load(storePathRootDir)``."""

    @classmethod
    def name(cls) -> str:
        return "rocketmq-store"

    def schema(self) -> str:
        return SPARK_SCHEMA_DDL

    def reader(self, schema: StructType) -> RocketMQStoreReader:
        opts = self.options
        path = opts.get("path")
        if not path:
            raise StoreSourceError(
                "option path: give the store directory, e.g. "
                'spark.read.format("rocketmq-store").load("/data/broker-a/store")'
            )
        commitlog_dir(path)  # fail on the driver with the path in the message
        broker = opts.get("brokerName") or default_broker_name(path)
        return RocketMQStoreReader(
            str(path),
            broker,
            _positive_int(opts, "maxBytesPerPartition", DEFAULT_MAX_BYTES_PER_PARTITION),
            _positive_int(opts, "batchSize", DEFAULT_BATCH_SIZE),
            opts.get("storePathDLedgerCommitLog") or None,
        )
