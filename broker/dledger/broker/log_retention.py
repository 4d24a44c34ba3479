"""Retention of the DLedger log's own files (DLedger's ``CleanSpaceService``).

Theory of operation
-------------------
In DLedger mode a message is stored once, in the Raft log (``mmap_file_store.FileLog``), whose
data files are the store's CommitLog (commitlog_view.py): this service cleans them, and
(``WriteOnceRetention``) the ConsumeQueue and index files below the new first file with them,
each queue's min offset following (RocketMQ's ``correctMinOffset``).  With the copying apply of
the in-memory tests (applier.py) it cleans the Raft log's files only.  DLedger's rules as RocketMQ configures them from the broker's store config
(``DLedgerCommitLog``): every ``cleanResourceInterval`` the data files go from the oldest on,
never the last one, when

* the hour is one of ``deleteWhen``, or the disk is over ``diskMaxUsedSpaceRatio`` percent
  (DLedger's ``diskSpaceRatioToCheckExpired``), and
* the file's last write is ``fileReservedTime + 1`` hours old, or the disk is over
  ``diskSpaceCleanForciblyRatio`` and ``cleanFileForciblyEnable`` is on (a forced clean).

``cleanFileForciblyEnable`` is off by default, as for the classic store (clean_service.py): a
full disk deletes only expired files, and the member refuses proposals (its own disk check,
driver/node.py) until the operator makes room.  A forced clean logs a warning naming how many of
the files it deleted had not expired.

What no rule may drop (the bound ``upto`` handed to ``FileLog.drop_head``): an entry the
log still needs.

* **Restart.** Written once, a restart re-dispatches from the store checkpoint's
  ``dispatched`` (written, fsynced, after the queues' flush): the entries from there must stay,
  so the bound is the last entry ending at or below it (``WriteOnceRetention``).  With the
  copying apply, the applier resumes from a hint and pairs the classic records after it with
  their entries (applier.py), so the entries after the hint must stay.  The bound is the
  *durable* hint: an (index, offset) pair taken a round earlier whose classic bytes and whose
  Raft entry the flushes have since put on disk, written with fsync before anything below it
  goes.  After a power cut resume starts there at the latest.
* **Committed.** Only committed entries (all of them are at or below the applied index) go,
  and ``drop_head`` keeps the new head entry itself, flushed: the log is never empty again and
  no truncation (only above the committed index) can reach its head.
* **Followers.** A leader drops only what every member holds (its peers' match indexes from
  replication), except in a forced clean: a member that was down for a while catches up by
  replication instead of being stranded.  A member whose log ends before the leader's first
  entry (a forced clean, or followers that deleted by their own clock and bounds and one of
  them leads later) is reset by the leader: its log begins again at the leader's first entry,
  as DLedger's TRUNCATE does it (raft/entry_handler.py, "Reset"), and the broker drops what it
  built from the old entries (driver/node.py's ``on_log_reset`` hook).  On the write-once
  layout that loses nothing the group still serves: the leader's dropped files held the only
  copies it served of the messages below its first entry.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Protocol, runtime_checkable

import attrs
import trio

from broker.dledger.broker.applier import Applier
from broker.dledger.broker.apply_resume import Hint
from broker.dledger.broker.commitlog_view import DLedgerBackedStore
from broker.dledger.broker.committed_dispatch import CommittedDispatch, entry_before
from broker.dledger.driver.mmap_file_store import DROP_FILES_MAX, FileLog
from broker.dledger.raft.messages import Role
from broker.store.api import MessageStore
from broker.store.clean_service import (
    disk_used_ratio,
    is_time_to_delete,
    mtimes_ms,
    unlink_segments,
)
from broker.store.config import MessageStoreConfig
from broker.store.mapped_file import MappedFile
from broker.store.message_store import DefaultMessageStore

log = logging.getLogger(__name__)

__all__ = [
    "AppliedProgress",
    "LogRetention",
    "RetentionNode",
    "WriteOnceRetention",
    "retention_for",
    "run_log_retention",
]


@runtime_checkable
class RetentionNode(Protocol):
    """What retention reads of a ``DLedgerNode``."""

    @property
    def role(self) -> Role: ...

    @property
    def committed_index(self) -> int: ...

    def peer_watermarks(self) -> dict[str, int]: ...


class AppliedProgress(Protocol):
    """What retention reads of the ``Applier``."""

    @property
    def applied_index(self) -> int: ...

    @property
    def applied_offset(self) -> int: ...

    @property
    def cuts(self) -> int: ...

    def write_durable_hint(self, hint: Hint) -> None: ...


@attrs.define(eq=False)
class LogRetention:
    flog: FileLog
    node: RetentionNode
    applier: AppliedProgress
    config: MessageStoreConfig
    # the classic CommitLog's flushed end (the durable hint needs its bytes on disk)
    classic_flushed: Callable[[], int]
    # wall clock in ms (tests replace it)
    clock: Callable[[], int] = attrs.field(factory=lambda: lambda: int(time.time() * 1000))
    # the point taken last round, made durable once the classic flush passes it
    _candidate: Hint = Hint(-1, 0, -1)
    # the last point written to the durable hint: entries up to its index may go
    durable: Hint = Hint(-1, 0, -1)
    # the applier's cut count the two above belong to
    _cuts: int = 0

    def bound(self, forced: bool) -> int:
        """The last entry retention may drop now (module docstring)."""
        upto = min(self.durable.entry, self.node.committed_index)
        if self.node.role is Role.LEADER and not forced:
            marks = self.node.peer_watermarks()
            upto = min(upto, min(marks.values(), default=-1))
        return upto

    def expired(self, forced: bool, mtimes: Mapping[str, float]) -> Callable[[MappedFile], bool]:
        """Whether a data file may go; ``mtimes``: the head files' last writes in ms (a file
        without one is kept)."""
        reserved_ms = (self.config.file_reserved_time + 1) * 3600 * 1000
        now_ms = self.clock()

        def expired(mf: MappedFile) -> bool:
            mtime = mtimes.get(mf.path)
            return forced or (mtime is not None and now_ms >= mtime + reserved_ms)

        return expired

    async def once(self) -> int:
        """One round; the number of data files dropped."""
        config = self.config
        await self._advance_durable_hint()
        ratio = await trio.to_thread.run_sync(disk_used_ratio, self.flog.data.store_dir)
        hour = time.localtime(self.clock() / 1000).tm_hour
        due = is_time_to_delete(config.delete_when, hour) or (
            ratio > config.disk_max_used_space_ratio / 100
        )
        if not due:
            return 0
        forced = (
            ratio > config.disk_space_clean_forcibly_ratio and config.clean_file_forcibly_enable
        )
        before = len(self.flog.data.files)
        heads = [mf.path for mf in self.flog.data.files[:DROP_FILES_MAX]]
        mtimes = await trio.to_thread.run_sync(mtimes_ms, heads)
        dropped = self.flog.drop_head(self.bound(forced), self.expired(forced, mtimes))
        expired = self.expired(False, mtimes)
        unexpired = sum(1 for mf in dropped if not expired(mf))
        if unexpired:
            log.warning(
                "dledger retention: cleanFileForciblyEnable=true and disk %.2f used, over "
                "diskSpaceCleanForciblyRatio %.2f: %d files deleted, %d of them unexpired",
                ratio,
                config.disk_space_clean_forcibly_ratio,
                len(dropped),
                unexpired,
            )
        elif dropped:
            log.info(
                "dledger retention: %d expired files deleted (disk %.2f used)", len(dropped), ratio
            )
        if dropped:
            await unlink_segments(dropped)
        return before - len(self.flog.data.files)

    async def _advance_durable_hint(self) -> None:
        applier = self.applier
        if applier.cuts != self._cuts:
            # the classic store was cut back (apply_resume.py): what was taken before may
            # name records that are gone, and the applier removed the durable hint
            self._cuts = applier.cuts
            self._candidate = self.durable = Hint(-1, 0, -1)
        candidate = self._candidate
        if (
            candidate.entry > self.durable.entry
            and self.classic_flushed() >= candidate.offset
            and self.flog.on_disk(candidate.entry)
            and self.flog.term_at(candidate.entry) == candidate.term
        ):
            await trio.to_thread.run_sync(applier.write_durable_hint, candidate)
            self.durable = candidate
        index = applier.applied_index
        self._candidate = Hint(index, applier.applied_offset, self.flog.term_at(index))


async def run_log_retention(
    retention: LogRetention,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """A round every ``cleanResourceInterval`` until cancelled; a round the disk refuses (the
    durable hint's fsync on a full disk) is logged and tried again next time."""
    task_status.started()
    while True:
        await trio.sleep(retention.config.clean_resource_interval)
        try:
            await retention.once()
        except OSError as exc:
            log.error("dledger retention round failed: %s", exc)


@attrs.define(eq=False)
class _WriteOnceProgress:
    """The write-once apply seen as retention's ``AppliedProgress``: no hint files, the store
    checkpoint's ``dispatched`` is the durable point (WriteOnceRetention)."""

    dispatch: CommittedDispatch

    @property
    def applied_index(self) -> int:
        return self.dispatch.applied_index

    @property
    def applied_offset(self) -> int:
        return self.dispatch.view.visible_end

    @property
    def cuts(self) -> int:
        return self.dispatch.cuts

    def write_durable_hint(self, hint: Hint) -> None:
        pass  # nothing to write: the store checkpoint is written by the store's flush


@attrs.define(eq=False)
class WriteOnceRetention(LogRetention):
    """Retention when the Raft log's data files are the store's CommitLog (committed_dispatch.py):
    dropping head data files is CommitLog retention, so the ConsumeQueue files and index files
    wholly below the new first file go with them and each queue's min offset moves to its first
    unit that still points into the log (RocketMQ's ``deleteExpiredFile`` +
    ``correctMinOffset``, clean_service.take_expired_segments).

    The bound changes meaning: nothing needs the entries again after a restart but the
    re-dispatch of units a power cut took, which starts at the store checkpoint's ``dispatched``
    (written after the queues' flush, fsynced): only entries ending at or below it go."""

    store: DLedgerBackedStore | None = None

    async def _advance_durable_hint(self) -> None:
        store = self.store
        assert store is not None
        index = entry_before(self.flog, store.checkpoint.dispatched)
        self.durable = Hint(index, store.checkpoint.dispatched, None)

    async def once(self) -> int:
        dropped = await super().once()
        store = self.store
        if dropped and store is not None:
            cl_min = store.commit_log.min_offset
            taken: list[MappedFile] = []
            for cq in store.consume_queues.values():
                taken.extend(cq.take_expired(cl_min))
            taken.extend(f.mf for f in store.index.take_expired(cl_min))
            if taken:
                await unlink_segments(taken)
        return dropped


def retention_for(
    classic: MessageStore, applier: Applier | CommittedDispatch, node: object
) -> LogRetention | None:
    """The retention of a member whose log is on files and whose classic store is the file
    store (or, written once, the store over the log); None otherwise (the in-memory logs and
    stores of tests keep everything)."""
    flog = getattr(node, "log", None)
    if not (
        isinstance(flog, FileLog)
        and isinstance(classic, DefaultMessageStore)
        and isinstance(node, RetentionNode)
    ):
        return None
    if isinstance(classic, DLedgerBackedStore) and isinstance(applier, CommittedDispatch):
        view = classic.view
        return WriteOnceRetention(
            flog,
            node,
            _WriteOnceProgress(applier),
            classic.config,
            lambda: view.visible_end,
            store=classic,
        )
    if not isinstance(applier, Applier):
        return None

    def classic_flushed() -> int:
        flush = classic.flush
        return flush.flushed if flush is not None else classic.commit_log.max_offset

    return LogRetention(flog, node, applier, classic.config, classic_flushed)
