"""The put path around the CommitLog copy (RocketMQ ``DefaultMessageStore.checkStoreStatus`` /
``checkMessage`` and ``CommitLog.asyncPutMessage``), shared by both stores.

Theory of operation
-------------------
A put is, in order:

1. refuse when the store is shut down or a SLAVE (``SERVICE_NOT_AVAILABLE``), or when a topic or
   the properties are too long; a batch may not hold delayed or transactional messages
   (``validate_put``);
2. the delay rewrite: a single message with ``DELAY > 0`` goes to ``SCHEDULE_TOPIC`` queue
   ``level - 1``, its destination kept in REAL_TOPIC / REAL_QID (``apply_delay``);
3. queue offsets from the topic-queue table (``assign_queue_offsets``; prepared and rolled-back
   transaction halves take none), a store timestamp that never goes backwards, and the records
   encoded into one buffer with PHYSICALOFFSET still 0 (``encode_for_put``); a put over
   ``maxMessageSize`` fails here, before anything is written;
4. the store reserves room in its CommitLog (maybe behind a BLANK filler) and the offset of each
   record is stamped into the buffer, which also gives the msgIds
   (``PutSteps._stamp_physical_offsets``); the store copies the buffer in;
5. the table updates are applied and the put counted (``PutSteps._put_ok``).

Steps 1-3 leave no trace when they fail, so a refused put changes nothing.  :class:`PutSteps` is
the mixin both stores inherit for 1-3 and 4-5; the copy itself (step 4) is each store's own.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import NamedTuple

from broker.store.config import MessageStoreConfig
from broker.store.dispatch import delay_level_of
from broker.store.results import AppendMessageResult, PutMessageResult, PutMessageStatus
from broker.store.stats import StoreStats
from common.message import (
    MAX_PROPERTIES_BYTES,
    MAX_TOPIC_BYTES,
    PHYSICAL_OFFSET_POSITION,
    MessageExtBrokerInner,
    MessageSysFlag,
)
from common.message_encoder import encode_records
from common.message_id import create_offset_msg_id
from common.message_properties import MessageConst, encode_properties
from common.topics import SCHEDULE_TOPIC

# (topic, queueId) -> the next queue offset to hand out
QueueOffsetTable = dict[tuple[str, int], int]


# ------------------------------------------------------------------------------------ checks


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
            refused = check_message(m, config, role)
            if refused is not None:
                return refused, f"store rejected the message: {refused.name}"
        if batch and (
            m.sys_flag & MessageSysFlag.TRANSACTION_MASK or delay_level_of(m.properties) > 0
        ):
            return (
                PutMessageStatus.MESSAGE_ILLEGAL,
                "batch messages cannot be delayed or transactional",
            )
    return None


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


# ------------------------------------------------------------------------------------ offsets


def assign_queue_offsets(
    msgs: Sequence[MessageExtBrokerInner], table: QueueOffsetTable
) -> tuple[list[int], QueueOffsetTable]:
    """Queue offsets the messages get, and the table updates (``table`` is not modified).

    Prepared/rollback transaction records get 0 and do not advance their queue (the rule
    ``dispatch.takes_queue_unit``, inlined: this runs for every message).
    """
    next_q: QueueOffsetTable = {}
    qoffs: list[int] = []
    prepared = MessageSysFlag.TRANSACTION_PREPARED
    rollback = MessageSysFlag.TRANSACTION_ROLLBACK
    mask = MessageSysFlag.TRANSACTION_MASK
    for m in msgs:
        t = m.sys_flag & mask
        if t == prepared or t == rollback:
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
    msgs: Sequence[MessageExtBrokerInner], table: QueueOffsetTable, store_ts: int
) -> tuple[bytearray, list[int], list[int], QueueOffsetTable]:
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
    next_q: QueueOffsetTable  # topic-queue table updates, applied after the copy
    store_ts: int


_PHYS = struct.Struct(">q")

# store host -> the offset msgId's host part (what precedes the 16 hex digits of the offset):
# one store host per broker, so this is computed once instead of once per put
_ID_PREFIXES: dict[tuple[str, int], str] = {}


def _id_prefix(store_host: tuple[str, int]) -> str:
    prefix = _ID_PREFIXES.get(store_host)
    if prefix is None:
        if len(_ID_PREFIXES) >= 64:
            _ID_PREFIXES.clear()
        prefix = _ID_PREFIXES[store_host] = create_offset_msg_id(store_host, 0)[:-16]
    return prefix


class PutSteps:
    """The put steps both stores share (module docstring), as a mixin.

    The store provides the attributes declared below.  Each step runs once per put; the
    per-message work stays inside the steps' own loops.
    """

    config: MessageStoreConfig
    shutdown: bool
    # "ASYNC_MASTER" | "SYNC_MASTER" | "SLAVE"; mutable (the config is frozen)
    broker_role: str
    # wall clock in ms for store timestamps; tests replace it
    clock: Callable[[], int]
    # highest store timestamp handed out
    last_store_timestamp: int
    _stats: StoreStats

    def _now_ms(self) -> int:
        # store timestamps never go backwards within one store (by-time search relies on order)
        ts = max(self.clock(), self.last_store_timestamp)
        self.last_store_timestamp = ts
        return ts

    def _fail(self, status: PutMessageStatus, remark: str) -> PutMessageResult:
        self._stats.put_failed += 1
        return PutMessageResult(status, None, remark)

    def _prepare_put(
        self, msgs: list[MessageExtBrokerInner], table: QueueOffsetTable, *, batch: bool
    ) -> PutMessageResult | PreparedPut:
        """Checks and encoding; a failed PutMessageResult or what to copy into the CommitLog."""
        if self.shutdown:
            return self._fail(PutMessageStatus.SERVICE_NOT_AVAILABLE, "message store is shut down")
        config = self.config
        if not batch and msgs and MessageConst.DELAY in msgs[0].properties:
            apply_delay(msgs[0], config)  # (without DELAY it changes nothing)
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
        if len(msgs) == 1:  # a single send: no list, no join
            _PHYS.pack_into(buf, PHYSICAL_OFFSET_POSITION, first)
            return f"{_id_prefix(msgs[0].store_host)}{first:016X}"
        phys = first
        host_id = None
        id_prefix = ""
        ids = []
        pos = 0
        pack_phys = _PHYS.pack_into
        for m, size in zip(msgs, put.sizes, strict=True):
            pack_phys(buf, pos + PHYSICAL_OFFSET_POSITION, phys)
            if m.store_host is not host_id:
                host_id = m.store_host
                id_prefix = _id_prefix(host_id)
            ids.append(f"{id_prefix}{phys:016X}")
            phys += size
            pos += size
        return ",".join(ids)

    @staticmethod
    def _stamp_group(
        buf: bytearray,
        msgs: Sequence[MessageExtBrokerInner],
        sizes: Sequence[int],
        qoffs: Sequence[int],
        first: int,
        store_ts: int,
    ) -> list[PutMessageResult]:
        """A group of single puts encoded in ``buf`` at ``first``: each record's PHYSICALOFFSET
        written, and each put's own PUT_OK result (its offset, size, msgId and queue offset)."""
        results: list[PutMessageResult] = []
        add = results.append
        pack_phys = _PHYS.pack_into
        ok = PutMessageStatus.PUT_OK
        phys = first
        prefix = ""
        host = None
        for m, size, q in zip(msgs, sizes, qoffs, strict=True):
            pack_phys(buf, phys - first + PHYSICAL_OFFSET_POSITION, phys)
            if m.store_host is not host:
                host = m.store_host
                prefix = _id_prefix(host)
            add(
                PutMessageResult(
                    ok, AppendMessageResult(phys, size, f"{prefix}{phys:016X}", store_ts, q)
                )
            )
            phys += size
        return results

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


__all__ = [
    "PreparedPut",
    "PutSteps",
    "QueueOffsetTable",
    "apply_delay",
    "assign_queue_offsets",
    "check_message",
    "encode_for_put",
    "validate_put",
]
