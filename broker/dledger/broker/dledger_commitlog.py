"""The read side of RocketMQ's ``DLedgerCommitLog`` over a store on disk, in RocketMQ's layout.

RocketMQ 4.9 in DLedger mode (``store/dledger/DLedgerCommitLog.java`` in apache/rocketmq, on
openmessaging/dledger 0.3.1.2) writes each message once: the DLedger data files hold entries
(driver/entry_coder.py) whose bodies are CommitLog records, and everything else points into
them.  :class:`DLedgerCommitLogReader` opens such a store read-only and answers what a broker's
read paths ask of it, by the same rules:

* Layout (``DLedgerCommitLog``'s constructor and ``DLedgerConfig``): the member's directory is
  ``<storePathRootDir>/dledger-<selfId>/`` with ``currterm``, ``checkpoint`` and ``index/``;
  the data files are in ``storePathDLedgerCommitLog`` when set, else in its ``data/``.  Data
  files are ``mappedFileSizeCommitLog`` bytes, named by the position they start at.
* A message's CommitLog offset (PHYSICALOFFSET, ConsumeQueue unit, offset msgId) is its
  entry's ``pos + 48``.  ``getMessage(offset)``: below ``dividedCommitlogOffset`` the classic
  CommitLog (``storePathCommitLog``) answers, else the data file holding ``offset``.
* ``dividedCommitlogOffset`` is the first data file's start (CommitLog files at or above it are
  never read).  A classic store switched to
  DLedger keeps its CommitLog files below it: at the switch RocketMQ closed the last classic
  file with a BLANK record (``int remaining, int BLANK_MAGIC_CODE``) at its write position and
  created the first data file at that file's end; DLedger's positions go on from there (entry
  indexes start at 0 all the same).
* Only committed entries are readable: RocketMQ's ``getMaxOffset`` is the committed position
  (the end of the entry at the checkpoint's ``committedIndex``); ConsumeQueue units at or past
  it are not served.

Opening walks the data files as ``DLedgerMmapFileStore.recover`` does (every entry's ``pos`` is
where it was read, indexes consecutive, terms not decreasing, each index unit agreeing with its
entry, blanks close files, a size of 0 ends the log) and keeps the entries it found; reads then
go by offset.  Nothing is written: the files are mapped read-only.

Invariants: ``entries[i].entry_index == begin_index + i``; ``committed_pos`` is the end of entry
``committed_index`` (``divided_commitlog_offset`` when nothing is committed); every record
returned carries the CommitLog offset it was asked for.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator

import attrs

from broker.dledger.driver import entry_coder as ec
from broker.dledger.driver.state_files import load_checkpoint, load_hard_state
from broker.store.consumequeue import CQ_UNIT, CQ_UNIT_SIZE
from common.message import MessageExt, decode_record
from common.message_id import decode_offset_msg_id

# ConsumeQueue.fillPreBlank's unit size (the unit is (0, INT_MAX, 0))
_BLANK_UNIT_SIZE = 0x7FFFFFFF

__all__ = [
    "DLedgerCommitLogReader",
    "DLedgerStoreError",
    "DLedgerStorePaths",
    "committed_position",
    "find_dledger_store",
    "open_dledger_commitlog",
]


class DLedgerStoreError(ValueError):
    """The files are not a consistent DLedger CommitLog (names the file and what is wrong), or
    an offset, msgId or queue offset names nothing readable."""


@attrs.frozen
class DLedgerStorePaths:
    """Where RocketMQ 4.9 keeps a DLedger member's files (``DLedgerConfig.getDefaultPath``,
    ``getDataStorePath``, ``getIndexStorePath``) and the classic ones around them."""

    root: str
    self_id: str
    store_path_dledger_commit_log: str | None = None
    store_path_commit_log: str | None = None

    @property
    def member_dir(self) -> str:
        return os.path.join(self.root, f"dledger-{self.self_id}")

    @property
    def data_dir(self) -> str:
        return self.store_path_dledger_commit_log or os.path.join(self.member_dir, "data")

    @property
    def index_dir(self) -> str:
        return os.path.join(self.member_dir, "index")

    @property
    def commit_log_dir(self) -> str:
        return self.store_path_commit_log or os.path.join(self.root, "commitlog")

    @property
    def consume_queue_dir(self) -> str:
        return os.path.join(self.root, "consumequeue")


@attrs.frozen
class StoredEntry:
    """One entry found in the data files: its header fields and where its body is."""

    entry_index: int
    term: int
    pos: int
    size: int

    @property
    def physical_offset(self) -> int:
        return self.pos + ec.BODY_OFFSET


class _Segments:
    """Files named by their 20-digit start offset, all of one size, mapped read-only."""

    def __init__(self, directory: str) -> None:
        self.files: list[tuple[int, mmap.mmap]] = []
        self.file_size = 0
        if not os.path.isdir(directory):
            return
        for name in sorted(n for n in os.listdir(directory) if n.isdigit() and len(n) == 20):
            path = os.path.join(directory, name)
            size = os.path.getsize(path)
            if size == 0:
                continue
            if self.file_size and size != self.file_size:
                raise DLedgerStoreError(f"{path}: {size} bytes, the others {self.file_size}")
            self.file_size = size
            with open(path, "rb") as f:
                self.files.append((int(name), mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)))
        for (a, _), (b, _) in zip(self.files, self.files[1:], strict=False):
            if b != a + self.file_size:
                raise DLedgerStoreError(f"{directory}: file {b:020d} does not follow {a:020d}")

    def find(self, offset: int) -> tuple[mmap.mmap, int] | None:
        """The file holding ``offset`` and the offset within it."""
        if not self.files or offset < self.files[0][0]:
            return None
        i = (offset - self.files[0][0]) // self.file_size
        if i >= len(self.files):
            return None
        start, mm = self.files[i]
        return mm, offset - start

    @property
    def min_offset(self) -> int:
        return self.files[0][0] if self.files else 0

    def close(self) -> None:
        for _start, mm in self.files:
            mm.close()
        self.files = []


@attrs.define(eq=False)
class DLedgerCommitLogReader:
    """A DLedger store opened read-only (:func:`open_dledger_commitlog`)."""

    paths: DLedgerStorePaths
    _data: _Segments
    _index: _Segments
    _classic: _Segments
    entries: list[StoredEntry]
    committed_index: int
    term: int
    _cq: dict[tuple[str, int], _Segments] = attrs.field(factory=dict)

    @property
    def begin_index(self) -> int:
        return self.entries[0].entry_index if self.entries else -1

    @property
    def end_index(self) -> int:
        return self.entries[-1].entry_index if self.entries else -1

    @property
    def divided_commitlog_offset(self) -> int:
        """The first data file's start: the classic CommitLog answers below it."""
        return self._data.min_offset

    @property
    def committed_pos(self) -> int:
        """RocketMQ's ``getMaxOffset`` in DLedger mode: the end of the last committed entry."""
        last = min(self.committed_index, self.end_index)
        if last < self.begin_index:
            return self.divided_commitlog_offset
        entry = self.entries[last - self.begin_index]
        return entry.pos + entry.size

    def entry(self, index: int) -> StoredEntry | None:
        i = index - self.begin_index
        return self.entries[i] if self.entries and 0 <= i < len(self.entries) else None

    def entry_body(self, entry: StoredEntry) -> bytes:
        found = self._data.find(entry.pos)
        assert found is not None
        mm, at = found
        return bytes(mm[at + ec.BODY_OFFSET : at + entry.size])

    # --- reads by offset (DLedgerCommitLog.getMessage) ---------------------------------------
    def message_at(self, offset: int) -> MessageExt:
        """The record whose CommitLog offset is ``offset``; DLedgerStoreError when none is
        (not a record start, not committed, or a record whose PHYSICALOFFSET disagrees)."""
        if offset < self.divided_commitlog_offset:
            found = self._classic.find(offset)
        elif offset < self.committed_pos:
            found = self._data.find(offset)
        else:
            raise DLedgerStoreError(
                f"offset {offset} is at or past the committed position {self.committed_pos}"
            )
        if found is None:
            raise DLedgerStoreError(f"no file holds offset {offset}")
        mm, at = found
        try:
            msg = decode_record(mm, at)
        except ValueError as exc:
            raise DLedgerStoreError(f"no record at offset {offset}: {exc}") from exc
        if msg.commit_log_offset != offset:
            raise DLedgerStoreError(
                f"the record at {offset} says its PHYSICALOFFSET is {msg.commit_log_offset}"
            )
        return msg

    def message_by_id(self, msg_id: str) -> MessageExt:
        """VIEW_MESSAGE_BY_ID: the offset msgId's CommitLog offset, read as above."""
        try:
            _host, offset = decode_offset_msg_id(msg_id)
        except ValueError as exc:
            raise DLedgerStoreError(str(exc)) from exc
        return self.message_at(offset)

    # --- reads by queue offset (ConsumeQueue -> CommitLog) ------------------------------------
    def _queue(self, topic: str, queue_id: int) -> _Segments:
        key = (topic, queue_id)
        segs = self._cq.get(key)
        if segs is None:
            segs = _Segments(os.path.join(self.paths.consume_queue_dir, topic, str(queue_id)))
            self._cq[key] = segs
        return segs

    def queue_unit(self, topic: str, queue_id: int, queue_offset: int) -> tuple[int, int, int]:
        """The ConsumeQueue unit ``(commitLogOffset, size, tagsCode)`` at ``queue_offset``,
        if it points below the committed position."""
        found = self._queue(topic, queue_id).find(queue_offset * CQ_UNIT_SIZE)
        if found is None:
            raise DLedgerStoreError(f"{topic}/{queue_id}: no unit at {queue_offset}")
        mm, at = found
        phys, size, tags = CQ_UNIT.unpack_from(mm, at)
        if size <= 0 or (phys == 0 and size == 0) or phys + size > self.committed_pos:
            raise DLedgerStoreError(f"{topic}/{queue_id}: no committed unit at {queue_offset}")
        return int(phys), int(size), int(tags)

    def max_queue_offset(self, topic: str, queue_id: int) -> int:
        """The queue's next offset: one past the last unit whose record is committed."""
        segs = self._queue(topic, queue_id)
        end = 0
        for start, mm in segs.files:
            for at in range(0, segs.file_size, CQ_UNIT_SIZE):
                phys, size, _tags = CQ_UNIT.unpack_from(mm, at)
                if (phys, size) == (0, _BLANK_UNIT_SIZE):
                    continue  # fillPreBlank's units before a queue's first real one
                if size <= 0 or phys + size > self.committed_pos:
                    return end
                end = (start + at) // CQ_UNIT_SIZE + 1
        return end

    def message(self, topic: str, queue_id: int, queue_offset: int) -> MessageExt:
        phys, size, _tags = self.queue_unit(topic, queue_id, queue_offset)
        msg = self.message_at(phys)
        if msg.store_size != size or msg.queue_offset != queue_offset:
            raise DLedgerStoreError(
                f"{topic}/{queue_id}@{queue_offset}: the unit says {size} bytes, the record "
                f"{msg.store_size} bytes at queue offset {msg.queue_offset}"
            )
        return msg

    def classic_messages(self) -> Iterator[MessageExt]:
        """The records of the classic CommitLog below ``dividedCommitlogOffset``, in offset
        order, up to its first BLANK or zeros (what :meth:`committed_messages` starts with)."""
        for start, mm in self._classic.files:
            at = 0
            while True:
                kind = ec.classify(mm, at)
                if kind is not ec.Kind.RECORD:
                    break
                msg = self.message_at(start + at)
                yield msg
                at += msg.store_size

    @property
    def min_offset(self) -> int:
        """The lowest CommitLog offset the files still hold: the first classic file's start, else
        the first entry's position (retention deletes data files from the head); a ConsumeQueue
        unit below it points at a deleted record."""
        if self._classic.files:
            return self._classic.files[0][0]
        return self.entries[0].pos if self.entries else self.divided_commitlog_offset

    def committed_messages(self) -> Iterator[MessageExt]:
        """Every committed record in offset order: the classic CommitLog below
        ``dividedCommitlogOffset``, then each committed entry's record."""
        for start, mm in self._classic.files:
            at = 0
            while True:
                kind = ec.classify(mm, at)
                if kind is not ec.Kind.RECORD:
                    break  # the end-of-file BLANK, or zeros: the classic log's end
                msg = self.message_at(start + at)
                yield msg
                at += msg.store_size
        for entry in self.entries:
            if entry.entry_index > self.committed_index:
                break
            yield self.message_at(entry.physical_offset)

    def close(self) -> None:
        for segs in (self._data, self._index, self._classic, *self._cq.values()):
            segs.close()
        self._cq.clear()


def _walk(data: _Segments, index: _Segments) -> list[StoredEntry]:
    """The entries of the data files, checked as DLedger's recovery checks them."""
    out: list[StoredEntry] = []
    for start, mm in data.files:
        at = 0
        while True:
            kind = ec.classify(mm, at)
            if kind is ec.Kind.DLEDGER_BLANK:
                break
            if kind is ec.Kind.END:
                return out
            if kind is not ec.Kind.ENTRY:
                raise DLedgerStoreError(f"{start:020d}: a classic record at {at} in DLedger data")
            try:
                header, _body = ec.decode_entry(mm, at, at=start + at)
            except ec.EntryFormatError as exc:
                raise DLedgerStoreError(f"data file {start:020d}: {exc}") from exc
            if out and (
                header.entry_index != out[-1].entry_index + 1 or header.term < out[-1].term
            ):
                raise DLedgerStoreError(
                    f"data file {start:020d} at {at}: entry {header.entry_index} term "
                    f"{header.term} after entry {out[-1].entry_index} term {out[-1].term}"
                )
            found = index.find(header.entry_index * ec.INDEX_UNIT_SIZE)
            if found is None:
                raise DLedgerStoreError(f"no index unit for entry {header.entry_index}")
            unit = ec.decode_index_unit(found[0], found[1])
            if unit != (ec.MAGIC_1, start + at, header.size, header.entry_index, header.term):
                raise DLedgerStoreError(
                    f"index unit of entry {header.entry_index} is {tuple(unit)}, the entry "
                    f"{(header.magic, start + at, header.size, header.entry_index, header.term)}"
                )
            out.append(StoredEntry(header.entry_index, header.term, start + at, header.size))
            at += header.size
    return out


def open_dledger_commitlog(paths: DLedgerStorePaths) -> DLedgerCommitLogReader:
    """Map a DLedger member's store read-only and walk its entries (see the module doc)."""
    data = _Segments(paths.data_dir)
    index = _Segments(paths.index_dir)
    classic = _Segments(paths.commit_log_dir)
    try:
        if data.files:
            # DLedgerCommitLog reads the classic CommitLog below dividedCommitlogOffset only:
            # files at or above it are never read (this broker's own classic copy of the
            # records, before issue 27's write-once layout, sits there)
            divided = data.min_offset
            for _start, mm in [f for f in classic.files if f[0] >= divided]:
                mm.close()
            classic.files = [f for f in classic.files if f[0] < divided]
        if classic.files and data.files and classic.file_size != data.file_size:
            raise DLedgerStoreError(
                f"CommitLog files of {classic.file_size} bytes, DLedger's of {data.file_size}"
            )
        entries = _walk(data, index)
        checkpoint = load_checkpoint(paths.member_dir)
        hard = load_hard_state(paths.member_dir)
    except BaseException:
        for segs in (data, index, classic):
            segs.close()
        raise
    committed = checkpoint.committed_index if checkpoint is not None else -1
    return DLedgerCommitLogReader(
        paths=paths,
        data=data,
        index=index,
        classic=classic,
        entries=entries,
        committed_index=committed,
        term=hard.term,
    )


# --- for the offline tools (rmq store verify, the Spark store source) -------------------------
def find_dledger_store(
    path: str | os.PathLike[str], *, store_path_dledger_commit_log: str | None = None
) -> DLedgerStorePaths | None:
    """The DLedger member whose store ``path`` is, told from the files, or None for a store
    without one (a classic store).  ``path`` is a ``storePathRootDir`` holding one
    ``dledger-<selfId>/`` (with ``index/``, ``data/`` or ``checkpoint``), that member directory
    itself, or the root's ``commitlog/`` (a classic store switched to DLedger).  A root with
    several members is refused (DLedgerStoreError): which one is meant is for the caller."""
    p = os.fspath(path)

    def is_member(d: str) -> bool:
        return any(
            os.path.exists(os.path.join(d, name)) for name in ("index", "data", "checkpoint")
        )

    name = os.path.basename(os.path.normpath(p))
    if name.startswith("dledger-") and len(name) > 8 and is_member(p):
        root = os.path.dirname(os.path.normpath(p))
        return DLedgerStorePaths(root, name[8:], store_path_dledger_commit_log)
    roots = [p]
    if name == "commitlog":
        roots.append(os.path.dirname(os.path.normpath(p)))
    for root in roots:
        try:
            names = sorted(os.listdir(root))
        except OSError:
            continue
        members = [
            n
            for n in names
            if n.startswith("dledger-") and len(n) > 8 and is_member(os.path.join(root, n))
        ]
        if len(members) > 1:
            raise DLedgerStoreError(
                f"{root}: several DLedger members ({', '.join(members)}): give one's directory"
            )
        if members:
            return DLedgerStorePaths(root, members[0][8:], store_path_dledger_commit_log)
    return None


def committed_position(paths: DLedgerStorePaths) -> int:
    """``committed_pos`` of :class:`DLedgerCommitLogReader` without walking the data files:
    the end of the committed entry as its index unit says (checked against the entry's own
    header).  When the unit or the entry cannot be read that way it opens the store and walks
    it, so the answer is the reader's either way."""
    checkpoint = load_checkpoint(paths.member_dir)
    committed = checkpoint.committed_index if checkpoint is not None else -1
    if checkpoint is not None:
        committed = min(committed, checkpoint.end_index)
    data = _Segments(paths.data_dir)
    index = _Segments(paths.index_dir)
    try:
        if committed < 0:
            return data.min_offset
        found = index.find(committed * ec.INDEX_UNIT_SIZE)
        if found is not None:
            unit = ec.decode_index_unit(found[0], found[1])
            held = data.find(unit.pos)
            if unit.magic == ec.MAGIC_1 and unit.entry_index == committed and held is not None:
                mm, at = held
                try:
                    header = ec.decode_entry_header(mm, at)
                except ec.EntryFormatError:
                    header = None
                if (
                    header is not None
                    and ec.entry_problem(header, at=unit.pos) is None
                    and (header.entry_index, header.size) == (committed, unit.size)
                ):
                    return int(unit.pos + unit.size)
    finally:
        data.close()
        index.close()
    reader = open_dledger_commitlog(paths)
    try:
        return reader.committed_pos
    finally:
        reader.close()
