"""CommitLog: every message of every topic, appended to one log of mapped segments.

Theory of operation
-------------------
Records (common/message.py) are appended at the log's end; a record or batch never straddles a
segment: if ``length + 8 > remaining`` the rest of the segment gets a BLANK filler (TOTALSIZE =
remaining, MAGIC = BLANK) and the write moves to a new segment (``END_FILE_MIN_BLANK_LENGTH`` in
``store/CommitLog.java``).  A record's PHYSICALOFFSET is its absolute offset; the put path patches
it into the encoded bytes before the single copy into the map, so what lands on disk is complete in
one memcpy.

``topic_queue_table`` hands out the next logical (ConsumeQueue) offset per (topic, queueId) at
append time; prepared/rollback transaction records get 0 and do not advance it.  On start it is
rebuilt from the ConsumeQueues.

Recovery (``recover``): starting exactly at ``from_offset`` (chosen by recovery.py: the
checkpoint's ``dispatched`` offset, so the log's end after a clean stop and the records written
since the last checkpoint after a crash) records are checked in order (magic, size, field
lengths, body CRC, PHYSICALOFFSET == position) until the first bad or incomplete one; that is
the valid end.  Everything after the end is zeroed (holes skipped) and later segments deleted
(``MappedFileQueue.truncate_dirty``), so a torn tail can never be served or resurrected later.
The checkpoint says the bytes below ``from_offset`` were flushed; a disk that lied about that
can still have lost them, so after a crash ``first_bad_below`` checks a window below it (body
CRC included, vectorized: commitlog_scan.py) and the first damaged record there becomes the end
instead (recovery.py).

HA: ``get_data`` returns the written bytes of one segment from an offset (BLANKs included) and
``append_raw`` appends replicated bytes at exactly the current end, never across a segment end.
"""

from __future__ import annotations

import logging

from broker.store.commitlog_scan import check_records, resync
from broker.store.dispatch import BLANK, PARTIAL, parse_record
from broker.store.mapped_file_queue import MappedFileQueue
from broker.store.results import Buffer
from common.message import BLANK_MAGIC_CODE, RecordDecodeError

log = logging.getLogger(__name__)

_BLANK_FILL = 8


class CommitLog:
    def __init__(self, store_dir: str, file_size: int, delay_millis: tuple[int, ...]):
        self.queue = MappedFileQueue(store_dir, file_size)
        self.file_size = file_size
        self.delay_millis = delay_millis
        # (topic, queueId) -> next logical offset to assign
        self.topic_queue_table: dict[tuple[str, int], int] = {}

    def load(self) -> None:
        self.queue.load()

    @property
    def max_offset(self) -> int:
        return self.queue.max_offset

    @property
    def min_offset(self) -> int:
        return self.queue.min_offset

    @property
    def flushed_offset(self) -> int:
        return self.queue.flushed_offset

    # ---------------------------------------------------------------- put path

    def reserve(self, length: int) -> int:
        """Absolute offset where ``length`` contiguous bytes will go (may write a BLANK)."""
        mf = self.queue.last()
        if mf is None:
            mf = self.queue.create(0)
        elif length + _BLANK_FILL > mf.remaining:
            rem = mf.remaining
            # the filler's tail is served (HA sends it, reads page it in), so it gets blocks too
            mf.reserve_blocks(self.file_size)
            if rem >= _BLANK_FILL:
                mf.append(rem.to_bytes(4, "big") + BLANK_MAGIC_CODE.to_bytes(4, "big", signed=True))
                # the rest of the segment is already zero (sparse); just move the position
                mf.wrote = self.file_size
            mf = self.queue.create(mf.file_from_offset + self.file_size)
        mf.reserve_blocks(mf.wrote + length)
        return mf.end_offset

    def fits(self, length: int) -> bool:
        """``reserve(length)`` would start no new segment (and write no BLANK filler)."""
        mf = self.queue.last()
        return mf is not None and length + _BLANK_FILL <= mf.remaining

    def write(self, data: Buffer) -> None:
        """Append ``data`` at the end; the caller reserved room with ``reserve``."""
        self.queue.files[-1].append(data)

    # ---------------------------------------------------------------- reads

    def read(self, phys: int, size: int) -> memoryview | None:
        mf = self.queue.find(phys)
        if mf is None:
            return None
        return mf.slice(phys - mf.file_from_offset, size)

    def read_size(self, phys: int) -> int:
        head = self.read(phys, 4)
        return -1 if head is None else int.from_bytes(head, "big", signed=True)

    def get_data(self, offset: int) -> memoryview | None:
        mf = self.queue.find(offset)
        if mf is None:
            return None
        pos = offset - mf.file_from_offset
        if pos >= mf.wrote:
            return None
        return mf.view[pos : mf.wrote]

    def roll_next_file(self, offset: int) -> int:
        return self.queue.roll_next(offset)

    # ---------------------------------------------------------------- HA slave

    def append_raw(self, start_offset: int, data: Buffer) -> bool:
        if not self.queue.files:
            if start_offset % self.file_size:
                log.error("HA append at %d is not at a segment start", start_offset)
                return False
            self.queue.create(start_offset)
        if start_offset != self.max_offset:
            return False
        mf = self.queue.files[-1]
        if mf.is_full:
            mf = self.queue.create(mf.file_from_offset + self.file_size)
        if len(data) > mf.remaining:
            log.error("HA append at %d of %d bytes crosses a segment end", start_offset, len(data))
            return False
        mf.append(data)
        return True

    # ---------------------------------------------------------------- recovery

    def recover(self, from_offset: int, *, check_crc: bool) -> tuple[int, int, int]:
        """Validate records from ``from_offset`` (a record boundary below which everything is
        known good, see recovery.py) to the first bad or incomplete one and truncate there.

        Returns (valid end, bytes validated, segments read)."""
        files = self.queue.files
        if not files:
            return 0, 0, 0
        from_offset = max(from_offset, files[0].file_from_offset)
        start = self.queue.find(from_offset)
        if start is None:  # the end of the last, full segment: nothing after it to check
            self._all_flushed()
            return from_offset, 0, 0
        idx = files.index(start)
        valid_end = from_offset
        scanned = 0
        read = 0
        pos = from_offset - start.file_from_offset
        for mf in files[idx:]:
            first = pos
            read += 1
            view = mf.view
            size = self.file_size
            while pos < size:
                try:
                    what, n = parse_record(view, pos, size, self.delay_millis, check_crc=check_crc)
                except RecordDecodeError as exc:
                    if int.from_bytes(view[pos : pos + 8], "big"):
                        log.warning(
                            "commitlog recovery: end at %d (%s)", mf.file_from_offset + pos, exc
                        )
                    break
                if what is PARTIAL:
                    break
                if what is BLANK:
                    if pos + n != size:
                        log.warning(
                            "commitlog recovery: bad BLANK at %d", mf.file_from_offset + pos
                        )
                        break
                    pos = size
                    break
                if what.commit_log_offset != mf.file_from_offset + pos:
                    log.warning(
                        "commitlog recovery: record at %d claims offset %d",
                        mf.file_from_offset + pos,
                        what.commit_log_offset,
                    )
                    break
                pos += n
            scanned += pos - first
            valid_end = mf.file_from_offset + pos
            if pos < size:
                break
            pos = 0
        self.queue.truncate_dirty(valid_end)
        self._all_flushed()
        return valid_end, scanned, read

    def first_bad_below(self, crc_from: int, upto: int) -> tuple[int, str] | None:
        """(offset, why) of the first record in ``[crc_from, upto)`` that is not intact (body
        CRC, structure, PHYSICALOFFSET), or None when all are.  ``upto`` is a record boundary
        (the checkpoint), so the records from the first one at or after ``crc_from`` must chain
        exactly up to it (a segment may end in its BLANK filler)."""
        for mf in self.queue.files:
            seg_end = mf.file_from_offset + self.file_size
            if seg_end <= crc_from or mf.file_from_offset >= upto:
                continue
            stop = min(upto, seg_end) - mf.file_from_offset
            start = max(crc_from, mf.file_from_offset) - mf.file_from_offset
            if start:
                # mid-segment: the first record at or after it (none: one record spans it all)
                found = resync(mf.view, mf.file_from_offset, start, stop=stop)
                if found is None:
                    continue
                start = found
            pos, why = check_records(mf.view, mf.file_from_offset, start, stop)
            if why is not None:
                return mf.file_from_offset + pos, why
        return None

    def _all_flushed(self) -> None:
        # everything kept is on disk already (it was there when we started)
        for mf in self.queue.files:
            mf.flushed = mf.wrote

    def close(self) -> None:
        self.queue.close()
