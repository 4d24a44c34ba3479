"""DefaultMessageStore: the file-backed MessageStore facade, its reput task and its lifecycle.

Theory of operation
-------------------
``run_message_store`` owns everything under ``store_path_root_dir``:

1. Start: take ``lock`` (flock: one store per directory), note whether ``abort`` exists (it is
   created at start and removed by a clean stop, so its presence means the last run died), load
   the checkpoint, map the CommitLog, ConsumeQueue and index files (mapping reads nothing),
   then recover by the rules of recovery.py, reading only the tail: validate the CommitLog from
   the checkpoint's ``dispatched`` offset (nothing after a clean stop, what was written since
   the last checkpoint after a crash, plus the body CRCs of a bounded window below it, which a
   disk that lied about a flush can have torn) and cut at the first damaged record, find each
   queue's end by binary search and drop units past the CommitLog's valid end, rebuild the
   topic queue table from the queues, cut the index back to ``dispatched`` (or the cut) and
   re-dispatch every record after it (idempotent).  ``self.recovery`` (a ``RecoveryReport``)
   records what was read.  Start-up time is thus independent of the store's size after a clean
   stop, and bounded by the window plus the writes of the last checkpoint interval after a
   crash.
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

Reput (reput.py, ``self.reput``): moves ``reput_from`` over new CommitLog bytes and writes
ConsumeQueue units and index entries by the rules of dispatch.py, then calls the arrival
listeners (which wake long polls).

Reads go straight to the maps: ``get_message`` scans CQ units (get_message.select_messages) and
returns memoryviews of the CommitLog records, no per-message objects; the other lookups are
queries.StoreQueries' over this store's primitives.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import trio

from broker.store.api import ArrivalListener, MessageStore
from broker.store.checkpoint import StoreCheckpoint
from broker.store.clean_service import disk_runtime_info, refuse_puts, run_clean_service
from broker.store.commitlog import CommitLog
from broker.store.commitlog_scan import check_implementation
from broker.store.config import MessageStoreConfig
from broker.store.consumequeue import ConsumeQueue
from broker.store.flush import FlushService
from broker.store.get_message import no_units, same_offset, select_messages
from broker.store.index import IndexService
from broker.store.page_warmer import run_page_warmer
from broker.store.put_message import PutSteps, encode_for_put, validate_put
from broker.store.queries import StoreQueries
from broker.store.recovery import RecoveryReport, commit_log_start, crc_check_from
from broker.store.reput import ReputService
from broker.store.results import (
    GetMessageResult,
    MessageFilter,
    PendingPut,
    PutMessageResult,
    PutMessageStatus,
    Record,
)
from broker.store.stats import StoreStats
from common.config_file import atomic_write
from common.message import MessageExtBrokerInner
from common.message_properties import MessageConst

log = logging.getLogger(__name__)


class StoreLockedError(OSError):
    """Another store already runs on this directory."""


class DefaultMessageStore(PutSteps, StoreQueries):
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
        self.reput = ReputService(config, self.commit_log, self.consume_queues, self.index)
        # why puts are refused right now (disk full, a failed queue write): running_flags.py
        self.flags = self.reput.flags
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
        # called right after a put's bytes are in the CommitLog (add_write_listener)
        self._write_listeners: list[Callable[[], None]] = []

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
        # after a crash the operator reads what recovery checked, cut and took (a WARNING: the
        # level a node's log keeps)
        level = logging.INFO if self.last_exit_ok else logging.WARNING
        log.log(level, "store %s: %s", self.root, self.recovery.summary())
        atomic_write(Path(self._abort_path()), b"")  # durable: a power cut must find it too

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
        crashed_at_checkpoint = not self.last_exit_ok and report.rule == "checkpoint"
        if not self.last_exit_ok and report.rule == "checkpoint":
            start = self._check_below_checkpoint(start, report)
        valid_end, report.bytes_scanned, report.files_scanned = cl.recover(
            start, check_crc=check_crc
        )
        if valid_end < cp.dispatched or valid_end < cp.commit_log_flushed:
            # a checkpoint naming bytes that are gone must not survive the next crash
            cp.dispatched = min(cp.dispatched, valid_end)
            cp.commit_log_flushed = min(cp.commit_log_flushed, valid_end)
            cp.write(cp.encode())
        report.commit_log_from, report.commit_log_end = start, valid_end
        if not self.last_exit_ok:
            log.warning(
                "store %s was not shut down cleanly; CommitLog valid to %d", self.root, valid_end
            )
        # after a crash, only the units of the records below the checkpoint are known to be on
        # disk as written (recovery.py): past it a power cut can have kept any subset of the
        # pages written, a hole before a kept unit included, so those units are cut and
        # written again by the re-dispatch below instead of being trusted
        units_end = min(valid_end, start) if crashed_at_checkpoint else valid_end
        last_unit_end = cl.min_offset
        for cq in self.consume_queues.values():
            cq.recover(cl.min_offset)
            report.cq_units_dropped += cq.truncate_dirty(units_end)
            last_unit_end = max(last_unit_end, cq.last_phys_end())
        cl.topic_queue_table = {k: cq.max_offset for k, cq in self.consume_queues.items()}
        if report.rule == "checkpoint":
            reput = start
        elif report.rule == "last-files":
            # RocketMQ's rule without a checkpoint: dispatch from where the queues end
            reput = min(last_unit_end, valid_end)
        else:
            reput = cl.min_offset
        self.reput.reput_from = report.redispatch_from = reput
        report.index_entries_dropped = self.index.recover(reput)
        self.reput.do_reput(limit=None)
        report.redispatched_bytes = self.reput_from - reput
        # what recovery zeroed must be on disk before new records are: a unit it dropped that
        # a power cut brought back would point at whatever record is written there next
        report.files_synced = cl.queue.sync_cuts() + sum(
            cq.queue.sync_cuts() for cq in self.consume_queues.values()
        )
        if self.reput_from < valid_end:
            log.error(
                "recovery could not dispatch past %d (valid end %d)", self.reput_from, valid_end
            )
        report.seconds = time.monotonic() - t0
        return report

    def _check_below_checkpoint(self, start: int, report: RecoveryReport) -> int:
        """After a crash: check the records of the window below the checkpoint that a lying disk
        can have torn (recovery.py), body CRC included; returns where validation goes on (the
        checkpoint, or the first damaged record, which then ends the log)."""
        cl = self.commit_log
        t0 = time.monotonic()
        crc_from = crc_check_from(
            start=start,
            segment_starts=[mf.file_from_offset for mf in cl.queue.files],
            window=self.config.crc_check_window_on_recover,
        )
        if crc_from >= start:
            return start
        bad = cl.first_bad_below(crc_from, start)
        report.crc_check = check_implementation()
        report.crc_from = crc_from
        report.crc_seconds = time.monotonic() - t0
        if bad is None:
            report.crc_bytes = start - crc_from
            return start
        offset, why = bad
        report.crc_bytes = offset - crc_from
        report.cut_below_checkpoint = start - offset
        log.error(
            "store %s: the CommitLog record at %d, below the checkpoint (%d), is damaged (%s): "
            "the disk lost writes it had reported flushed; cutting the CommitLog at %d: the "
            "records in [%d, %d) and any after them are dropped, acknowledged ones among them",
            self.root,
            offset,
            start,
            why,
            offset,
            offset,
            start,
        )
        cl.queue.truncate_dirty(offset)
        return offset

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
        flags = self.flags
        if flags.disk_full or flags.logics_queue_error:
            return self._fail(PutMessageStatus.SERVICE_NOT_AVAILABLE, flags.refusal())
        put = self._prepare_put(msgs, cl.topic_queue_table, batch=batch)
        if isinstance(put, PutMessageResult):
            return put
        # Dispatch inline when the reput task has nothing older left to do: the put is then
        # visible to get_message as soon as this returns, without a round trip through the task.
        reput = self.reput
        caught_up = reput.caught_up
        try:
            first = cl.reserve(len(put.buf))
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                # the filesystem cannot back the write (mapped_file.py): nothing was stored
                refuse_puts(flags, self.config, f"a CommitLog write found no space: {exc}")
                return self._fail(PutMessageStatus.SERVICE_NOT_AVAILABLE, flags.refusal())
            log.exception("cannot create a CommitLog segment")
            return self._fail(PutMessageStatus.CREATE_MAPEDFILE_FAILED, str(exc))
        msg_id = self._stamp_physical_offsets(put, msgs, first)
        cl.write(put.buf)
        for fn in self._write_listeners:
            fn()
        if caught_up:
            reput.dispatch_put(msgs, put.sizes, put.qoffs, first, put.store_ts)
        else:
            reput.queue_put(msgs, put.sizes, put.qoffs, first, put.store_ts)
        cl.topic_queue_table.update(put.next_q)
        return self._put_ok(put, len(msgs), first, msg_id)

    def _finish(self, result: PutMessageResult, wait_store: bool) -> PutMessageResult | PendingPut:
        """Final result if nothing is left to wait for, else a PendingPut."""
        append = result.append
        if append is None:  # the put failed
            return result
        end = append.wrote_offset + append.wrote_bytes
        flush = self.flush
        need_flush = False
        if flush is not None and flush.sync:
            if wait_store:
                need_flush = True
            else:
                flush.request()  # WAIT=false: ask for the flush but do not wait for it
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

    def append_message_group(
        self, msgs: Sequence[MessageExtBrokerInner]
    ) -> list[PutMessageResult | PendingPut]:
        """Several single sends, in order: ``[self.append_message(m) for m in msgs]``, with the
        same records, offsets and results, in one CommitLog reservation and write.

        The records of one socket read (issue 28): the per-put steps that do not depend on the
        message (the store's state checks, the timestamp, the reservation, the copy, the
        dispatch call, the counters) run once for the group; each message keeps its own record,
        queue offset, msgId and result.  A group that any single put would treat specially
        takes the per-message path, so the bytes on disk are those of single puts: a message
        with DELAY (rewritten to SCHEDULE_TOPIC), one the store's checks refuse (answered
        alone), one over ``maxMessageSize``, or a group that does not fit in the current
        segment (each record then rolls or fills the segment as its own put would).  The
        records share one store timestamp, which single puts within the same millisecond get
        as well.
        """
        n = len(msgs)
        config = self.config
        flags = self.flags
        if (
            n < 2
            or self.shutdown
            or flags.disk_full
            or flags.logics_queue_error
            or any(MessageConst.DELAY in m.properties for m in msgs)
            or validate_put(list(msgs), config, batch=False, role=self.broker_role) is not None
        ):
            return [self.append_message(m) for m in msgs]
        cl = self.commit_log
        store_ts = self._now_ms()
        buf, sizes, qoffs, next_q = encode_for_put(msgs, cl.topic_queue_table, store_ts)
        total = len(buf)
        if max(sizes) > config.max_message_size or not cl.fits(total):
            return [self.append_message(m) for m in msgs]
        reput = self.reput
        caught_up = reput.caught_up
        try:
            first = cl.reserve(total)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                refuse_puts(flags, config, f"a CommitLog write found no space: {exc}")
                return [
                    self._fail(PutMessageStatus.SERVICE_NOT_AVAILABLE, flags.refusal())
                    for _ in msgs
                ]
            log.exception("cannot create a CommitLog segment")
            return [self._fail(PutMessageStatus.CREATE_MAPEDFILE_FAILED, str(exc)) for _ in msgs]
        results = self._stamp_group(buf, msgs, sizes, qoffs, first, store_ts)
        cl.write(buf)
        for fn in self._write_listeners:
            fn()
        if caught_up:
            reput.dispatch_put(msgs, sizes, qoffs, first, store_ts)
        else:
            reput.queue_put(msgs, sizes, qoffs, first, store_ts)
        cl.topic_queue_table.update(next_q)
        self._stats.on_put(n, total)
        flush = self.flush
        if (flush is not None and flush.sync) or self.reput_from < first + total:
            # a flush or the reput task to wait for: each put's own PendingPut, as single puts
            wait = MessageConst.WAIT
            return [
                self._finish(r, m.properties.get(wait) != "false")
                for r, m in zip(results, msgs, strict=True)
            ]
        return list(results)

    async def put_message(self, msg: MessageExtBrokerInner) -> PutMessageResult:
        r = self.append_message(msg)
        if isinstance(r, PendingPut):
            return await r.wait()
        await trio.lowlevel.checkpoint()
        return r

    async def put_messages(self, msgs: list[MessageExtBrokerInner]) -> PutMessageResult:
        r = self.append_messages(msgs)
        if isinstance(r, PendingPut):
            return await r.wait()
        await trio.lowlevel.checkpoint()
        return r

    # ================================================================ reput / dispatch

    @property
    def reput_from(self) -> int:
        """CommitLog offset up to which every record is dispatched (reput.py)."""
        return self.reput.reput_from

    async def wait_dispatched(self, end: int | None = None) -> None:
        await self.reput.wait_dispatched(end)

    async def wait_flushed(self, end: int) -> bool:
        """True once the CommitLog is on disk up to ``end`` (False: sync_flush_timeout passed)."""
        flush = self.flush
        if flush is None:
            return True
        return await flush.wait_flushed(end, self.config.sync_flush_timeout)

    @property
    def dispatch_behind_bytes(self) -> int:
        return self.commit_log.max_offset - self.reput.reput_from

    def add_arrival_listener(self, fn: ArrivalListener) -> None:
        self.reput.listeners.append(fn)

    def add_write_listener(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` (which must not raise) right after each put's bytes are written to the
        CommitLog, before they are dispatched to the ConsumeQueues and the index.  The HA master
        sends the new bytes to its slaves from here: the slave then appends and acknowledges
        while this process dispatches, instead of after (issue 28)."""
        self._write_listeners.append(fn)

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
        result = select_messages(
            self.config,
            offset,
            max_msg_nums,
            message_filter,
            min_offset=None if cq is None else cq.min_offset,
            max_offset=0 if cq is None else cq.max_offset,
            read_units=no_units if cq is None else cq.read_units,
            cq_roll_next_file=same_offset if cq is None else cq.roll_next_file,
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

    # what queries.StoreQueries asks of a store
    def _queue_bounds(self, topic: str, queue_id: int) -> tuple[int, int] | None:
        cq = self.consume_queues.get((topic, queue_id))
        return None if cq is None else (cq.min_offset, cq.max_offset)

    def _queue_unit(self, topic: str, queue_id: int, offset: int) -> tuple[int, int, int] | None:
        cq = self.consume_queues.get((topic, queue_id))
        if cq is None or not cq.min_offset <= offset < cq.max_offset:
            return None
        return cq.unit(offset)

    def _read(self, phys: int, size: int) -> Record | None:
        return self.commit_log.read(phys, size)

    def _record_size(self, phys: int) -> int:
        return self.commit_log.read_size(phys)

    def _index_candidates(self, full_key: str, max_num: int, begin: int, end: int) -> list[int]:
        return self.index.query(full_key, max_num, begin, end)

    def _index_last_update(self) -> tuple[int, int]:
        return self.index.last_update

    def _queue_keys(self) -> Iterable[tuple[str, int]]:
        return self.consume_queues

    def get_max_phy_offset(self) -> int:
        return self.commit_log.max_offset

    def get_min_phy_offset(self) -> int:
        return self.commit_log.min_offset

    # ================================================================ HA

    def get_commit_log_data(self, offset: int) -> memoryview | None:
        return self.commit_log.get_data(offset)

    def append_put_to_commit_log(
        self,
        start_offset: int,
        data: bytes | memoryview,
        msgs: Sequence[MessageExtBrokerInner],
        sizes: Sequence[int],
        qoffs: Sequence[int],
        store_ts: int,
    ) -> bool:
        """``append_to_commit_log`` of records whose messages the caller still has (a DLedger
        leader applying its own proposals): dispatched from them, as the put path does, instead
        of parsing the bytes again."""
        caught_up = self.reput.caught_up and start_offset == self.commit_log.max_offset
        if not self.append_to_commit_log(start_offset, data):
            return False
        # (the reput task it woke runs only after this returns: the records are taken first)
        if caught_up:
            self.reput.dispatch_put(msgs, sizes, qoffs, start_offset, store_ts)
        else:
            self.reput.queue_put(msgs, sizes, qoffs, start_offset, store_ts)
        return True

    def append_to_commit_log(
        self, start_offset: int, data: bytes | memoryview, *, wake_reput: bool = True
    ) -> bool:
        if self.shutdown:
            return False
        try:
            ok = self.commit_log.append_raw(start_offset, data)
        except OSError as exc:  # nothing appended; the HA slave or DLedger applier retries
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                log.error("cannot append %d bytes at %d: %s", len(data), start_offset, exc)
            else:
                refuse_puts(self.flags, self.config, f"a replicated append found no space: {exc}")
            return False
        if ok:
            reput = self.reput
            if reput.reput_from < self.commit_log.min_offset:
                reput.reput_from = self.commit_log.min_offset
            if wake_reput:
                reput.wake()
        return ok

    def dispatch_appended(self) -> None:
        self.reput.dispatch_now()

    # ================================================================ admin

    def delete_topics(self, topics: Iterable[str]) -> None:
        names = set(topics)
        for key in [k for k in self.consume_queues if k[0] in names]:
            self.consume_queues.pop(key).destroy()
        table = self.commit_log.topic_queue_table
        for key in [k for k in table if k[0] in names]:
            del table[key]
        for t in names:
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(self._cq_root(), t))

    def runtime_info(self) -> dict[str, str]:
        info = self._stats.runtime_info()
        flushed = self.flush.flushed if self.flush else self.commit_log.max_offset
        info.update(
            {
                "commitLogMinOffset": str(self.get_min_phy_offset()),
                "commitLogMaxOffset": str(self.get_max_phy_offset()),
                "dispatchBehindBytes": str(self.dispatch_behind_bytes),
                "remainHowManyDataToFlush": f"{self.commit_log.max_offset - flushed} B",
                "remainHowManyDataToCommit": "0 B",
                **disk_runtime_info(self.config.commit_log_dir, self.flags),
            }
        )
        return info


# mypy proves here that the file store keeps the MessageStore contract (api.py)
_CONTRACT: type[MessageStore] = DefaultMessageStore


async def run_message_store(
    config: MessageStoreConfig,
    *,
    task_status: trio.TaskStatus[DefaultMessageStore] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Recover and run the file store until cancelled; see the module docstring."""
    store = DefaultMessageStore(config)
    await trio.to_thread.run_sync(store.open_and_recover)
    flush = FlushService(store)
    store.flush = flush
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.reput.run)
            nursery.start_soon(flush.run)
            await nursery.start(run_page_warmer, store.commit_log.queue.last)
            await nursery.start(run_clean_service, store)
            task_status.started(store)
            await trio.sleep_forever()
    finally:
        await close_store(store, flush)


async def close_store(store: DefaultMessageStore, flush: FlushService) -> None:
    """A running store's end: puts refused, the last records dispatched and everything
    flushed (shielded, at most 30 s), then the files closed cleanly (no ``abort`` left)."""
    store.shutdown = True
    with trio.CancelScope(shield=True), trio.move_on_after(30):
        try:
            store.reput.do_reput(limit=None)
            await flush.flush_all()
        except OSError:
            log.exception("final flush failed")
        else:
            store.close_files()
