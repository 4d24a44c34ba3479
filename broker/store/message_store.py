"""DefaultMessageStore: the file-backed MessageStore facade, its reput task and its lifecycle.

Theory of operation
-------------------
``run_message_store`` owns everything under ``store_path_root_dir``:

1. Start: take ``lock`` (flock: one store per directory), note whether ``abort`` exists (it is
   created at start and removed by a clean stop, so its presence means the last run died), load
   the checkpoint, map the CommitLog, ConsumeQueue and index files (mapping reads nothing),
   then recover by the rules of recovery.py, reading only the tail: validate the CommitLog from
   the checkpoint's ``dispatched`` offset (nothing after a clean stop, what was written since
   the last checkpoint after a crash) and cut the torn tail, find each queue's end by binary
   search and drop units past the CommitLog's valid end, rebuild the topic queue table from
   the queues, cut the index back to ``dispatched`` and re-dispatch every record after it
   (idempotent).  ``self.recovery`` (a ``RecoveryReport``) records what was read.  Start-up
   time is thus independent of the store's size after a clean stop, and proportional to the
   writes of the last checkpoint interval after a crash.
   Only then ``task_status.started(store)``: nothing is served before recovery finished.
2. Run: the reput task and the flush task (flush.py) live in the store's nursery.
3. Stop (cancellation): shielded and bounded, flush everything, write the checkpoint, remove
   ``abort``, unmap, unlock.

Put path: ``append_message(s)`` validates, applies the delay rewrite, encodes the records,
reserves room (maybe a BLANK filler) and copies them into the CommitLog map, all synchronously:
there is no ``await`` between receiving a message and appending it, so call order is CommitLog
order.  When the reput task has nothing older pending (always, on a master) the new records are
dispatched right there too, so they are visible to ``get_message`` at once.  The result is then
final under ASYNC_FLUSH; otherwise it is a ``PendingPut`` whose ``await wait()`` waits for the
dispatch (reput behind) and, under SYNC_FLUSH unless WAIT=false, for the group-commit flush
covering the records' end.  ``put_message(s)`` is append + wait (one checkpoint if final).

Reput: a task that moves ``reput_from`` over new CommitLog bytes and writes ConsumeQueue units
and index entries, then calls the arrival listeners (which wake long polls).  Records the put
path wrote while reput was behind come with a ready ``DispatchRequest`` (no re-parse); bytes
appended by HA or found by recovery are parsed.  A record split across HA chunks waits for its remaining bytes.

Reads go straight to the maps: ``get_message`` scans CQ units (store_util.select_messages) and
returns memoryviews of the CommitLog records, no per-message objects.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import logging
import os
import struct
import time
from collections.abc import Callable

import trio

from broker.store.checkpoint import StoreCheckpoint
from broker.store.commitlog import CommitLog
from broker.store.config import MessageStoreConfig
from broker.store.consumequeue import ConsumeQueue
from broker.store.flush import FlushService
from broker.store.index import IndexService, topic_key_hash
from broker.store.recovery import RecoveryReport, commit_log_start
from broker.store.results import (
    GetMessageResult,
    MessageFilter,
    PendingPut,
    PutMessageResult,
    PutMessageStatus,
    QueryMessageResult,
)
from broker.store.store_util import (
    BLANK,
    CQ_UNIT,
    CQ_UNIT_SIZE,
    MAX_QUERY_NUM,
    PARTIAL,
    SCHEDULE_TOPIC,
    DispatchRequest,
    StoreStats,
    StoreSteps,
    dispatch_tags_code,
    group_queue_ids,
    index_keys,
    is_prepared_or_rollback,
    parse_record,
    search_offset_by_time,
    select_messages,
)
from common.message import (
    MessageConst,
    MessageExtBrokerInner,
    MessageSysFlag,
    RecordDecodeError,
    store_timestamp_position,
    tags_code,
)

log = logging.getLogger(__name__)

ArrivalListener = Callable[[str, int, int, int], None]
_Q = struct.Struct(">q")
_I = struct.Struct(">i")
# records dispatched before the reput task yields to other tasks
_REPUT_BATCH = 4096


class StoreLockedError(OSError):
    """Another store already runs on this directory."""


class DefaultMessageStore(StoreSteps):
    def __init__(self, config: MessageStoreConfig):
        self.config = config
        root = config.store_path_root_dir
        self.root = root
        self.delay_millis = config.delay_level_millis
        self.commit_log = CommitLog(
            config.commit_log_dir, config.mapped_file_size_commit_log, self.delay_millis
        )
        self.consume_queues: dict[tuple[str, int], ConsumeQueue] = {}
        self.index = IndexService(
            os.path.join(root, "index"), config.max_hash_slot_num, config.max_index_num
        )
        self.checkpoint = StoreCheckpoint(os.path.join(root, "checkpoint"))
        # CommitLog offset up to which records were dispatched (a record boundary or file start)
        self.reput_from = 0
        # DispatchRequests of records the put path wrote, in CommitLog order, not yet dispatched
        self._pending: collections.deque[DispatchRequest] = collections.deque()
        self._reput_wake = trio.Event()
        # replaced after every reput round; waiters re-check reput_from when it fires
        self._reput_progress = trio.Event()
        self._listeners: list[ArrivalListener] = []
        self._stats = StoreStats()
        self.last_store_timestamp = 0
        self.clock: Callable[[], int] = lambda: int(time.time() * 1000)
        self.shutdown = False
        # Mutable: DLedger/role changes switch it at runtime (the config is frozen).
        self.broker_role = config.broker_role
        self.flush: FlushService | None = None
        self._lock_fd = -1
        self.last_exit_ok = True
        # what the last open_and_recover read (recovery.py)
        self.recovery: RecoveryReport | None = None

    # ================================================================ lifecycle

    def _cq_root(self) -> str:
        return os.path.join(self.root, "consumequeue")

    def _abort_path(self) -> str:
        return os.path.join(self.root, "abort")

    def open_and_recover(self) -> None:
        """Blocking: lock, load and recover. Raises StoreLockedError / OSError."""
        try:
            self._open_and_recover()
        except BaseException:
            self.close_files(clean=False)
            raise

    def _open_and_recover(self) -> None:
        os.makedirs(self.root, exist_ok=True)
        self._lock_fd = os.open(os.path.join(self.root, "lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            self._lock_fd = -1
            raise StoreLockedError(f"store directory {self.root} is in use") from None
        self.last_exit_ok = not os.path.exists(self._abort_path())
        self.checkpoint = StoreCheckpoint.load(os.path.join(self.root, "checkpoint"))
        cp = self.checkpoint
        self.commit_log.load()
        self._load_consume_queues()
        self.index.load()

        self.recovery = self._recover(cp)
        log.info("store %s: %s", self.root, self.recovery.summary())
        with open(self._abort_path(), "wb"):
            pass

    def _recover(self, cp: StoreCheckpoint) -> RecoveryReport:
        """The rules of recovery.py: validate the CommitLog's tail from the checkpoint, cut the
        queues and the index back to it, re-dispatch what follows."""
        t0 = time.monotonic()
        cl = self.commit_log
        report = RecoveryReport(clean=self.last_exit_ok, checkpoint_valid=cp.valid)
        start, report.rule = commit_log_start(
            clean=self.last_exit_ok,
            checkpoint_offset=cp.dispatched if cp.valid else None,
            segment_starts=[mf.file_from_offset for mf in cl.queue.files],
            file_size=cl.file_size,
        )
        check_crc = self.config.check_crc_on_recover or not self.last_exit_ok
        valid_end, report.bytes_scanned, report.files_scanned = cl.recover(
            start, check_crc=check_crc
        )
        report.commit_log_from, report.commit_log_end = start, valid_end
        if not self.last_exit_ok:
            log.warning(
                "store %s was not shut down cleanly; CommitLog valid to %d", self.root, valid_end
            )
        last_unit_end = cl.min_offset
        for cq in self.consume_queues.values():
            cq.recover(cl.min_offset)
            report.cq_units_dropped += cq.truncate_dirty(valid_end)
            last_unit_end = max(last_unit_end, cq.last_phys_end())
        cl.topic_queue_table = {k: cq.max_offset for k, cq in self.consume_queues.items()}
        if report.rule == "checkpoint":
            reput = start
        elif report.rule == "last-files":
            # RocketMQ's rule without a checkpoint: dispatch from where the queues end
            reput = min(last_unit_end, valid_end)
        else:
            reput = cl.min_offset
        self.reput_from = report.redispatch_from = reput
        report.index_entries_dropped = self.index.recover(reput)
        self._do_reput(limit=None)
        report.redispatched_bytes = self.reput_from - reput
        if self.reput_from < valid_end:
            log.error(
                "recovery could not dispatch past %d (valid end %d)", self.reput_from, valid_end
            )
        report.seconds = time.monotonic() - t0
        return report

    def _load_consume_queues(self) -> None:
        root = self._cq_root()
        if not os.path.isdir(root):
            return
        for topic in os.listdir(root):
            tdir = os.path.join(root, topic)
            if not os.path.isdir(tdir):
                continue
            for qid in os.listdir(tdir):
                if not qid.lstrip("-").isdigit():
                    continue
                cq = ConsumeQueue(root, topic, int(qid), self.config.mapped_file_size_consume_queue)
                cq.load()
                self.consume_queues[(topic, int(qid))] = cq

    def close_files(self, *, clean: bool = True) -> None:
        self.commit_log.close()
        for cq in self.consume_queues.values():
            cq.close()
        self.index.close()
        if clean:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._abort_path())
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    # ================================================================ put path

    def _append(self, msgs: list[MessageExtBrokerInner], *, batch: bool) -> PutMessageResult:
        """Synchronous part of a put: checks, encode, copy into the CommitLog."""
        cl = self.commit_log
        put = self._prepare_put(msgs, cl.topic_queue_table, batch=batch)
        if type(put) is PutMessageResult:
            return put
        # Dispatch inline when the reput task has nothing older left to do: the put is then
        # visible to get_message as soon as this returns, without a round trip through the task.
        caught_up = self.reput_from == cl.max_offset and not self._pending
        try:
            first = cl.reserve(len(put.buf))
        except OSError as exc:
            log.exception("cannot create a CommitLog segment")
            return self._fail(PutMessageStatus.CREATE_MAPEDFILE_FAILED, str(exc))
        msg_id = self._stamp_physical_offsets(put, msgs, first)
        cl.write(put.buf)
        if caught_up:
            self._dispatch_put(msgs, put.sizes, put.qoffs, first, put.store_ts)
        else:
            self._queue_dispatch(msgs, put.sizes, put.qoffs, first, put.store_ts)
        cl.topic_queue_table.update(put.next_q)
        return self._put_ok(put, len(msgs), first, msg_id)

    def _finish(self, result: PutMessageResult, wait_store: bool) -> PutMessageResult | PendingPut:
        """Final result if nothing is left to wait for, else a PendingPut."""
        if not result.ok:
            return result
        end = result.append.wrote_offset + result.append.wrote_bytes
        flush = self.flush
        need_flush = flush is not None and flush.sync
        if need_flush and not wait_store:
            flush.request()  # WAIT=false: ask for the flush but do not wait for it
            need_flush = False
        if not need_flush and self.reput_from >= end:
            return result
        return PendingPut(self, result, end, need_flush)

    def append_message(self, msg: MessageExtBrokerInner) -> PutMessageResult | PendingPut:
        """Append now (no await); a final result, or a PendingPut to ``await .wait()``."""
        result = self._append([msg], batch=False)
        return self._finish(result, msg.properties.get(MessageConst.WAIT) != "false")

    def append_messages(self, msgs: list[MessageExtBrokerInner]) -> PutMessageResult | PendingPut:
        """Batch form of :meth:`append_message` (one batch, consecutive offsets)."""
        result = self._append(msgs, batch=True)
        wait = bool(msgs) and msgs[0].properties.get(MessageConst.WAIT) != "false"
        return self._finish(result, wait)

    async def put_message(self, msg: MessageExtBrokerInner) -> PutMessageResult:
        r = self.append_message(msg)
        if type(r) is PendingPut:
            return await r.wait()
        await trio.lowlevel.checkpoint()
        return r

    async def put_messages(self, msgs: list[MessageExtBrokerInner]) -> PutMessageResult:
        r = self.append_messages(msgs)
        if type(r) is PendingPut:
            return await r.wait()
        await trio.lowlevel.checkpoint()
        return r

    # ================================================================ reput / dispatch

    async def wait_dispatched(self, end: int | None = None) -> None:
        """Until every record below ``end`` (default: the CommitLog end) is dispatched."""
        if end is None:
            end = self.commit_log.max_offset
        with trio.move_on_after(self.config.sync_flush_timeout):
            while self.reput_from < end:
                ev = self._reput_progress
                self._reput_wake.set()
                await ev.wait()
            return
        log.error("dispatch is stuck at %d (wanted %d)", self.reput_from, end)

    @property
    def dispatch_behind_bytes(self) -> int:
        return self.commit_log.max_offset - self.reput_from

    def _do_reput(self, limit: int | None = _REPUT_BATCH) -> bool:
        """Dispatch available records; returns True if it stopped because of ``limit``."""
        cl = self.commit_log
        pending = self._pending
        n = 0
        while self.reput_from < cl.max_offset:
            if limit is not None and n >= limit:
                return True
            pos = self.reput_from
            while pending and pending[0].commit_log_offset < pos:
                pending.popleft()
            if pending and pending[0].commit_log_offset == pos:
                req = pending.popleft()
                size = req.msg_size
            else:
                mf = cl.queue.find(pos)
                if mf is None:
                    break
                try:
                    req, size = parse_record(
                        mf.view,
                        pos - mf.file_from_offset,
                        mf.wrote,
                        self.delay_millis,
                        check_crc=False,
                    )
                except RecordDecodeError as exc:
                    log.error("reput stopped at %d: %s", pos, exc)
                    break
                if req == PARTIAL:
                    if mf.is_full:  # nothing more can come in this segment
                        log.error("reput: truncated record at the end of segment %s", mf.path)
                    break
                if req == BLANK:
                    self.reput_from = cl.roll_next_file(pos)
                    continue
                if req.commit_log_offset != pos:
                    log.error("reput: record at %d claims offset %d", pos, req.commit_log_offset)
                    break
            self._dispatch(req)
            self.reput_from = pos + size
            n += 1
        return False

    def _consume_queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        key = (topic, queue_id)
        cq = self.consume_queues.get(key)
        if cq is None:
            cq = ConsumeQueue(
                self._cq_root(), topic, queue_id, self.config.mapped_file_size_consume_queue
            )
            self.consume_queues[key] = cq
        return cq

    def _dispatch(self, req: DispatchRequest) -> None:
        if not is_prepared_or_rollback(req.sys_flag):
            cq = self._consume_queue(req.topic, req.queue_id)
            if cq.put(req.commit_log_offset, req.msg_size, req.tags_code, req.consume_queue_offset):
                table = self.commit_log.topic_queue_table
                key = (req.topic, req.queue_id)
                if table.get(key, 0) <= req.consume_queue_offset:
                    table[key] = req.consume_queue_offset + 1  # a slave learns it from records
                for fn in self._listeners:
                    try:
                        fn(req.topic, req.queue_id, req.consume_queue_offset + 1, req.tags_code)
                    except Exception:
                        log.exception("arrival listener failed")
        if (
            req.keys
            and self.config.message_index_enable
            and MessageSysFlag.transaction_value(req.sys_flag)
            != MessageSysFlag.TRANSACTION_ROLLBACK
        ):
            self.index.put(req.keys, req.commit_log_offset, req.store_timestamp)

    def _queue_dispatch(self, msgs, sizes, qoffs, phys: int, store_ts: int) -> None:
        """Reput is behind: leave ready DispatchRequests for the reput task (no re-parse)."""
        pending = self._pending
        delays = self.delay_millis
        for m, size, q in zip(msgs, sizes, qoffs, strict=True):
            pending.append(
                DispatchRequest(
                    m.topic,
                    m.queue_id,
                    phys,
                    size,
                    dispatch_tags_code(m.topic, m.properties, store_ts, delays),
                    store_ts,
                    q,
                    m.sys_flag,
                    tuple(index_keys(m.topic, m.properties)),
                )
            )
            phys += size
        self._reput_wake.set()

    def _dispatch_put(self, msgs, sizes, qoffs, first: int, store_ts: int) -> None:
        """Dispatch records the put path just wrote at ``first`` while reput was caught up.

        Same effect as ``_dispatch`` per record, in fewer steps: the units of consecutive
        records of one queue go into the ConsumeQueue in one copy, index keys are hashed
        without building "topic#key" strings.  [reput_from, first) can only be a BLANK filler
        written by reserve().  On an error reput_from stays at ``first`` and the reput task
        re-parses from there (CQ puts are idempotent, duplicate index entries are harmless).
        """
        self.reput_from = first
        try:
            notes = self._dispatch_put_records(msgs, sizes, qoffs, first, store_ts)
        except Exception:
            log.exception("dispatch failed at %d", first)
            self._reput_wake.set()
            return
        self.reput_from = first + sum(sizes)
        listeners = self._listeners
        if listeners:
            for note in notes:
                for fn in listeners:
                    try:
                        fn(*note)
                    except Exception:
                        log.exception("arrival listener failed")

    def _dispatch_put_records(self, msgs, sizes, qoffs, phys: int, store_ts: int) -> list:
        notes = []  # arrival listener calls, made once every unit is written
        cq_key = None
        units = bytearray()
        unit_q = 0
        index_on = self.config.message_index_enable
        entries = []  # index (key hash, phys), written in one go
        delays = self.delay_millis
        pack_unit = CQ_UNIT.pack
        for m, size, q in zip(msgs, sizes, qoffs, strict=True):
            props = m.properties
            topic = m.topic
            t = m.sys_flag & MessageSysFlag.TRANSACTION_MASK
            if (
                t != MessageSysFlag.TRANSACTION_PREPARED
                and t != MessageSysFlag.TRANSACTION_ROLLBACK
            ):
                key = (topic, m.queue_id)
                if key != cq_key or q != unit_q + len(units) // CQ_UNIT_SIZE:
                    if units:
                        notes.extend(self._put_units(cq_key, unit_q, units))
                    cq_key, unit_q, units = key, q, bytearray()
                if topic == SCHEDULE_TOPIC:
                    tc = dispatch_tags_code(topic, props, store_ts, delays)
                else:
                    tags = props.get(MessageConst.TAGS)
                    tc = tags_code(tags) if tags else 0
                units += pack_unit(phys, size, tc)
            if index_on and t != MessageSysFlag.TRANSACTION_ROLLBACK:
                uniq = props.get(MessageConst.UNIQ_KEY)
                if uniq:
                    entries.append((topic_key_hash(topic, uniq), phys))
                keys = props.get(MessageConst.KEYS)
                if keys:
                    entries.extend(
                        (topic_key_hash(topic, k), phys)
                        for k in keys.split(MessageConst.KEY_SEPARATOR)
                        if k
                    )
            phys += size
        if units:
            notes.extend(self._put_units(cq_key, unit_q, units))
        if entries:
            self.index.put_entries(entries, store_ts)
        return notes

    def _put_units(self, key: tuple[str, int], first_q: int, units: bytearray) -> list:
        """Write packed CQ units for offsets from ``first_q``; the arrival notes of those added."""
        topic, qid = key
        cq = self._consume_queue(topic, qid)
        n = len(units) // CQ_UNIT_SIZE
        if cq.put_tail(first_q, units):
            added = range(n)
        else:
            added = [
                i
                for i in range(n)
                if cq.put(*CQ_UNIT.unpack_from(units, i * CQ_UNIT_SIZE), first_q + i)
            ]
        table = self.commit_log.topic_queue_table
        if added and table.get(key, 0) < first_q + added[-1] + 1:
            table[key] = first_q + added[-1] + 1
        tcs = [CQ_UNIT.unpack_from(units, i * CQ_UNIT_SIZE)[2] for i in added]
        return [(topic, qid, first_q + i + 1, tc) for i, tc in zip(added, tcs, strict=True)]

    async def run_reput(self) -> None:
        while True:
            await self._reput_wake.wait()
            self._reput_wake = trio.Event()
            while self._do_reput():
                self._wake_progress()
                await trio.lowlevel.checkpoint()
            self._wake_progress()

    def _wake_progress(self) -> None:
        ev, self._reput_progress = self._reput_progress, trio.Event()
        ev.set()

    def add_arrival_listener(self, fn: ArrivalListener) -> None:
        self._listeners.append(fn)

    # ================================================================ get path

    def get_message(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_msg_nums: int,
        message_filter: MessageFilter | None = None,
    ) -> GetMessageResult:
        cq = self.consume_queues.get((topic, queue_id))
        cl = self.commit_log
        if cq is None:
            result = select_messages(
                self.config,
                offset,
                max_msg_nums,
                message_filter,
                min_offset=None,
                max_offset=0,
                read_units=lambda o, n: None,
                cq_roll_next_file=lambda o: o,
                read_record=cl.read,
                commit_log_roll_next_file=cl.roll_next_file,
                max_phy_offset=cl.max_offset,
                role=self.broker_role,
            )
        else:
            result = select_messages(
                self.config,
                offset,
                max_msg_nums,
                message_filter,
                min_offset=cq.min_offset,
                max_offset=cq.max_offset,
                read_units=cq.read_units,
                cq_roll_next_file=cq.roll_next_file,
                read_record=cl.read,
                commit_log_roll_next_file=cl.roll_next_file,
                max_phy_offset=cl.max_offset,
                role=self.broker_role,
            )
        self._stats.on_get(result)
        return result

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self.consume_queues.get((topic, queue_id))
        return 0 if cq is None else cq.max_offset

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self.consume_queues.get((topic, queue_id))
        return 0 if cq is None else cq.min_offset

    def get_commit_log_offset_in_queue(self, topic: str, queue_id: int, cq_offset: int) -> int:
        cq = self.consume_queues.get((topic, queue_id))
        if cq is None or not cq.min_offset <= cq_offset < cq.max_offset:
            return 0
        u = cq.unit(cq_offset)
        return 0 if u is None else u[0]

    def _store_time(self, phys: int, size: int) -> int:
        rec = self.commit_log.read(phys, size)
        if rec is None or size < 64:
            return -1
        (sys_flag,) = _I.unpack_from(rec, 36)
        return _Q.unpack_from(rec, store_timestamp_position(sys_flag))[0]

    def get_offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        cq = self.consume_queues.get((topic, queue_id))
        if cq is None:
            return 0

        def ts_at(off: int) -> int:
            u = cq.unit(off)
            return -1 if u is None else self._store_time(u[0], u[1])

        return search_offset_by_time(cq.min_offset, cq.max_offset, timestamp_ms, ts_at)

    def get_earliest_message_time(self, topic: str, queue_id: int) -> int:
        cq = self.consume_queues.get((topic, queue_id))
        if cq is None or cq.max_offset <= cq.min_offset:
            return -1
        u = cq.unit(cq.min_offset)
        return -1 if u is None else self._store_time(u[0], u[1])

    def select_one_message_by_offset(self, phys_offset: int, size: int | None = None):
        if size is None:
            size = self.commit_log.read_size(phys_offset)
        if size <= 0:
            return None
        return self.commit_log.read(phys_offset, size)

    def query_message(
        self, topic: str, key: str, max_num: int, begin_ts: int, end_ts: int
    ) -> QueryMessageResult:
        max_num = max(min(max_num, MAX_QUERY_NUM), 0)
        full_key = f"{topic}#{key}"
        offsets = sorted(set(self.index.query(full_key, max_num, begin_ts, end_ts)))
        bufs = []
        for phys in offsets:
            rec = self.select_one_message_by_offset(phys)
            if rec is None:
                continue
            try:
                req, _ = parse_record(rec, 0, len(rec), self.delay_millis, check_crc=False)
            except RecordDecodeError:
                continue
            # the index stores only hashes: keep records that really carry the key
            if req in (PARTIAL, BLANK) or req.topic != topic or full_key not in req.keys:
                continue
            bufs.append(rec)
        ts, phy = self.index.last_update
        return QueryMessageResult(bufs, ts, phy)

    def get_max_phy_offset(self) -> int:
        return self.commit_log.max_offset

    def get_min_phy_offset(self) -> int:
        return self.commit_log.min_offset

    # ================================================================ HA

    def get_commit_log_data(self, offset: int) -> memoryview | None:
        return self.commit_log.get_data(offset)

    def append_to_commit_log(self, start_offset: int, data) -> bool:
        if self.shutdown:
            return False
        ok = self.commit_log.append_raw(start_offset, data)
        if ok:
            if self.reput_from < self.commit_log.min_offset:
                self.reput_from = self.commit_log.min_offset
            self._reput_wake.set()
        return ok

    # ================================================================ admin

    def topic_queues(self) -> dict[str, list[int]]:
        return group_queue_ids(self.consume_queues)

    def delete_topics(self, topics) -> None:
        topics = set(topics)
        for key in [k for k in self.consume_queues if k[0] in topics]:
            self.consume_queues.pop(key).destroy()
        table = self.commit_log.topic_queue_table
        for key in [k for k in table if k[0] in topics]:
            del table[key]
        for t in topics:
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(self._cq_root(), t))

    def runtime_info(self) -> dict[str, str]:
        info = self._stats.runtime_info()
        flushed = self.flush.flushed if self.flush else self.commit_log.max_offset
        try:
            st = os.statvfs(self.root)
            ratio = 1.0 - st.f_bavail / st.f_blocks if st.f_blocks else 0.0
            cap = f"Total : {st.f_blocks * st.f_frsize} B, Free : {st.f_bavail * st.f_frsize} B."
        except OSError:
            ratio, cap = 0.0, "unknown"
        info.update(
            {
                "commitLogMinOffset": str(self.get_min_phy_offset()),
                "commitLogMaxOffset": str(self.get_max_phy_offset()),
                "dispatchBehindBytes": str(self.dispatch_behind_bytes),
                "remainHowManyDataToFlush": f"{self.commit_log.max_offset - flushed} B",
                "remainHowManyDataToCommit": "0 B",
                "commitLogDirCapacity": cap,
                "commitLogDiskRatio": f"{ratio:.4f}",
                "consumeQueueDiskRatio": f"{ratio:.4f}",
            }
        )
        return info


async def run_message_store(
    config: MessageStoreConfig, *, task_status=trio.TASK_STATUS_IGNORED
) -> None:
    """Recover and run the file store until cancelled; see the module docstring."""
    store = DefaultMessageStore(config)
    await trio.to_thread.run_sync(store.open_and_recover)
    flush = FlushService(store)
    store.flush = flush
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.run_reput)
            nursery.start_soon(flush.run)
            task_status.started(store)
            await trio.sleep_forever()
    finally:
        store.shutdown = True
        with trio.CancelScope(shield=True), trio.move_on_after(30):
            try:
                store._do_reput(limit=None)
                await flush.flush_all()
            except OSError:
                log.exception("final flush failed")
            else:
                store.close_files()
