"""Store rules shared by the file-backed and in-memory stores (DefaultMessageStore's logic).

Theory of operation
-------------------
Both store implementations keep the same shapes: a CommitLog addressed by physical offset, one
ConsumeQueue of 20-byte units per (topic, queueId), and a key index.  What they share is the
*rules*, kept here as pure functions so both behave identically and the conformance suite can
hold them to RocketMQ's answers:

* ``check_message`` / ``apply_delay``: the put-path checks and the delay rewrite to
  ``SCHEDULE_TOPIC_XXXX`` (``DefaultMessageStore.checkMessage``, ``CommitLog.asyncPutMessage``).
* ``dispatch_tags_code`` / ``index_keys``: what the reput dispatcher writes for a record
  (``CommitLog.checkMessageAndReturnSize``, ``IndexService.buildIndex``).
* ``select_messages``: ``DefaultMessageStore.getMessage``: status and next-offset rules, the CQ
  scan (which never crosses a CQ file), tag filtering that skips units, and the batch limits
  (``isTheBatchFull``).  The caller supplies the CQ/CommitLog readers.
* ``search_offset_by_time``: ``ConsumeQueue.getOffsetInQueueByTime``'s "closest unit" answer.
* ``StoreSteps``: the put steps around the CommitLog copy (shut-down/delay/validate preamble,
  encode, size limit, PHYSICALOFFSET stamping and msgIds, the PUT_OK result), as a mixin both
  stores inherit so the steps exist once.
* ``StoreStats``: counters behind ``runtime_info`` (``StoreStatsService``), read on Trio's clock.
"""

from __future__ import annotations

import os
import struct
import time
import zlib
from collections.abc import Callable
from typing import NamedTuple

from broker.store.config import MessageStoreConfig
from broker.store.results import (
    AppendMessageResult,
    GetMessageResult,
    GetMessageStatus,
    MessageFilter,
    PutMessageResult,
    PutMessageStatus,
)
from common.message import (
    BLANK_MAGIC_CODE,
    MAX_PROPERTIES_BYTES,
    MAX_TOPIC_BYTES,
    MESSAGE_MAGIC_CODE,
    PHYSICAL_OFFSET_POSITION,
    MessageConst,
    MessageExt,
    MessageExtBrokerInner,
    MessageSysFlag,
    RecordDecodeError,
    create_offset_msg_id,
    decode_properties,
    decode_record,
    encode_properties,
    encode_records,
    tags_code,
)

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
CQ_UNIT_SIZE = 20
# RocketMQ caps one key query at maxMsgsNumBatch messages
MAX_QUERY_NUM = 64
CQ_UNIT = struct.Struct(">qiq")  # commitLogOffset, size, tagsCode

try:
    TOTAL_PHYSICAL_MEMORY = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
    TOTAL_PHYSICAL_MEMORY = 8 * 1024**3


def offset_to_file_name(offset: int) -> str:
    """``UtilAll.offset2FileName``: 20-digit zero-padded start offset."""
    return f"{offset:020d}"


# ------------------------------------------------------------------------------------ put path


def check_message(
    msg: MessageExtBrokerInner, config: MessageStoreConfig, role: str | None = None
) -> PutMessageStatus | None:
    """Store-level checks (role, topic and properties length); None when the message may go in.

    Leaves the encoded properties in ``msg.properties_string`` so encoding the record does not
    encode them a second time.
    """
    if (role or config.broker_role) == "SLAVE":
        return PutMessageStatus.SERVICE_NOT_AVAILABLE
    topic = msg.topic
    if len(topic) > MAX_TOPIC_BYTES or (
        not topic.isascii() and len(topic.encode("utf-8")) > MAX_TOPIC_BYTES
    ):
        return PutMessageStatus.MESSAGE_ILLEGAL
    props = msg.stored_properties_string()
    if len(props) > MAX_PROPERTIES_BYTES or (
        not props.isascii() and len(props.encode("utf-8")) > MAX_PROPERTIES_BYTES
    ):
        return PutMessageStatus.PROPERTIES_SIZE_EXCEEDED
    msg.properties_string = props
    return None


def is_prepared_or_rollback(sys_flag: int) -> bool:
    t = MessageSysFlag.transaction_value(sys_flag)
    return t in (MessageSysFlag.TRANSACTION_PREPARED, MessageSysFlag.TRANSACTION_ROLLBACK)


def validate_put(
    msgs: list[MessageExtBrokerInner],
    config: MessageStoreConfig,
    *,
    batch: bool,
    role: str | None = None,
) -> tuple[PutMessageStatus, str] | None:
    """All put-path checks for one put (single or batch); None when it may go in."""
    if not msgs:
        return PutMessageStatus.MESSAGE_ILLEGAL, "empty batch"
    if (role or config.broker_role) == "SLAVE":
        bad = PutMessageStatus.SERVICE_NOT_AVAILABLE
        return bad, f"store rejected the message: {bad.name}"
    for m in msgs:
        # check_message, inlined: this runs for every message of every batch
        topic = m.topic
        props = m.properties_string
        if props is None:
            props = m.properties_string = encode_properties(m.properties)
        if (
            len(topic) > MAX_TOPIC_BYTES
            or len(props) > MAX_PROPERTIES_BYTES
            or not topic.isascii()
            or not props.isascii()
        ):
            bad = check_message(m, config, role)
            if bad is not None:
                return bad, f"store rejected the message: {bad.name}"
        if batch and (
            m.sys_flag & MessageSysFlag.TRANSACTION_MASK or delay_level_of(m.properties) > 0
        ):
            return (
                PutMessageStatus.MESSAGE_ILLEGAL,
                "batch messages cannot be delayed or transactional",
            )
    return None


def assign_queue_offsets(
    msgs: list[MessageExtBrokerInner], table: dict[tuple[str, int], int]
) -> tuple[list[int], dict[tuple[str, int], int]]:
    """Queue offsets the messages get, and the table updates (``table`` is not modified).

    Prepared/rollback transaction records get 0 and do not advance their queue.
    """
    next_q: dict[tuple[str, int], int] = {}
    qoffs: list[int] = []
    for m in msgs:
        t = m.sys_flag & MessageSysFlag.TRANSACTION_MASK
        if t == MessageSysFlag.TRANSACTION_PREPARED or t == MessageSysFlag.TRANSACTION_ROLLBACK:
            qoffs.append(0)
            continue
        key = (m.topic, m.queue_id)
        q = next_q.get(key)
        if q is None:
            q = table.get(key, 0)
        next_q[key] = q + 1
        qoffs.append(q)
    return qoffs, next_q


def encode_for_put(
    msgs: list[MessageExtBrokerInner], table: dict[tuple[str, int], int], store_ts: int
) -> tuple[bytearray, list[int], list[int], dict[tuple[str, int], int]]:
    """Encode records with the queue offsets they will get (PHYSICALOFFSET still 0).

    Returns (all records in one buffer, record sizes, queue offsets, table updates); ``table``
    is not modified, so a put that then fails (too big) leaves no trace.  One buffer per put
    means one copy into the CommitLog and one ``pack_into`` per record for its offset.
    """
    qoffs, next_q = assign_queue_offsets(msgs, table)
    for m in msgs:
        m.store_timestamp = store_ts
    buf, sizes = encode_records(msgs, qoffs, store_ts)
    return buf, sizes, qoffs, next_q


class PreparedPut(NamedTuple):
    """A put that passed every check and is encoded, not yet in the CommitLog."""

    buf: bytearray  # all records, PHYSICALOFFSET still 0
    sizes: list[int]
    qoffs: list[int]
    next_q: dict[tuple[str, int], int]  # topic-queue table updates, applied after the copy
    store_ts: int


_PHYS = struct.Struct(">q")


class StoreSteps:
    """Steps both stores share: the put around the CommitLog copy (``asyncPutMessage``), lookups.

    A mixin: the store provides ``config``, ``shutdown``, ``broker_role``, ``clock`` (ms),
    ``last_store_timestamp`` and ``_stats``.  Each step runs once per put; the per-message work
    stays inside the steps' own loops.
    """

    __slots__ = ()

    def _now_ms(self) -> int:
        # store timestamps never go backwards within one store (by-time search relies on order)
        ts = max(self.clock(), self.last_store_timestamp)
        self.last_store_timestamp = ts
        return ts

    def _fail(self, status: PutMessageStatus, remark: str) -> PutMessageResult:
        self._stats.put_failed += 1
        return PutMessageResult(status, None, remark)

    def _prepare_put(
        self,
        msgs: list[MessageExtBrokerInner],
        table: dict[tuple[str, int], int],
        *,
        batch: bool,
    ) -> PutMessageResult | PreparedPut:
        """Checks and encoding; a failed PutMessageResult or what to copy into the CommitLog."""
        if self.shutdown:
            return self._fail(PutMessageStatus.SERVICE_NOT_AVAILABLE, "message store is shut down")
        config = self.config
        if not batch and msgs:
            apply_delay(msgs[0], config)
        bad = validate_put(msgs, config, batch=batch, role=self.broker_role)
        if bad is not None:
            return self._fail(*bad)
        store_ts = self._now_ms()
        buf, sizes, qoffs, next_q = encode_for_put(msgs, table, store_ts)
        total = len(buf)
        if total > config.max_message_size or total + 8 > config.mapped_file_size_commit_log:
            return self._fail(
                PutMessageStatus.MESSAGE_ILLEGAL,
                f"message size {total} exceeds the limit {config.max_message_size}",
            )
        return PreparedPut(buf, sizes, qoffs, next_q, store_ts)

    @staticmethod
    def _stamp_physical_offsets(
        put: PreparedPut, msgs: list[MessageExtBrokerInner], first: int
    ) -> str:
        """Write each record's PHYSICALOFFSET into ``put.buf``; the (comma-joined) msgId."""
        buf = put.buf
        phys = first
        host_id = None
        ids = []
        pos = 0
        pack_phys = _PHYS.pack_into
        for m, size in zip(msgs, put.sizes, strict=True):
            pack_phys(buf, pos + PHYSICAL_OFFSET_POSITION, phys)
            if m.store_host is not host_id:
                host_id = m.store_host
                id_prefix = create_offset_msg_id(host_id, 0)[:-16]
            ids.append(f"{id_prefix}{phys:016X}")
            phys += size
            pos += size
        return ",".join(ids)

    def _put_ok(self, put: PreparedPut, n: int, first: int, msg_id: str) -> PutMessageResult:
        """Count the put and answer PUT_OK."""
        total = len(put.buf)
        self._stats.on_put(n, total)
        return PutMessageResult(
            PutMessageStatus.PUT_OK,
            AppendMessageResult(
                wrote_offset=first,
                wrote_bytes=total,
                msg_id=msg_id,
                store_timestamp=put.store_ts,
                logics_offset=put.qoffs[0],
                msg_num=n,
            ),
        )

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


def group_queue_ids(keys) -> dict[str, list[int]]:
    """``{topic: sorted queue ids}`` of (topic, queueId) keys (``topic_queues``)."""
    out: dict[str, list[int]] = {}
    for topic, qid in keys:
        out.setdefault(topic, []).append(qid)
    return {t: sorted(q) for t, q in out.items()}


def delay_level_of(props: dict[str, str]) -> int:
    v = props.get(MessageConst.DELAY)
    if not v:
        return 0
    try:
        return int(v)
    except ValueError:
        return 0


def apply_delay(msg: MessageExtBrokerInner, config: MessageStoreConfig) -> None:
    """Rewrite a DELAY>0 message to SCHEDULE_TOPIC_XXXX / queue level-1 (in place).

    Only non-transactional and commit messages are delayed; the level is clamped to the max
    level; REAL_TOPIC / REAL_QID keep the destination for the schedule service.
    """
    t = MessageSysFlag.transaction_value(msg.sys_flag)
    if t not in (MessageSysFlag.TRANSACTION_NOT_TYPE, MessageSysFlag.TRANSACTION_COMMIT):
        return
    level = delay_level_of(msg.properties)
    if level <= 0:
        return
    level = min(level, config.max_delay_level)
    props = msg.properties
    props[MessageConst.DELAY] = str(level)
    props[MessageConst.REAL_TOPIC] = msg.topic
    props[MessageConst.REAL_QID] = str(msg.queue_id)
    if msg.properties_string is not None:
        # Keep the broker's stored-string choices (e.g. no WAIT) while adding the new keys.
        stored = {k: v for k, v in props.items() if k != MessageConst.WAIT}
        msg.properties_string = encode_properties(stored)
    msg.topic = SCHEDULE_TOPIC
    msg.queue_id = level - 1


def dispatch_tags_code(
    topic: str, props: dict[str, str], store_timestamp: int, delay_millis: tuple[int, ...]
) -> int:
    """CQ tagsCode: tags hash, or the deliver timestamp for a delayed message."""
    if topic == SCHEDULE_TOPIC:
        level = delay_level_of(props)
        if level > 0:
            level = min(level, len(delay_millis))
            return store_timestamp + delay_millis[level - 1]
    return tags_code(props.get(MessageConst.TAGS))


def index_keys(topic: str, props: dict[str, str]) -> list[str]:
    """Index keys "topic#key" for UNIQ_KEY and every KEYS token."""
    out = []
    uniq = props.get(MessageConst.UNIQ_KEY)
    if uniq:
        out.append(f"{topic}#{uniq}")
    keys = props.get(MessageConst.KEYS)
    if keys:
        for k in keys.split(MessageConst.KEY_SEPARATOR):
            if k:
                out.append(f"{topic}#{k}")
    return out


# ------------------------------------------------------------------------------------ dispatch

_HEAD2 = struct.Struct(">ii")
_HEAD9 = struct.Struct(">iiiiiqqiq")
_Q = struct.Struct(">q")
_I = struct.Struct(">i")
_H = struct.Struct(">h")


class DispatchRequest(NamedTuple):
    """What the reput dispatcher needs from one record (CommitLog.checkMessageAndReturnSize).

    A NamedTuple: one is built per message on the put path, so construction must be cheap.
    """

    topic: str
    queue_id: int
    commit_log_offset: int
    msg_size: int
    tags_code: int
    store_timestamp: int
    consume_queue_offset: int
    sys_flag: int
    keys: tuple[str, ...]  # index keys, "topic#key"


# parse_record outcomes besides a DispatchRequest
PARTIAL = "partial"  # not enough bytes yet (HA chunk boundary, or torn tail)
BLANK = "blank"  # end-of-file filler: continue at the next file


def parse_record(buf, pos: int, end: int, delay_millis: tuple[int, ...], *, check_crc: bool):
    """Classify the bytes at ``buf[pos:end]``.

    Returns ``(PARTIAL, 0)``, ``(BLANK, size)``, ``(DispatchRequest, size)``; raises
    RecordDecodeError for bytes that can never become a valid record (bad magic, size or CRC).
    """
    if end - pos < 8:
        return PARTIAL, 0
    size, magic = _HEAD2.unpack_from(buf, pos)
    if magic == BLANK_MAGIC_CODE:
        if size < 8:
            raise RecordDecodeError(f"BLANK filler with size {size}")
        return BLANK, size
    if magic != MESSAGE_MAGIC_CODE:
        raise RecordDecodeError(f"bad magic {magic:#x}")
    if size <= 0:
        raise RecordDecodeError(f"bad record size {size}")
    if end - pos < size:
        return PARTIAL, 0
    # Parse only what dispatch needs, without copying the body (this runs for every record).
    try:
        (_, _, crc, queue_id, _, qoff, poff, sys_flag, _) = _HEAD9.unpack_from(buf, pos)
        p = pos + 48 + (20 if sys_flag & MessageSysFlag.BORNHOST_V6 else 8)
        (store_ts,) = _Q.unpack_from(buf, p)
        p += 8 + (20 if sys_flag & MessageSysFlag.STOREHOSTADDRESS_V6 else 8) + 12
        (body_len,) = _I.unpack_from(buf, p)
        p += 4
        if body_len < 0 or p + body_len + 3 > pos + size:
            raise RecordDecodeError(f"body length {body_len} overruns the record")
        if check_crc and (zlib.crc32(buf[p : p + body_len]) & 0x7FFFFFFF) != crc:
            raise RecordDecodeError("body CRC mismatch")
        p += body_len
        topic_len = buf[p]
        p += 1
        topic = bytes(buf[p : p + topic_len]).decode("utf-8")
        p += topic_len
        (props_len,) = _H.unpack_from(buf, p)
        p += 2
        if props_len < 0 or p + props_len != pos + size:
            raise RecordDecodeError("field lengths disagree with TOTALSIZE")
        props = decode_properties(bytes(buf[p : p + props_len]).decode("utf-8"))
    except (struct.error, UnicodeDecodeError, IndexError) as exc:
        raise RecordDecodeError(str(exc)) from exc
    req = DispatchRequest(
        topic=topic,
        queue_id=queue_id,
        commit_log_offset=poff,
        msg_size=size,
        tags_code=dispatch_tags_code(topic, props, store_ts, delay_millis),
        store_timestamp=store_ts,
        consume_queue_offset=qoff,
        sys_flag=sys_flag,
        keys=tuple(index_keys(topic, props)),
    )
    return req, size


# ------------------------------------------------------------------------------------ get path


def _next_offset_correction(role: str, old: int, new: int) -> int:
    # RocketMQ keeps the consumer's offset on a slave (offsetCheckInSlave defaults to false).
    return old if role == "SLAVE" else new


def select_messages(
    config: MessageStoreConfig,
    offset: int,
    max_msg_nums: int,
    message_filter: MessageFilter | None,
    *,
    min_offset: int | None,
    max_offset: int,
    read_units: Callable[[int, int], memoryview | bytes | None],
    cq_roll_next_file: Callable[[int], int],
    read_record: Callable[[int, int], memoryview | bytes | None],
    commit_log_roll_next_file: Callable[[int], int],
    max_phy_offset: int,
    role: str | None = None,
) -> GetMessageResult:
    """DefaultMessageStore.getMessage over abstract readers.

    ``min_offset`` None means the queue does not exist.  ``read_units(offset, max_bytes)`` returns the CQ
    units from ``offset`` to the end of the written part of that CQ file (or None if that file
    is gone), at most ``max_bytes`` of them; ``read_record(phys, size)`` the raw record or None if the CommitLog file is gone.
    """
    role = role or config.broker_role
    if min_offset is None or max_offset == 0:
        # RocketMQ creates the queue object on lookup, so an unknown queue answers like an empty one.
        return GetMessageResult(
            GetMessageStatus.NO_MESSAGE_IN_QUEUE,
            _next_offset_correction(role, offset, 0),
            0 if min_offset is None else min_offset,
            max_offset,
        )
    if offset < min_offset:
        return GetMessageResult(
            GetMessageStatus.OFFSET_TOO_SMALL,
            _next_offset_correction(role, offset, min_offset),
            min_offset,
            max_offset,
        )
    if offset == max_offset:
        return GetMessageResult(
            GetMessageStatus.OFFSET_OVERFLOW_ONE, offset, min_offset, max_offset
        )
    if offset > max_offset:
        target = min_offset if min_offset == 0 else max_offset
        return GetMessageResult(
            GetMessageStatus.OFFSET_OVERFLOW_BADLY,
            _next_offset_correction(role, offset, target),
            min_offset,
            max_offset,
        )
    max_filter_bytes = max(16000, max_msg_nums * CQ_UNIT_SIZE)
    units = read_units(offset, max_filter_bytes)
    if units is None:
        return GetMessageResult(
            GetMessageStatus.OFFSET_FOUND_NULL,
            _next_offset_correction(role, offset, cq_roll_next_file(offset)),
            min_offset,
            max_offset,
        )
    status = GetMessageStatus.NO_MATCHED_MESSAGE
    buffers: list = []
    qoffs: list[int] = []
    total = 0
    count = 0
    next_phy_file_start = -1
    max_phy_pulling = 0
    memory = TOTAL_PHYSICAL_MEMORY * config.access_message_in_memory_max_ratio // 100
    limit = min(len(units), max_filter_bytes)
    limit -= limit % CQ_UNIT_SIZE
    i = 0
    unpack = CQ_UNIT.unpack_from
    while i < limit:
        phys, size, tcode = unpack(units, i)
        max_phy_pulling = phys
        if next_phy_file_start != -1 and phys < next_phy_file_start:
            i += CQ_UNIT_SIZE
            continue
        in_disk = (max_phy_offset - phys) > memory
        if total and count:  # isTheBatchFull
            if max_msg_nums <= count:
                break
            if in_disk:
                if total + size > config.max_transfer_bytes_on_message_in_disk:
                    break
                if count > config.max_transfer_count_on_message_in_disk - 1:
                    break
            else:
                if total + size > config.max_transfer_bytes_on_message_in_memory:
                    break
                if count > config.max_transfer_count_on_message_in_memory - 1:
                    break
        if message_filter is not None and not message_filter.is_matched_by_consume_queue(tcode):
            i += CQ_UNIT_SIZE
            continue
        rec = read_record(phys, size)
        if rec is None:
            if total == 0:
                status = GetMessageStatus.MESSAGE_WAS_REMOVING
            next_phy_file_start = commit_log_roll_next_file(phys)
            i += CQ_UNIT_SIZE
            continue
        buffers.append(rec)
        qoffs.append(offset + i // CQ_UNIT_SIZE)
        total += size
        count += 1
        status = GetMessageStatus.FOUND
        next_phy_file_start = -1
        i += CQ_UNIT_SIZE
    return GetMessageResult(
        status,
        offset + i // CQ_UNIT_SIZE,
        min_offset,
        max_offset,
        buffers,
        count,
        total,
        (max_phy_offset - max_phy_pulling) > memory,
        qoffs,
    )


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


# ------------------------------------------------------------------------------------ stats


class StoreStats:
    """Counters for runtime_info (StoreStatsService); TPS over the whole uptime."""

    def __init__(self) -> None:
        self.boot_ms = int(time.time() * 1000)
        self.boot_mono = time.monotonic()
        self.put_times = 0
        self.put_size = 0
        self.put_failed = 0
        self.get_found = 0
        self.get_miss = 0
        self.get_transferred = 0

    def on_put(self, n: int, size: int) -> None:
        self.put_times += n
        self.put_size += size

    def on_get(self, result: GetMessageResult) -> None:
        if result.status is GetMessageStatus.FOUND:
            self.get_found += 1
            self.get_transferred += result.message_count
        else:
            self.get_miss += 1

    def runtime_info(self) -> dict[str, str]:
        up = max(time.monotonic() - self.boot_mono, 1e-3)
        avg = self.put_size / self.put_times if self.put_times else 0.0
        return {
            "bootTimestamp": str(self.boot_ms),
            "runtime": f"[ {int(up)} seconds ]",
            "putMessageTimesTotal": str(self.put_times),
            "putMessageSizeTotal": str(self.put_size),
            "putMessageFailedTimes": str(self.put_failed),
            "putMessageAverageSize": f"{avg:.2f}",
            "putMessageEntireTimeMax": "0",
            "putMessageDistributeTime": "",
            "getMessageEntireTimeMax": "0",
            "putTps": f"{self.put_times / up:.4f}",
            "getFoundTps": f"{self.get_found / up:.4f}",
            "getMissTps": f"{self.get_miss / up:.4f}",
            "getTotalTps": f"{(self.get_found + self.get_miss) / up:.4f}",
            "getTransferedTps": f"{self.get_transferred / up:.4f}",
            "pageCacheLockTimeMills": "0",
            "dispatchMaxBuffer": "0",
        }
