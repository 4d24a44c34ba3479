"""DLedgerMessageStore: the broker's MessageStore in DLedger mode (RocketMQ ``DLedgerCommitLog``).

Theory of operation
-------------------
The store keeps the :class:`broker.store.api.MessageStore` surface the processors, the schedule
service and the slave sync already use.  Everything read-side (pulls, queue offsets, lookups,
queries, arrival listeners, runtime numbers) is the wrapped store's.  In the broker that store
is a :class:`~broker.dledger.broker.commitlog_view.DLedgerBackedStore`, whose CommitLog is the
Raft log's data files (written once): :class:`~broker.dledger.broker.committed_dispatch.
CommittedDispatch` makes committed entries visible and dispatches them in place, and a record's
offset is its entry's ``pos + 48``.  Over any other store (the in-memory ones of tests) the
:class:`broker.dledger.broker.applier.Applier` copies committed entries into it.  Either way only
committed entries are read.  The put path is replaced:

1. ``append_message(s)`` runs synchronously, like the classic one, so the order of calls is the
   order of the Raft log.  It answers SERVICE_NOT_AVAILABLE unless this member is the leader
   *and* the broker became master in the leader's current term (``_table_term``, set by
   :meth:`become_master`): a leader that has not yet applied its whole log, or a re-elected one
   whose role change is still queued, must not hand out queue offsets from a stale table.
2. The classic checks and encoding (``PutSteps._prepare_put``: role, lengths, the delay
   rewrite, batch rules: a batch with a transaction flag or a delay is MESSAGE_ILLEGAL) run
   against this store's own leader-side topic queue table; each record becomes one entry
   body, and ``node.propose(bodies)`` appends them (one entry per record, consecutive).
3. A refused proposal is a final answer (codes below).  An accepted one advances the queue
   table (the entries are in the leader's log: they commit, or leadership is lost, which voids
   the table) and returns a :class:`DLedgerPut`.  Its ``wait()`` awaits the quorum commit, then
   the apply of the last entry, then the classic dispatch, and answers PUT_OK with the
   physical offsets the records landed at (offset msgIds) and the leader's queue offsets.

DLedger outcome -> PutMessageStatus (as ``store/.../dledger/DLedgerCommitLog.java`` in
apache/rocketmq 4.9 maps it): SUCCESS -> PUT_OK; WAIT_QUORUM_ACK_TIMEOUT and
LEADER_PENDING_FULL -> OS_PAGECACHE_BUSY (the client sees code 1 "[PC_SYNCHRONIZED]..." and backs
off); everything else (NOT_LEADER, INCONSISTENT_LEADER, LEADER_NOT_READY, DISK_FULL,
TERM_CHANGED, LEADER_TRANSFERRING) -> SERVICE_NOT_AVAILABLE (14).  FLUSH_SLAVE_TIMEOUT is never
used.  A put answered with an error may still commit later (a timed-out entry stays in the
log): the client's retry may then store it twice, never lose it.

:meth:`become_master` (roles.py calls it once the log is fully committed, applied and
dispatched) rebuilds the queue table from the classic ConsumeQueues; :meth:`step_down` voids it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

import attrs
import trio

from broker.dledger.broker.applier import (
    Applier,
    ApplyError,
    DLedgerNodeView,
    ProposalView,
    PutHint,
)
from broker.dledger.broker.commitlog_view import DLedgerBackedStore
from broker.dledger.broker.committed_dispatch import CommittedDispatch
from broker.dledger.driver.entry_coder import BODY_OFFSET
from broker.dledger.driver.mmap_file_store import FileLog
from broker.dledger.raft.messages import Role
from broker.store.api import ArrivalListener, MessageStore
from broker.store.config import MessageStoreConfig
from broker.store.dirty_files import truncate_dirty_files
from broker.store.message_store import DefaultMessageStore
from broker.store.put_message import PreparedPut, PutSteps, QueueOffsetTable
from broker.store.results import (
    AppendMessageResult,
    GetMessageResult,
    MessageFilter,
    PutMessageResult,
    PutMessageStatus,
    QueryMessageResult,
)
from broker.store.running_flags import RunningFlags
from broker.store.stats import StoreStats
from common.message import MessageExt, MessageExtBrokerInner
from common.message_id import create_offset_msg_id
from common.remoting.codes import DLedgerResponseCode

log = logging.getLogger(__name__)

_BUSY = (DLedgerResponseCode.WAIT_QUORUM_ACK_TIMEOUT, DLedgerResponseCode.LEADER_PENDING_FULL)


def put_status(code: DLedgerResponseCode) -> PutMessageStatus:
    """The PutMessageStatus of a DLedger append outcome (``DLedgerCommitLog.putMessage``)."""
    if code is DLedgerResponseCode.SUCCESS:
        return PutMessageStatus.PUT_OK
    if code in _BUSY:
        return PutMessageStatus.OS_PAGECACHE_BUSY
    return PutMessageStatus.SERVICE_NOT_AVAILABLE


@attrs.define(eq=False)
class DLedgerMessageStore(PutSteps):
    classic: MessageStore
    node: DLedgerNodeView
    # write once (the store over the Raft log's data files): CommittedDispatch; the in-memory
    # stores of tests: the copying Applier
    applier: Applier | CommittedDispatch = attrs.field(init=False)
    # the classic store's (one frozen config for both)
    config: MessageStoreConfig = attrs.field(init=False)
    # (topic, queueId) -> next queue offset the leader hands out; valid only in _table_term
    _queue_table: QueueOffsetTable = attrs.field(factory=dict, init=False)
    # the Raft term in which this member became master (table rebuilt); None: not master
    _table_term: int | None = attrs.field(default=None, init=False)
    # PutSteps' state (put_message.py)
    shutdown: bool = attrs.field(default=False, init=False)
    clock: Callable[[], int] = attrs.field(default=lambda: int(time.time() * 1000), init=False)
    last_store_timestamp: int = attrs.field(default=0, init=False)
    _stats: StoreStats = attrs.field(factory=StoreStats, init=False)

    def __attrs_post_init__(self) -> None:
        classic = self.classic
        if isinstance(classic, DLedgerBackedStore):
            self.applier = CommittedDispatch(classic, self.node)
        else:
            self.applier = Applier(classic, self.node)
        self.config = classic.config

    @property
    def broker_role(self) -> str:
        return self.classic.broker_role

    @broker_role.setter
    def broker_role(self, role: str) -> None:
        self.classic.broker_role = role

    # --- roles (roles.py) ---------------------------------------------------------------------
    @property
    def applied_index(self) -> int:
        return self.applier.applied_index

    def caught_up(self) -> bool:
        """Leader readiness (RocketMQ's check before changeToMaster): every entry of the log
        committed, applied and dispatched."""
        node = self.node
        end = node.log.end_index
        return (
            node.role is Role.LEADER
            and end == node.committed_index == self.applier.applied_index
            and self.classic.dispatch_behind_bytes == 0
        )

    def become_master(self, term: int) -> None:
        """Rebuild the leader-side queue table from the applied state; puts are taken in
        ``term`` only.  Once per term: a second call in the term this member already serves
        as master changes nothing, for the live table is ahead of the applied state by every
        put still in flight, and rebuilding it would hand their queue offsets out again."""
        if self._table_term == term:
            return
        classic = self.classic
        self._queue_table = {
            (topic, qid): classic.get_max_offset_in_queue(topic, qid)
            for topic, qids in classic.topic_queues().items()
            for qid in qids
        }
        self._table_term = term

    def step_down(self) -> None:
        self._table_term = None

    def is_master_of(self, term: int) -> bool:
        """This member already serves as master in ``term`` (its queue table is that term's)."""
        return self._table_term == term and self.is_master

    @property
    def is_master(self) -> bool:
        node = self.node
        return (
            self._table_term is not None
            and node.role is Role.LEADER
            and node.term == self._table_term
        )

    # --- put path -----------------------------------------------------------------------------
    def _append(
        self, msgs: list[MessageExtBrokerInner], *, batch: bool
    ) -> PutMessageResult | DLedgerPut:
        # a full disk or a failed queue write refuses puts as the classic store does
        # (DefaultMessageStore._append; the reason is what `rmq top` shows)
        flags = self.classic.flags
        if flags.disk_full or flags.logics_queue_error:
            return self._fail(PutMessageStatus.SERVICE_NOT_AVAILABLE, flags.refusal())
        # (a SLAVE, or a store shutting down, is refused here like the classic store does)
        put = self._prepare_put(msgs, self._queue_table, batch=batch)
        if isinstance(put, PutMessageResult):
            return put
        if not self.is_master:
            node = self.node
            return self._fail(
                PutMessageStatus.SERVICE_NOT_AVAILABLE,
                f"not the DLedger leader (role {node.role.name}, term {node.term})",
            )
        view = memoryview(put.buf)
        bodies = []
        pos = 0
        for size in put.sizes:
            bodies.append(bytes(view[pos : pos + size]))
            pos += size
        proposal = self.node.propose(bodies)
        if proposal.code is not DLedgerResponseCode.SUCCESS:
            return self._fail(put_status(proposal.code), f"DLedger append: {proposal.code.name}")
        self._queue_table.update(put.next_q)
        applier = self.applier
        landed = applier.landed if isinstance(applier, Applier) else None
        hints = applier.hints
        for entry, msg, size, qoff in zip(
            proposal.entries, msgs, put.sizes, put.qoffs, strict=True
        ):
            if landed is not None:
                landed[entry.index] = -1
            hints[entry.index] = PutHint(entry.term, msg, size, qoff, put.store_ts)
        return DLedgerPut(self, proposal, put, [m.store_host for m in msgs])

    def append_message(self, msg: MessageExtBrokerInner) -> PutMessageResult | DLedgerPut:
        return self._append([msg], batch=False)

    def append_messages(self, msgs: list[MessageExtBrokerInner]) -> PutMessageResult | DLedgerPut:
        return self._append(msgs, batch=True)

    async def put_message(self, msg: MessageExtBrokerInner) -> PutMessageResult:
        r = self.append_message(msg)
        if isinstance(r, PutMessageResult):
            await trio.lowlevel.checkpoint()
            return r
        return await r.wait()

    async def put_messages(self, msgs: list[MessageExtBrokerInner]) -> PutMessageResult:
        r = self.append_messages(msgs)
        if isinstance(r, PutMessageResult):
            await trio.lowlevel.checkpoint()
            return r
        return await r.wait()

    def append_to_commit_log(
        self, start_offset: int, data: bytes | memoryview, *, wake_reput: bool = True
    ) -> bool:
        return False  # no classic HA in DLedger mode: the Raft log replicates

    def dispatch_appended(self) -> None:
        pass  # nothing is appended through append_to_commit_log here

    # --- read side: the classic store's ---------------------------------------------------------
    async def wait_dispatched(self, end: int | None = None) -> None:
        await self.classic.wait_dispatched(end)

    def add_arrival_listener(self, fn: ArrivalListener) -> None:
        self.classic.add_arrival_listener(fn)

    def add_write_listener(self, fn: Callable[[], None]) -> None:
        """Keeps no listener: a DLedger group replicates its entries through Raft, not through
        an HA master that would send the bytes it wrote."""

    def delete_topics(self, topics: Iterable[str]) -> None:
        names = set(topics)
        self.classic.delete_topics(names)
        for key in [k for k in self._queue_table if k[0] in names]:
            del self._queue_table[key]

    def get_message(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_msg_nums: int,
        message_filter: MessageFilter | None = None,
    ) -> GetMessageResult:
        return self.classic.get_message(
            group, topic, queue_id, offset, max_msg_nums, message_filter
        )

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        return self.classic.get_max_offset_in_queue(topic, queue_id)

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        return self.classic.get_min_offset_in_queue(topic, queue_id)

    def get_commit_log_offset_in_queue(self, topic: str, queue_id: int, cq_offset: int) -> int:
        return self.classic.get_commit_log_offset_in_queue(topic, queue_id, cq_offset)

    def get_queue_unit(
        self, topic: str, queue_id: int, cq_offset: int
    ) -> tuple[int, int, int] | None:
        return self.classic.get_queue_unit(topic, queue_id, cq_offset)

    def get_offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        return self.classic.get_offset_in_queue_by_time(topic, queue_id, timestamp_ms)

    def get_earliest_message_time(self, topic: str, queue_id: int) -> int:
        return self.classic.get_earliest_message_time(topic, queue_id)

    def select_one_message_by_offset(
        self, phys_offset: int, size: int | None = None
    ) -> bytes | memoryview | None:
        return self.classic.select_one_message_by_offset(phys_offset, size)

    def look_message_by_offset(
        self, phys_offset: int, size: int | None = None
    ) -> MessageExt | None:
        return self.classic.look_message_by_offset(phys_offset, size)

    def query_message(
        self, topic: str, key: str, max_num: int, begin_ts: int, end_ts: int
    ) -> QueryMessageResult:
        return self.classic.query_message(topic, key, max_num, begin_ts, end_ts)

    def get_max_phy_offset(self) -> int:
        return self.classic.get_max_phy_offset()

    @property
    def flags(self) -> RunningFlags:
        return self.classic.flags

    def get_min_phy_offset(self) -> int:
        return self.classic.get_min_phy_offset()

    def get_commit_log_data(self, offset: int) -> memoryview | None:
        return self.classic.get_commit_log_data(offset)

    @property
    def dispatch_behind_bytes(self) -> int:
        return self.classic.dispatch_behind_bytes

    def topic_queues(self) -> dict[str, list[int]]:
        return self.classic.topic_queues()

    def runtime_info(self) -> dict[str, str]:
        """The classic store's numbers (puts counted here) and the Raft state (the keys the
        CLI reads: dledgerRole, dledgerTerm, ...)."""
        info = self.classic.runtime_info()
        info.update(self._stats.runtime_info())
        node = self.node
        info.update(
            {
                "dledgerGroup": node.config.group,
                "dledgerSelfId": node.config.self_id,
                "dledgerRole": node.role.name,
                "dledgerTerm": str(node.term),
                "dledgerLeaderId": node.leader_id or "",
                "dledgerLedgerBeginIndex": str(node.log.begin_index),
                "dledgerLedgerEndIndex": str(node.log.end_index),
                "dledgerCommittedIndex": str(node.committed_index),
                "dledgerAppliedIndex": str(self.applier.applied_index),
                "dledgerPeers": node.config.peers,
                # reset by the leader after retention left it behind, not caught up yet
                # (driver/node.py; a fake node of the tests has no such state)
                "dledgerRebuilding": str(bool(getattr(node, "rebuilding", False))).lower(),
            }
        )
        return info


class DLedgerPut:
    """A put proposed to the Raft log; ``await wait()`` once for its final result."""

    __slots__ = ("_hosts", "_prepared", "_proposal", "_store")

    def __init__(
        self,
        store: DLedgerMessageStore,
        proposal: ProposalView,
        prepared: PreparedPut,
        hosts: list[tuple[str, int]],
    ) -> None:
        self._store = store
        self._proposal = proposal
        self._prepared = prepared  # the encoded records (sizes, queue offsets, timestamp)
        self._hosts = hosts  # each record's store host, for its msgId

    async def wait(self) -> PutMessageResult:
        store = self._store
        entries = self._proposal.entries
        applier = store.applier
        if isinstance(applier, CommittedDispatch):
            # written once: each record is where its entry is, at pos + 48
            code = await self._proposal.wait()
            if code is not DLedgerResponseCode.SUCCESS:
                return store._fail(put_status(code), f"DLedger append: {code.name}")
            await applier.wait_applied(entries[-1].index)
            offsets = [e.pos + BODY_OFFSET for e in entries]
        else:
            landed = applier.landed
            try:
                code = await self._proposal.wait()
                if code is not DLedgerResponseCode.SUCCESS:
                    return store._fail(put_status(code), f"DLedger append: {code.name}")
                await applier.wait_applied(entries[-1].index)
                offsets = [landed[e.index] for e in entries]
            finally:
                for e in entries:
                    landed.pop(e.index, None)
        put = self._prepared
        await store.classic.wait_dispatched(offsets[-1] + put.sizes[-1])
        ids = ",".join(
            create_offset_msg_id(h, o) for h, o in zip(self._hosts, offsets, strict=True)
        )
        store._stats.on_put(len(entries), len(put.buf))
        return PutMessageResult(
            PutMessageStatus.PUT_OK,
            AppendMessageResult(
                wrote_offset=offsets[0],
                wrote_bytes=len(put.buf),
                msg_id=ids,
                store_timestamp=put.store_ts,
                logics_offset=put.qoffs[0],
                msg_num=len(entries),
            ),
        )


# mypy proves here that the DLedger store keeps the MessageStore contract (api.py)
_CONTRACT: type[MessageStore] = DLedgerMessageStore


async def run_dledger_store(
    classic: MessageStore,
    node: DLedgerNodeView,
    *,
    hint_interval: float = 1.0,
    task_status: trio.TaskStatus[DLedgerMessageStore] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Resume the apply (applier.py) and run it until cancelled; the classic store and the
    node are started (and stopped) by the caller, around this."""
    store = DLedgerMessageStore(classic, node)
    applier = store.applier
    if isinstance(applier, CommittedDispatch):
        applier.resume()
        flog = node.log
        if isinstance(flog, FileLog):
            flog.truncate_listeners.append(applier.on_truncate)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(applier.run)
                task_status.started(store)
        finally:
            store.shutdown = True
            if isinstance(flog, FileLog):
                flog.truncate_listeners.remove(applier.on_truncate)
        return
    report = applier.resume()
    if report.cut_from is not None:
        if not isinstance(classic, DefaultMessageStore):
            raise ApplyError(f"the classic store holds records past the log at {report.cut_from}")
        await truncate_dirty_files(classic, report.cut_from)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(applier.run, hint_interval)
            task_status.started(store)
    finally:
        store.shutdown = True
        try:
            applier.write_hint()
        except OSError as exc:
            log.error("could not write the DLedger apply hint: %s", exc)


__all__ = ["DLedgerMessageStore", "DLedgerPut", "put_status", "run_dledger_store"]
