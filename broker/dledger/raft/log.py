"""The Raft log the core writes to: its Protocol, DLedger's placement rule, and an in-memory log.

Theory of operation
-------------------
Entries are numbered from 0 without gaps.  Each entry also has a ``pos``: the absolute position
of its 48-byte header in DLedger's data files (``entry/DLedgerEntryCoder.java`` in
openmessaging/dledger 0.3.1.2).  Positions are a pure function of the entry sizes and the data file
size (:func:`place_entry`): an entry never straddles a data file; when it does not fit in what is
left of the current file, the rest of that file is a blank (``int -1, int remaining``) and the entry
starts the next file.  So every member computes the same ``pos`` for the same sequence of entries,
which is what lets a follower check ``pos == its write position`` (DLedger's ``appendAsFollower``)
and lets the leader's TRUNCATE name a position.

The core mutates the log synchronously (the file log is memory-mapped, as DLedger's is: a write
is in the page cache, and so survives a process crash, when the call returns; the node's flush
task makes it durable against power loss every ``flushFileInterval``).

:class:`MemoryLog` keeps the same rules in lists; the file log
(broker/dledger/driver/mmap_file_store.py) and this one pass one conformance suite
(tests/broker/dledger/test_log_conformance.py).

Invariants (both implementations)
* indexes are ``begin_index .. end_index`` with no gap; ``end_index == -1`` when empty;
* ``get(i).pos`` is ``place_entry`` applied to the previous entry's end;
* terms never decrease along the log;
* ``truncate(i)`` removes exactly the entries ``>= i`` and puts the write position back at the
  end of entry ``i - 1`` (entry ``i``'s ``pos`` unless entry ``i`` had opened a new file: that
  blank is undone too, so the next ``pos`` depends on the kept entries only, as on the leader);
* ``reset(e)`` leaves exactly one entry, ``e``, at ``e.pos``: the log begins there.  Only at the
  start of a data file (``e.pos % file_size == 0``; else ValueError and nothing changes),
  because that is where a log that lost its head begins: retention drops whole data files, and
  DLedger's store finds its first index in the first data file's first header;
* when ``begin_index > 0`` the entry there is committed: retention drops files only up to the
  committed index (broker/dledger/broker/log_retention.py), and a follower resets only to an
  entry its leader reports committed (entry_handler.py).  The core counts on it: its committed
  index starts at ``begin_index`` at least (core.py).
"""

from __future__ import annotations

from typing import Protocol

import attrs

from broker.dledger.raft.messages import ENTRY_HEADER_SIZE, Entry

__all__ = ["MIN_BLANK_LEN", "MemoryLog", "RaftLog", "place_entry"]

# MmapFileList.MIN_BLANK_LEN: the smallest blank (magic + remaining) a file end can take
MIN_BLANK_LEN = 8
BLANK_MAGIC_CODE = -1


def place_entry(write_pos: int, size: int, file_size: int) -> int:
    """Where an entry of ``size`` bytes goes when the data files end at ``write_pos``.

    The entry moves to the next file when it would leave less than a blank's room at the end
    (DLedger's ``preAppend``); the caller writes the blank over ``[write_pos, result)``."""
    if size + MIN_BLANK_LEN > file_size:
        raise ValueError(f"entry of {size} bytes does not fit a {file_size}-byte data file")
    used = write_pos % file_size
    if used + size + MIN_BLANK_LEN > file_size and used != 0:
        return write_pos - used + file_size
    return write_pos


class RaftLog(Protocol):
    """What the Raft core needs of a log.  All calls are synchronous and never block on I/O
    beyond a memory copy."""

    @property
    def begin_index(self) -> int:
        """First index held (0 unless old files were deleted); -1 when empty."""
        ...

    @property
    def end_index(self) -> int:
        """Last index held; -1 when empty."""
        ...

    @property
    def end_term(self) -> int:
        """Term of the last entry; -1 when empty."""
        ...

    @property
    def write_pos(self) -> int:
        """Where the next entry's header would go before placement (the data end)."""
        ...

    def get(self, index: int) -> Entry | None:
        """The entry at ``index``; None outside ``begin_index..end_index``."""
        ...

    def term_at(self, index: int) -> int:
        """Term of the entry at ``index``; -1 when there is none."""
        ...

    def append(self, term: int, body: bytes) -> Entry:
        """Leader append: the next index, placed by :func:`place_entry`; returns it stored."""
        ...

    def append_entry(self, entry: Entry) -> bool:
        """Follower append of the leader's entry.  False (nothing written) unless
        ``entry.index == end_index + 1`` and ``entry.pos`` is where this log would place it."""
        ...

    def truncate(self, index: int) -> None:
        """Remove every entry ``>= index`` (nothing when ``index > end_index``); the write
        position goes back to the end of the last entry kept."""
        ...

    def reset(self, first: Entry) -> None:
        """Drop every entry and begin again with ``first`` alone, at ``first.pos`` (DLedger's
        TRUNCATE of a follower that holds nothing the leader still has: its store rebuilt at
        the entry's position).  ``first.pos`` must start a data file, else ValueError and the
        log is unchanged.  Durable against power loss when it returns; a crash inside it
        leaves either the old log cut somewhere or an empty log, never a mix."""
        ...


def _empty_entries() -> list[Entry]:
    return []


@attrs.define(eq=False)
class MemoryLog:
    """The in-memory :class:`RaftLog` of the simulator and the tests."""

    file_size: int = 1 << 30
    # entries[i].index == begin + i; never a gap
    _entries: list[Entry] = attrs.field(factory=_empty_entries)
    # the data end: after the last entry, or its truncation point
    _write_pos: int = 0

    @property
    def begin_index(self) -> int:
        return self._entries[0].index if self._entries else -1

    @property
    def end_index(self) -> int:
        return self._entries[-1].index if self._entries else -1

    @property
    def end_term(self) -> int:
        return self._entries[-1].term if self._entries else -1

    @property
    def write_pos(self) -> int:
        return self._write_pos

    def get(self, index: int) -> Entry | None:
        if not self._entries:
            return None
        i = index - self._entries[0].index
        if 0 <= i < len(self._entries):
            return self._entries[i]
        return None

    def term_at(self, index: int) -> int:
        entry = self.get(index)
        return -1 if entry is None else entry.term

    def append(self, term: int, body: bytes) -> Entry:
        pos = place_entry(self._write_pos, ENTRY_HEADER_SIZE + len(body), self.file_size)
        entry = Entry(index=self.end_index + 1, term=term, pos=pos, body=bytes(body))
        self._entries.append(entry)
        self._write_pos = pos + entry.size
        return entry

    def append_entry(self, entry: Entry) -> bool:
        if entry.index != self.end_index + 1:
            return False
        if entry.pos != place_entry(self._write_pos, entry.size, self.file_size):
            return False
        self._entries.append(entry)
        self._write_pos = entry.pos + entry.size
        return True

    def reset(self, first: Entry) -> None:
        if first.pos % self.file_size:
            raise ValueError(f"a log cannot begin at {first.pos}: not a data file's start")
        place_entry(first.pos, first.size, self.file_size)  # raises if it cannot fit a file
        self._entries = [first]
        self._write_pos = first.pos + first.size

    def drop_head(self, upto: int) -> int:
        """Retention's head drop for this log (the file log's ``drop_head``, without files and
        their ages): the log begins at the last entry ``<= upto`` that starts a data file,
        when that is above the current begin; returns the entries dropped."""
        if not self._entries:
            return 0
        begin = self._entries[0].index
        for entry in reversed(self._entries[: max(0, min(upto, self.end_index) - begin + 1)]):
            if entry.index > begin and entry.pos % self.file_size == 0:
                del self._entries[: entry.index - begin]
                return entry.index - begin
        return 0

    def truncate(self, index: int) -> None:
        entry = self.get(index)
        if entry is None:
            if self._entries and index <= self._entries[0].index:
                self._write_pos = self._entries[0].pos
                self._entries.clear()
            return
        del self._entries[index - self._entries[0].index :]
        if self._entries:
            last = self._entries[-1]
            self._write_pos = last.pos + last.size
        else:
            self._write_pos = entry.pos
