"""FileLog: the Raft log in DLedger's own on-disk format (``store/file/DLedgerMmapFileStore.java``
and ``entry/DLedgerEntryCoder.java`` in openmessaging/dledger 0.3.1.2).

Theory of operation
-------------------
Two queues of memory-mapped files (broker/store/mapped_file_queue.py, files named by their
20-digit start offset), under ``<dir>/data`` and ``<dir>/index``, in the formats of
entry_coder.py (which the tests and the reader of Apache stores decode them with):

* data: entries, each a 48-byte header (big-endian ``int magic=1, int size, long index, long
  term, long pos, int channel, int chainCrc=0, int bodyCrc=0, int bodyLength``) then the body.
  An entry never straddles a data file: where it would not fit (log.place_entry) the rest of
  the file gets a blank, ``int -1, int remaining``, and the entry starts the next file.
* index: one 32-byte unit per entry (``int magic, long pos, int size, long index, long term``);
  entry ``i`` is at byte ``i * 32``, so a lookup is one unpack and one slice.

With ``patch_physical_offset`` (the broker's logs: every body is a CommitLog record), ``append``
writes the entry's ``pos + 48`` into the record's PHYSICALOFFSET first, as RocketMQ's
DLedgerCommitLog append hook does, so the records in the data files say where they are, as in
an Apache store (broker/dledger/broker/dledger_commitlog.py reads both the same way).

An append is two memory copies, data first and then the index unit, with no system call: a
process crash (SIGKILL) keeps both in the page cache.  ``flush`` (the node calls it every
``flushFileInterval`` from a worker thread) makes them durable against power loss.

Recovery (``open_file_log``): the index's end is found by binary search for the first unit
whose magic is not 1 (units are written in order and files are zero beyond what was written).
Walking back from there, the last unit whose fields agree with the data header at its
``pos`` (magic, size, index, term, pos) is the last whole entry: a unit is written after its
entry's bytes, so after a process crash an entry with a whole unit is whole.  A power cut can
keep a header and its unit and tear the body, and DLedger's header has no body CRC: so in a
broker's log (``patch_physical_offset``) the records of the entries in the last
``TAIL_CHECK_BYTES`` are checked too (structure, PHYSICALOFFSET, body CRC), and the log ends
before the first that fails.  Everything after the end, in both queues, is zeroed and later
files deleted (a torn entry or unit can never come back).  ``truncate`` cuts the same way, after the last entry kept, so a truncated log and the same log reopened
are byte for byte the same files.

Retention (``drop_head``, driven by broker/dledger/broker/log_retention.py) removes whole data
files from the head, never the last one, and the index files wholly below what is left;
``begin_index`` is then the first entry of the first data file, which is where ``open_file_log``
finds it again (a data file always starts with an entry).  The new first entry must already be on
disk, so a power cut cannot leave a log whose head is gone and whose first kept entry is torn.

Reset (``reset``, a follower the leader's retention left behind: raft/entry_handler.py, "Reset";
DLedger's ``truncate`` with ``rebuildWithPos``): every data and index file goes, and the log
begins again with the leader's first entry, at its position ``P`` (a data file's start, where
recovery looks for the begin index: a new data file named ``P``) and its index unit at
``B * 32`` (in an index file whose units below ``B`` stay zero, sparse: recovery's search for the
index end starts at the begin index).  A crash inside it must not leave a mix of old files and
new ones, so a marker file ``index/resetting`` is written and synced first, the old files are
unlinked newest first (the directories synced), the new entry and unit written and synced, and
the marker removed last.  ``open_file_log`` finding the marker finishes the job the simple way:
it deletes every data and index file and opens an empty log (entry_handler.py: an empty member
is reset again by its leader; everything the old files held was below the leader's first entry).
``reset`` is synchronous, syncs included: it is rare, and the answer to the leader must not leave
before the new log is durable.

Invariants: ``end_index + 1 == index bytes / 32``; ``write_pos`` == the data queue's end ==
``get(end_index).pos + size`` (0 when empty); every index unit matches its header; nothing
but zeros after ``write_pos``.
The newest entries (at most ``RECENT_ENTRIES`` of them and ``RECENT_BYTES`` of bodies) are
also kept as the Entry values they were written from, so the readers of a fresh entry (one
replicator per follower on the leader, the applier on every member) get it without a header
parse and a body copy out of the map: on a 3-member group that is a third of a leader's log
cost.  The cache holds only entries that are in the files; ``truncate`` drops those it cuts.
The byte bound keeps a member's heap bounded under large messages (an entry is one record,
up to the 4 MiB message limit: 8192 of them could be 32 GiB); 64 MiB is generous because a
follower's applier can lag by thousands of entries under load and a miss costs a parse and a
copy.

RSS: pages written through the maps count toward the process's RSS until dropped.  Once
nothing was written for ``QUIET_S`` (``quiet_release_due``), the flush caller empties the
cache on the loop's thread (nobody reads a fresh entry any more), then ``release_quiet`` drops
every flushed page (``MappedFile.release_behind``) and trims the heap (broker/store/heap.py)
in a worker thread: an idle member holds no log pages.  While entries keep coming the pages
stay mapped: releasing them in steps during load has not been shown to be free of a throughput
cost (docs/benchmarks.md).

Thread safety: only ``flush`` may run in another thread, concurrently with the loop's appends
(see :class:`FileLog`).
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
from collections.abc import Callable

import attrs

from broker.dledger.driver.entry_coder import BLANK, ENTRY_HEADER, INDEX_UNIT, INDEX_UNIT_SIZE
from broker.dledger.raft.log import BLANK_MAGIC_CODE, MIN_BLANK_LEN, place_entry
from broker.dledger.raft.messages import ENTRY_HEADER_SIZE, ENTRY_MAGIC, Entry
from broker.store.commitlog_scan import check_records
from broker.store.heap import trim_heap
from broker.store.mapped_file import MappedFile
from broker.store.mapped_file_queue import MappedFileQueue
from common.message import MESSAGE_MAGIC_CODE, PHYSICAL_OFFSET_POSITION

__all__ = ["INDEX_UNIT_SIZE", "FileLog", "open_file_log"]

log = logging.getLogger(__name__)

DEFAULT_DATA_FILE_SIZE = 1 << 30
DEFAULT_INDEX_FILE_SIZE = INDEX_UNIT_SIZE * 5 * 1024 * 1024

# a record's magic code (bytes 4..8) and PHYSICALOFFSET (bytes 28..36): the append hook
_MAGIC_AT = 4
_PHYS_AT = PHYSICAL_OFFSET_POSITION
_PHYS_END = PHYSICAL_OFFSET_POSITION + 8
_RECORD_MAGIC = struct.pack(">i", MESSAGE_MAGIC_CODE)
_PHYS = struct.Struct(">q")
# the formats, byte for byte: entry_coder.py
_HEADER = ENTRY_HEADER
_UNIT = INDEX_UNIT
_BLANK = BLANK
# entries kept in memory after their write (see the module doc): 8192 x 1 KiB is 8 MiB, and a
# follower further behind than that is read from the files as before
RECENT_ENTRIES = 8192
RECENT_BYTES = 64 << 20
# head data files dropped per retention round at most (the classic DELETE_FILES_BATCH_MAX)
DROP_FILES_MAX = 10
# how long without writes counts as quiet: flush then releases pages, cache and heap
QUIET_S = 0.5
# the log's last bytes whose records recovery checks (``_first_damaged_record``): a power cut
# tears what was written since the last flush (``flushFileInterval``, 10 ms); 16 MiB of 1 KiB
# entries is ~16k compiled checks, tens of milliseconds at start
TAIL_CHECK_BYTES = 16 << 20
# in the index directory while a reset runs (module doc)
RESET_MARKER = "resetting"


@attrs.define(eq=False)
class FileLog:
    """A :class:`~broker.dledger.raft.log.RaftLog` on DLedger's files; :func:`open_file_log` makes
    one.

    Every call runs on the owner's thread (the node's event loop) except :meth:`flush`, which
    may run in a worker thread at the same time as ``append``/``append_entry``/``get``.
    ``truncate`` and ``close`` wait only for a flush's bookkeeping, never for its syncs (see
    :meth:`flush`); appends never wait."""

    data: MappedFileQueue
    index: MappedFileQueue
    # entries _begin .. _end; _end == -1 when empty
    _end: int = -1
    # the first entry held: 0 until retention dropped head files (``drop_head``); once above
    # 0 the log is never empty again (retention keeps a committed entry at the head)
    _begin: int = 0
    # term of entry _end
    _end_term: int = -1
    # held to take or record a flush's jobs, and to delete, cut or close files
    _files_lock: threading.Lock = attrs.field(factory=threading.Lock)
    # truncations so far: a flush records its syncs only if none came in between
    _cuts: int = 0
    # set by close: a later flush has nothing left to sync
    _closed: bool = False
    # index -> Entry for the newest entries written, in index order (see the module doc)
    _recent: dict[int, Entry] = attrs.field(factory=dict)
    # the bodies' bytes in _recent
    _recent_bytes: int = 0
    # called after every truncation with (first index cut, the data end after it), on the
    # loop's thread: the store over these files (broker/dledger/broker/commitlog_view.py)
    # stops serving what was cut before anything can be written in its place
    truncate_listeners: list[Callable[[int, int], None]] = attrs.field(factory=list)
    # flush's quiet release: monotonic time of the last flush that had bytes to sync, and
    # whether everything flushed since then was released
    release_pages: bool = True
    # entry bodies are CommitLog records: append writes pos + 48 into their PHYSICALOFFSET
    patch_physical_offset: bool = False
    _last_write: float = 0.0
    _settled: bool = True

    # --- RaftLog -------------------------------------------------------------------------
    @property
    def begin_index(self) -> int:
        return self._begin if self._end >= 0 else -1

    @property
    def end_index(self) -> int:
        return self._end

    @property
    def end_term(self) -> int:
        return self._end_term

    @property
    def write_pos(self) -> int:
        return self.data.max_offset

    def _unit(self, index: int) -> tuple[int, int, int, int, int] | None:
        if index < self._begin or index > self._end:
            return None
        offset = index * INDEX_UNIT_SIZE
        mf = self.index.find(offset)
        if mf is None:
            return None
        return _UNIT.unpack_from(mf.view, offset - mf.file_from_offset)

    def get(self, index: int) -> Entry | None:
        entry = self._recent.get(index)
        if entry is not None:
            return entry
        unit = self._unit(index)
        if unit is None:
            return None
        _magic, pos, size, _index, term = unit
        mf = self.data.find(pos)
        if mf is None:
            return None
        at = pos - mf.file_from_offset
        view = mf.view
        magic, _size, _i, _t, _p, channel, _c1, _c2, body_len = _HEADER.unpack_from(view, at)
        body = bytes(view[at + ENTRY_HEADER_SIZE : at + ENTRY_HEADER_SIZE + body_len])
        return Entry(index=index, term=term, pos=pos, body=body, magic=magic, channel=channel)

    def term_at(self, index: int) -> int:
        unit = self._unit(index)
        return -1 if unit is None else unit[4]

    def append(self, term: int, body: bytes) -> Entry:
        pos = place_entry(self.write_pos, ENTRY_HEADER_SIZE + len(body), self.data.file_size)
        if (
            self.patch_physical_offset
            and len(body) >= _PHYS_END
            and body[_MAGIC_AT : _MAGIC_AT + 4] == _RECORD_MAGIC
        ):
            # DLedgerCommitLog's append hook: the record's PHYSICALOFFSET is where it lands,
            # written on the leader before the entry is stored or pushed; followers get the
            # patched body in the entry.  Bodies that are not records (none in the broker)
            # are kept as they are.
            body = b"".join(
                (body[:_PHYS_AT], _PHYS.pack(pos + ENTRY_HEADER_SIZE), body[_PHYS_END:])
            )
        else:
            body = bytes(body)
        entry = Entry(index=self._end + 1, term=term, pos=pos, body=body)
        self._write(entry)
        return entry

    def append_entry(self, entry: Entry) -> bool:
        if entry.index != self._end + 1:
            return False
        if entry.pos != place_entry(self.write_pos, entry.size, self.data.file_size):
            return False
        self._write(entry)
        return True

    def truncate(self, index: int) -> None:
        """Drop entries ``>= index``; the data end goes back to entry ``index - 1``'s end.

        Not to entry ``index``'s pos: when that entry had opened a new file, the blank before
        it is undone too, so the next entry is placed from the previous one's end alone, as on
        every other member (a leader's smaller entry may fit where the blank was)."""
        if index > self._end:
            return
        if index <= self._begin and self._begin > 0:
            # never happens by the core's rules: only entries above the committed index are
            # cut, and retention keeps the head entry committed
            raise ValueError(f"cannot truncate at {index}: the log begins at {self._begin}")
        recent = self._recent
        for cut in range(max(index, self._end - RECENT_ENTRIES), self._end + 1):
            entry = recent.pop(cut, None)
            if entry is not None:
                self._recent_bytes -= len(entry.body)
        with self._files_lock:
            self._cuts += 1
            if index <= 0:
                # (the first data file stays where it is: dividedCommitlogOffset)
                self.data.truncate_dirty(self.data.min_offset)
                self.index.truncate_dirty(0)
                self._end, self._end_term = -1, -1
            else:
                unit = self._unit(index - 1)
                assert unit is not None
                _magic, pos, size, _index, term = unit
                self.data.truncate_dirty(pos + size)
                self.index.truncate_dirty(index * INDEX_UNIT_SIZE)
                self._end, self._end_term = index - 1, term
        for listener in self.truncate_listeners:
            listener(index, self.write_pos)

    def reset(self, first: Entry) -> None:
        """The log becomes ``first`` alone, at ``first.pos`` (module doc, "Reset"); durable when
        it returns.  ValueError (nothing changed) unless ``first.pos`` starts a data file and
        ``first`` fits one; OSError (a full disk) after the old files went leaves the log
        empty."""
        data, index = self.data, self.index
        if first.pos % data.file_size:
            raise ValueError(f"a log cannot begin at {first.pos}: not a data file's start")
        place_entry(first.pos, first.size, data.file_size)  # ValueError when it cannot fit
        marker = os.path.join(index.store_dir, RESET_MARKER)
        self.drop_recent()
        with self._files_lock:
            self._cuts += 1
            os.makedirs(index.store_dir, exist_ok=True)
            os.makedirs(data.store_dir, exist_ok=True)
            _write_synced(marker, f"{first.index} {first.pos}\n".encode())
            for queue in (data, index):
                for mf in reversed(queue.files):  # newest first: a crash leaves a cut log
                    mf.destroy()
                queue.files = []
                sync_dir(queue.store_dir)
            self._begin, self._end, self._end_term = 0, -1, -1
            unit_at = first.index * INDEX_UNIT_SIZE
            created = [data.create(first.pos), index.create(unit_at - unit_at % index.file_size)]
            imf = created[1]
            imf.wrote = unit_at - imf.file_from_offset
            imf.allocated = imf.wrote - imf.wrote % imf.chunk  # the zeros below stay sparse
            imf.flushed = imf.released = imf.wrote
            self._begin = first.index
            try:
                self._write(first)
                for mf in created:
                    os.fdatasync(mf.fileno())
                    mf.flushed = mf.wrote
                sync_dir(data.store_dir)
                sync_dir(index.store_dir)
            except OSError:
                for queue in (data, index):
                    for mf in queue.files:
                        mf.destroy()
                    queue.files = []
                self.drop_recent()
                self._begin, self._end, self._end_term = 0, -1, -1
                raise
            os.unlink(marker)
            sync_dir(index.store_dir)
        log.warning(
            "dledger log reset: it begins at entry %d (pos %d), all older files deleted",
            first.index,
            first.pos,
        )

    # --- writing ----------------------------------------------------------------------------
    def _write(self, entry: Entry) -> None:
        size = entry.size
        data = self.data
        mf = data.last()
        old = created = new_index = None
        if mf is None or mf.is_full:
            mf = created = data.create(entry.pos - entry.pos % data.file_size)
        elif mf.end_offset != entry.pos:
            # the entry moves to the next file: the rest of this one gets a filler (below)
            old = mf
            mf = created = data.create(old.file_from_offset + data.file_size)
        imf = self.index.last()
        if imf is None or imf.is_full:
            imf = new_index = self.index.create(
                0 if imf is None else imf.file_from_offset + imf.file_size
            )
        try:
            # every block this entry needs is reserved before a byte is written: an ENOSPC
            # here (a full disk) leaves the log exactly as it was, files included
            if old is not None:
                old.reserve_blocks(data.file_size)  # the filler is served too (mapped_file.py)
            mf.reserve_blocks(mf.wrote + size)
            imf.reserve_blocks(imf.wrote + INDEX_UNIT_SIZE)
        except OSError:
            for queue, fresh in ((data, created), (self.index, new_index)):
                if fresh is not None and queue.files and queue.files[-1] is fresh:
                    queue.files.pop()
                    fresh.destroy()
            raise
        if old is not None:
            remaining = old.remaining
            if remaining >= MIN_BLANK_LEN:
                old.append(_BLANK.pack(BLANK_MAGIC_CODE, remaining))
            old.wrote = data.file_size  # the rest is zero already (sparse)
        header = _HEADER.pack(
            entry.magic,
            size,
            entry.index,
            entry.term,
            entry.pos,
            entry.channel,
            0,
            0,
            len(entry.body),
        )
        pos = mf.wrote
        view = mf.view
        view[pos : pos + ENTRY_HEADER_SIZE] = header
        view[pos + ENTRY_HEADER_SIZE : pos + size] = entry.body
        mf.wrote = pos + size
        imf.append(_UNIT.pack(entry.magic, entry.pos, size, entry.index, entry.term))
        self._end = entry.index
        self._end_term = entry.term
        recent = self._recent
        recent[entry.index] = entry
        held = self._recent_bytes + len(entry.body)
        if held > RECENT_BYTES or len(recent) > RECENT_ENTRIES:
            # the cache is the consecutive indexes oldest..entry.index (appends are consecutive,
            # truncate cuts the tail), so the oldest is found by arithmetic: next(iter(recent))
            # would walk every slot deleted from the front of the dict, O(n) per append
            oldest = entry.index - len(recent) + 1
            while len(recent) > 1 and (held > RECENT_BYTES or len(recent) > RECENT_ENTRIES):
                held -= len(recent.pop(oldest).body)
                oldest += 1
        self._recent_bytes = held

    # --- durability -------------------------------------------------------------------------
    def has_unflushed(self) -> bool:
        """Bytes were written that no flush has synced yet (loop thread: the flusher asks
        before it hands ``flush`` to a worker thread, which costs more than an idle flush)."""
        return bool(self.data.flush_jobs() or self.index.flush_jobs())

    def flush(self) -> None:
        """fdatasync what was written since the last flush; no system call when nothing was.
        Safe in a worker thread while the loop appends.  The lock is held to take and to record
        the jobs, not through the syncs (each syncs a duplicate descriptor), so a ``truncate``
        on the loop never waits for the disk; a flush that a cut overlapped records nothing
        (what it synced may be gone or zeroed), and the next one syncs what is left."""
        with self._files_lock:
            if self._closed:
                return
            todo = self.data.flush_jobs() + self.index.flush_jobs()
            jobs = [(mf, mf.wrote, os.dup(mf.fileno())) for mf in todo]
            cuts = self._cuts
        if not jobs:
            return
        try:
            for _mf, _end, fd in jobs:
                os.fdatasync(fd)
        finally:
            for _mf, _end, fd in jobs:
                os.close(fd)
        with self._files_lock:
            if self._cuts == cuts and not self._closed:
                for mf, end, _fd in jobs:
                    mf.flushed = max(mf.flushed, end)
            self._last_write, self._settled = time.monotonic(), False

    # --- retention (broker/dledger/broker/log_retention.py decides what may go) ---------------
    def first_index_of(self, mf: MappedFile) -> int:
        """The index of the entry a data file starts with (every data file starts with one:
        an entry never straddles files); -1 when the file holds none yet."""
        if mf.wrote < ENTRY_HEADER_SIZE:
            return -1
        magic, _size, index, *_rest = _HEADER.unpack_from(mf.view, 0)
        return index if magic == ENTRY_MAGIC else -1

    def drop_head(self, upto: int, expired: Callable[[MappedFile], bool]) -> list[MappedFile]:
        """Remove head data files (and the index files wholly below them) from the log, oldest
        first, while the next file's first entry is at most ``upto`` and on disk and
        ``expired(file)`` says the file may go; returns the removed files, closed, for the
        caller to unlink.  The last data file is never dropped, so neither is the log's end.

        ``begin_index`` becomes the first entry of the new first data file.  A file is kept if
        its own bytes are not all flushed: what stays must recover after a power cut without
        the files that went (recovery cannot walk below ``begin_index``)."""
        data, index = self.data, self.index
        count = 0
        new_begin = self._begin
        for i in range(min(len(data.files) - 1, DROP_FILES_MAX)):
            mf, nxt = data.files[i], data.files[i + 1]
            first = self.first_index_of(nxt)
            if first < 0 or first > upto or not self.on_disk(first):
                break
            if mf.flushed < mf.wrote or not expired(mf):
                break
            count, new_begin = i + 1, first
        if not count or not self._files_lock.acquire(blocking=False):
            # held by a flush's bookkeeping or the quiet release's walk (worker threads):
            # on the loop's thread this does not wait; the next round tries again
            return []
        try:
            dropped = data.take_head(count)
            below = sum(
                1 for f in index.files[:-1] if f.file_from_offset + f.file_size <= new_begin * 32
            )
            dropped += index.take_head(below)
            self._begin = new_begin
            for mf in dropped:
                mf.close()
        finally:
            self._files_lock.release()
        recent = self._recent
        if recent:
            oldest = self._end - len(recent) + 1
            while oldest < new_begin and recent:
                self._recent_bytes -= len(recent.pop(oldest).body)
                oldest += 1
        log.info("dledger log: dropped %d head files, the log begins at %d", count, new_begin)
        return dropped

    def on_disk(self, index: int) -> bool:
        """Entry ``index`` and its index unit are flushed (they survive a power cut)."""
        unit = self._unit(index)
        if unit is None:
            return False
        _magic, pos, size, _i, _t = unit
        mf = self.data.find(pos)
        imf = self.index.find(index * INDEX_UNIT_SIZE)
        return (
            mf is not None
            and imf is not None
            and mf.flushed >= pos - mf.file_from_offset + size
            and imf.flushed >= index * INDEX_UNIT_SIZE - imf.file_from_offset + INDEX_UNIT_SIZE
        )

    # --- the quiet release (see the module doc) ----------------------------------------------
    def quiet_release_due(self) -> bool:
        """Nothing was written for QUIET_S and the pages are not released yet (loop thread)."""
        return (
            self.release_pages
            and not self._settled
            and time.monotonic() - self._last_write >= QUIET_S
        )

    def drop_recent(self) -> None:
        """Empty the fresh-entry cache; on the loop's thread, like every other cache change."""
        self._recent = {}
        self._recent_bytes = 0

    def release_quiet(self) -> None:
        """Drop every flushed page from RSS and trim the heap; blocking, for a worker thread."""
        with self._files_lock:
            if self._closed:
                return
            for queue in (self.data, self.index):
                for mf in queue.files:
                    mf.release_behind(mf.flushed)
            self._settled = True
        trim_heap()

    def close(self) -> None:
        self.flush()
        with self._files_lock:
            if not self._closed:
                self._closed = True
                self.data.close()
                self.index.close()


def _header_matches(data: MappedFileQueue, unit: tuple[int, int, int, int, int], i: int) -> bool:
    magic, pos, size, index, term = unit
    if magic != ENTRY_MAGIC or index != i or size < ENTRY_HEADER_SIZE:
        return False
    mf = data.find(pos)
    if mf is None:
        return False
    at = pos - mf.file_from_offset
    if at + size > data.file_size:
        return False
    h = _HEADER.unpack_from(mf.view, at)  # magic size index term pos ... bodyLength
    return h[:5] == (ENTRY_MAGIC, size, i, term, pos) and h[8] == size - ENTRY_HEADER_SIZE


def _write_synced(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    sync_dir(os.path.dirname(path))


def sync_dir(path: str) -> None:
    """fsync a directory: the renames, creations and unlinks in it are durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _finish_reset(data_dir: str, index_dir: str) -> None:
    """A reset was cut short (its marker is there): delete every data and index file, then the
    marker (module doc, "Reset")."""
    log.warning("dledger log: a log reset was interrupted; the log starts empty")
    for directory in (index_dir, data_dir):
        if os.path.isdir(directory):
            for name in os.listdir(directory):
                if name.isdigit() and len(name) == 20:
                    os.unlink(os.path.join(directory, name))
            sync_dir(directory)
    os.unlink(os.path.join(index_dir, RESET_MARKER))
    sync_dir(index_dir)


def _first_damaged_record(
    data: MappedFileQueue, index: MappedFileQueue, begin: int, end: int
) -> tuple[int, str] | None:
    """(index, why) of the first entry among those in the log's last ``TAIL_CHECK_BYTES``
    whose body is not one intact CommitLog record (structure, PHYSICALOFFSET == pos + 48, body
    CRC: commitlog_scan.check_records), or None.

    A whole header and index unit do not make a whole entry: a power cut mid-write (or a disk
    that lost a write) can keep both and tear the body, and DLedger 0.3.1.2 writes no body CRC
    into the header.  On the write-once layout that body is the record readers are served, so
    the log ends before it, like a torn entry; the leader refills the rest.  A legacy no-op
    (no body) has nothing to check."""
    last = _unit_at(index, end)
    window_from = last[1] + last[2] - TAIL_CHECK_BYTES
    first = end
    while first > begin and _unit_at(index, first - 1)[1] >= window_from:
        first -= 1
    for i in range(first, end + 1):
        _magic, pos, size, _index, _term = _unit_at(index, i)
        if size == ENTRY_HEADER_SIZE:
            continue
        mf = data.find(pos)
        if mf is None:
            return i, "its data file is missing"
        at = pos - mf.file_from_offset + ENTRY_HEADER_SIZE
        stop = pos - mf.file_from_offset + size
        where, why = check_records(mf.view, mf.file_from_offset, at, stop)
        if why is not None:
            return i, f"at {mf.file_from_offset + where}: {why}"
        if where != stop:
            return i, f"the record ends at {mf.file_from_offset + where}, not at the entry's end"
    return None


def _unit_at(index: MappedFileQueue, i: int) -> tuple[int, int, int, int, int]:
    offset = i * INDEX_UNIT_SIZE
    mf = index.find(offset)
    assert mf is not None
    return _UNIT.unpack_from(mf.view, offset - mf.file_from_offset)


def _units_written(index: MappedFileQueue, begin: int) -> int:
    """Units up to the first one whose magic is not 1 (binary search in the last file, from the
    begin index on: a reset log's first index file is zero below it)."""
    if not index.files:
        return 0
    last = index.files[-1]
    per_file = index.file_size // INDEX_UNIT_SIZE
    first_unit = last.file_from_offset // INDEX_UNIT_SIZE
    lo, hi = min(max(0, begin - first_unit), per_file), per_file  # the answer is in [lo, hi]
    while lo < hi:
        mid = (lo + hi) // 2
        (magic,) = struct.unpack_from(">i", last.view, mid * INDEX_UNIT_SIZE)
        if magic == ENTRY_MAGIC:
            lo = mid + 1
        else:
            hi = mid
    return last.file_from_offset // INDEX_UNIT_SIZE + lo


def open_file_log(
    directory: str,
    *,
    data_file_size: int = DEFAULT_DATA_FILE_SIZE,
    index_file_size: int = DEFAULT_INDEX_FILE_SIZE,
    patch_physical_offset: bool = False,
    data_dir: str | None = None,
) -> FileLog:
    """Map ``<directory>/{data,index}`` (the data files in ``data_dir`` when given: RocketMQ's
    storePathDLedgerCommitLog) and recover the log's end (see the module doc)."""
    if index_file_size % INDEX_UNIT_SIZE:
        raise ValueError(f"index file size {index_file_size} is not a multiple of 32")
    data = MappedFileQueue(data_dir or os.path.join(directory, "data"), data_file_size)
    index = MappedFileQueue(os.path.join(directory, "index"), index_file_size)
    if os.path.exists(os.path.join(index.store_dir, RESET_MARKER)):
        _finish_reset(data.store_dir, index.store_dir)
    data.load()
    index.load()
    flog = FileLog(data, index, patch_physical_offset=patch_physical_offset)
    if data.files:
        flog._begin = max(0, flog.first_index_of(data.files[0]))
    n = _units_written(index, flog._begin)
    end = n - 1
    while end >= flog._begin:
        offset = end * INDEX_UNIT_SIZE
        mf = index.find(offset)
        assert mf is not None
        unit = _UNIT.unpack_from(mf.view, offset - mf.file_from_offset)
        if _header_matches(data, unit, end):
            break
        end -= 1
    if patch_physical_offset and end >= flog._begin:
        damaged = _first_damaged_record(data, index, flog._begin, end)
        if damaged is not None:
            bad, why = damaged
            log.warning("dledger log recovery: entry %d holds a damaged record (%s)", bad, why)
            end = bad - 1
    if end < n - 1:
        # an index unit is synced apart from its entry's bytes: a power cut can keep units of
        # entries whose data it lost, as many as one flush interval wrote
        log.warning("dledger log recovery: entries %d..%d are torn, cutting them", end + 1, n - 1)
    if flog._begin > 0 and end < flog._begin:
        # retention dropped the head only once this entry was on disk: its loss is damage
        raise OSError(f"{directory}: the log's first entry {flog._begin} is not whole")
    if end >= 0:
        offset = end * INDEX_UNIT_SIZE
        mf = index.find(offset)
        assert mf is not None
        _m, pos, size, _i, term = _UNIT.unpack_from(mf.view, offset - mf.file_from_offset)
        data.truncate_dirty(pos + size)
        flog._end, flog._end_term = end, term
    else:
        # an empty log keeps its first data file where it is: a classic store switched to
        # DLedger starts its data at dividedCommitlogOffset (broker/dledger/broker/
        # commitlog_view.start_after_classic), not at 0
        data.truncate_dirty(data.min_offset)
    index.truncate_dirty((end + 1) * INDEX_UNIT_SIZE)
    for queue in (data, index):
        for f in queue.files:
            f.flushed = f.wrote
    return flog
