"""The file store's reput: CommitLog records -> ConsumeQueue units and index entries (RocketMQ
``DefaultMessageStore.ReputMessageService`` and the ``CommitLogDispatcher``s).

Theory of operation
-------------------
``reput_from`` is the CommitLog offset up to which every record is dispatched: a record
boundary, or the start of the file after a BLANK filler.  Three paths move it, all applying the
rules of dispatch.py:

* the put path, when nothing older is pending (always, on a master), dispatches the records it
  just wrote right away (``dispatch_put``), so they are visible to ``get_message`` when the
  append returns;
* when reput is behind, the put path leaves a ready :class:`DispatchRequest` per record
  (``queue_put``: no re-parse) and wakes the task;
* the task (``run``) otherwise parses what is past ``reput_from``: bytes appended by HA (a
  record split across HA chunks waits for its remaining bytes) or found by recovery
  (``do_reput(limit=None)``).

A unit is written only at its queue's end (``ConsumeQueue.put``), so a re-dispatch after
recovery is idempotent; a duplicate index entry is harmless (queries verify records).  After
the units of a record are written, the arrival listeners are called with
``(topic, queueId, offset + 1, tagsCode)``: long polls wake, the HA master learns of new bytes.
Waiters (``wait_dispatched``) park on an event replaced after every round.
"""

from __future__ import annotations

import collections
import logging
import os
from collections.abc import Callable, Sequence

import trio

from broker.store.api import ArrivalListener
from broker.store.commitlog import CommitLog
from broker.store.config import MessageStoreConfig
from broker.store.consumequeue import CQ_UNIT, CQ_UNIT_SIZE, ConsumeQueue
from broker.store.dispatch import (
    BLANK,
    PARTIAL,
    SKIP,
    DispatchRequest,
    Framing,
    NotARecord,
    UnitRun,
    dispatch_put,
    dispatch_tags_code,
    index_key_names,
    parse_record,
    request_for_put,
    takes_index_entries,
    takes_queue_unit,
)
from broker.store.index import IndexService, topic_key_hash
from broker.store.running_flags import RunningFlags
from common.message import MessageExtBrokerInner, RecordDecodeError

log = logging.getLogger(__name__)

# records dispatched before the reput task yields to other tasks.  Small, so that a slave's
# HA reader, which takes in megabytes per turn, is not held back by the queue building behind
# it: a slave catching up acknowledges bytes as soon as they are appended (4096 here held the
# catch-up of a 1 GiB CommitLog to the reput's pace, ~110 MB/s; a yield costs ~0.1 us a record)
_REPUT_BATCH = 64
# seconds between tries of a dispatch round that failed on the filesystem
_RETRY_S = 1.0
# a CommitLog's own framing (ReputService.parse_at)
ParseAt = Callable[[int], tuple[DispatchRequest | NotARecord | Framing, int]]
# an arrival listener's arguments: (topic, queueId, offset + 1, tagsCode)
_Arrival = tuple[str, int, int, int]


class ReputService:
    def __init__(
        self,
        config: MessageStoreConfig,
        commit_log: CommitLog,
        consume_queues: dict[tuple[str, int], ConsumeQueue],
        index: IndexService,
    ):
        self.config = config
        self.delay_millis = config.delay_level_millis
        self.commit_log = commit_log
        # shared with the store, which loads and deletes queues; reput creates new ones
        self.consume_queues = consume_queues
        self.index = index
        self.cq_root = os.path.join(config.store_path_root_dir, "consumequeue")
        # CommitLog offset up to which records were dispatched (a record boundary or file start)
        self.reput_from = 0
        # DispatchRequests of records the put path wrote, in CommitLog order, not yet dispatched
        self._pending: collections.deque[DispatchRequest] = collections.deque()
        self._wake = trio.Event()
        # replaced after every reput round; waiters re-check reput_from when it fires
        self._progress = trio.Event()
        self.listeners: list[ArrivalListener] = []
        # shared with the store: a failed queue write refuses puts until a round gets through
        self.flags = RunningFlags()
        # the CommitLog's own framing, when it is not records back to back: a DLedger
        # member's records sit inside Raft entries (broker/dledger/broker/commitlog_view.py);
        # pos -> (request | BLANK | SKIP | PARTIAL, bytes to the next boundary), the request's
        # offset checked by it.  None: the classic framing below.
        self.parse_at: ParseAt | None = None

    @property
    def caught_up(self) -> bool:
        """Nothing older than a put arriving now waits for dispatch."""
        return self.reput_from == self.commit_log.max_offset and not self._pending

    def wake(self) -> None:
        self._wake.set()

    def dispatch_now(self) -> None:
        """One round on the caller's turn (a slave's HA reader, after it acknowledged what it
        appended): the records of a send are dispatched without waking this task, a scheduler
        pass per send saved.  What one round leaves (a catch-up), a failed round and a round
        after a failure (the task logs, refuses puts, retries and says when it resumed) are the
        task's, woken here."""
        if self.flags.logics_queue_error:
            self._wake.set()
            return
        before = self.reput_from
        try:
            more = self.do_reput()
        except OSError:
            self._wake.set()
            return
        if self.reput_from != before:
            self._wake_progress()
        if more:
            self._wake.set()

    def cut(self, offset: int) -> None:
        """The CommitLog was cut back to ``offset`` (dirty_files.py): dispatch from there, and
        forget what the put path left for records at or past it."""
        self.reput_from = min(self.reput_from, offset)
        pending = self._pending
        while pending and pending[-1].commit_log_offset >= offset:
            pending.pop()

    async def wait_dispatched(self, end: int | None = None) -> None:
        """Until every record below ``end`` (default: the CommitLog end) is dispatched."""
        if end is None:
            end = self.commit_log.max_offset
        with trio.move_on_after(self.config.sync_flush_timeout):
            while self.reput_from < end:
                ev = self._progress
                self._wake.set()
                await ev.wait()
            return
        log.error("dispatch is stuck at %d (wanted %d)", self.reput_from, end)

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            try:
                while self.do_reput():
                    self._wake_progress()
                    await trio.lowlevel.checkpoint()
            except OSError as exc:
                # a queue or index segment the filesystem cannot back (a full disk): reput_from
                # stays before the record, which is safe in the CommitLog; puts are refused
                # (running_flags.py) and the round is tried again until it gets through
                if not self.flags.logics_queue_error:
                    log.error("dispatch stopped at %d, retrying: %s", self.reput_from, exc)
                self.flags.logics_queue_error = True
                self._wake_progress()
                await trio.sleep(_RETRY_S)
                self._wake.set()
                continue
            if self.flags.logics_queue_error:
                log.warning("dispatch resumed at %d", self.reput_from)
                self.flags.logics_queue_error = False
            self._wake_progress()

    def _wake_progress(self) -> None:
        ev, self._progress = self._progress, trio.Event()
        ev.set()

    # --- the parse path -----------------------------------------------------------------------

    def do_reput(self, limit: int | None = _REPUT_BATCH) -> bool:
        """Dispatch available records; returns True if it stopped because of ``limit``.

        The records found in one call are dispatched together (:meth:`dispatch_many`), then
        ``reput_from`` moves past them."""
        cl = self.commit_log
        pending = self._pending
        reqs: list[DispatchRequest] = []
        pos = self.reput_from
        stopped = False
        while pos < cl.max_offset:
            if limit is not None and len(reqs) >= limit:
                stopped = True
                break
            while pending and pending[0].commit_log_offset < pos:
                pending.popleft()
            if pending and pending[0].commit_log_offset == pos:
                req = pending.popleft()
                size = req.msg_size
            elif self.parse_at is not None:
                try:
                    parsed, size = self.parse_at(pos)
                except RecordDecodeError as exc:
                    log.error("reput stopped at %d: %s", pos, exc)
                    break
                if parsed is PARTIAL:
                    break
                if parsed is BLANK:
                    pos = cl.roll_next_file(pos)
                    continue
                if parsed is SKIP:
                    pos += size
                    continue
                assert isinstance(parsed, DispatchRequest)
                req = parsed
            else:
                mf = cl.queue.find(pos)
                if mf is None:
                    break
                try:
                    parsed, size = parse_record(
                        mf.view,
                        pos - mf.file_from_offset,
                        mf.wrote,
                        self.delay_millis,
                        check_crc=False,
                    )
                except RecordDecodeError as exc:
                    log.error("reput stopped at %d: %s", pos, exc)
                    break
                if parsed is PARTIAL:
                    if mf.is_full:  # nothing more can come in this segment
                        log.error("reput: truncated record at the end of segment %s", mf.path)
                    break
                if parsed is BLANK:
                    pos = cl.roll_next_file(pos)
                    continue
                req = parsed
                if req.commit_log_offset != pos:
                    log.error("reput: record at %d claims offset %d", pos, req.commit_log_offset)
                    break
            reqs.append(req)
            pos += size
        self.dispatch_many(reqs)
        self.reput_from = pos
        return stopped

    def consume_queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        key = (topic, queue_id)
        cq = self.consume_queues.get(key)
        if cq is None:
            cq = ConsumeQueue(
                self.cq_root, topic, queue_id, self.config.mapped_file_size_consume_queue
            )
            self.consume_queues[key] = cq
        return cq

    def dispatch(self, req: DispatchRequest) -> None:
        if takes_queue_unit(req.sys_flag):
            cq = self.consume_queue(req.topic, req.queue_id)
            if cq.put(req.commit_log_offset, req.msg_size, req.tags_code, req.consume_queue_offset):
                table = self.commit_log.topic_queue_table
                key = (req.topic, req.queue_id)
                if table.get(key, 0) <= req.consume_queue_offset:
                    table[key] = req.consume_queue_offset + 1  # a slave learns it from records
                for fn in self.listeners:
                    try:
                        fn(req.topic, req.queue_id, req.consume_queue_offset + 1, req.tags_code)
                    except Exception:
                        log.exception("arrival listener failed")
        if req.keys and self.config.message_index_enable and takes_index_entries(req.sys_flag):
            self.index.put(req.keys, req.commit_log_offset, req.store_timestamp)

    def dispatch_many(self, reqs: Sequence[DispatchRequest]) -> None:
        """``dispatch`` of consecutive records, with the put path's economies: the units of
        consecutive offsets of one queue are written as one run, and index entries are added
        per run of one store time without the ``topic#key`` strings being hashed whole."""
        if len(reqs) < 2:
            for req in reqs:
                self.dispatch(req)
            return
        runs: list[UnitRun] = []
        run_key: tuple[str, int] | None = None
        units = bytearray()
        next_q = 0
        pack_unit = CQ_UNIT.pack
        indexing = self.config.message_index_enable
        entries: list[tuple[int, int]] = []
        entries_ts = 0
        for req in reqs:
            sys_flag = req.sys_flag
            if takes_queue_unit(sys_flag):
                q = req.consume_queue_offset
                if q != next_q or run_key != (req.topic, req.queue_id):
                    run_key = (req.topic, req.queue_id)
                    units = bytearray()
                    runs.append(UnitRun(run_key, q, units))
                units += pack_unit(req.commit_log_offset, req.msg_size, req.tags_code)
                next_q = q + 1
            if req.keys and indexing and takes_index_entries(sys_flag):
                if entries and req.store_timestamp != entries_ts:
                    self.index.put_entries(entries, entries_ts)
                    entries = []
                entries_ts = req.store_timestamp
                cut = len(req.topic) + 1  # keys are "topic#key"
                topic = req.topic
                for k in req.keys:
                    entries.append((topic_key_hash(topic, k[cut:]), req.commit_log_offset))
        if entries:
            self.index.put_entries(entries, entries_ts)
        notes: list[_Arrival] = []
        for run in runs:
            notes.extend(self._put_units(run))
        self._notify(notes)

    # --- the put path -------------------------------------------------------------------------

    def queue_put(
        self,
        msgs: Sequence[MessageExtBrokerInner],
        sizes: Sequence[int],
        qoffs: Sequence[int],
        phys: int,
        store_ts: int,
    ) -> None:
        """Reput is behind: leave ready DispatchRequests for the task (no re-parse)."""
        pending = self._pending
        delays = self.delay_millis
        for m, size, q in zip(msgs, sizes, qoffs, strict=True):
            pending.append(request_for_put(m, phys, size, q, store_ts, delays))
            phys += size
        self._wake.set()

    def dispatch_put(
        self,
        msgs: Sequence[MessageExtBrokerInner],
        sizes: Sequence[int],
        qoffs: Sequence[int],
        first: int,
        store_ts: int,
    ) -> None:
        """Dispatch records the put path just wrote at ``first`` while reput was caught up.

        Same effect as ``dispatch`` per record (dispatch.dispatch_put).  [reput_from, first)
        can only be a BLANK filler written by reserve().  On an error reput_from stays at
        ``first`` and the task re-parses from there (CQ puts are idempotent, duplicate index
        entries are harmless).
        """
        self.reput_from = first
        notes: list[_Arrival]  # arrival listener calls, made once every unit is written
        try:
            if len(msgs) == 1:  # a single send: its unit and index entries without the runs
                notes = self._dispatch_one(msgs[0], sizes[0], qoffs[0], first, store_ts)
            else:
                runs, entries = dispatch_put(
                    msgs,
                    sizes,
                    qoffs,
                    first,
                    store_ts,
                    self.delay_millis,
                    index_enabled=self.config.message_index_enable,
                )
                notes = []
                for run in runs:
                    notes.extend(self._put_units(run))
                if entries:
                    self.index.put_entries(entries, store_ts)
        except OSError as exc:
            log.error("dispatch failed at %d, the task retries: %s", first, exc)
            self.flags.logics_queue_error = True
            self._wake.set()
            return
        except Exception:
            log.exception("dispatch failed at %d", first)
            self._wake.set()
            return
        self.reput_from = first + sum(sizes)
        self._notify(notes)

    def dispatch_put_at(
        self, msg: MessageExtBrokerInner, size: int, q: int, phys: int, end: int, store_ts: int
    ) -> bool:
        """A framed CommitLog's put path (a DLedger leader's own entry, whose record is at
        ``phys`` and whose framing ends at ``end``): dispatched from the message as
        ``dispatch_put`` does, when ``reput_from`` is where its framing starts (the caller
        checked).  False on a failed queue write: ``reput_from`` stays and the task parses it
        again.  Waiters are woken by :meth:`wake_waiters`, once per batch."""
        try:
            notes = self._dispatch_one(msg, size, q, phys, store_ts)
        except OSError as exc:
            log.error("dispatch failed at %d, the task retries: %s", phys, exc)
            self.flags.logics_queue_error = True
            self._wake.set()
            return False
        self.reput_from = end
        self._notify(notes)
        return True

    def wake_waiters(self) -> None:
        """``wait_dispatched`` callers look again (after ``dispatch_put_at``)."""
        self._wake_progress()

    def _dispatch_one(
        self, m: MessageExtBrokerInner, size: int, q: int, phys: int, store_ts: int
    ) -> list[_Arrival]:
        """``dispatch_put`` + ``_put_units`` + the index entries for one record: the same
        unit, the same entries, the same arrival note, in fewer steps."""
        topic, qid, props, sys_flag = m.topic, m.queue_id, m.properties, m.sys_flag
        notes: list[_Arrival] = []
        if takes_queue_unit(sys_flag):
            tcode = dispatch_tags_code(topic, props, store_ts, self.delay_millis)
            key = (topic, qid)
            cq = self.consume_queues.get(key) or self.consume_queue(topic, qid)
            if cq.put_tail_unit(q, phys, size, tcode) or cq.put(phys, size, tcode, q):
                table = self.commit_log.topic_queue_table
                if table.get(key, 0) < q + 1:
                    table[key] = q + 1
                notes.append((topic, qid, q + 1, tcode))
        if self.config.message_index_enable and takes_index_entries(sys_flag):
            keys = index_key_names(props)
            if keys:
                self.index.put_entries([(topic_key_hash(topic, k), phys) for k in keys], store_ts)
        return notes

    def _notify(self, notes: Sequence[_Arrival]) -> None:
        listeners = self.listeners
        if listeners:
            for note in notes:
                for fn in listeners:
                    try:
                        fn(*note)
                    except Exception:
                        log.exception("arrival listener failed")

    def _put_units(self, run: UnitRun) -> list[_Arrival]:
        """Write a run of packed units; the arrival notes of those added."""
        topic, qid = key = run.key
        first_q, units = run.first_offset, run.units
        cq = self.consume_queue(topic, qid)
        n = len(units) // CQ_UNIT_SIZE
        added: Sequence[int]
        if cq.put_tail(first_q, units):
            added = range(n)
        else:
            added = []
            for i in range(n):
                phys, size, tcode = CQ_UNIT.unpack_from(units, i * CQ_UNIT_SIZE)
                if cq.put(phys, size, tcode, first_q + i):
                    added.append(i)
        table = self.commit_log.topic_queue_table
        if added and table.get(key, 0) < first_q + added[-1] + 1:
            table[key] = first_q + added[-1] + 1
        unpack = CQ_UNIT.unpack_from
        return [(topic, qid, first_q + i + 1, unpack(units, i * CQ_UNIT_SIZE)[2]) for i in added]
