"""MemoryMessageStore: the MessageStore API with no files (tests, conformance reference).

Theory of operation
-------------------
A deliberately simple second implementation of the store facade.  It keeps the CommitLog as a
list of "files" (bytearrays that grow up to ``mapped_file_size_commit_log``) and applies the
same BLANK-filler rollover as the file store, so physical offsets, msgIds and HA data are
byte-for-byte what the file store produces for the same puts.  ConsumeQueues are bytearrays of
20-byte units per (topic, queueId); the index is a dict from "topic#key" to (phys, storeTime).

Dispatch (CQ + index + arrival listeners) runs synchronously right after each append, so a put
is visible to ``get_message`` when ``put_message`` returns.  Bytes appended by HA are dispatched
the same way, from the raw records, waiting for the rest of a record split across HA chunks.

Readers get ``bytes`` copies (never views of the growing bytearrays, which could then not grow).
The get-path rules are ``get_message.select_messages`` and the other lookups
``queries.StoreQueries``, shared with the file store; the put steps are ``put_message.PutSteps``
and the dispatch rules dispatch.py's.
"""

from __future__ import annotations

import bisect
import logging
import struct
import time
from collections.abc import Callable, Iterable

import attrs
import trio

from broker.store.api import ArrivalListener, MessageStore
from broker.store.config import MessageStoreConfig
from broker.store.consumequeue import CQ_UNIT, CQ_UNIT_SIZE
from broker.store.dispatch import (
    BLANK,
    PARTIAL,
    DispatchRequest,
    parse_record,
    takes_index_entries,
    takes_queue_unit,
)
from broker.store.get_message import select_messages
from broker.store.put_message import PutSteps
from broker.store.queries import StoreQueries
from broker.store.results import (
    GetMessageResult,
    MessageFilter,
    PutMessageResult,
)
from broker.store.running_flags import RunningFlags
from broker.store.stats import StoreStats
from common.message import BLANK_MAGIC_CODE, MessageExtBrokerInner, RecordDecodeError

log = logging.getLogger(__name__)

_BLANK_HEAD = struct.Struct(">ii")
_I = struct.Struct(">i")


@attrs.define(eq=False)
class _MemQueue:
    base: int = 0  # logical offset of units[0:20]
    units: bytearray = attrs.Factory(bytearray)

    @property
    def max_offset(self) -> int:
        return self.base + len(self.units) // CQ_UNIT_SIZE


@attrs.define(eq=False)
class MemoryMessageStore(PutSteps, StoreQueries):
    config: MessageStoreConfig
    # commit log "files": starts[i] is the physical offset of files[i]; files are contiguous
    _starts: list[int] = attrs.Factory(list)
    _files: list[bytearray] = attrs.Factory(list)
    # (topic, queueId) -> next logical offset to assign (put path; prepared/rollback excluded)
    _topic_queue_table: dict[tuple[str, int], int] = attrs.Factory(dict)
    _queues: dict[tuple[str, int], _MemQueue] = attrs.Factory(dict)
    # "topic#key" -> [(phys, storeTimestamp)] in dispatch order
    _index: dict[str, list[tuple[int, int]]] = attrs.Factory(dict)
    _index_last_ts: int = 0
    _index_last_phy: int = 0
    # physical offset up to which records were dispatched (<= max_phy_offset)
    _reput_from: int = 0
    _listeners: list[ArrivalListener] = attrs.Factory(list)
    _write_listeners: list[Callable[[], None]] = attrs.Factory(list)
    _stats: StoreStats = attrs.Factory(StoreStats)
    # highest store timestamp handed out (store timestamps never go backwards)
    last_store_timestamp: int = attrs.field(default=0, init=False)
    shutdown: bool = False
    # nothing here fills a disk; the flags stay clear (the MessageStore contract has them)
    flags: RunningFlags = attrs.Factory(RunningFlags)
    # wall clock in ms for store timestamps; tests replace it
    clock: Callable[[], int] = attrs.field(default=lambda: int(time.time() * 1000))
    # Mutable: DLedger/role changes switch it at runtime (the config is frozen).
    broker_role: str = ""

    def __attrs_post_init__(self) -> None:
        if not self.broker_role:
            self.broker_role = self.config.broker_role

    # ------------------------------------------------------------------ commit log bytes

    @property
    def dispatch_behind_bytes(self) -> int:
        return self.get_max_phy_offset() - self._reput_from

    def get_max_phy_offset(self) -> int:
        if not self._files:
            return 0
        return self._starts[-1] + len(self._files[-1])

    def get_min_phy_offset(self) -> int:
        return self._starts[0] if self._starts else 0

    def _locate(self, phys: int) -> tuple[bytearray, int] | None:
        i = bisect.bisect_right(self._starts, phys) - 1
        if i < 0:
            return None
        pos = phys - self._starts[i]
        f = self._files[i]
        if pos >= len(f):
            return None
        return f, pos

    def _roll_next_file(self, phys: int) -> int:
        size = self.config.mapped_file_size_commit_log
        return phys + size - phys % size

    def _reserve(self, length: int) -> int:
        """Physical offset where ``length`` bytes go, writing a BLANK filler if needed."""
        size = self.config.mapped_file_size_commit_log
        if not self._files:
            self._starts.append(0)
            self._files.append(bytearray())
        f = self._files[-1]
        remaining = size - len(f)
        if length + 8 > remaining:
            if remaining >= 8:
                f += _BLANK_HEAD.pack(remaining, BLANK_MAGIC_CODE) + bytes(remaining - 8)
            self._starts.append(self._starts[-1] + size)
            self._files.append(bytearray())
        return self._starts[-1] + len(self._files[-1])

    # ------------------------------------------------------------------ put path

    def append_message(self, msg: MessageExtBrokerInner) -> PutMessageResult:
        """Append and dispatch now (no await); always a final result here (no disk)."""
        return self._put_sync([msg], batch=False)

    def append_messages(self, msgs: list[MessageExtBrokerInner]) -> PutMessageResult:
        return self._put_sync(msgs, batch=True)

    async def put_message(self, msg: MessageExtBrokerInner) -> PutMessageResult:
        result = self._put_sync([msg], batch=False)
        await trio.lowlevel.checkpoint()
        return result

    async def put_messages(self, msgs: list[MessageExtBrokerInner]) -> PutMessageResult:
        result = self._put_sync(msgs, batch=True)
        await trio.lowlevel.checkpoint()
        return result

    def _put_sync(self, msgs: list[MessageExtBrokerInner], *, batch: bool) -> PutMessageResult:
        table = self._topic_queue_table
        put = self._prepare_put(msgs, table, batch=batch)
        if isinstance(put, PutMessageResult):
            return put
        first = self._reserve(len(put.buf))
        msg_id = self._stamp_physical_offsets(put, msgs, first)
        self._files[-1] += put.buf
        for fn in self._write_listeners:
            fn()
        table.update(put.next_q)
        result = self._put_ok(put, len(msgs), first, msg_id)
        self._dispatch_new()
        return result

    # ------------------------------------------------------------------ dispatch (reput)

    def _dispatch_new(self) -> None:
        end = self.get_max_phy_offset()
        delays = self.config.delay_level_millis
        while self._reput_from < end:
            loc = self._locate(self._reput_from)
            if loc is None:
                break
            f, pos = loc
            try:
                what, size = parse_record(f, pos, len(f), delays, check_crc=False)
            except RecordDecodeError as exc:
                log.error("reput stopped at %d: %s", self._reput_from, exc)
                break
            if what is PARTIAL:
                break
            if what is BLANK:
                self._reput_from = self._roll_next_file(self._reput_from)
                continue
            self._dispatch(what)
            self._reput_from += size

    def _dispatch(self, req: DispatchRequest) -> None:
        if takes_queue_unit(req.sys_flag):
            key = (req.topic, req.queue_id)
            q = self._queues.get(key)
            if q is None:
                q = self._queues[key] = _MemQueue(base=req.consume_queue_offset)
            if req.consume_queue_offset == q.max_offset:
                q.units += CQ_UNIT.pack(req.commit_log_offset, req.msg_size, req.tags_code)
                # a slave learns the next offset from the replicated records
                if self._topic_queue_table.get(key, 0) <= req.consume_queue_offset:
                    self._topic_queue_table[key] = req.consume_queue_offset + 1
                for fn in list(self._listeners):
                    fn(req.topic, req.queue_id, req.consume_queue_offset + 1, req.tags_code)
            elif req.consume_queue_offset > q.max_offset:
                log.error(
                    "consume queue %s gap: unit %d after %d",
                    key,
                    req.consume_queue_offset,
                    q.max_offset,
                )
        if self.config.message_index_enable and takes_index_entries(req.sys_flag):
            for k in req.keys:
                self._index.setdefault(k, []).append((req.commit_log_offset, req.store_timestamp))
            if req.keys:
                self._index_last_ts = req.store_timestamp
                self._index_last_phy = req.commit_log_offset

    async def wait_dispatched(self, end: int | None = None) -> None:
        """Dispatch is synchronous here; kept for API parity with the file store."""
        await trio.lowlevel.checkpoint()

    def add_arrival_listener(self, fn: ArrivalListener) -> None:
        self._listeners.append(fn)

    def add_write_listener(self, fn: Callable[[], None]) -> None:
        self._write_listeners.append(fn)

    # ------------------------------------------------------------------ get path

    def _read(self, phys: int, size: int) -> bytes | None:
        loc = self._locate(phys)
        if loc is None:
            return None
        f, pos = loc
        if pos + size > len(f):
            return None
        return bytes(f[pos : pos + size])

    def get_message(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_msg_nums: int,
        message_filter: MessageFilter | None = None,
    ) -> GetMessageResult:
        q = self._queues.get((topic, queue_id))
        upf = self.config.mapped_file_size_consume_queue // CQ_UNIT_SIZE

        def read_units(off: int, max_bytes: int) -> bytes | None:
            assert q is not None
            file_end = (off // upf + 1) * upf
            a = (off - q.base) * CQ_UNIT_SIZE
            b = min(file_end - q.base, q.max_offset - q.base) * CQ_UNIT_SIZE
            return bytes(q.units[a : min(b, a + max_bytes)])

        result = select_messages(
            self.config,
            offset,
            max_msg_nums,
            message_filter,
            min_offset=None if q is None else q.base,
            max_offset=0 if q is None else q.max_offset,
            read_units=read_units,
            cq_roll_next_file=lambda off: (off // upf + 1) * upf,
            read_record=self._read,
            commit_log_roll_next_file=self._roll_next_file,
            max_phy_offset=self.get_max_phy_offset(),
            role=self.broker_role,
        )
        self._stats.on_get(result)
        return result

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        q = self._queues.get((topic, queue_id))
        return 0 if q is None else q.max_offset

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        q = self._queues.get((topic, queue_id))
        return 0 if q is None else q.base

    # what queries.StoreQueries asks of a store
    def _queue_bounds(self, topic: str, queue_id: int) -> tuple[int, int] | None:
        q = self._queues.get((topic, queue_id))
        return None if q is None else (q.base, q.max_offset)

    def _queue_unit(self, topic: str, queue_id: int, offset: int) -> tuple[int, int, int] | None:
        q = self._queues.get((topic, queue_id))
        if q is None or not q.base <= offset < q.max_offset:
            return None
        phys, size, tcode = CQ_UNIT.unpack_from(q.units, (offset - q.base) * CQ_UNIT_SIZE)
        return phys, size, tcode

    def _record_size(self, phys: int) -> int:
        head = self._read(phys, 4)
        return -1 if head is None else int(_I.unpack(head)[0])

    def _index_candidates(self, full_key: str, max_num: int, begin: int, end: int) -> list[int]:
        hits = self._index.get(full_key, [])
        return [p for p, ts in reversed(hits) if begin <= ts <= end][:max_num]

    def _index_last_update(self) -> tuple[int, int]:
        return self._index_last_ts, self._index_last_phy

    def _queue_keys(self) -> Iterable[tuple[str, int]]:
        return self._queues

    # ------------------------------------------------------------------ HA

    def get_commit_log_data(self, offset: int) -> memoryview | None:
        loc = self._locate(offset)
        if loc is None:
            return None
        f, pos = loc
        return memoryview(bytes(f[pos:]))

    def append_to_commit_log(
        self, start_offset: int, data: bytes | memoryview, *, wake_reput: bool = True
    ) -> bool:
        # (dispatched right here either way: there is no reput task to spare a turn of)
        size = self.config.mapped_file_size_commit_log
        if not self._files:
            if start_offset % size:
                log.error("HA append at %d is not at a file start", start_offset)
                return False
            self._starts.append(start_offset)
            self._files.append(bytearray())
            self._reput_from = start_offset
        if start_offset != self.get_max_phy_offset():
            return False
        if len(self._files[-1]) == size:
            self._starts.append(self._starts[-1] + size)
            self._files.append(bytearray())
        if len(self._files[-1]) + len(data) > size:
            log.error("HA append at %d of %d bytes crosses a file end", start_offset, len(data))
            return False
        self._files[-1] += data
        self._dispatch_new()
        return True

    def dispatch_appended(self) -> None:
        pass  # append_to_commit_log dispatched already

    # ------------------------------------------------------------------ admin

    def delete_topics(self, topics: Iterable[str]) -> None:
        names = set(topics)
        for key in [k for k in self._queues if k[0] in names]:
            del self._queues[key]
        for key in [k for k in self._topic_queue_table if k[0] in names]:
            del self._topic_queue_table[key]

    def runtime_info(self) -> dict[str, str]:
        info = self._stats.runtime_info()
        info.update(
            {
                "commitLogMinOffset": str(self.get_min_phy_offset()),
                "commitLogMaxOffset": str(self.get_max_phy_offset()),
                "dispatchBehindBytes": str(self.dispatch_behind_bytes),
                "remainHowManyDataToFlush": "0 B",
                "remainHowManyDataToCommit": "0 B",
                "commitLogDirCapacity": "memory",
                "commitLogDiskRatio": "0.0",
                "consumeQueueDiskRatio": "0.0",
            }
        )
        return info


# mypy proves here that the in-memory store keeps the MessageStore contract (api.py)
_CONTRACT: type[MessageStore] = MemoryMessageStore


async def run_memory_store(
    config: MessageStoreConfig,
    *,
    task_status: trio.TaskStatus[MemoryMessageStore] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Start an in-memory store; it lives until this task is cancelled."""
    store = MemoryMessageStore(config)
    try:
        task_status.started(store)
        await trio.sleep_forever()
    finally:
        store.shutdown = True


__all__ = ["MemoryMessageStore", "run_memory_store"]
