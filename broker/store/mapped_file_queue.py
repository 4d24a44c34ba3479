"""MappedFileQueue: a directory of equal-size segments forming one contiguous byte log.

Theory of operation
-------------------
Segment ``i`` covers ``[start_i, start_i + file_size)`` and segments are contiguous, so the
segment for an absolute offset is found by arithmetic from the first one.  The first segment
need not start at 0: a slave's CommitLog starts where the master's replication began, and a
consume queue that begins mid-way starts at that unit's file.  ``load`` maps the existing files
(all marked fully written: recovery then sets the real ``wrote`` of the tail);
an empty newest file (a crash between creating and sizing it) is removed; a file of any other
size than the configured one is a :class:`SegmentSizeError` (a filesystem that lost the file's
tail, or a store written with another segment size): its records cannot be trusted or found;
``truncate_dirty`` cuts the log back to an offset, zeroing the rest of that segment and
deleting later segments, so nothing beyond the valid end can be read or resurrected.
"""

from __future__ import annotations

import errno
import logging
import os

from broker.store.mapped_file import PAGE_SIZE, MappedFile

log = logging.getLogger(__name__)


class SegmentSizeError(OSError):
    """A segment file is not the configured size; ``filename`` names it and ``strerror`` says
    what happened and what to do (the CLI prints ``<filename>: <strerror>``)."""

    def __init__(self, path: str, size: int, expected: int) -> None:
        what = "shorter" if size < expected else "longer"
        super().__init__(
            errno.EIO,
            f"segment is {size} bytes, {what} than the configured {expected} (the filesystem "
            "lost its tail, or the store was written with another segment size); move the file "
            "away (its records are lost) or restore it, or start with the segment size it was "
            "written with",
            path,
        )
        self.size = size
        self.expected = expected


def offset_to_file_name(offset: int) -> str:
    """A segment's name: its start offset, 20 digits zero-padded (``UtilAll.offset2FileName``)."""
    return f"{offset:020d}"


class MappedFileQueue:
    def __init__(self, store_dir: str, file_size: int):
        self.store_dir = store_dir
        self.file_size = file_size
        # contiguous segments in offset order
        self.files: list[MappedFile] = []

    def load(self) -> None:
        if not os.path.isdir(self.store_dir):
            return
        names = sorted(n for n in os.listdir(self.store_dir) if n.isdigit() and len(n) == 20)
        for i, name in enumerate(names):
            path = os.path.join(self.store_dir, name)
            start = int(name)
            size = os.path.getsize(path)
            if size == 0 and i == len(names) - 1:
                # killed between creating the newest segment and sizing it (ftruncate is
                # atomic, so it is empty or full size): it never held a byte
                log.warning("removing empty segment %s left by a crash", path)
                os.unlink(path)
                break
            if size != self.file_size:
                raise SegmentSizeError(path, size, self.file_size)
            if self.files and start != self.files[-1].file_from_offset + self.file_size:
                raise OSError(f"{path}: not contiguous with the previous segment")
            mf = MappedFile(path, start, self.file_size, create=False)
            mf.wrote = mf.flushed = self.file_size
            self.files.append(mf)

    # ---------------------------------------------------------------- lookup

    @property
    def min_offset(self) -> int:
        return self.files[0].file_from_offset if self.files else 0

    @property
    def max_offset(self) -> int:
        return self.files[-1].end_offset if self.files else 0

    @property
    def flushed_offset(self) -> int:
        for mf in reversed(self.files):
            if mf.flushed:
                return mf.file_from_offset + mf.flushed
        return self.min_offset

    def last(self) -> MappedFile | None:
        return self.files[-1] if self.files else None

    def create(self, start: int) -> MappedFile:
        if self.files and start != self.files[-1].file_from_offset + self.file_size:
            raise ValueError(f"new segment at {start} is not contiguous")
        if start % self.file_size:
            raise ValueError(f"segment start {start} is not a multiple of {self.file_size}")
        os.makedirs(self.store_dir, exist_ok=True)
        path = os.path.join(self.store_dir, offset_to_file_name(start))
        mf = MappedFile(path, start, self.file_size, create=True)
        self.files.append(mf)
        return mf

    def find(self, offset: int) -> MappedFile | None:
        if not self.files or offset < self.files[0].file_from_offset:
            return None
        i = (offset - self.files[0].file_from_offset) // self.file_size
        return self.files[i] if i < len(self.files) else None

    def roll_next(self, offset: int) -> int:
        return offset + self.file_size - offset % self.file_size

    # ---------------------------------------------------------------- maintenance

    def truncate_dirty(self, offset: int, *, destroy: bool = True) -> list[MappedFile]:
        """Make ``offset`` the end of the log: zero the tail of its segment, drop later ones.
        The dropped segments are destroyed here, or with ``destroy=False`` returned, still
        mapped, for a running store to unlink off the loop (``clean_service.unlink_segments``)."""
        keep, dropped = [], []
        for mf in self.files:
            if mf.file_from_offset + self.file_size <= offset:
                keep.append(mf)
            elif mf.file_from_offset <= offset:
                pos = offset - mf.file_from_offset
                mf.zero_from(pos)
                mf.wrote = pos
                mf.flushed = min(mf.flushed, pos)
                # pages rewritten after the cut are faulted in again: release_behind must see them
                mf.released = min(mf.released, pos - pos % PAGE_SIZE)
                keep.append(mf)
            else:
                log.warning("deleting segment %s beyond the valid end %d", mf.path, offset)
                dropped.append(mf)
        self.files = keep
        if destroy:
            for mf in dropped:
                mf.destroy()
            return []
        return dropped

    def take_head(self, count: int) -> list[MappedFile]:
        """Remove the first ``count`` segments (never the last, the one written) from the queue
        and return them for the caller to destroy: the log then starts at the next one, which
        ``find`` and ``min_offset`` see at once (retention, clean_service.py)."""
        count = max(0, min(count, len(self.files) - 1))
        head, self.files = self.files[:count], self.files[count:]
        return head

    def destroy(self) -> None:
        for mf in self.files:
            mf.destroy()
        self.files = []
        try:
            os.rmdir(self.store_dir)
        except OSError:
            pass

    def close(self) -> None:
        for mf in self.files:
            mf.close()

    def flush_jobs(self) -> list[MappedFile]:
        """Segments with unflushed bytes or an unsynced cut (for the flush thread)."""
        return [mf for mf in self.files if mf.flushed < mf.wrote or mf.cut_unsynced]

    def sync_cuts(self) -> int:
        """Blocking: fdatasync every segment with an unsynced cut (for a worker thread, or
        recovery's); returns how many."""
        cut = [mf for mf in self.files if mf.cut_unsynced]
        for mf in cut:
            mf.sync()
        return len(cut)
