"""Half messages, their end and their check (RocketMQ ``TransactionalMessageServiceImpl``,
apache/rocketmq 4.9 ``broker/.../transaction/queue/TransactionalMessageServiceImpl.java``).

Theory of operation
-------------------
* prepare: the send path stores a TRAN_MSG=true message as a half record
  (``bridge.half_message_inner``), appended like any send, so its answer, flush and replica wait
  are the send path's.
* end (END_TRANSACTION, ``end_transaction``): the half record is found by its CommitLog offset
  and checked against the request (producer group, queue offset, CommitLog offset: RocketMQ's
  ``checkPrepareMessage``).  Unless its transaction already ended (``check.TransactionLedger``),
  a commit puts the real message (``bridge.end_message_inner``) and then an op record for every
  live copy of the transaction; a rollback puts only the ops.  An end whose transaction already
  ended writes nothing and is answered SUCCESS: a repeated commit delivers nothing twice.
* check (``check``, one round of ``run_transaction_check``): the half queue is walked from the
  persisted cursor; each record is decided by ``check.decide_half`` and acted on here: moved to
  TRANS_CHECK_MAX_TIME_TOPIC, re-put (immunity), or re-put with one more check counted and sent
  to a producer of its group (``check_listener``).  The cursors are committed as the consumer
  offsets of ``CID_RMQ_SYS_TRANS`` afterwards.

One lock orders ends and check decisions: a decision and the writes it makes are not interleaved
with another's, so a transaction is never both ended and checked from the same state.

Crash window: the real message is put before the ops.  A master that dies between the two puts
comes back (or is replaced) with a half record that has no op; before such a record is checked
or ended again, the store is asked whether the real topic already holds its committed message
(UNIQ_KEY index) and, if so, the missing ops are written instead: no second delivery.  (The op
first would lose the commit instead.)
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import attrs
import trio

from broker.consumer_offset_manager import ConsumerOffsetManager
from broker.schedule import trio_wall_clock_ms
from broker.store.api import MessageStore
from broker.store.results import PutMessageResult, PutMessageStatus
from broker.transaction import bridge
from broker.transaction.check import (
    CheckConfig,
    HalfAction,
    TransactionLedger,
    decide_half,
    transaction_key,
)
from broker.transaction.check import check_times as _check_times
from common.message import (
    MessageExt,
    MessageExtBrokerInner,
    MessageSysFlag,
    decode_record,
    decode_records,
)
from common.message_encoder import encode_record
from common.message_properties import MessageConst
from common.remoting.codes import ResponseCode
from common.topics import RMQ_SYS_TRANS_HALF_TOPIC, RMQ_SYS_TRANS_OP_HALF_TOPIC

log = logging.getLogger(__name__)

# RocketMQ: one check round spends at most this long (MAX_PROCESS_TIME_LIMIT, 60 s)
MAX_PROCESS_TIME_MS = 60_000
# a stored-but-not-confirmed put still counts as done (EndTransactionProcessor.sendFinalMessage)
_STORED = {
    PutMessageStatus.PUT_OK,
    PutMessageStatus.FLUSH_DISK_TIMEOUT,
    PutMessageStatus.FLUSH_SLAVE_TIMEOUT,
    PutMessageStatus.SLAVE_NOT_AVAILABLE,
}


@attrs.frozen
class EndRequest:
    """The fields of EndTransactionRequestHeader the broker reads."""

    producer_group: str
    tran_state_table_offset: int
    commit_log_offset: int
    # MessageSysFlag: 0 unknown, 8 commit, 12 rollback
    commit_or_rollback: int
    from_transaction_check: bool = False


@attrs.frozen
class CheckRequest:
    """One CHECK_TRANSACTION_STATE to send: the group, header fields, and the record body."""

    group: str
    fields: dict[str, str]
    body: bytes
    msg: MessageExt


@attrs.define
class TransactionStats:
    half_stored: int = 0
    committed: int = 0
    rolled_back: int = 0
    # ends that found their transaction already ended (repeats, late answers)
    already_ended: int = 0
    checks: int = 0
    discarded: int = 0
    requeued: int = 0
    # ops written because the real message was already in its topic (the crash window)
    repaired: int = 0


class CheckListener:
    """What a check round hands its results to (``AbstractTransactionalMessageCheckListener``)."""

    async def resolve_half(self, request: CheckRequest) -> None:
        raise NotImplementedError


@attrs.define(eq=False)
class TransactionalMessageService:
    store: MessageStore
    offsets: ConsumerOffsetManager
    store_host: Callable[[], tuple[str, int]]
    config: CheckConfig = attrs.field(factory=CheckConfig)
    # wall-clock ms (the check compares it with born/store timestamps)
    now_ms: Callable[[], int] | None = None
    # called with TRANS_CHECK_MAX_TIME_TOPIC before the first message is moved there
    ensure_topic: Callable[[str], None] = lambda topic: None
    stats: TransactionStats = attrs.field(factory=TransactionStats)
    ledger: TransactionLedger | None = None
    _lock: trio.Lock = attrs.field(factory=trio.Lock)

    def _now(self) -> int:
        if self.now_ms is None:
            self.now_ms = trio_wall_clock_ms()
        return self.now_ms()

    # --- the ledger ------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget the ledger: the next use rebuilds it from the persisted cursors and the log
        (a master that starts, or a slave that becomes one)."""
        self.ledger = None

    def _ledger(self) -> TransactionLedger:
        if self.ledger is None:
            half = bridge.fetch_progress(self.offsets, self.store, RMQ_SYS_TRANS_HALF_TOPIC)
            op = bridge.fetch_progress(self.offsets, self.store, RMQ_SYS_TRANS_OP_HALF_TOPIC)
            self.ledger = TransactionLedger.starting_at(half, op)
        led = self.ledger
        self._read_halves(led)
        self._read_ops(led)
        return led

    def _read_halves(self, led: TransactionLedger) -> None:
        while True:
            start = led.half_read
            msgs, nxt = bridge.read_queue(self.store, RMQ_SYS_TRANS_HALF_TOPIC, start)
            for m in msgs:
                if m.queue_offset >= led.half_read:
                    led.half_read = m.queue_offset  # past a hole, if any: read in order
                    led.add_half(m.queue_offset, transaction_key(m.properties, m.queue_offset))
            led.half_read = max(led.half_read, nxt)
            if led.half_read == start:
                return

    def _read_ops(self, led: TransactionLedger) -> None:
        while True:
            start = led.op_read
            msgs, nxt = bridge.read_queue(self.store, RMQ_SYS_TRANS_OP_HALF_TOPIC, start)
            for m in msgs:
                if m.properties.get(MessageConst.TAGS) != bridge.REMOVE_TAG:
                    log.error("op record at %d has tag %r, ignored", m.queue_offset, m.tags)
                    continue
                try:
                    half_offset = int(m.body.decode())
                except (UnicodeDecodeError, ValueError):
                    log.error("op record at %d has a bad body, ignored", m.queue_offset)
                    continue
                key = led.key_of(half_offset)
                if key is None and half_offset < led.half_progress:
                    key = self._key_of_old_half(half_offset)
                led.add_op(m.queue_offset, half_offset, key)
            led.op_read = max(led.op_read, nxt)
            if led.op_read == start:
                return

    def _key_of_old_half(self, half_offset: int) -> str | None:
        msgs, _ = bridge.read_queue(self.store, RMQ_SYS_TRANS_HALF_TOPIC, half_offset, 1)
        for m in msgs:
            if m.queue_offset == half_offset:
                return transaction_key(m.properties, m.queue_offset)
        return None

    # --- prepare ---------------------------------------------------------------------------
    def prepare_message(self, msg: MessageExtBrokerInner) -> MessageExtBrokerInner:
        self.stats.half_stored += 1
        return bridge.half_message_inner(msg)

    # --- end -------------------------------------------------------------------------------
    async def end_transaction(self, req: EndRequest) -> tuple[int, str | None]:
        """Commit or roll back; (response code, remark) as EndTransactionProcessor answers."""
        half = self.store.look_message_by_offset(req.commit_log_offset)
        if half is None or half.topic != RMQ_SYS_TRANS_HALF_TOPIC:
            return ResponseCode.SYSTEM_ERROR, "Find prepared transaction message failed"
        if half.properties.get(MessageConst.PGROUP) != req.producer_group:
            return ResponseCode.SYSTEM_ERROR, "The producer group wrong"
        if half.queue_offset != req.tran_state_table_offset:
            return ResponseCode.SYSTEM_ERROR, "The transaction state table offset wrong"
        if half.commit_log_offset != req.commit_log_offset:
            return ResponseCode.SYSTEM_ERROR, "The commit log offset wrong"
        commit = req.commit_or_rollback == MessageSysFlag.TRANSACTION_COMMIT
        async with self._lock:
            led = self._ledger()
            key = transaction_key(half.properties, half.queue_offset)
            if led.is_ended(key, half.queue_offset):
                self.stats.already_ended += 1
                log.info("transaction %s already ended; %s ignored", key, "commit" * commit)
                return ResponseCode.SUCCESS, None
            if commit and not self._committed_before(half):
                inner = bridge.end_message_inner(half, half.commit_log_offset)
                if inner is None:
                    return ResponseCode.SYSTEM_ERROR, "the half message lost its REAL_TOPIC"
                result = await self.store.put_message(inner)
                if result.status not in _STORED:
                    return _final_put_error(result, self.store.config.max_message_size)
            await self._delete_prepare(led, key, half.queue_offset)
            if commit:
                self.stats.committed += 1
            else:
                self.stats.rolled_back += 1
        return ResponseCode.SUCCESS, None

    async def _delete_prepare(self, led: TransactionLedger, key: str, offset: int) -> None:
        """``deletePrepareMessage``: an op for the record and every live copy of its key."""
        for off in sorted({offset, *led.live_copies(key)}):
            result = await self.store.put_message(bridge.op_message_inner(off, self.store_host()))
            if not result.ok:
                log.error("op for half %d not stored: %s", off, result.status)
            led.mark_ended(off, key)

    def _committed_before(self, half: MessageExt) -> bool:
        """The real topic already holds this half message committed (see the crash window)."""
        uniq = half.properties.get(MessageConst.UNIQ_KEY)
        topic = half.properties.get(MessageConst.REAL_TOPIC)
        if not uniq or not topic:
            return False
        found = self.store.query_message(topic, uniq, 4, 0, 2**62)
        for rec in found.buffers:
            for m in decode_records(bytes(rec)):
                if (
                    m.sys_flag & MessageSysFlag.TRANSACTION_MASK
                    == MessageSysFlag.TRANSACTION_COMMIT
                    and m.properties.get(MessageConst.UNIQ_KEY) == uniq
                ):
                    return True
        return False

    # --- check -----------------------------------------------------------------------------
    async def check(self, listener: CheckListener) -> int:
        """One check round; returns the number of records it decided on."""
        round_start = self._now()
        decided = 0
        async with self._lock:
            led = self._ledger()
        offset = led.half_progress
        # only records that existed when the round began: the copies it re-puts wait for the
        # next round (RocketMQ stops at a store time past the round's start, the same rule
        # without trusting two clocks to agree)
        end = self.store.get_max_offset_in_queue(RMQ_SYS_TRANS_HALF_TOPIC, bridge.HALF_QUEUE_ID)
        while offset < end and self._now() - round_start <= MAX_PROCESS_TIME_MS:
            msgs, nxt = bridge.read_queue(
                self.store, RMQ_SYS_TRANS_HALF_TOPIC, offset, min(end - offset, 32)
            )
            if not msgs:
                if nxt > offset:  # a hole (expired files): nothing there to decide
                    async with self._lock:
                        led.advance(nxt)
                    offset = nxt
                    continue
                break
            stop = False
            for m in msgs:
                if m.queue_offset >= end:
                    stop = True
                    break
                request, stop = await self._decide(led, m, round_start)
                if stop:
                    break
                decided += 1
                offset = m.queue_offset + 1
                if request is not None:
                    await listener.resolve_half(request)
            if stop:
                break
            offset = max(offset, nxt)
        self._persist_progress(led)
        return decided

    async def _decide(
        self, led: TransactionLedger, m: MessageExt, round_start: int
    ) -> tuple[CheckRequest | None, bool]:
        """Act on one half record; (a check to send, whether the round stops here)."""
        async with self._lock:
            self._ledger()
            key = transaction_key(m.properties, m.queue_offset)
            ended = led.is_ended(key, m.queue_offset)
            action = decide_half(
                m.properties,
                m.born_timestamp,
                m.store_timestamp,
                ended=ended,
                now_ms=self._now(),
                round_start_ms=round_start,
                config=self.config,
            )
            if action is HalfAction.WAIT:
                return None, True
            if action is not HalfAction.DONE and self._committed_before(m):
                await self._delete_prepare(led, key, m.queue_offset)
                self.stats.repaired += 1
                action = HalfAction.DONE
            request = None
            if action is HalfAction.DISCARD:
                if not await self._discard(m):
                    return None, True
            elif action is HalfAction.REQUEUE:
                copy = bridge.renew_half_message_inner(
                    m, check_times=None, first_offset=m.queue_offset
                )
                if await self._put_copy(led, key, copy) is None:
                    return None, True
                self.stats.requeued += 1
            elif action is HalfAction.CHECK:
                copy = bridge.renew_half_message_inner(
                    m, check_times=_check_times(m.properties) + 1, first_offset=m.queue_offset
                )
                put = await self._put_copy(led, key, copy)
                if put is None:
                    return None, True
                request = check_request(copy, put)
                self.stats.checks += 1
            led.advance(m.queue_offset + 1)
            return request, False

    async def _put_copy(
        self, led: TransactionLedger, key: str, copy: MessageExtBrokerInner
    ) -> PutMessageResult | None:
        result = await self.store.put_message(copy)
        if not result.ok or result.append is None:
            log.error("half message re-put failed: %s; the round stops", result.status)
            return None
        led.add_half(result.append.logics_offset, key)
        return result

    async def _discard(self, m: MessageExt) -> bool:
        """``resolveDiscardMsg``: keep it in TRANS_CHECK_MAX_TIME_TOPIC; never delivered."""
        self.ensure_topic(bridge.check_max_time_inner(m).topic)
        result = await self.store.put_message(bridge.check_max_time_inner(m))
        if not result.ok:
            log.error("moving half %d aside failed: %s", m.queue_offset, result.status)
            return False
        log.warning(
            "half message %s checked %s times: moved to TRANS_CHECK_MAX_TIME_TOPIC",
            m.properties.get(MessageConst.UNIQ_KEY),
            m.properties.get(MessageConst.TRANSACTION_CHECK_TIMES),
        )
        self.stats.discarded += 1
        return True

    def _persist_progress(self, led: TransactionLedger) -> None:
        bridge.update_progress(self.offsets, RMQ_SYS_TRANS_HALF_TOPIC, led.half_progress)
        bridge.update_progress(self.offsets, RMQ_SYS_TRANS_OP_HALF_TOPIC, led.op_progress)


def check_request(copy: MessageExtBrokerInner, put: PutMessageResult) -> CheckRequest:
    """The CHECK_TRANSACTION_STATE of a re-put copy (``sendCheckMessage``): its offsets in the
    header, and as body the record as Java's ``MessageDecoder.encode`` writes it, with the real
    topic and queue in place of the half topic's."""
    append = put.append
    assert append is not None
    props = copy.properties
    uniq = props.get(MessageConst.UNIQ_KEY, "")
    try:
        real_qid = int(props.get(MessageConst.REAL_QID, "0"))
    except ValueError:
        real_qid = 0
    real = attrs.evolve(
        copy,
        topic=props.get(MessageConst.REAL_TOPIC, copy.topic),
        queue_id=real_qid,
        properties_string=None,
    )
    body = encode_record(real, append.logics_offset, append.wrote_offset, append.store_timestamp)
    fields = {
        "tranStateTableOffset": str(append.logics_offset),
        "commitLogOffset": str(append.wrote_offset),
        "msgId": uniq,
        "transactionId": uniq,
        "offsetMsgId": append.msg_id,
    }
    return CheckRequest(
        group=props.get(MessageConst.PGROUP, ""),
        fields=fields,
        body=body,
        msg=decode_record(body),
    )


def _final_put_error(result: PutMessageResult, max_size: int) -> tuple[int, str]:
    """``sendFinalMessage``'s codes for a real message the store refused."""
    st = result.status
    if st is PutMessageStatus.CREATE_MAPEDFILE_FAILED:
        return ResponseCode.SYSTEM_ERROR, "Create mapped file failed."
    if st in (PutMessageStatus.MESSAGE_ILLEGAL, PutMessageStatus.PROPERTIES_SIZE_EXCEEDED):
        return (
            ResponseCode.MESSAGE_ILLEGAL,
            "The message is illegal, maybe msg body or properties length not matched. "
            f"msg body length limit {max_size}B, msg properties length limit 32KB.",
        )
    if st is PutMessageStatus.SERVICE_NOT_AVAILABLE:
        return ResponseCode.SERVICE_NOT_AVAILABLE, "Service not available now."
    if st is PutMessageStatus.OS_PAGECACHE_BUSY:
        return ResponseCode.SYSTEM_ERROR, "OS page cache busy, please try another machine"
    return ResponseCode.SYSTEM_ERROR, "UNKNOWN_ERROR"


__all__ = [
    "CheckListener",
    "CheckRequest",
    "EndRequest",
    "TransactionStats",
    "TransactionalMessageService",
    "check_request",
]
