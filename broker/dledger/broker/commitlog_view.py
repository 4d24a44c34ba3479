"""The CommitLog of a DLedger member *is* its Raft log's data files (RocketMQ 4.9
``store/dledger/DLedgerCommitLog.java``): a read view over them, and the store built on it.

Theory of operation
-------------------
RocketMQ writes each message once in DLedger mode.  The data files (driver/mmap_file_store.py,
formats in driver/entry_coder.py) hold entries whose bodies are CommitLog records; a record's
CommitLog offset (its PHYSICALOFFSET, its ConsumeQueue units, its index entries, its offset
msgId) is its entry's ``pos + 48``.  :class:`DLedgerCommitLogView` gives the classic store
(``DefaultMessageStore``, its reput, its reads) that log as its CommitLog:

* **Shared files, one writer.**  The view wraps the ``FileLog``'s data ``MappedFileQueue``;
  the FileLog appends, truncates and drops head files, the view only reads.  It never appends
  (``append_raw`` refuses: the Raft log replicates, no classic HA runs) and never validates or
  cuts the files (the FileLog recovers itself).
* **The visible end** (``visible_end``, RocketMQ's committed position: ``getMaxOffset``) is the
  end of the last entry the owner made visible: the Applier moves it over committed entries,
  and on open it is what was dispatched before the restart or committed by the member's
  checkpoint.  ``max_offset`` is that end, so the reput dispatches nothing past it, and
  ``read`` serves nothing past it: an uncommitted record is never dispatched nor served.
  ``cut(offset)`` takes it back, for a log that replaced entries (apply_resume.py's unconfirmed
  prefix) or was reset.
* **The framing** (``parse_at``, the reput's seam, RocketMQ's
  ``DLedgerCommitLog.checkMessageAndReturnSize``): at a position the reput finds an entry
  (header checked as DLedger's recovery does, ``pos`` where it was read; the record at
  ``pos + 48`` parsed as the classic reput parses, its PHYSICALOFFSET ``pos + 48``), DLedger's
  blank ``int -1, int remaining`` (go on at the next file), or an entry with nothing to dispatch
  (``SKIP``: the legacy empty no-op, or a body that is not one record, which every member skips
  alike).  The broker's own no-op (``entry_coder.NOOP_RECORD``, a ROLLBACK record) is a record:
  the dispatchers skip ROLLBACK records already.  ``reput_from`` is always an entry boundary.
* **A classic store switched to DLedger** (``dividedCommitlogOffset``): below the first data
  file's start, reads and the parse go to the classic CommitLog files as they are (records at
  their own offsets, a BLANK closing each file); :func:`start_after_classic` places the first
  data file where ``DLedgerCommitLog.recover`` places it: the last classic file is closed with
  a BLANK at its end and DLedger starts at the next file boundary.

:class:`DLedgerBackedStore` is ``DefaultMessageStore`` over the view.  Its recovery reads no
CommitLog (the FileLog did): ConsumeQueue units past the visible end go (``truncate_dirty``),
the topic queue table is rebuilt from the queues, the index is cut back to the re-dispatch
point and everything from there to the visible end is dispatched again (idempotent).

Invariants
* ``divided_commitlog_offset <= visible_end <= data end`` (the FileLog's ``write_pos``), and
  ``visible_end`` is an entry boundary (the end of an entry, or the first data file's start);
* every ConsumeQueue unit and index entry the store holds points at ``pos + 48`` of an entry
  below ``visible_end`` (or at a classic record below ``divided_commitlog_offset``);
* the view writes nothing: the data files are the FileLog's alone.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Callable

from broker.dledger.driver import entry_coder as ec
from broker.store.checkpoint import StoreCheckpoint
from broker.store.commitlog import CommitLog
from broker.store.config import MessageStoreConfig
from broker.store.dispatch import (
    BLANK,
    PARTIAL,
    SKIP,
    DispatchRequest,
    Framing,
    NotARecord,
    parse_record,
)
from broker.store.mapped_file_queue import MappedFileQueue
from broker.store.message_store import DefaultMessageStore
from broker.store.recovery import RecoveryReport
from broker.store.results import Buffer
from common.message import BLANK_MAGIC_CODE, RecordDecodeError

log = logging.getLogger(__name__)

__all__ = ["DLedgerBackedStore", "DLedgerCommitLogView", "start_after_classic"]

_BLANK_HEAD = struct.Struct(">ii")


class DLedgerCommitLogView(CommitLog):
    """The CommitLog surface of a DLedger member's data files (see the module doc)."""

    def __init__(
        self,
        data: MappedFileQueue,
        delay_millis: tuple[int, ...],
        classic: CommitLog | None = None,
    ) -> None:
        # no CommitLog directory of its own: ``queue`` is the FileLog's data queue, shared
        self.queue = data
        self.file_size = data.file_size
        self.delay_millis = delay_millis
        self.topic_queue_table: dict[tuple[str, int], int] = {}
        # the classic CommitLog of a store switched to DLedger (read below the divided offset)
        self.classic = classic
        if classic is not None and classic.queue.files and classic.file_size != self.file_size:
            raise ValueError(
                f"classic CommitLog files of {classic.file_size} bytes, DLedger's of "
                f"{self.file_size}: RocketMQ uses mappedFileSizeCommitLog for both"
            )
        self.visible_end = self.divided_commitlog_offset

    # --- bounds -------------------------------------------------------------------------------
    @property
    def divided_commitlog_offset(self) -> int:
        """Where the DLedger data begins; the classic CommitLog answers below it."""
        return self.queue.min_offset

    @property
    def max_offset(self) -> int:
        return self.visible_end

    @property
    def min_offset(self) -> int:
        classic = self.classic
        if classic is not None and classic.queue.files:
            return classic.min_offset
        return self.queue.min_offset

    @property
    def flushed_offset(self) -> int:
        # the FileLog flushes the data files (its own task); nothing to say here beyond them
        return min(self.visible_end, self.queue.flushed_offset)

    def advance(self, end: int) -> None:
        """Make everything below ``end`` (an entry's end, within the data) visible."""
        if end > self.queue.max_offset:
            raise ValueError(f"visible end {end} past the data end {self.queue.max_offset}")
        if end > self.visible_end:
            self.visible_end = end

    def cut(self, offset: int) -> None:
        """Nothing at or past ``offset`` (an entry boundary) is visible any more."""
        self.visible_end = max(min(self.visible_end, offset), self.divided_commitlog_offset)

    # --- reads --------------------------------------------------------------------------------
    def read(self, phys: int, size: int) -> memoryview | None:
        if phys < self.divided_commitlog_offset:
            return None if self.classic is None else self.classic.read(phys, size)
        if phys + size > self.visible_end:
            return None
        mf = self.queue.find(phys)
        if mf is None:
            return None
        return mf.slice(phys - mf.file_from_offset, size)

    def get_data(self, offset: int) -> memoryview | None:
        if offset < self.divided_commitlog_offset:
            return None if self.classic is None else self.classic.get_data(offset)
        mf = self.queue.find(offset)
        if mf is None:
            return None
        pos = offset - mf.file_from_offset
        end = min(mf.wrote, self.visible_end - mf.file_from_offset)
        if pos >= end:
            return None
        return mf.view[pos:end]

    # --- the reput's framing (checkMessageAndReturnSize) --------------------------------------
    def parse_at(self, pos: int) -> tuple[DispatchRequest | NotARecord | Framing, int]:
        """What the reput finds at ``pos`` (below ``visible_end``): a record's DispatchRequest
        and the bytes to its next boundary, ``BLANK`` (go on at the next file), ``SKIP`` (go on
        after ``size`` bytes), or ``PARTIAL`` (nothing here yet).  Raises RecordDecodeError for
        bytes that are no entry: the reput stops there and says so."""
        if pos < self.divided_commitlog_offset:
            return self._parse_classic(pos)
        mf = self.queue.find(pos)
        if mf is None:
            return PARTIAL, 0
        view, at = mf.view, pos - mf.file_from_offset
        kind = ec.classify(view, at)
        if kind is ec.Kind.DLEDGER_BLANK:
            return BLANK, self.file_size - at
        if kind is ec.Kind.END:
            return PARTIAL, 0
        if kind is not ec.Kind.ENTRY:
            raise RecordDecodeError(f"a classic record at {pos} in the DLedger data")
        try:
            header = ec.decode_entry_header(view, at)
        except ec.EntryFormatError as exc:
            raise RecordDecodeError(str(exc)) from exc
        problem = ec.entry_problem(header, at=pos)
        if problem is not None:
            raise RecordDecodeError(f"DLedger entry at {pos}: {problem}")
        size = header.size
        if header.body_length == 0:
            return SKIP, size  # a legacy no-op (Raft section 8): nothing to dispatch
        rec = at + ec.BODY_OFFSET
        try:
            parsed, n = parse_record(view, rec, at + size, self.delay_millis, check_crc=False)
        except RecordDecodeError as exc:
            parsed, n, why = PARTIAL, 0, str(exc)
        else:
            why = ""
        if not isinstance(parsed, DispatchRequest) or n != header.body_length:
            # every member skips it alike, so their queues stay equal
            log.error(
                "DLedger entry %d at %d is not one CommitLog record (%s); skipped",
                header.entry_index,
                pos,
                why or f"{n} of {header.body_length} bytes",
            )
            return SKIP, size
        if parsed.commit_log_offset != pos + ec.BODY_OFFSET:
            raise RecordDecodeError(
                f"the record of DLedger entry {header.entry_index} at {pos} claims offset "
                f"{parsed.commit_log_offset}, not {pos + ec.BODY_OFFSET}"
            )
        return parsed, size

    def _parse_classic(self, pos: int) -> tuple[DispatchRequest | NotARecord, int]:
        classic = self.classic
        mf = None if classic is None else classic.queue.find(pos)
        if mf is None:
            # no classic file here (retention took it): go on at the next file
            return BLANK, self.file_size - pos % self.file_size
        parsed, size = parse_record(
            mf.view, pos - mf.file_from_offset, mf.wrote, self.delay_millis, check_crc=False
        )
        if parsed is PARTIAL:
            # the classic log ends here: what follows is the DLedger data's
            return BLANK, self.file_size - pos % self.file_size
        if isinstance(parsed, DispatchRequest) and parsed.commit_log_offset != pos:
            raise RecordDecodeError(f"record at {pos} claims offset {parsed.commit_log_offset}")
        return parsed, size

    # --- what the classic CommitLog does and this one must not --------------------------------
    def load(self) -> None:
        pass  # the FileLog mapped and recovered the data files; the classic part is loaded

    def reserve(self, length: int) -> int:
        raise RuntimeError("the DLedger CommitLog is written by the Raft log only")

    def write(self, data: Buffer) -> None:
        raise RuntimeError("the DLedger CommitLog is written by the Raft log only")

    def append_raw(self, start_offset: int, data: Buffer) -> bool:
        return False  # no classic HA in DLedger mode: the Raft log replicates

    def recover(self, from_offset: int, *, check_crc: bool) -> tuple[int, int, int]:
        return self.visible_end, 0, 0  # the FileLog recovered the data files itself

    def first_bad_below(self, crc_from: int, upto: int) -> tuple[int, str] | None:
        return None

    def close(self) -> None:
        # the data files are the FileLog's to close
        if self.classic is not None:
            self.classic.close()


def start_after_classic(classic: CommitLog, data: MappedFileQueue) -> int:
    """A classic store switched to DLedger, before its first entry: close the last classic file
    with a BLANK at its valid end and create the first (empty) data file at the next file
    boundary, as ``DLedgerCommitLog.recover`` does; returns that offset
    (``dividedCommitlogOffset``).  ``classic`` must be recovered (its last file's ``wrote`` is
    its end); nothing is done when the data files exist already.  Blocking."""
    if data.files:
        return data.min_offset
    last = classic.queue.last()
    if last is None:
        return 0
    # (an empty last file is closed the same way: a BLANK over all of it, so no classic file
    # is ever at or past the division, where only this broker's earlier copies are)
    remaining = last.file_size - last.wrote
    if remaining >= 8:
        last.append(_BLANK_HEAD.pack(remaining, BLANK_MAGIC_CODE))
        last.flush_range()
    last.wrote = last.file_size
    divided = last.file_from_offset + last.file_size
    data.create(divided)
    log.warning(
        "the classic CommitLog (%s) ends at %d: DLedger's data starts at %d "
        "(dividedCommitlogOffset); records below it are read from the classic files",
        classic.queue.store_dir,
        last.file_from_offset + last.wrote,
        divided,
    )
    return divided


class DLedgerBackedStore(DefaultMessageStore):
    """``DefaultMessageStore`` whose CommitLog is a :class:`DLedgerCommitLogView` (the module
    doc says how it recovers).  ``view.visible_end`` is set before ``open_and_recover`` to the
    end of the entry the member's checkpoint names committed (RocketMQ's committed position),
    or left at the data's start; recovery moves it further to the newest entry a ConsumeQueue
    unit points to, if that entry is whole."""

    def __init__(self, config: MessageStoreConfig, view: DLedgerCommitLogView) -> None:
        super().__init__(config)
        self.commit_log = view
        self.reput.commit_log = view
        self.reput.parse_at = view.parse_at
        # who hears of a log reset once the apply runs (CommittedDispatch.on_log_reset); before
        # that, :meth:`log_reset` resets the store alone and the apply's resume starts there
        self.log_reset_hook: Callable[[int, int], None] | None = None

    def log_reset(self, begin_index: int, begin_pos: int) -> None:
        """The node's ``on_log_reset`` hook (driver/node.py): the leader reset this member's log
        to begin at entry ``begin_index`` at ``begin_pos``."""
        if self.log_reset_hook is not None:
            self.log_reset_hook(begin_index, begin_pos)
        else:
            self.on_log_reset(begin_pos)

    @property
    def view(self) -> DLedgerCommitLogView:
        cl = self.commit_log
        assert isinstance(cl, DLedgerCommitLogView)
        return cl

    def _recover(self, cp: StoreCheckpoint) -> RecoveryReport:
        t0 = time.monotonic()
        view = self.view
        report = RecoveryReport(clean=self.last_exit_ok, checkpoint_valid=cp.valid)
        report.rule = "dledger"
        data_end = view.queue.max_offset
        # units past the log's end point at entries it lost (a power cut): they go; after a
        # crash so do the units past the checkpoint, which a power cut may have kept in part
        # (a hole before a kept unit: broker/store/recovery.py); the re-dispatch below and the
        # apply write them again
        units_end = data_end
        if not self.last_exit_ok and cp.valid and view.min_offset <= cp.dispatched <= data_end:
            units_end = cp.dispatched
        newest = (0, 0)
        for cq in self.consume_queues.values():
            cq.recover(view.min_offset)
            report.cq_units_dropped += cq.truncate_dirty(units_end)
            if cq.max_offset > cq.min_offset:
                unit = cq.unit(cq.max_offset - 1)
                if unit is not None and unit[0] + unit[1] > sum(newest):
                    newest = (unit[0], unit[1])
        # entries dispatched before the restart stay served, as before it (the Applier takes
        # them back if a new leader replaces them): the visible end moves to the newest unit's
        # entry when that entry is whole where the unit says
        if sum(newest) > view.visible_end and _entry_of(view, *newest):
            view.visible_end = sum(newest)
        valid_end = view.visible_end
        report.commit_log_from = report.commit_log_end = valid_end
        last_unit_end = view.min_offset
        for cq in self.consume_queues.values():
            report.cq_units_dropped += cq.truncate_dirty(valid_end)
            last_unit_end = max(last_unit_end, cq.last_phys_end())
        view.topic_queue_table = {k: cq.max_offset for k, cq in self.consume_queues.items()}
        # our checkpoint's dispatched offset (an entry boundary); RocketMQ's rule otherwise:
        # from where the queues end (an Apache store's checkpoint holds timestamps only)
        if cp.valid and view.min_offset <= cp.dispatched <= valid_end:
            reput = cp.dispatched
        else:
            reput = min(last_unit_end, valid_end)
        self.reput.reput_from = report.redispatch_from = reput
        report.index_entries_dropped = self.index.recover(reput)
        self.reput.do_reput(limit=None)
        report.redispatched_bytes = self.reput_from - reput
        if self.reput_from < valid_end:
            log.error(
                "recovery could not dispatch past %d (visible end %d)", self.reput_from, valid_end
            )
        # a dropped unit must not come back with a power cut before new entries land where it
        # pointed (broker/store/recovery.py)
        report.files_synced = sum(cq.queue.sync_cuts() for cq in self.consume_queues.values())
        report.seconds = time.monotonic() - t0
        return report

    def cut_dispatched(self, offset: int) -> int:
        """The log no longer holds what is at or past ``offset`` (an entry boundary): nothing
        there is visible any more, ConsumeQueue units and index entries pointing there go, and
        dispatch resumes at ``offset``.  Returns the units dropped.  Blocking (file cuts), and
        synchronous: no read can see a unit into replaced bytes after it returns."""
        view = self.view
        view.cut(offset)
        dropped = 0
        for key, cq in self.consume_queues.items():
            dropped += cq.truncate_dirty(view.visible_end)
            view.topic_queue_table[key] = cq.max_offset
        self.index.recover(view.visible_end)
        self.reput.cut(view.visible_end)
        cp = self.checkpoint
        if cp.dispatched > view.visible_end:
            cp.dispatched = view.visible_end
        return dropped

    def on_log_reset(self, begin_pos: int) -> None:
        """The Raft log was reset to begin at ``begin_pos`` (a stranded member rebuilt from a
        leader's snapshot): every ConsumeQueue and index entry goes, and dispatch resumes at
        ``begin_pos`` once entries from there are made visible (``view.advance``)."""
        for cq in list(self.consume_queues.values()):
            cq.destroy()
        self.consume_queues.clear()
        self.view.topic_queue_table.clear()
        self.index.recover(0)
        self.reput.cut(0)
        self.view.visible_end = begin_pos
        self.reput.reput_from = begin_pos
        self.checkpoint.dispatched = begin_pos


def _entry_of(view: DLedgerCommitLogView, phys: int, size: int) -> bool:
    """The record ``(phys, size)`` a unit points to is the whole body of a DLedger entry at
    ``phys - 48`` (its header checked as DLedger's recovery checks it)."""
    pos = phys - ec.BODY_OFFSET
    if pos < view.divided_commitlog_offset or phys + size > view.queue.max_offset:
        return False
    mf = view.queue.find(pos)
    if mf is None:
        return False
    try:
        header = ec.decode_entry_header(mf.view, pos - mf.file_from_offset)
    except ec.EntryFormatError:
        return False
    return ec.entry_problem(header, at=pos) is None and header.body_length == size
