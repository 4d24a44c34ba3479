"""The store's lookups besides pulls: by time, by key, by offset (RocketMQ ``DefaultMessageStore``'s
``getOffsetInQueueByTime``, ``getEarliestMessageTime``, ``queryMessage``, ``lookMessageByOffset``).

Theory of operation
-------------------
Both stores answer these the same way; :class:`StoreQueries` is the mixin holding the answers
once, over a handful of primitives each store provides (its ConsumeQueue units, its CommitLog
reads, its index):

* by time (``search_offset_by_time``): a binary search over a queue's units by the store
  timestamp of their records, answering the unit whose time equals the one asked for (the
  first of equal ones) or else the closest one, the earlier on a tie; before the queue's start
  the first unit, past its end the last (``ConsumeQueue.getOffsetInQueueByTime``).  Store
  timestamps never go backwards within a store (``PutSteps._now_ms``), so the units are sorted.
* by key (``query_message``): the index gives candidate offsets (the file index stores only
  key hashes), and a candidate is kept only when its record's topic and keys really hold the
  key; at most ``MAX_QUERY_NUM`` records, in CommitLog order.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable

from broker.store.config import MessageStoreConfig
from broker.store.dispatch import DispatchRequest, parse_record
from broker.store.results import QueryMessageResult, Record
from common.message import MessageExt, RecordDecodeError, decode_record, store_timestamp_position

# RocketMQ caps one key query at maxMsgsNumBatch messages
MAX_QUERY_NUM = 64
# a record is at least this long (its fixed fields), so its store timestamp can be read
_MIN_RECORD = 64
_Q = struct.Struct(">q")
_I = struct.Struct(">i")


def search_offset_by_time(
    lo: int, hi: int, timestamp: int, store_time_at: Callable[[int], int]
) -> int:
    """Queue offset in [lo, hi) whose store time equals ``timestamp`` or is closest to it.

    Ties between the unit before and after go to the earlier one; past the end gives the last
    unit, before the start the first (``ConsumeQueue.getOffsetInQueueByTime``).  An empty
    range gives 0.  ``store_time_at`` returning < 0 (unreadable) also gives 0.
    """
    if hi <= lo:
        return 0
    a, b = lo, hi - 1
    left = right = -1
    left_v = right_v = -1
    while a <= b:
        mid = (a + b) // 2
        t = store_time_at(mid)
        if t < 0:
            return 0
        if t == timestamp:
            # walk back to the first of equal timestamps (stable answer for duplicates)
            while mid > lo and store_time_at(mid - 1) == timestamp:
                mid -= 1
            return mid
        if t > timestamp:
            b = mid - 1
            right, right_v = mid, t
        else:
            a = mid + 1
            left, left_v = mid, t
    if left_v == -1:
        return right
    if right_v == -1:
        return left
    return right if abs(timestamp - left_v) > abs(timestamp - right_v) else left


def group_queue_ids(keys: Iterable[tuple[str, int]]) -> dict[str, list[int]]:
    """``{topic: sorted queue ids}`` of (topic, queueId) keys (``topic_queues``)."""
    out: dict[str, list[int]] = {}
    for topic, qid in keys:
        out.setdefault(topic, []).append(qid)
    return {t: sorted(q) for t, q in out.items()}


class StoreQueries:
    """The lookups of the module docstring, over the primitives below (a mixin)."""

    config: MessageStoreConfig

    # --- what each store provides ---------------------------------------------------------

    def _queue_bounds(self, topic: str, queue_id: int) -> tuple[int, int] | None:
        """The queue's (min offset, max offset), None when there is no such queue."""
        raise NotImplementedError

    def _queue_unit(self, topic: str, queue_id: int, offset: int) -> tuple[int, int, int] | None:
        """The unit (phys, size, tagsCode) at ``offset``; None outside the queue or unreadable."""
        raise NotImplementedError

    def _read(self, phys: int, size: int) -> Record | None:
        """``size`` CommitLog bytes at ``phys``; None when they are not (all) there."""
        raise NotImplementedError

    def _record_size(self, phys: int) -> int:
        """TOTALSIZE of the record at ``phys``; <= 0 when there is none."""
        raise NotImplementedError

    def _index_candidates(self, full_key: str, max_num: int, begin: int, end: int) -> list[int]:
        """Offsets of up to ``max_num`` newest records indexed under ``full_key`` (or a key
        with the same hash) stored in [begin, end]."""
        raise NotImplementedError

    def _index_last_update(self) -> tuple[int, int]:
        """(store timestamp, phys) of the newest indexed record."""
        raise NotImplementedError

    def _queue_keys(self) -> Iterable[tuple[str, int]]:
        raise NotImplementedError

    # --- the lookups ------------------------------------------------------------------------

    def get_queue_unit(
        self, topic: str, queue_id: int, cq_offset: int
    ) -> tuple[int, int, int] | None:
        """(commit log offset, size, tagsCode) of the unit at ``cq_offset`` (QUERY_CONSUME_QUEUE)."""
        return self._queue_unit(topic, queue_id, cq_offset)

    def get_commit_log_offset_in_queue(self, topic: str, queue_id: int, cq_offset: int) -> int:
        u = self._queue_unit(topic, queue_id, cq_offset)
        return 0 if u is None else u[0]

    def _store_time(self, unit: tuple[int, int, int] | None) -> int:
        """Store timestamp of the record a unit points at; -1 when unreadable."""
        if unit is None or unit[1] < _MIN_RECORD:
            return -1
        rec = self._read(unit[0], unit[1])
        if rec is None:
            return -1
        (sys_flag,) = _I.unpack_from(rec, 36)
        ts: int = _Q.unpack_from(rec, store_timestamp_position(sys_flag))[0]
        return ts

    def get_offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        bounds = self._queue_bounds(topic, queue_id)
        if bounds is None:
            return 0

        def ts_at(off: int) -> int:
            return self._store_time(self._queue_unit(topic, queue_id, off))

        return search_offset_by_time(bounds[0], bounds[1], timestamp_ms, ts_at)

    def get_earliest_message_time(self, topic: str, queue_id: int) -> int:
        bounds = self._queue_bounds(topic, queue_id)
        if bounds is None or bounds[1] <= bounds[0]:
            return -1
        return self._store_time(self._queue_unit(topic, queue_id, bounds[0]))

    def select_one_message_by_offset(
        self, phys_offset: int, size: int | None = None
    ) -> Record | None:
        if size is None:
            size = self._record_size(phys_offset)
        if size <= 0:
            return None
        return self._read(phys_offset, size)

    def look_message_by_offset(
        self, phys_offset: int, size: int | None = None
    ) -> MessageExt | None:
        rec = self.select_one_message_by_offset(phys_offset, size)
        if rec is None:
            return None
        try:
            return decode_record(rec)
        except RecordDecodeError:
            return None

    def query_message(
        self, topic: str, key: str, max_num: int, begin_ts: int, end_ts: int
    ) -> QueryMessageResult:
        max_num = max(min(max_num, MAX_QUERY_NUM), 0)
        full_key = f"{topic}#{key}"
        delays = self.config.delay_level_millis
        bufs = []
        for phys in sorted(set(self._index_candidates(full_key, max_num, begin_ts, end_ts))):
            rec = self.select_one_message_by_offset(phys)
            if rec is None:
                continue
            try:
                req, _ = parse_record(rec, 0, len(rec), delays, check_crc=False)
            except RecordDecodeError:
                continue
            # keep only records that really carry the key (the file index holds hashes)
            if type(req) is DispatchRequest and req.topic == topic and full_key in req.keys:
                bufs.append(rec)
        ts, phy = self._index_last_update()
        return QueryMessageResult(bufs, ts, phy)

    def topic_queues(self) -> dict[str, list[int]]:
        return group_queue_ids(self._queue_keys())


__all__ = ["MAX_QUERY_NUM", "StoreQueries", "group_queue_ids", "search_offset_by_time"]
