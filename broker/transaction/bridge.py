"""What transactional messages ask of the store (RocketMQ ``TransactionalMessageBridge``,
apache/rocketmq 4.9 ``broker/.../transaction/queue/TransactionalMessageBridge.java``).

The half and op topics are ordinary topics of one queue each: their records go through the
CommitLog like any other, so they replicate to a slave (classic HA) or through the Raft log
(DLedger) with nothing added.  The check's cursors are the consumer offsets of group
``CID_RMQ_SYS_TRANS`` on both topics (``consumerOffset.json``), which a slave's metadata sync
copies from its master.

Every function here builds a record or reads some; none decides anything (``check.py``) or
holds state (``service.py``).
"""

from __future__ import annotations

import time

from broker.consumer_offset_manager import ConsumerOffsetManager
from broker.store.api import MessageStore
from broker.store.results import GetMessageStatus
from common.message import (
    MessageExt,
    MessageExtBrokerInner,
    MessageSysFlag,
    decode_records,
    rewritten,
)
from common.message_properties import MessageConst, encode_properties, real_destination
from common.mixall import CID_SYS_RMQ_TRANS
from common.topics import (
    RMQ_SYS_TRANS_HALF_TOPIC,
    RMQ_SYS_TRANS_OP_HALF_TOPIC,
    TRANS_CHECK_MAX_TIME_TOPIC,
)

# the op record's tag (TransactionalMessageUtil.REMOVETAG)
REMOVE_TAG = "d"
HALF_QUEUE_ID = 0
_READ_BATCH = 32


def _without_transaction_bits(sys_flag: int) -> int:
    return sys_flag & ~MessageSysFlag.TRANSACTION_MASK


def half_message_inner(msg: MessageExtBrokerInner) -> MessageExtBrokerInner:
    """``parseHalfMessageInner``: the send's message moved to the half topic, queue 0, with
    REAL_TOPIC / REAL_QID and the transaction bits cleared (so the store gives it a queue unit:
    a prepared record would have none)."""
    props = dict(msg.properties)
    props[MessageConst.REAL_TOPIC] = msg.topic
    props[MessageConst.REAL_QID] = str(msg.queue_id)
    stored = {k: v for k, v in props.items() if k != MessageConst.WAIT}
    half = rewritten(
        msg,
        RMQ_SYS_TRANS_HALF_TOPIC,
        HALF_QUEUE_ID,
        props,
        sys_flag=_without_transaction_bits(msg.sys_flag),
    )
    half.properties_string = encode_properties(stored)
    return half


def renew_half_message_inner(
    half: MessageExt, *, check_times: int | None, first_offset: int | None = None
) -> MessageExtBrokerInner:
    """``renewHalfMessageInner``: a copy of a half record for the end of the queue.

    ``check_times``: the new TRANSACTION_CHECK_TIMES (None: unchanged, an immunity re-put);
    ``first_offset``: TRAN_PREPARED_QUEUE_OFFSET to record (the first copy's offset)."""
    props = dict(half.properties)
    if check_times is not None:
        props[MessageConst.TRANSACTION_CHECK_TIMES] = str(check_times)
    if first_offset is not None and MessageConst.TRAN_PREPARED_QUEUE_OFFSET not in props:
        props[MessageConst.TRAN_PREPARED_QUEUE_OFFSET] = str(first_offset)
    return rewritten(half, half.topic, half.queue_id, props)


def op_message_inner(half_queue_offset: int, store_host: tuple[str, int]) -> MessageExtBrokerInner:
    """``addRemoveTagInTransactionOp``: tag ``d``, body the half's queue offset as text."""
    return MessageExtBrokerInner(
        topic=RMQ_SYS_TRANS_OP_HALF_TOPIC,
        queue_id=HALF_QUEUE_ID,
        body=str(half_queue_offset).encode(),
        properties={MessageConst.TAGS: REMOVE_TAG},
        born_timestamp=int(time.time() * 1000),
        born_host=store_host,
        store_host=store_host,
    )


def end_message_inner(half: MessageExt, commit_log_offset: int) -> MessageExtBrokerInner | None:
    """``EndTransactionProcessor.endMessageTransaction``: the real message of a committed half
    record (TRANSACTION_COMMIT, PREPARED_TRANSACTION_OFFSET = the half's CommitLog offset, no
    REAL_TOPIC / REAL_QID / TRAN_MSG); None when the record lost its destination."""
    props = dict(half.properties)
    destination = real_destination(props)
    if destination is None:
        return None
    topic, queue_id = destination
    for key in (MessageConst.REAL_TOPIC, MessageConst.REAL_QID, MessageConst.TRAN_MSG):
        props.pop(key, None)
    real = rewritten(
        half,
        topic,
        queue_id,
        props,
        sys_flag=_without_transaction_bits(half.sys_flag) | MessageSysFlag.TRANSACTION_COMMIT,
    )
    real.prepared_transaction_offset = commit_log_offset
    return real


def check_max_time_inner(half: MessageExt) -> MessageExtBrokerInner:
    """``DefaultTransactionalMessageCheckListener.toMessageExtBrokerInner``: a half record given
    up on, kept in TRANS_CHECK_MAX_TIME_TOPIC (one queue) for operators; never delivered."""
    return rewritten(half, TRANS_CHECK_MAX_TIME_TOPIC, 0, dict(half.properties))


def read_queue(
    store: MessageStore, topic: str, offset: int, max_num: int = _READ_BATCH
) -> tuple[list[MessageExt], int]:
    """Records of queue 0 of ``topic`` from ``offset`` (each with its queue offset), and the
    offset to read next (past holes and expired units)."""
    res = store.get_message(CID_SYS_RMQ_TRANS, topic, HALF_QUEUE_ID, offset, max_num, None)
    if res.status is GetMessageStatus.FOUND:
        msgs = decode_records(b"".join(bytes(b) for b in res.buffers))
        return msgs, max(res.next_begin_offset, offset)
    if res.status is GetMessageStatus.OFFSET_TOO_SMALL:
        return [], res.min_offset
    if res.status in (GetMessageStatus.NO_MATCHED_MESSAGE, GetMessageStatus.MESSAGE_WAS_REMOVING):
        return [], max(res.next_begin_offset, offset)
    return [], offset


def fetch_progress(offsets: ConsumerOffsetManager, store: MessageStore, topic: str) -> int:
    """``fetchConsumeOffset``: the check's cursor on ``topic``, else the queue's first unit."""
    off = offsets.query_offset(CID_SYS_RMQ_TRANS, topic, HALF_QUEUE_ID)
    if off < 0:
        off = store.get_min_offset_in_queue(topic, HALF_QUEUE_ID)
    return off


def update_progress(offsets: ConsumerOffsetManager, topic: str, offset: int) -> None:
    offsets.commit_offset(CID_SYS_RMQ_TRANS, topic, HALF_QUEUE_ID, offset)


__all__ = [
    "HALF_QUEUE_ID",
    "REMOVE_TAG",
    "check_max_time_inner",
    "end_message_inner",
    "fetch_progress",
    "half_message_inner",
    "op_message_inner",
    "read_queue",
    "renew_half_message_inner",
    "update_progress",
]
