"""Message properties (RocketMQ's ``MessageConst`` names and the ``k\\x01v\\x02k\\x01v`` codec).

A message's properties travel as one string (``MessageDecoder.messageProperties2String`` in
``common/message/MessageDecoder.java``): pairs ``name\\x01value`` joined by ``\\x02``.  It is stored
in the CommitLog record (``common.message``), sent in the ``properties`` field of a SEND request
header and embedded per message in batch bodies (``common.batch_body``), so this module is the one
definition of the format and of the reserved names (:class:`MessageConst`).

The parser mirrors Java's ``MessageDecoder.string2messageProperties`` tolerance: a segment
shorter than 3 characters, or with an empty name or value, is skipped; a repeated name keeps
its last value (a ``HashMap.put`` per pair).  The encoder refuses names and values holding a
separator, which Java would write and then misread.
"""

from __future__ import annotations

from collections.abc import Mapping

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"


class MessageConst:
    KEYS = "KEYS"
    TAGS = "TAGS"
    WAIT = "WAIT"
    DELAY = "DELAY"
    RETRY_TOPIC = "RETRY_TOPIC"
    REAL_TOPIC = "REAL_TOPIC"
    REAL_QID = "REAL_QID"
    TRAN_MSG = "TRAN_MSG"
    PGROUP = "PGROUP"
    MIN_OFFSET = "MIN_OFFSET"
    MAX_OFFSET = "MAX_OFFSET"
    BUYER_ID = "BUYER_ID"
    ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
    TRANSFER_FLAG = "TRANSFER_FLAG"
    CORRECTION_FLAG = "CORRECTION_FLAG"
    MQ2_FLAG = "MQ2_FLAG"
    RECONSUME_TIME = "RECONSUME_TIME"
    MSG_REGION = "MSG_REGION"
    TRACE_ON = "TRACE_ON"
    UNIQ_KEY = "UNIQ_KEY"
    MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
    CONSUME_START_TIME = "CONSUME_START_TIME"
    TRAN_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
    TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
    CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
    INSTANCE_ID = "INSTANCE_ID"
    CORRELATION_ID = "CORRELATION_ID"
    # RocketMQ 5 timer messages (MessageConst.PROPERTY_TIMER_*): what a producer sets (an
    # absolute epoch ms, or a delay from now) and what the broker's timer store adds
    TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
    TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
    TIMER_DELAY_MS = "TIMER_DELAY_MS"
    TIMER_OUT_MS = "TIMER_OUT_MS"
    TIMER_ENQUEUE_MS = "TIMER_ENQUEUE_MS"
    TIMER_DEQUEUE_MS = "TIMER_DEQUEUE_MS"
    TIMER_ROLL_TIMES = "TIMER_ROLL_TIMES"
    TIMER_DEL_UNIQKEY = "TIMER_DEL_UNIQKEY"
    REPLY_TO_CLIENT = "REPLY_TO_CLIENT"
    TTL = "TTL"
    ARRIVE_TIME = "ARRIVE_TIME"
    PUSH_REPLY_TIME = "PUSH_REPLY_TIME"
    CLUSTER = "CLUSTER"
    MSG_TYPE = "MSG_TYPE"
    INNER_MULTI_DISPATCH = "INNER_MULTI_DISPATCH"
    INNER_MULTI_QUEUE_OFFSET = "INNER_MULTI_QUEUE_OFFSET"
    KEY_SEPARATOR = " "


# --------------------------------------------------------------------------------------- properties


def encode_properties(props: Mapping[str, str | None]) -> str:
    """``k\\x01v\\x02k\\x01v`` with no trailing separator; None values are skipped like Java."""
    items = [(k, v if isinstance(v, str) else str(v)) for k, v in props.items() if v is not None]
    s = PROPERTY_SEPARATOR.join([k + NAME_VALUE_SEPARATOR + v for k, v in items])
    # one C-level scan instead of four per property: exactly one \x01 per pair, \x02 between
    if s.count(NAME_VALUE_SEPARATOR) != len(items) or s.count(PROPERTY_SEPARATOR) != max(
        len(items) - 1, 0
    ):
        for k, v in items:
            if NAME_VALUE_SEPARATOR in k or PROPERTY_SEPARATOR in k:
                raise ValueError(f"property name {k!r} contains a separator character")
            if NAME_VALUE_SEPARATOR in v or PROPERTY_SEPARATOR in v:
                raise ValueError(f"property {k!r} value contains a separator character")
    return s


def decode_properties(s: str) -> dict[str, str]:
    """Java ``string2messageProperties``: skip segments < 3 chars, need non-empty key and value."""
    out: dict[str, str] = {}
    if not s:
        return out
    for seg in s.split(PROPERTY_SEPARATOR):
        # key before the first \x01, value after it; both non-empty (so len(seg) >= 3)
        k, _, v = seg.partition(NAME_VALUE_SEPARATOR)
        if k and v:
            out[k] = v
    return out
