"""MappedFile: one fixed-size, memory-mapped store segment (CommitLog, ConsumeQueue, index).

Theory of operation
-------------------
A segment is a file of exactly ``file_size`` bytes named after the absolute offset of its first
byte (20 digits, ``UtilAll.offset2FileName``).  It is created sparse (``ftruncate``) and mapped
``MAP_SHARED`` read/write once; appends copy bytes into the map at ``wrote`` (one memcpy, no
syscall), readers get ``memoryview`` slices of the map (zero copy all the way to the socket).

Positions (invariants: ``0 <= flushed <= wrote <= file_size``):

* ``wrote``: bytes appended so far.  Only bytes below ``wrote`` are ever served.
* ``flushed``: bytes known to be on disk (``fdatasync`` done).  Flushing runs in a worker thread
  (``flush_range`` is a plain blocking function the flush service hands to
  ``trio.to_thread.run_sync``) so the event loop never blocks on the disk.

RSS: pages touched through a mapping count toward the process RSS even though they are page
cache.  Once a range is flushed, ``release`` drops it from our page tables with
``madvise(MADV_DONTNEED)``: for a shared file mapping this only unmaps (the data stays in the
page cache and on disk) and a later read refaults it cheaply.  We chose this over ``pwrite``
writes because the put path then stays a memcpy (no syscall per batch) and reads stay zero-copy.

Disk space: the file is sparse, so a store through the map into a hole needs the filesystem to
find a block right then, and on a full filesystem the kernel answers that page fault with
SIGBUS, which kills the process.  So no byte is copied into the map above ``allocated``: the
writer first calls ``reserve_blocks``, which ``posix_fallocate``s the file from ``allocated`` up
to the next ``chunk`` boundary and raises ``OSError(ENOSPC)`` if the filesystem cannot back it.
A full disk is then an error the put path answers, found one chunk ahead of the writes.
Invariant: ``wrote <= allocated`` for every segment this process wrote to (a loaded segment
starts at ``allocated = 0``; fallocating blocks it already has changes nothing).  A chunk is
1/256 of the file, in whole pages, at most ``ALLOCATION_CHUNK`` (1 MiB): a fresh 1 GiB segment
does not take 1 GiB of disk (or of RAM on tmpfs) at once, one syscall covers a MiB of
CommitLog writes, and a consume queue of 6 MB holding a few units takes 24 KiB, not a MiB.

Kill -9 safety: bytes copied into a shared mapping are in the kernel page cache the moment the
copy finishes, so a killed process loses at most a record that was mid-copy; recovery detects
and zeroes such a torn tail (see commitlog.py).
"""

from __future__ import annotations

import errno
import mmap
import os

from broker.store.results import Buffer

PAGE_SIZE = mmap.PAGESIZE
# bytes reserved on the filesystem per posix_fallocate at most (one syscall per MiB written)
ALLOCATION_CHUNK = 1 << 20
_ZERO_CHUNK = 1 << 20


class MappedFile:
    """One segment; see the module docstring for the position invariants."""

    __slots__ = (
        "_fd",
        "allocated",
        "chunk",
        "cut_unsynced",
        "file_from_offset",
        "file_size",
        "flushed",
        "mm",
        "path",
        "pinned",
        "released",
        "view",
        "wrote",
    )

    def __init__(self, path: str, file_from_offset: int, file_size: int, *, create: bool = True):
        self.path = path
        self.file_from_offset = file_from_offset
        self.file_size = file_size
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        self._fd = os.open(path, flags, 0o644)
        try:
            actual = os.fstat(self._fd).st_size
            if actual != file_size:
                if actual == 0 and create:
                    # sizing takes no blocks (sparse); reserve_blocks takes them as writes come
                    os.ftruncate(self._fd, file_size)
                else:
                    raise OSError(f"{path}: size {actual}, expected {file_size}")
            self.mm = mmap.mmap(self._fd, file_size, mmap.MAP_SHARED)
        except BaseException:
            os.close(self._fd)
            raise
        self.view = memoryview(self.mm)
        self.wrote = 0
        self.flushed = 0
        # zero_from wrote zeros over bytes that may be on disk, and no fdatasync has covered
        # them since: ``flushed`` cannot say so (it only ever covers [0, wrote)), yet until
        # they are synced a power cut brings the old bytes back (flush_jobs takes such files)
        self.cut_unsynced = False
        # release_behind: pages below this are dropped from our page tables (page aligned)
        self.released = 0
        # release keeps the pages below this mapped: a region written at random places on
        # every put (an index file's slot table), where a page dropped would fault again at once
        self.pinned = 0
        # bytes [0, allocated) are known to have filesystem blocks (reserve_blocks)
        self.allocated = 0
        # reserved per step: 1/256 of the file in pages, at most ALLOCATION_CHUNK (a consume
        # queue of 6 MB takes 24 KiB at a time, not a MiB: thousands of queues stay small)
        pages = -(-file_size // 256 // PAGE_SIZE)
        self.chunk = min(ALLOCATION_CHUNK, max(1, pages) * PAGE_SIZE)

    # ---------------------------------------------------------------- write / read

    @property
    def remaining(self) -> int:
        return self.file_size - self.wrote

    @property
    def is_full(self) -> bool:
        return self.wrote >= self.file_size

    @property
    def end_offset(self) -> int:
        """Absolute offset just after the last written byte."""
        return self.file_from_offset + self.wrote

    def fileno(self) -> int:
        return self._fd

    def reserve_blocks(self, end: int) -> None:
        """Have the filesystem back bytes [0, end) before anything is stored there (module
        docstring); raises OSError (ENOSPC on a full filesystem) and then changes nothing."""
        if end <= self.allocated:
            return
        chunk = self.chunk
        upto = min(self.file_size, -(-end // chunk) * chunk)
        os.posix_fallocate(self._fd, self.allocated, upto - self.allocated)
        self.allocated = upto

    def append(self, data: Buffer) -> int:
        """Copy ``data`` at ``wrote``; returns the file-relative position it went to."""
        pos = self.wrote
        n = len(data)
        if pos + n > self.allocated:
            if pos + n > self.file_size:
                raise ValueError(f"{self.path}: append of {n} bytes at {pos} overflows the file")
            self.reserve_blocks(pos + n)
        self.view[pos : pos + n] = data
        self.wrote = pos + n
        return pos

    def write_at(self, pos: int, data: Buffer) -> None:
        if pos + len(data) > self.allocated:
            self.reserve_blocks(pos + len(data))
        self.view[pos : pos + len(data)] = data

    def slice(self, pos: int, size: int) -> memoryview | None:
        """Bytes [pos, pos+size) if they are all written, else None."""
        if pos < 0 or size < 0 or pos + size > self.wrote:
            return None
        return self.view[pos : pos + size]

    # ---------------------------------------------------------------- flush / release

    def flush_range(self, upto: int | None = None) -> int:
        """Blocking fdatasync covering [flushed, upto); run it in a worker thread. Returns new flushed."""
        end = self.wrote if upto is None else min(upto, self.wrote)
        if end > self.flushed or self.cut_unsynced:
            # fdatasync writes back the pages dirtied through the mapping too (one page cache),
            # and unlike mmap.flush (msync) it releases the GIL while the disk works
            self.cut_unsynced = False
            os.fdatasync(self._fd)
            self.flushed = max(self.flushed, end)
        return self.flushed

    def sync(self) -> None:
        """Blocking fdatasync of whatever the map holds (after a cut zeroed bytes that were on
        disk: ``flushed`` does not cover those); for a worker thread."""
        self.cut_unsynced = False
        os.fdatasync(self._fd)

    def release(self, upto: int | None = None, *, keep_pinned: bool = True) -> None:
        """Drop flushed pages below ``upto`` from our page tables (they stay in page cache);
        those below ``pinned`` too unless ``keep_pinned``."""
        end = self.flushed if upto is None else min(upto, self.flushed)
        end -= end % PAGE_SIZE
        start = self.pinned + (-self.pinned % PAGE_SIZE) if keep_pinned else 0
        if end > start and hasattr(mmap, "MADV_DONTNEED"):
            self.mm.madvise(mmap.MADV_DONTNEED, start, end - start)

    def release_behind(self, upto: int) -> int:
        """Drop the flushed pages in [released, upto) for a file written front to back; returns
        the bytes dropped.  One call per step instead of ``release``'s walk from 0 each time."""
        end = min(upto, self.flushed)
        end -= end % PAGE_SIZE
        start = min(self.released, end)  # a truncation may have moved the end back below it
        if end > start and hasattr(mmap, "MADV_DONTNEED"):
            self.mm.madvise(mmap.MADV_DONTNEED, start, end - start)
        self.released = end
        return end - start

    def zero_from(self, pos: int) -> None:
        """Zero [pos, file_size) without touching pages that are already zero (sparse holes).

        Holes are skipped with SEEK_DATA/SEEK_HOLE (which see pages dirtied through the map),
        so zeroing the tail of a 1 GiB segment costs what was written there, not 1 GiB of reads.
        A file whose bytes were zeroed here is ``cut_unsynced`` until its next fdatasync.
        """
        end = self.file_size
        while pos < end:
            try:
                data = os.lseek(self._fd, pos, os.SEEK_DATA)
            except OSError as exc:  # ENXIO: only holes from pos on; else no SEEK_DATA here
                if exc.errno != errno.ENXIO:
                    self._zero_scan(pos, end)
                return
            hole = min(os.lseek(self._fd, data, os.SEEK_HOLE), end)
            self._zero_scan(max(pos, data), hole)
            pos = hole

    def _zero_scan(self, pos: int, end: int) -> None:
        """Zero the non-zero chunks of [pos, end)."""
        while pos < end:
            n = min(_ZERO_CHUNK - pos % _ZERO_CHUNK, end - pos)
            chunk = os.pread(self._fd, n, pos)
            if chunk.count(0) != len(chunk):
                os.pwrite(self._fd, bytes(n), pos)
                self.cut_unsynced = True
            pos += n

    def close(self) -> None:
        try:
            self.view.release()
            self.mm.close()
        except BufferError:
            # a reader still holds a view of the map; the mapping is freed once it drops it
            pass
        finally:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def destroy(self) -> None:
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
