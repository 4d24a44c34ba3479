"""Where store recovery starts, and the report of what it read (RocketMQ's recover rules).

Theory of operation
-------------------
Start-up must not read the whole store: after a clean stop it reads (almost) nothing, after a
crash only what was written since the last checkpoint.  RocketMQ 4.9 gets there with file
granularity, because its checkpoint holds timestamps only: after a clean stop
(``CommitLog.recoverNormally``, no ``abort`` file) it validates the last 3 segments; after a
crash (``recoverAbnormally``) it scans back from the last segment to the first one whose first
record was stored at or before the checkpoint's minimum timestamp and validates from there.
ConsumeQueues recover from their own last segments, the index from the checkpoint.

Our checkpoint (checkpoint.py) holds an exact CommitLog offset, ``dispatched``, with two
invariants the flush service keeps (flush.py):

* it is a record boundary (or a segment start), and every CommitLog byte below it was
  fdatasync'ed before the checkpoint was written;
* every ConsumeQueue unit and index entry of the records below it was flushed too.

So everything below ``dispatched`` is known good and recovery starts exactly there, in the
middle of a segment if need be (``commit_log_start``):

=====================  ======================================================================
rule                   when, and where validation starts
=====================  ======================================================================
``checkpoint``         valid checkpoint whose offset lies within the segments: at it.  After a
                       clean stop that is the log's end (zero records read); after a crash the
                       records written since the last checkpoint (at most
                       ``flush_interval_consume_queue`` of writes).
``last-files``         clean stop, no usable checkpoint: the last 3 segments (RocketMQ).
``first-file``         crash without a usable checkpoint, or a checkpoint older than the first
                       segment: the first segment.
``empty``              no segment.
=====================  ======================================================================

From the start offset, records are checked (commitlog.py) up to the first bad or incomplete one,
which becomes the end; the torn tail is zeroed.

Torn bytes below the checkpoint
-------------------------------
The first invariant holds for what the store asked of the disk, not for what a disk that lies
about fdatasync (a volatile write cache, a filesystem that lost a write in a power cut) kept:
such a disk can hand back zeros or stale bytes for writes the checkpoint already covers.  What
it loses is what its cache held at the cut: the most recent writes, the log's tail below the
checkpoint.  So after an unclean stop the records below the checkpoint are checked too, body
CRC included, as RocketMQ's ``recoverAbnormally`` checks every record's body CRC from the file
the checkpoint falls in to the end (``checkCRCOnRecover``, ``store/CommitLog.java``).  The check
starts at the lower of two places (``crc_check_from``):

* the start of the segment holding the last byte below the checkpoint: all of the last
  segment's written data, RocketMQ's rule (a checkpoint exactly at a segment start means the
  segment before it, as with RocketMQ, which skips a file whose first record is newer than its
  checkpoint);
* ``crc_check_window_on_recover`` bytes below the checkpoint (default 128 MiB, more than a
  disk's write cache holds): with small segments this reaches into the segments before the
  last one.  It may start mid-segment: the first record at or after it is found by its
  self-referencing PHYSICALOFFSET (commitlog_scan.resync).

Start-up after a crash thus reads at most one segment or the window, whichever is larger, plus
what followed the checkpoint, whatever the store's size.  The check is compiled
(broker/store/_record_check.c, commitlog_scan.check_records: the walk, the field checks and the
CRC-32 per body, folded with PCLMULQDQ where the CPU has it, without the GIL): a whole 1 GiB
segment of 1 KiB messages in ~0.1 s on one core, so a restart after a kill stays well under
1.5 s (docs/benchmarks.md).  Where the extension was not built the numpy path gives the same
answer in ~1 s per GiB (``RecoveryReport.crc_check`` says which ran).

The first record checked that is not intact cuts the log there, exactly like a torn
tail past the checkpoint: every record after it is suspect (RocketMQ cuts at the first bad
record too).  The cut is below ``dispatched``, so the ConsumeQueues drop the units of the cut
records, the index drops its entries from the cut, re-dispatch starts at the cut, and the
checkpoint is rewritten at once to name the cut; new sends then take the next queue offsets.
Messages cut this way may have been acknowledged (the disk said they were flushed): the store
logs an error naming the range it cut (docs/guarantees.md).

ConsumeQueue units past the checkpoint, and making the cuts durable
--------------------------------------------------------------------
Units are written in order, but a power cut keeps whichever of the pages written since the
last fdatasync the kernel happened to write back: a queue's tail past the checkpoint can hold a
hole with units after it, or units of records the CommitLog no longer holds.  So after a crash
the queues keep only the units of records below the checkpoint (flushed before it was written,
the second invariant) and the re-dispatch writes the rest again from the CommitLog; after a
clean stop they are cut at the CommitLog's valid end as before.

A cut is zeros written over bytes that may be on disk.  Until an fdatasync covers them, a power
cut brings the old bytes back, and a dropped unit that comes back points at whatever record the
store writes at that offset next: served, and damaged.  So recovery fdatasyncs every segment it
zeroed (``MappedFile.cut_unsynced``) before the store takes a write, and so does a cut of a
running store (dirty_files.py).
"""

from __future__ import annotations

import bisect

import attrs

# RocketMQ recoverNormally: validate this many segments from the end after a clean stop
LAST_FILES = 3


@attrs.define
class RecoveryReport:
    clean: bool  # the last run removed ``abort`` (a clean stop)
    checkpoint_valid: bool
    rule: str = "empty"  # see the table in the module docstring
    commit_log_from: int = 0  # where CommitLog validation started
    commit_log_end: int = 0  # the valid end it found
    bytes_scanned: int = 0  # CommitLog bytes validated
    files_scanned: int = 0  # CommitLog segments validation read from
    redispatch_from: int = 0
    redispatched_bytes: int = 0
    cq_units_dropped: int = 0  # ConsumeQueue units pointing past the CommitLog's end
    index_entries_dropped: int = 0  # index entries at or past ``dispatched`` (a crash)
    crc_from: int = 0  # where the body CRC check below the checkpoint started (after a crash)
    crc_bytes: int = 0  # CommitLog bytes below the checkpoint whose records were CRC-checked
    crc_seconds: float = 0.0
    crc_check: str = ""  # which check ran: "compiled" or "numpy" (commitlog_scan.check_records)
    cut_below_checkpoint: int = 0  # bytes of records below the checkpoint found damaged, cut
    files_synced: int = 0  # segments whose zeroed tail recovery fdatasync'ed before serving
    seconds: float = 0.0

    def summary(self) -> str:
        return (
            f"recovery ({'clean stop' if self.clean else 'after a crash'}, rule {self.rule}): "
            f"validated {self.bytes_scanned} B in {self.files_scanned} segment(s) from "
            f"{self.commit_log_from}, end {self.commit_log_end}; body CRCs below it checked for "
            f"{self.crc_bytes} B from {self.crc_from} in {self.crc_seconds:.3f} s "
            f"({self.crc_check or 'none'}), "
            f"{self.cut_below_checkpoint} B cut; re-dispatched "
            f"{self.redispatched_bytes} B from {self.redispatch_from}; dropped "
            f"{self.cq_units_dropped} ConsumeQueue unit(s), {self.index_entries_dropped} index "
            f"entr(y/ies), synced {self.files_synced} cut segment(s); {self.seconds:.3f} s"
        )


def commit_log_start(
    *,
    clean: bool,
    checkpoint_offset: int | None,
    segment_starts: list[int],
    file_size: int,
) -> tuple[int, str]:
    """(offset where CommitLog validation starts, rule); ``checkpoint_offset`` is None when
    the checkpoint is missing or torn."""
    if not segment_starts:
        return 0, "empty"
    first = segment_starts[0]
    end = segment_starts[-1] + file_size
    if checkpoint_offset is not None and first <= checkpoint_offset <= end:
        return checkpoint_offset, "checkpoint"
    if clean and checkpoint_offset is None:
        return segment_starts[max(0, len(segment_starts) - LAST_FILES)], "last-files"
    # a crash without a checkpoint, or a checkpoint outside the segments: trust nothing
    return first, "first-file"


def crc_check_from(*, start: int, segment_starts: list[int], window: int) -> int:
    """Where the body CRC check below the validation start ``start`` (the checkpoint) begins
    after a crash (module docstring): the start of the segment holding the last byte below it,
    or ``window`` bytes below it if that is lower (possibly mid-segment); never before the
    first segment.  ``start`` itself when nothing lies below it."""
    if not segment_starts or start <= segment_starts[0]:
        return start
    holding = segment_starts[bisect.bisect_right(segment_starts, start - 1) - 1]
    return max(segment_starts[0], min(holding, start - window))
