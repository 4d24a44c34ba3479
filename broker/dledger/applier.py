"""The DLedger state machine: committed log entries applied to the classic store, in index order.

Theory of operation
-------------------
In DLedger mode the Raft log (``node.log``) is the replicated truth and the classic store
(``DefaultMessageStore``, or the in-memory one in tests) is the state machine readers see: its
CommitLog, ConsumeQueues and index.  Each non-empty entry body is exactly one CommitLog record
as the classic put path would have written it, queue offset included (the leader assigned it);
an empty body is a leader's no-op entry (Raft §8) and is skipped.

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

Restart (:meth:`Applier.resume`), exact after any crash: the hint file ``dledger_applied`` in the
classic store's root holds a pair (index, offset) that was true when written: the classic
CommitLog ended at ``offset`` holding exactly the records of the entries ``<= index``.  A
process crash loses nothing of the classic CommitLog (its files are memory-mapped; recovery
only cuts a torn last record), so its recovered end is at or past ``offset``; resume walks the
classic records from ``offset`` to that end, pairing each with the next non-empty entry after
``index`` and checking they are the same record (every byte but PHYSICALOFFSET).  The last one
paired is the applied index: apply goes on at the next entry, with no record applied twice
and none skipped.  A hint the classic store cannot hold (it ends before the hint: an in-memory
store, or a tail lost to a power cut, the hint not being fsynced) gives way to the *durable*
hint, ``dledger_applied.durable``: a pair log retention (log_retention.py) wrote with fsync once
the classic flush had passed it, and below which it alone deletes Raft log files.  Without
either, the classic store is walked from its start (which must be 0).  A record that does not match its entry
stops the broker (``ApplyError``): the two logs diverged, and serving either would be wrong.

Invariants
* ``applied_offset == classic.get_max_phy_offset()`` between two calls of ``apply_entry``;
* the classic CommitLog holds exactly the records of the non-empty entries ``<= applied_index``,
  in index order, and ``applied_index <= node.committed_index`` as seen when they were applied
  (only committed entries ever reach the classic store);
* ``applied_index`` never decreases.
"""

from __future__ import annotations

import json
import logging
import os
import struct
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple, Protocol, runtime_checkable

import attrs
import trio

from broker.dledger.log import RaftLog
from broker.dledger.messages import Entry, Role
from broker.store.api import MessageStore
from common.config_file import atomic_write
from common.message import (
    BLANK_MAGIC_CODE,
    MESSAGE_MAGIC_CODE,
    PHYSICAL_OFFSET_POSITION,
    MessageExtBrokerInner,
)
from common.remoting.codes import DLedgerResponseCode

log = logging.getLogger(__name__)

HINT_FILE = "dledger_applied"
# the fsynced hint beside it (write_durable_hint)
DURABLE_SUFFIX = ".durable"
# entries applied before the apply task lets other tasks run
_APPLY_BATCH = 1024
# seconds between tries to apply when the classic store's disk is full
_STALL_RETRY_S = 1.0
_BLANK_HEAD = struct.Struct(">ii")
_PHYS = struct.Struct(">q")
_PHYS_END = PHYSICAL_OFFSET_POSITION + 8


class ApplyError(RuntimeError):
    """The classic store and the DLedger log disagree (or the store refused a record)."""


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
    """What the broker uses of a ``broker.dledger.node.DLedgerNode`` (tests hand in fakes)."""

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


@attrs.frozen
class ResumeReport:
    hint_index: int
    hint_offset: int
    # records found after the hint's offset (applied before the restart, paired with entries)
    records_after_hint: int
    applied_index: int
    applied_offset: int


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

    def __attrs_post_init__(self) -> None:
        classic = self.classic
        self._dispatching = classic if isinstance(classic, PutDispatchingStore) else None

    @property
    def hint_path(self) -> str:
        return os.path.join(self.classic.config.store_path_root_dir, HINT_FILE)

    # --- restart ----------------------------------------------------------------------------
    def read_hint(self, suffix: str = "") -> tuple[int, int] | None:
        try:
            with open(self.hint_path + suffix, "rb") as f:
                obj = json.loads(f.read())
            return int(obj["appliedIndex"]), int(obj["appliedOffset"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def write_hint(self) -> None:
        """Atomically replace the hint with the current (index, offset) pair (no fsync: the
        pair only has to survive a process crash, like the mapped CommitLog it describes)."""
        pair = (self.applied_index, self.applied_offset)
        if pair == self._hinted:
            return
        os.makedirs(os.path.dirname(self.hint_path), exist_ok=True)
        tmp = self.hint_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"appliedIndex": pair[0], "appliedOffset": pair[1]}, f)
        os.replace(tmp, self.hint_path)
        self._hinted = pair

    def write_durable_hint(self, pair: tuple[int, int]) -> None:
        """Write ``pair`` (a past (index, offset) whose classic bytes are flushed) to the durable
        hint, fsynced: after a power cut it is where resume starts when the plain hint points
        past the recovered classic end.  Log retention (log_retention.py) drops entries only up
        to it.  Blocking: for a worker thread."""
        data = json.dumps({"appliedIndex": pair[0], "appliedOffset": pair[1]}).encode()
        atomic_write(Path(self.hint_path + DURABLE_SUFFIX), data)

    def _usable_hint(self) -> tuple[int, int] | None:
        classic = self.classic
        end, start = classic.get_max_phy_offset(), classic.get_min_phy_offset()
        for hint in (self.read_hint(), self.read_hint(DURABLE_SUFFIX)):
            if hint is not None and start <= hint[1] <= end:
                return hint
        return None

    def resume(self) -> ResumeReport:
        """Find ``applied_index`` from the hint and the classic store (module docstring)."""
        classic = self.classic
        end = classic.get_max_phy_offset()
        hint = self._usable_hint()
        if hint is None:
            if classic.get_min_phy_offset() > 0:
                raise ApplyError(
                    f"no usable {HINT_FILE} and the classic CommitLog does not start at 0"
                )
            hint = (-1, classic.get_min_phy_offset())
        index, offset = hint
        file_size = classic.config.mapped_file_size_commit_log
        paired = 0
        while offset < end:
            data = classic.get_commit_log_data(offset)
            if data is None or len(data) < 8:
                raise ApplyError(f"classic CommitLog unreadable at {offset} (end {end})")
            size, magic = _BLANK_HEAD.unpack_from(data, 0)
            if magic == BLANK_MAGIC_CODE:
                offset += file_size - offset % file_size
                continue
            if magic != MESSAGE_MAGIC_CODE or size > len(data):
                raise ApplyError(f"classic CommitLog has no record at {offset}")
            index = self._next_record_entry(index, offset)
            body = self.node.log.get(index)
            assert body is not None
            if not _same_record(data[:size], body.body):
                raise ApplyError(
                    f"classic record at {offset} is not the record of DLedger entry {index}"
                )
            offset += size
            paired += 1
        self.applied_index, self.applied_offset = index, end
        report = ResumeReport(hint[0], hint[1], paired, index, end)
        log.info("dledger apply resumes after entry %d (classic end %d): %s", index, end, report)
        return report

    def _next_record_entry(self, index: int, offset: int) -> int:
        """The first non-empty entry after ``index``."""
        log_ = self.node.log
        i = index + 1
        while True:
            entry = log_.get(i)
            if entry is None:
                raise ApplyError(
                    f"classic record at {offset} has no DLedger entry (log ends at "
                    f"{log_.end_index})"
                )
            if entry.body:
                return i
            i += 1

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
                if body:
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
            if node.committed_index <= self.applied_index:
                with trio.move_on_at(next_hint):
                    await node.wait_committed(self.applied_index + 1)
            # a task woken just as its scope was cancelled must not apply any more: the classic
            # store may already be shutting down (and would refuse the record)
            await trio.lowlevel.checkpoint_if_cancelled()
            first = self.applied_index + 1
            last = min(node.committed_index, self.applied_index + _APPLY_BATCH)
            try:
                self.apply_entries(self._committed(first, last))
            except ApplyStalled as exc:
                # nothing lost: the entries are in the Raft log and are applied again once the
                # disk has room (the store refuses puts meanwhile, running_flags.py)
                log.error("%s; applying again in %.0f s", exc, _STALL_RETRY_S)
                await trio.sleep(_STALL_RETRY_S)
                continue
            n = last - first + 1
            if n:
                ev, self._progress = self._progress, trio.Event()
                ev.set()
            if trio.current_time() >= next_hint:
                self.write_hint()
                next_hint = trio.current_time() + hint_interval
            await trio.lowlevel.checkpoint()

    def _committed(self, first: int, last: int) -> Iterator[Entry]:
        log_ = self.node.log
        for index in range(first, last + 1):
            entry = log_.get(index)
            if entry is None:
                raise ApplyError(f"committed entry {index} is not in the log")
            yield entry

    async def wait_applied(self, index: int) -> None:
        while self.applied_index < index:
            await self._progress.wait()


def _same_record(stored: memoryview | bytes, body: bytes) -> bool:
    """The classic record is the entry's record: every byte equal but PHYSICALOFFSET."""
    return (
        len(stored) == len(body)
        and stored[:PHYSICAL_OFFSET_POSITION] == body[:PHYSICAL_OFFSET_POSITION]
        and stored[_PHYS_END:] == body[_PHYS_END:]
    )


__all__ = [
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
