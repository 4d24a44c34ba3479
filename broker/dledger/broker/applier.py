"""The copying DLedger state machine: committed log entries applied to a separate store, in index
order.

Used only where the store is not the Raft log's data files: the in-memory stores and logs of
tests.  The broker writes once (committed_dispatch.py, commitlog_view.py): this copy is what it
did before issue 27, kept so the in-memory groups of the tests keep running.

Theory of operation
-------------------
In DLedger mode the Raft log (``node.log``) is the replicated truth and the classic store
(``DefaultMessageStore``, or the in-memory one in tests) is the state machine readers see: its
CommitLog, ConsumeQueues and index.  Each non-empty entry body is exactly one CommitLog record
as the classic put path would have written it, queue offset included (the leader assigned it);
a leader's no-op entry (Raft §8: ``entry_coder.is_noop_body``, a ROLLBACK record no dispatcher
indexes, or an empty body) is skipped.

:meth:`Applier.run` waits until ``node.committed_index`` passes ``applied_index``, then for each
committed entry in order writes its record at the classic CommitLog's end through the store's
raw append (the seam a classic slave's HA uses): when the record does not fit the current
file, first a BLANK filler over the rest of it, by the classic rule (``size + 8 > remaining``),
then the record with its PHYSICALOFFSET patched to where it lands.  The classic store's own
dispatch (reput) then writes the ConsumeQueue units and index entries and wakes long polls.
On the leader, the put that proposed an entry leaves a :class:`PutHint` (its message, size,
queue offset and store time): a hint whose term is the entry's term is that entry's record, so
a store that can (:class:`PutDispatchingStore`) dispatches it from the message as its own put
path does, without parsing the record again.  A hint of another term (the entry was cut and
replaced by a new leader's) is dropped.
Every member applies the same record sequence into files of the same size, so a record lands
at the same physical offset on every member: msgIds and queue units agree across the group.

Restart (:meth:`Applier.resume`, apply_resume.py): the apply goes on exactly after the last
entry the classic store holds, found from a hint file and a walk of the classic tail; entries
applied before a restart that no leader has confirmed since stay revocable (a whole-group power
cut can take them from the other members' logs): if the new leader's log replaces them, the
classic store is cut back to the last entry the log still holds, and apply goes on from there.

Invariants
* ``applied_offset == classic.get_max_phy_offset()`` between two calls of ``apply_entry``;
* the classic CommitLog holds exactly the records of the non-empty entries ``<= applied_index``,
  in index order, and ``applied_index <= node.committed_index`` as seen when they were applied
  (only committed entries ever reach the classic store);
* ``applied_index`` never decreases, except when the log replaced entries applied before a
  restart that no leader had confirmed (the unconfirmed prefix, apply_resume.py): only a
  whole-group power cut can bring that about, and the store then follows the leader's log.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple, Protocol, runtime_checkable

import attrs
import trio

from broker.dledger.broker.apply_resume import (
    DURABLE_SUFFIX,
    HINT_FILE,
    ApplyError,
    Hint,
    ResumeReport,
    UnconfirmedPrefix,
    drop_durable_hint,
    find_resume_point,
    write_durable_hint,
    write_hint,
)
from broker.dledger.driver.entry_coder import is_noop_body
from broker.dledger.raft.log import RaftLog
from broker.dledger.raft.messages import Entry, Role
from broker.store.api import MessageStore
from broker.store.dirty_files import truncate_dirty_files
from broker.store.message_store import DefaultMessageStore
from common.message import (
    BLANK_MAGIC_CODE,
    MESSAGE_MAGIC_CODE,
    PHYSICAL_OFFSET_POSITION,
    MessageExtBrokerInner,
)
from common.remoting.codes import DLedgerResponseCode

log = logging.getLogger(__name__)

# entries applied before the apply task lets other tasks run
_APPLY_BATCH = 1024
# seconds between looks at the classic store's disk-full mark while applying is stalled on it
# (its disk check clears the mark within 100 ms of room coming back, clean_service.py)
_STALL_POLL_S = 0.1
_BLANK_HEAD = struct.Struct(">ii")
_PHYS = struct.Struct(">q")
_PHYS_END = PHYSICAL_OFFSET_POSITION + 8


class ApplyStalled(Exception):
    """The classic store's disk is full: nothing of the refused records was applied, and
    ``applied_index`` / ``applied_offset`` are back before them; ``run`` tries again later."""


class PutHint(NamedTuple):
    """What the leader's put knew of the record it proposed as entry ``index`` in ``term``
    (a NamedTuple: one is made per message on the leader's hot path)."""

    term: int
    msg: MessageExtBrokerInner
    size: int
    queue_offset: int
    store_ts: int


@runtime_checkable
class PutDispatchingStore(Protocol):
    """A classic store that takes records with their messages (``DefaultMessageStore``)."""

    def append_put_to_commit_log(
        self,
        start_offset: int,
        data: bytes | memoryview,
        msgs: Sequence[MessageExtBrokerInner],
        sizes: Sequence[int],
        qoffs: Sequence[int],
        store_ts: int,
    ) -> bool: ...


@attrs.define(eq=False)
class _Run:
    """Consecutive records for one call of the store: ``append_put_to_commit_log`` for hinted
    ones (with their messages), ``append_to_commit_log`` for the others."""

    start: int
    # the entry of the run's first record (where applying starts again after a stall)
    first_index: int
    buf: bytearray
    hinted: bool
    msgs: list[MessageExtBrokerInner]
    sizes: list[int]
    qoffs: list[int]
    store_ts: int


class ProposalView(Protocol):
    """What the store uses of a ``node.Proposal``."""

    @property
    def code(self) -> DLedgerResponseCode: ...

    @property
    def entries(self) -> Sequence[Entry]: ...

    async def wait(self) -> DLedgerResponseCode: ...


class NodeConfigView(Protocol):
    @property
    def group(self) -> str: ...

    @property
    def self_id(self) -> str: ...

    @property
    def peers(self) -> str: ...


class DLedgerNodeView(Protocol):
    """What the broker uses of a ``broker.dledger.driver.node.DLedgerNode`` (tests hand in
    fakes)."""

    @property
    def config(self) -> NodeConfigView: ...

    @property
    def log(self) -> RaftLog: ...

    @property
    def role(self) -> Role: ...

    @property
    def term(self) -> int: ...

    @property
    def leader_id(self) -> str | None: ...

    @property
    def committed_index(self) -> int: ...

    def propose(self, bodies: Sequence[bytes]) -> ProposalView: ...

    async def wait_committed(self, index: int) -> None: ...


@attrs.define(eq=False)
class Applier:
    classic: MessageStore
    node: DLedgerNodeView
    # last entry applied (-1: none); only grows
    applied_index: int = -1
    # the classic CommitLog's end after the last applied record
    applied_offset: int = 0
    # entry index -> physical offset it landed at (-1 until applied), only for the indexes a
    # pending put registered; the put removes its own
    landed: dict[int, int] = attrs.field(factory=dict)
    # entry index -> the leader's put of it (see the module doc); taken when the index is
    # applied, so at most the pending proposals (maxPendingRequestsNum) are here
    hints: dict[int, PutHint] = attrs.field(factory=dict)
    # hinted records gathered but not yet handed to the store (only inside apply_entries)
    _run: _Run | None = None
    # the classic store if it takes records with their messages (decided once: isinstance
    # against a runtime Protocol is slow)
    _dispatching: PutDispatchingStore | None = attrs.field(init=False, default=None)
    # set and replaced after every batch of applies
    _progress: trio.Event = attrs.field(factory=trio.Event)
    # the (index, offset) pair last written to the hint file
    _hinted: tuple[int, int] = (-2, -1)
    # the last periodic hint write failed (logged once until one succeeds)
    _hint_failing: bool = False
    # how many times the classic store was cut back after a restart (retention watches it)
    cuts: int = 0
    # entries applied before the restart and not yet confirmed by a leader (apply_resume.py)
    _unconfirmed: UnconfirmedPrefix = attrs.field(factory=lambda: UnconfirmedPrefix({}))

    def __attrs_post_init__(self) -> None:
        classic = self.classic
        self._dispatching = classic if isinstance(classic, PutDispatchingStore) else None

    @property
    def hint_path(self) -> str:
        return os.path.join(self.classic.config.store_path_root_dir, HINT_FILE)

    # --- restart (apply_resume.py) -----------------------------------------------------------
    def write_hint(self) -> None:
        """Atomically replace the hint with the current (index, offset, term) (no fsync: it
        only has to survive a process crash, like the mapped CommitLog it describes).

        On the loop's thread on purpose: once a second, a 60-byte write and a rename that wait
        for no writeback.  In a worker thread the applier's progress would hang on a thread's
        timing, which the deterministic tests (autojump clock) cannot follow: one that promotes
        a leader after its apply caught up failed that way."""
        pair = (self.applied_index, self.applied_offset)
        if pair != self._hinted:
            write_hint(self.hint_path, Hint(*pair, self.node.log.term_at(pair[0])))
            self._hinted = pair

    def _write_hint_or_log(self) -> None:
        """The periodic hint write; one the disk refuses (full) is logged once and tried again
        next time: the hint on disk stays an earlier point, from which a restart resumes as
        well (apply_resume.py)."""
        try:
            self.write_hint()
        except OSError as exc:
            if not self._hint_failing:
                log.error("could not write the apply hint, retrying: %s", exc)
            self._hint_failing = True
        else:
            self._hint_failing = False

    def write_durable_hint(self, hint: Hint) -> None:
        """Write ``hint`` (a past point whose classic bytes and Raft entry are on disk) to the
        durable hint, fsynced: log retention drops entries only up to it.  Blocking: for a
        worker thread."""
        write_durable_hint(self.hint_path, hint)

    def resume(self) -> ResumeReport:
        """Find where to apply from (apply_resume.py); records past the log are the caller's to
        cut (``report.cut_from``)."""
        report = find_resume_point(self.classic, self.node.log, self.hint_path)
        self.applied_index, self.applied_offset = report.applied_index, report.applied_offset
        self._unconfirmed = UnconfirmedPrefix(dict(report.points))
        return report

    async def _settle_unconfirmed(self) -> None:
        """Cut the classic store back if the log no longer holds entries applied before the
        restart (apply_resume.py); forget them once a leader confirmed them."""
        prefix = self._unconfirmed
        cut = prefix.cut_point(self.node.log)
        if cut is None:
            # the log still holds them; confirmed once a leader's commit index passed them
            prefix.confirmed_by(self.node.committed_index)
            return
        index, offset = cut
        log.warning(
            "the log replaced entries %d..%d applied before the restart: the classic store goes "
            "back to %d",
            index + 1,
            self.applied_index,
            offset,
        )
        classic = self.classic
        if not isinstance(classic, DefaultMessageStore):
            raise ApplyError(f"the classic store cannot be cut back to {offset}")
        await truncate_dirty_files(classic, offset)
        self.applied_index, self.applied_offset = index, offset
        prefix.drop_above(index)
        # the hints may name records that are gone: the plain one is rewritten now, the durable
        # one removed (retention writes a new one), and retention drops what it took before
        self.cuts += 1
        self._hinted = (-2, -1)
        self.write_hint()
        await trio.to_thread.run_sync(drop_durable_hint, self.hint_path)

    # --- apply ------------------------------------------------------------------------------
    def apply_entry(self, entry: Entry) -> None:
        """Write one committed entry's record at the classic CommitLog's end (no-ops: nothing)."""
        self.apply_entries((entry,))

    def apply_entries(self, entries: Iterable[Entry]) -> None:
        """Apply consecutive committed entries; the classic store holds all of them on return.

        Records are gathered into runs (contiguous, in one file; hinted ones of one put) that go
        to the store in one call: one copy per run, and for hinted records one put-path
        dispatch."""
        try:
            for entry in entries:
                if entry.index != self.applied_index + 1:
                    raise ApplyError(f"apply of entry {entry.index} after {self.applied_index}")
                body = entry.body
                hint = self.hints.pop(entry.index, None) if self.hints else None
                if not is_noop_body(body):
                    if hint is not None and hint.term != entry.term:
                        hint = None
                    self._write_record(entry.index, body, hint)
                self.applied_index = entry.index
        finally:
            self._flush_run()

    def _flush_run(self) -> None:
        run = self._run
        if run is None:
            return
        self._run = None
        data = memoryview(run.buf)
        if run.hinted:
            dispatcher = self._dispatching
            assert dispatcher is not None  # a run is hinted only when there is one
            ok = dispatcher.append_put_to_commit_log(
                run.start, data, run.msgs, run.sizes, run.qoffs, run.store_ts
            )
        else:
            ok = self.classic.append_to_commit_log(run.start, data)
        if not ok:
            if self.classic.flags.disk_full:
                self._stall(run.first_index, run.start)
            raise ApplyError(f"classic store refused the records at {run.start}")

    def _stall(self, index: int, offset: int) -> None:
        """Go back to just before entry ``index`` (at CommitLog ``offset``) and stop."""
        self._run = None
        self.applied_index, self.applied_offset = index - 1, offset
        raise ApplyStalled(f"the classic store's disk is full at {offset} (entry {index})")

    def _write_record(self, index: int, body: bytes, hint: PutHint | None = None) -> None:
        classic = self.classic
        size = len(body)
        if size < _PHYS_END or _BLANK_HEAD.unpack_from(body, 0) != (size, MESSAGE_MAGIC_CODE):
            # every member skips it alike, so the stores stay equal
            log.error("DLedger entry %d is not one CommitLog record; skipped", index)
            return
        end = self.applied_offset
        file_size = classic.config.mapped_file_size_commit_log
        used = end % file_size
        hinted = hint is not None and self._dispatching is not None
        run = self._run
        if run is not None and (
            used == 0
            or size + 8 > file_size - used
            or run.hinted is not hinted
            or (hint is not None and hinted and run.store_ts != hint.store_ts)
        ):
            # the run ends: a new file (or a BLANK first), or records of another kind or put
            self._flush_run()
            run = None
        if used and size + 8 > file_size - used:
            rest = file_size - used
            blank = _BLANK_HEAD.pack(rest, BLANK_MAGIC_CODE) + bytes(rest - 8)
            if not classic.append_to_commit_log(end, blank):
                if classic.flags.disk_full:
                    self._stall(index, end)
                raise ApplyError(f"classic store refused the BLANK at {end}")
            end += rest
        if run is None:
            store_ts = hint.store_ts if hinted and hint is not None else 0
            run = self._run = _Run(end, index, bytearray(), hinted, [], [], [], store_ts)
        at = len(run.buf)
        run.buf += body
        _PHYS.pack_into(run.buf, at + PHYSICAL_OFFSET_POSITION, end)
        if hint is not None and hinted:
            run.msgs.append(hint.msg)
            run.sizes.append(hint.size)
            run.qoffs.append(hint.queue_offset)
        self.applied_offset = end + size
        if index in self.landed:
            self.landed[index] = end

    async def run(self, hint_interval: float = 1.0) -> None:
        """Apply committed entries until cancelled; rewrite the hint every ``hint_interval``."""
        node = self.node
        next_hint = trio.current_time() + hint_interval
        while True:
            if self._unconfirmed.points:
                # before waiting: the log may have replaced them while the commit index stays
                # below what this member applied before its restart
                await self._settle_unconfirmed()
            if node.committed_index <= self.applied_index:
                # while some are unconfirmed, look at the log often: a leader can replace them
                # without moving the commit index past what was applied
                wake = next_hint if not self._unconfirmed.points else trio.current_time() + 0.05
                with trio.move_on_at(min(next_hint, wake)):
                    await node.wait_committed(self.applied_index + 1)
            # a task woken just as its scope was cancelled must not apply any more: the classic
            # store may already be shutting down (and would refuse the record)
            await trio.lowlevel.checkpoint_if_cancelled()
            if self._unconfirmed.points:
                await self._settle_unconfirmed()
            first = self.applied_index + 1
            last = min(node.committed_index, self.applied_index + _APPLY_BATCH)
            try:
                self.apply_entries(self._committed(first, last))
            except ApplyStalled as exc:
                # nothing lost: the entries are in the Raft log and are applied again once the
                # disk has room (the store refuses puts meanwhile, running_flags.py); one line
                # per stall, however long the disk stays full
                log.error("%s; applying again once the disk has room", exc)
                await trio.sleep(_STALL_POLL_S)
                while self.classic.flags.disk_full:  # noqa: ASYNC110 - cleared by a 100 ms poll
                    await trio.sleep(_STALL_POLL_S)
                continue
            n = last - first + 1
            if n:
                ev, self._progress = self._progress, trio.Event()
                ev.set()
            if trio.current_time() >= next_hint:
                self._write_hint_or_log()
                next_hint = trio.current_time() + hint_interval
            await trio.lowlevel.checkpoint()

    def _committed(self, first: int, last: int) -> Iterator[Entry]:
        return committed_entries(self.node.log, first, last)

    async def wait_applied(self, index: int) -> None:
        while self.applied_index < index:
            await self._progress.wait()


__all__ = [
    "DURABLE_SUFFIX",
    "HINT_FILE",
    "ApplyError",
    "ApplyStalled",
    "Applier",
    "DLedgerNodeView",
    "NodeConfigView",
    "ProposalView",
    "PutDispatchingStore",
    "PutHint",
    "ResumeReport",
]


def committed_entries(log_: RaftLog, first: int, last: int) -> Iterator[Entry]:
    """Entries ``first..last`` of ``log_``, committed ones: ApplyError if one is missing."""
    for index in range(first, last + 1):
        entry = log_.get(index)
        if entry is None:
            raise ApplyError(f"committed entry {index} is not in the log")
        yield entry
