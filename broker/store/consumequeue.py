"""ConsumeQueue: the per-(topic, queueId) index of 20-byte units into the CommitLog.

Theory of operation
-------------------
Unit n (logical offset n) sits at byte n*20 of a log of segments of
``mapped_file_size_consume_queue`` bytes (6,000,000 = 300,000 units by default) under
``consumequeue/<topic>/<queueId>/``; a unit is ``long commitLogOffset, int size, long tagsCode``.
Units are only ever written by the dispatcher, in CommitLog order, so the queue's end is also
the highest CommitLog position it covers.

* ``put``: a unit for logical offset ``q`` is written only when ``q`` is the queue's end.  An
  older ``q`` is a re-dispatch after recovery and is skipped; a queue that starts mid-way (a
  slave that began replicating late) creates its first segment at ``q``'s file and fills the
  units before ``q`` with blanks ``(0, INT_MAX, 0)``, like RocketMQ's ``fillPreBlank``.
* ``min_offset`` is the first non-blank unit; reads (``read_units``) never cross a segment, so
  one pull scans at most one file (RocketMQ's ``getIndexBuffer``).
* ``recover`` finds the end of the last segment by binary search (invariant: the written units
  of a segment are a prefix and every byte after them is zero; appends are sequential, files
  start sparse and every truncation zeroes the cut tail), drops a torn last unit (size <= 0),
  and ``truncate_dirty`` drops units pointing at or past the CommitLog's valid end (walking
  back from the end, so it reads only the dropped units).  Units a crash lost are re-added by
  the re-dispatch from the checkpoint (recovery.py), never rebuilt from the queue's start.
"""

from __future__ import annotations

import logging
import os
import struct

from broker.store.mapped_file import MappedFile
from broker.store.mapped_file_queue import MappedFileQueue
from broker.store.results import Buffer

log = logging.getLogger(__name__)

# a unit: long commitLogOffset, int size, long tagsCode
CQ_UNIT = struct.Struct(">qiq")
CQ_UNIT_SIZE = 20

BLANK_UNIT = CQ_UNIT.pack(0, 0x7FFFFFFF, 0)
_ZERO_UNIT = bytes(CQ_UNIT_SIZE)


class ConsumeQueue:
    def __init__(self, root_dir: str, topic: str, queue_id: int, file_size: int):
        if file_size % CQ_UNIT_SIZE:
            raise ValueError("consume queue file size must be a multiple of 20")
        self.topic = topic
        self.queue_id = queue_id
        self.file_size = file_size
        self.queue = MappedFileQueue(os.path.join(root_dir, topic, str(queue_id)), file_size)
        # logical offset of the first real (non-blank) unit
        self._min = 0

    # ---------------------------------------------------------------- offsets

    @property
    def max_offset(self) -> int:
        return self.queue.max_offset // CQ_UNIT_SIZE

    @property
    def min_offset(self) -> int:
        return max(self._min, self.queue.min_offset // CQ_UNIT_SIZE)

    def unit(self, offset: int) -> tuple[int, int, int] | None:
        mf = self.queue.find(offset * CQ_UNIT_SIZE)
        if mf is None:
            return None
        b = mf.slice(offset * CQ_UNIT_SIZE - mf.file_from_offset, CQ_UNIT_SIZE)
        return None if b is None else CQ_UNIT.unpack(b)

    def last_phys_end(self) -> int:
        """CommitLog offset just after the last unit's record (0 if empty)."""
        if self.max_offset <= self.min_offset:
            return 0
        u = self.unit(self.max_offset - 1)
        return 0 if u is None else u[0] + u[1]

    # ---------------------------------------------------------------- write

    def put(self, phys: int, size: int, tags_code: int, queue_offset: int) -> bool:
        """True when the unit was appended (False: already there, or a gap)."""
        end = self.max_offset
        if queue_offset < end:
            return False  # already there (re-dispatch after recovery)
        mf = self.queue.last()
        if queue_offset > end:
            if mf is not None:
                log.error(
                    "consume queue %s-%d: unit %d leaves a gap after %d",
                    self.topic,
                    self.queue_id,
                    queue_offset,
                    end,
                )
                return False
            byte_pos = queue_offset * CQ_UNIT_SIZE
            mf = self.queue.create(byte_pos - byte_pos % self.file_size)
            try:
                # the blanks and the unit in one reservation: a full disk fails the put before
                # any blank is written (else the retry would see a gap and skip the unit)
                mf.reserve_blocks(byte_pos - mf.file_from_offset + CQ_UNIT_SIZE)
            except OSError:
                self.queue.files.pop()
                mf.destroy()
                raise
            for _ in range((byte_pos - mf.file_from_offset) // CQ_UNIT_SIZE):
                mf.append(BLANK_UNIT)
            self._min = queue_offset
        elif mf is None:
            mf = self.queue.create(0)
        if mf.is_full:
            mf = self.queue.create(mf.file_from_offset + self.file_size)
        mf.append(CQ_UNIT.pack(phys, size, tags_code))
        return True

    def put_tail_unit(self, queue_offset: int, phys: int, size: int, tags_code: int) -> bool:
        """``put_tail`` of one unit, packed straight into the mapped segment at its cursor.

        The put path of a single send: no packed bytes in between, no memoryview, no slicing.
        Same bytes and the same False as ``put_tail``; a full last segment takes ``put_tail``'s
        way (a new segment).
        """
        files = self.queue.files
        if not files:
            return False
        mf = files[-1]
        pos = mf.wrote
        if queue_offset * CQ_UNIT_SIZE != mf.file_from_offset + pos:
            return False  # not the queue's end
        end = pos + CQ_UNIT_SIZE
        if end > mf.file_size:
            return self.put_tail(queue_offset, CQ_UNIT.pack(phys, size, tags_code))
        if end > mf.allocated:
            mf.reserve_blocks(end)  # (as MappedFile.append: OSError before anything is written)
        CQ_UNIT.pack_into(mf.view, pos, phys, size, tags_code)
        mf.wrote = end
        return True

    def put_tail(self, queue_offset: int, units: Buffer) -> bool:
        """Append consecutive ``units`` (packed) for logical offsets from ``queue_offset``.

        Only when ``queue_offset`` is the queue's end and the queue has a segment (the put path
        of a master); False, writing nothing, otherwise (then use ``put`` unit by unit).
        """
        mf = self.queue.last()
        if mf is None or queue_offset != self.max_offset:
            return False
        view = memoryview(units)
        pos, n = 0, len(units)
        while pos < n:
            if mf.is_full:
                mf = self.queue.create(mf.file_from_offset + self.file_size)
            k = min(n - pos, mf.remaining)
            mf.append(view[pos : pos + k])
            pos += k
        return True

    # ---------------------------------------------------------------- read

    def read_units(self, offset: int, max_bytes: int) -> memoryview | None:
        mf = self.queue.find(offset * CQ_UNIT_SIZE)
        if mf is None:
            return None
        pos = offset * CQ_UNIT_SIZE - mf.file_from_offset
        end = min(mf.wrote, pos + max_bytes)
        if pos >= end:
            return None
        return mf.view[pos:end]

    def roll_next_file(self, offset: int) -> int:
        units = self.file_size // CQ_UNIT_SIZE
        return offset + units - offset % units

    # ---------------------------------------------------------------- recovery

    def load(self) -> None:
        self.queue.load()

    def recover(self, commit_log_min: int) -> int:
        """Find the written end of the last segment and the first real unit; returns the
        number of units read to find the end.

        Units are appended in order into a file that starts zero (sparse, and ``zero_from``
        after every truncation), so the written units are a prefix and the end is found by
        binary search: O(log units), whatever the queue's size.  A unit torn by a kill
        (non-zero but with size <= 0 or a negative offset) is dropped from the end."""
        files = self.queue.files
        if not files:
            return 0
        last = files[-1]
        view = last.view
        lo, hi = 0, self.file_size // CQ_UNIT_SIZE
        read = 0
        while lo < hi:
            mid = (lo + hi) // 2
            read += 1
            if view[mid * CQ_UNIT_SIZE : (mid + 1) * CQ_UNIT_SIZE] == _ZERO_UNIT:
                hi = mid
            else:
                lo = mid + 1
        while lo > 0:
            read += 1
            phys, size, _ = CQ_UNIT.unpack_from(view, (lo - 1) * CQ_UNIT_SIZE)
            if phys >= 0 and size > 0:
                break
            lo -= 1
        pos = lo * CQ_UNIT_SIZE
        last.wrote = last.flushed = pos
        last.zero_from(pos)
        self._correct_min(commit_log_min)
        return read

    def _correct_min(self, commit_log_min: int) -> None:
        """First unit that is not a pre-blank and points at or after the CommitLog's start
        (blank/old units form a prefix, so binary search)."""
        lo = self.queue.min_offset // CQ_UNIT_SIZE
        hi = self.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            u = self.unit(mid)
            if u is None or u[1] == 0x7FFFFFFF or u[0] < commit_log_min:
                lo = mid + 1
            else:
                hi = mid
        self._min = lo

    def truncate_dirty(self, phy_end: int, dropped: list[MappedFile] | None = None) -> int:
        """Drop trailing units whose record ends after ``phy_end``, and units that point at no
        record (a hole a power cut left: zero size); returns how many.  Segments left empty
        are destroyed, or appended to ``dropped`` for the caller to unlink."""
        end = self.max_offset
        start = self.min_offset
        while end > start:
            u = self.unit(end - 1)
            if u is not None and u[1] > 0 and u[0] >= 0 and u[0] + u[1] <= phy_end:
                break
            end -= 1
        count = self.max_offset - end
        if count:
            log.warning("consume queue %s-%d truncated to %d", self.topic, self.queue_id, end)
            gone = self.queue.truncate_dirty(end * CQ_UNIT_SIZE, destroy=dropped is None)
            if dropped is not None:
                dropped.extend(gone)
        return count

    def take_expired(self, commit_log_min: int) -> list[MappedFile]:
        """Take the head segments whose units all point below the CommitLog's new start (their
        records were deleted) and move ``min_offset`` to the first unit that still points into
        the CommitLog (RocketMQ ``deleteExpiredFile`` + ``correctMinOffset``).  A full segment's
        last unit has the highest offset in it, units being written in CommitLog order."""
        count = 0
        for mf in self.queue.files[:-1]:
            phys, _size, _tags = CQ_UNIT.unpack_from(mf.view, mf.wrote - CQ_UNIT_SIZE)
            if phys >= commit_log_min or mf.flushed < mf.wrote:  # (a flush job may hold it)
                break
            count += 1
        taken = self.queue.take_head(count)
        self._correct_min(commit_log_min)
        return taken

    def flush_jobs(self) -> list[MappedFile]:
        return self.queue.flush_jobs()

    def close(self) -> None:
        self.queue.close()

    def destroy(self) -> None:
        self.queue.destroy()
