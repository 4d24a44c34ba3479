"""Committed entries made visible and dispatched, in place (the write-once apply: RocketMQ 4.9
``DLedgerCommitLog``, whose reput reads the DLedger data files up to the committed position).

Theory of operation
-------------------
The store is a :class:`~broker.dledger.broker.commitlog_view.DLedgerBackedStore`: its
CommitLog is the Raft log's data files, read up to ``visible_end``.  Applying an entry writes
nothing: :meth:`CommittedDispatch.apply_entries` moves the visible end over committed entries
in index order and lets the store's reput build their ConsumeQueue units and index entries from
the bytes in place (record at ``pos + 48``).  On the leader, the put that proposed an entry left
a :class:`~broker.dledger.broker.applier.PutHint`; a hint of the entry's term whose record starts
where the reput stands is dispatched from the message, as the classic put path does, without
parsing the record again.  A hint of another term (a new leader replaced the entry) is dropped.
Every member makes the same entries visible at the same positions: queue units, PHYSICALOFFSET
and offset msgIds agree across the group, and with an Apache member's.

Restart (:meth:`CommittedDispatch.resume`): the FileLog recovered itself; the store's recovery
(commitlog_view.py) cut ConsumeQueue units past the log, set the visible end (the member
checkpoint's committed entry, or the newest entry a queue points to when that entry is whole)
and dispatched everything below it.  The applied index is the entry ending at the visible end,
found by binary search over the log's index units: nothing is applied twice, nothing skipped.

Revocation: entries applied before a restart are the member's own word until a leader confirms
them (apply_resume.py's theory: after a whole-group power cut a new leader elected without this
member can replace them, and the member's log takes the replacement).  The FileLog calls
:meth:`CommittedDispatch.on_truncate` synchronously from every truncation, before anything can
be written in the cut place: if the cut reaches below the visible end, the store's units and
index entries from there go (``DLedgerBackedStore.cut_dispatched``), the applied index goes
back to the last entry kept, and apply goes on from there as the leader's entries commit.
Only an unconfirmed entry can be cut this way (Raft never truncates committed entries), so
this never fires in a group that did not lose power together.

A log reset (a stranded member rebuilt from a leader's snapshot): :meth:`on_log_reset` drops
every queue and index entry and dispatch resumes at the new first entry.

Invariants
* ``view.visible_end`` is the end of entry ``applied_index`` (the data's start when none);
* ``applied_index <= node.committed_index`` as seen when applied, except for entries applied
  before a restart and not yet confirmed (revocable, above);
* the store's units point only at records of entries ``<= applied_index``;
* ``applied_index`` only grows, except by a truncation of unconfirmed entries or a log reset.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Iterable, Iterator

import attrs
import trio

from broker.dledger.broker.applier import (
    ApplyError,
    DLedgerNodeView,
    PutHint,
    committed_entries,
)
from broker.dledger.broker.apply_resume import HINT_FILE
from broker.dledger.broker.commitlog_view import DLedgerBackedStore, DLedgerCommitLogView
from broker.dledger.driver import entry_coder as ec
from broker.dledger.driver.mmap_file_store import FileLog
from broker.dledger.driver.state_files import load_checkpoint
from broker.dledger.raft.log import RaftLog
from broker.dledger.raft.messages import Entry
from broker.store.clean_service import DISK_FULL_POLL, disk_used_ratio, judge
from broker.store.commitlog import CommitLog
from broker.store.config import MessageStoreConfig
from broker.store.flush import FlushService
from broker.store.message_store import close_store

log = logging.getLogger(__name__)

__all__ = [
    "CommittedDispatch",
    "LegacyStoreError",
    "entry_before",
    "entry_ending_at",
    "open_dledger_backed_store",
    "run_dledger_backed_store",
]

# entries made visible before the apply task lets other tasks run
_APPLY_BATCH = 1024


class LegacyStoreError(RuntimeError):
    """A store in this broker's earlier two-copy layout that cannot be rebuilt in place."""


@attrs.define(eq=False)
class CommittedDispatch:
    store: DLedgerBackedStore
    node: DLedgerNodeView
    # last entry applied (-1: none)
    applied_index: int = -1
    # entry index -> the leader's put of it (taken when the index is applied)
    hints: dict[int, PutHint] = attrs.field(factory=dict)
    # how many times applied entries were taken back (retention watches it)
    cuts: int = 0
    _progress: trio.Event = attrs.field(factory=trio.Event)

    def __attrs_post_init__(self) -> None:
        self.store.log_reset_hook = self.on_log_reset

    @property
    def view(self) -> DLedgerCommitLogView:
        return self.store.view

    # --- restart ------------------------------------------------------------------------------
    def resume(self) -> int:
        """The applied index after the store's recovery: the entry ending at the visible end."""
        self.applied_index = entry_ending_at(self.node.log, self.view.visible_end)
        log.info(
            "dledger dispatch resumes after entry %d (visible end %d)",
            self.applied_index,
            self.view.visible_end,
        )
        return self.applied_index

    # --- revocation and reset -----------------------------------------------------------------
    def on_truncate(self, index: int, data_end: int) -> None:
        """The log cut entries ``>= index`` (its data now ends at ``data_end``)."""
        for i in [i for i in self.hints if i >= index]:
            del self.hints[i]
        if index > self.applied_index:
            return
        log.warning(
            "the log replaced entries %d..%d applied before the restart: their queue units go "
            "(back to %d)",
            index,
            self.applied_index,
            data_end,
        )
        self.store.cut_dispatched(data_end)
        self.applied_index = index - 1
        self.cuts += 1

    def on_log_reset(self, begin_index: int, begin_pos: int) -> None:
        """The log was reset to begin at entry ``begin_index`` at ``begin_pos`` (a stranded
        member rebuilt): every queue and index entry goes; dispatch resumes there."""
        self.hints.clear()
        self.store.on_log_reset(begin_pos)
        self.applied_index = begin_index - 1
        self.cuts += 1

    # --- apply --------------------------------------------------------------------------------
    def apply_entries(self, entries: Iterable[Entry]) -> None:
        """Make consecutive committed entries visible and dispatch them."""
        store = self.store
        view = store.view
        reput = store.reput
        hints = self.hints
        moved = False
        for entry in entries:
            if entry.index != self.applied_index + 1:
                raise ApplyError(f"apply of entry {entry.index} after {self.applied_index}")
            end = entry.pos + entry.size
            view.advance(end)
            hint = hints.pop(entry.index, None) if hints else None
            if (
                hint is not None
                and hint.term == entry.term
                and reput.reput_from == entry.pos
                and hint.size == len(entry.body)
                and not ec.is_noop_body(entry.body)
            ):
                moved |= reput.dispatch_put_at(
                    hint.msg,
                    hint.size,
                    hint.queue_offset,
                    entry.pos + ec.BODY_OFFSET,
                    end,
                    hint.store_ts,
                )
            self.applied_index = entry.index
        if moved:
            reput.wake_waiters()
        # what no hint covered (a follower's entries, no-ops, blanks): the reput parses it
        store.dispatch_appended()

    def _committed(self, first: int, last: int) -> Iterator[Entry]:
        return committed_entries(self.node.log, first, last)

    async def run(self) -> None:
        node = self.node
        while True:
            await node.wait_committed(self.applied_index + 1)
            await trio.lowlevel.checkpoint_if_cancelled()
            first = self.applied_index + 1
            last = min(node.committed_index, self.applied_index + _APPLY_BATCH)
            self.apply_entries(self._committed(first, last))
            if last >= first:
                ev, self._progress = self._progress, trio.Event()
                ev.set()
            await trio.lowlevel.checkpoint()

    async def wait_applied(self, index: int) -> None:
        while self.applied_index < index:
            await self._progress.wait()


def entry_ending_at(log_: RaftLog, end: int) -> int:
    """The index of the entry of ``log_`` that ends at ``end`` (binary search by position);
    ``begin_index - 1`` when ``end`` is at or before the first entry.  ApplyError when no entry
    ends there."""
    begin, last, get = log_.begin_index, log_.end_index, log_.get
    if last < 0 or begin < 0:
        return -1
    first = get(begin)
    assert first is not None
    if end <= first.pos:
        return begin - 1
    lo, hi = begin, last
    while lo <= hi:
        mid = (lo + hi) // 2
        entry = get(mid)
        assert entry is not None
        entry_end = entry.pos + entry.size
        if entry_end == end:
            return mid
        if entry_end < end:
            lo = mid + 1
        else:
            hi = mid - 1
    raise ApplyError(f"no entry of the log ends at {end} (the store's visible end)")


def entry_before(log_: RaftLog, offset: int) -> int:
    """The last entry of ``log_`` that ends at or before ``offset``; ``begin_index - 1`` when
    none does (binary search by position)."""
    begin, last, get = log_.begin_index, log_.end_index, log_.get
    if last < 0 or begin < 0:
        return -1
    lo, hi = begin, last
    found = begin - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        entry = get(mid)
        assert entry is not None
        if entry.pos + entry.size <= offset:
            found, lo = mid, mid + 1
        else:
            hi = mid - 1
    return found


class _ConsumeQueueFlush(FlushService):
    """The store's flush task minus the CommitLog: the data files are the FileLog's, which
    flushes them itself; ConsumeQueues, index and checkpoint as in the classic store."""

    def __init__(self, store: DLedgerBackedStore) -> None:
        super().__init__(store)
        # the data files' pages are the FileLog's to release (mmap_file_store.release_quiet)
        self.release = False

    async def _flush_commit_log(self) -> None:
        target = self.store.commit_log.max_offset
        if target > self.flushed:
            self.flushed = target
        ev, self._progress = self._progress, trio.Event()
        ev.set()


def _legacy_two_copy(config: MessageStoreConfig, flog: FileLog) -> bool:
    """This broker's store before issue 27: the Applier's hint beside a classic CommitLog that
    copies the Raft log (CommitLog files at or above the data's start, where RocketMQ never
    reads)."""
    if os.path.exists(os.path.join(config.store_path_root_dir, HINT_FILE)):
        return True
    cl_dir = config.commit_log_dir
    if not flog.data.files or not os.path.isdir(cl_dir):
        return False
    divided = flog.data.min_offset
    return any(n.isdigit() and int(n) >= divided for n in os.listdir(cl_dir))


def _move_legacy_aside(config: MessageStoreConfig, flog: FileLog) -> str:
    """Rebuild from the Raft log: the classic copy, its queues, index and checkpoint move to
    ``legacy-two-copy-<ms>/`` (kept for the operator); returns that directory.  Blocking."""
    root = config.store_path_root_dir
    if flog.begin_index > 0:
        raise LegacyStoreError(
            f"{root}: a store in the earlier two-copy DLedger layout whose Raft log no longer "
            f"begins at entry 0 (it begins at {flog.begin_index}): its queues cannot be rebuilt "
            "from the log; start it with the broker version that wrote it, or empty the store"
        )
    aside = os.path.join(root, f"legacy-two-copy-{int(time.time() * 1000)}")
    os.makedirs(aside)
    names = ("commitlog", "consumequeue", "index", "checkpoint", HINT_FILE, HINT_FILE + ".durable")
    moved = []
    for name in names:
        path = os.path.join(root, name)
        if os.path.exists(path):
            shutil.move(path, os.path.join(aside, name))
            moved.append(name)
    if config.store_path_commit_log and os.path.isdir(config.store_path_commit_log):
        shutil.move(config.store_path_commit_log, os.path.join(aside, "commitlog-path"))
        moved.append(config.store_path_commit_log)
    log.warning(
        "%s: the earlier two-copy DLedger layout (%s) moved to %s; the queues are rebuilt from "
        "the Raft log",
        root,
        ", ".join(moved),
        aside,
    )
    return aside


def open_dledger_backed_store(
    config: MessageStoreConfig, flog: FileLog, member_dir: str
) -> DLedgerBackedStore:
    """Open (and recover) the store over a member's recovered FileLog: a classic CommitLog
    below the data's start is read in place (switching a classic store now puts the first data
    file after it, ``commitlog_view.start_after_classic``); a store in the earlier two-copy
    layout is rebuilt from the log when the log begins at entry 0, else refused
    (:class:`LegacyStoreError`).  Blocking."""
    from broker.dledger.broker.commitlog_view import start_after_classic

    if _legacy_two_copy(config, flog):
        _move_legacy_aside(config, flog)
    classic: CommitLog | None = None
    cl_dir = config.commit_log_dir
    if os.path.isdir(cl_dir) and any(n.isdigit() for n in os.listdir(cl_dir)):
        classic = CommitLog(cl_dir, config.mapped_file_size_commit_log, config.delay_level_millis)
        classic.load()
        if not flog.data.files:
            # switching now: the last classic file's end is found (the others are closed by
            # their BLANK) and the first data file goes after it
            last = classic.queue.files[-1].file_from_offset if classic.queue.files else 0
            classic.recover(last, check_crc=False)
            start_after_classic(classic, flog.data)
    view = DLedgerCommitLogView(flog.data, config.delay_level_millis, classic)
    checkpoint = load_checkpoint(member_dir)
    if checkpoint is not None and flog.end_index >= 0:
        last = min(checkpoint.committed_index, flog.end_index)
        entry = flog.get(last) if last >= flog.begin_index else None
        if entry is not None:
            view.visible_end = entry.pos + entry.size
    store = DLedgerBackedStore(config, view)
    store.open_and_recover()
    return store


async def _run_disk_check(store: DLedgerBackedStore, directory: str) -> None:
    """The classic store's disk judgement (clean_service.judge: puts refused over
    ``diskSpaceWarningLevelRatio``, accepted again at or below ``diskSpaceCleanForciblyRatio``)
    on the data files' filesystem, every ``cleanResourceInterval`` and every 100 ms while the
    disk is full.  No deletion here: the data files are dropped by log_retention.py."""
    config = store.config
    flags = store.flags
    while True:
        ratio = await trio.to_thread.run_sync(disk_used_ratio, directory)
        judge(flags, ratio, config)
        if flags.disk_full:
            await trio.sleep(DISK_FULL_POLL)
            continue
        if flags.disk_full_marked.is_set():
            flags.disk_full_marked = trio.Event()  # cleared by a hand other than judge's
        with trio.move_on_after(config.clean_resource_interval):
            await flags.disk_full_marked.wait()


async def run_dledger_backed_store(
    config: MessageStoreConfig,
    flog: FileLog,
    member_dir: str,
    *,
    task_status: trio.TaskStatus[DLedgerBackedStore] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Open the store over ``flog`` and run its reput and flush tasks until cancelled (the
    FileLog is the caller's: opened before, closed after)."""
    store = await trio.to_thread.run_sync(open_dledger_backed_store, config, flog, member_dir)
    flush = _ConsumeQueueFlush(store)
    store.flush = flush
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.reput.run)
            nursery.start_soon(flush.run)
            nursery.start_soon(_run_disk_check, store, flog.data.store_dir)
            task_status.started(store)
            await trio.sleep_forever()
    finally:
        await close_store(store, flush)
