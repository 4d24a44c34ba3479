"""Trace records and their text layout (RocketMQ ``TraceDataEncoder`` / ``TraceContext`` /
``TraceBean`` in ``client/trace/`` of apache/rocketmq 4.9).

Theory of operation
-------------------
A trace message's body is a run of records.  Each record is its fields joined by
``CONTENT_SPLITOR`` (\\x01) and ended by ``FIELD_SPLITOR`` (\\x02); the first field names the
type and fixes the order of the rest:

- ``Pub``: type, timestamp, regionId, group, topic, msgId, tags, keys, storeHost, bodyLength,
  costTime, msgType ordinal, offsetMsgId, success (14 fields);
- ``SubBefore``: type, timestamp, regionId, group, requestId, msgId, retryTimes, keys (one
  record per message of the listener call);
- ``SubAfter``: type, requestId, msgId, costTime, success, keys, contextCode, timestamp, group
  (9 fields; the requestId ties it to its SubBefore);
- ``EndTransaction``: type, timestamp, regionId, group, topic, msgId, tags, keys, storeHost,
  msgType ordinal, transactionId, transactionState, fromTransactionCheck.

Values are rendered as Java's ``StringBuilder.append`` renders them: a missing string is
``null``, a boolean ``true``/``false``.  The encoder also gives the message keys the trace
message is indexed under: every record's msgId and each of its KEYS, so QUERY_MESSAGE on the
trace topic by a message's msgId finds every trace of it.

Reading is Java's ``decoderFromTraceDataString``, including its tolerance of the older layouts
(a Pub with 13 fields has no offsetMsgId; one with 15 carries the client host; a SubAfter of 6
or 7 fields has no timestamp and group), and ``String.split``'s habit of dropping trailing empty
fields.  Unlike Java it never raises: a record it cannot read (another client's garbage, a
truncated body) is skipped and the rest are still returned.
"""

from __future__ import annotations

import enum
import time

import attrs

from common.message_properties import MessageConst
from rmq.client_instance import local_ip
from rmq.message import create_unique_id

CONTENT_SPLITOR = "\x01"
FIELD_SPLITOR = "\x02"
# TraceConstants.GROUP_NAME_PREFIX: the group of the producer that writes a client's traces
GROUP_NAME_PREFIX = "_INNER_TRACE_PRODUCER"
# MixAll.DEFAULT_TRACE_REGION_ID: an EndTransaction's region when the message names none
DEFAULT_TRACE_REGION_ID = "DefaultRegion"


class TraceType(enum.Enum):
    Pub = "Pub"
    SubBefore = "SubBefore"
    SubAfter = "SubAfter"
    EndTransaction = "EndTransaction"


class MessageType(enum.IntEnum):
    """``common/message/MessageType``: the ordinal is what the layout carries."""

    Normal_Msg = 0
    Trans_Msg_Half = 1
    Trans_msg_Commit = 2
    Delay_Msg = 3


class ConsumeReturnType(enum.IntEnum):
    """``ConsumeReturnType``: a SubAfter's contextCode is the ordinal."""

    SUCCESS = 0
    TIME_OUT = 1
    EXCEPTION = 2
    RETURNNULL = 3
    FAILED = 4


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@attrs.define
class TraceBean:
    """One message in a trace record (``TraceBean``: empty strings and this host by default)."""

    topic: str | None = ""
    msg_id: str | None = ""
    offset_msg_id: str | None = ""
    tags: str | None = ""
    keys: str | None = ""
    store_host: str | None = attrs.Factory(local_ip)
    client_host: str | None = attrs.Factory(local_ip)
    store_time: int = 0
    retry_times: int = 0
    body_length: int = 0
    msg_type: MessageType | None = None
    transaction_state: str | None = None
    transaction_id: str | None = None
    from_transaction_check: bool = False


@attrs.define
class TraceContext:
    """One trace record before encoding (``TraceContext``)."""

    trace_type: TraceType
    time_stamp: int = attrs.Factory(now_ms)
    region_id: str | None = ""
    group_name: str | None = ""
    cost_time: int = 0
    success: bool = True
    request_id: str | None = attrs.Factory(create_unique_id)
    context_code: int = 0
    # AccessChannel.CLOUD leaves a SubAfter's timestamp and group out; we only write LOCAL
    cloud: bool = False
    trace_beans: list[TraceBean] = attrs.Factory(list)


@attrs.frozen
class TraceTransferBean:
    """An encoded record and the keys its trace message is indexed under."""

    trans_data: str
    trans_keys: tuple[str, ...]


def _s(value: object) -> str:
    """A value as Java's StringBuilder.append writes it."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    return str(value)


def _record(*fields: object) -> str:
    return CONTENT_SPLITOR.join(_s(f) for f in fields) + FIELD_SPLITOR


def _ordinal(t: MessageType | None) -> object:
    return None if t is None else int(t)


def _message_head(ctx: TraceContext, b: TraceBean) -> tuple[object, ...]:
    """The fields a Pub and an EndTransaction record both start with."""
    return (
        ctx.trace_type.value,
        ctx.time_stamp,
        ctx.region_id,
        ctx.group_name,
        b.topic,
        b.msg_id,
        b.tags,
        b.keys,
        b.store_host,
    )


def encode(ctx: TraceContext) -> TraceTransferBean:
    """``TraceDataEncoder.encoderFromContextBean``."""
    t = ctx.trace_type
    parts: list[str] = []
    if t is TraceType.Pub:
        b = ctx.trace_beans[0]
        parts.append(
            _record(
                *_message_head(ctx, b),
                b.body_length,
                ctx.cost_time,
                _ordinal(b.msg_type),
                b.offset_msg_id,
                ctx.success,
            )
        )
    elif t is TraceType.SubBefore:
        for b in ctx.trace_beans:
            parts.append(
                _record(
                    t.value,
                    ctx.time_stamp,
                    ctx.region_id,
                    ctx.group_name,
                    ctx.request_id,
                    b.msg_id,
                    b.retry_times,
                    b.keys,
                )
            )
    elif t is TraceType.SubAfter:
        for b in ctx.trace_beans:
            head = (t.value, ctx.request_id, b.msg_id, ctx.cost_time, ctx.success, b.keys)
            if ctx.cloud:
                # Java ends a CLOUD SubAfter after the contextCode's splitter, with no \x02
                parts.append(CONTENT_SPLITOR.join(_s(f) for f in (*head, ctx.context_code)))
                parts.append(CONTENT_SPLITOR)
            else:
                parts.append(_record(*head, ctx.context_code, ctx.time_stamp, ctx.group_name))
    elif t is TraceType.EndTransaction:
        b = ctx.trace_beans[0]
        parts.append(
            _record(
                *_message_head(ctx, b),
                _ordinal(b.msg_type),
                b.transaction_id,
                b.transaction_state,
                b.from_transaction_check,
            )
        )
    keys: list[str] = []
    for b in ctx.trace_beans:
        keys.append(_s(b.msg_id))
        if b.keys:
            keys.extend(b.keys.split(MessageConst.KEY_SEPARATOR))
    # a HashSet in Java: each key once
    return TraceTransferBean("".join(parts), tuple(dict.fromkeys(keys)))


def java_split(s: str, sep: str) -> list[str]:
    """Java's ``String.split`` for a one-character separator: trailing empty strings are
    removed (so a string of separators only gives []), but a string without the separator is
    itself, even when empty."""
    if sep not in s:
        return [s]
    parts = s.split(sep)
    while parts and parts[-1] == "":
        parts.pop()
    return parts


def _bool(s: str) -> bool:
    return s.lower() == "true"  # Boolean.parseBoolean


def _decode_message_head(t: TraceType, line: list[str]) -> tuple[TraceContext, TraceBean]:
    """What `_message_head` wrote: the context and the start of its one bean."""
    ctx = TraceContext(
        t, time_stamp=int(line[1]), region_id=line[2], group_name=line[3], request_id=None
    )
    bean = TraceBean(topic=line[4], msg_id=line[5], tags=line[6], keys=line[7], store_host=line[8])
    return ctx, bean


def _decode_one(line: list[str]) -> TraceContext | None:
    kind = line[0]
    if kind == TraceType.Pub.value:
        ctx, bean = _decode_message_head(TraceType.Pub, line)
        bean.body_length = int(line[9])
        bean.msg_type = MessageType(int(line[11]))
        ctx.cost_time = int(line[10])
        if len(line) == 13:
            ctx.success = _bool(line[12])
        elif len(line) >= 14:
            bean.offset_msg_id = line[12]
            ctx.success = _bool(line[13])
            if len(line) >= 15:
                bean.client_host = line[14]
        ctx.trace_beans = [bean]
        return ctx
    if kind == TraceType.SubBefore.value:
        ctx = TraceContext(
            TraceType.SubBefore,
            time_stamp=int(line[1]),
            region_id=line[2],
            group_name=line[3],
            request_id=line[4],
        )
        ctx.trace_beans = [TraceBean(msg_id=line[5], retry_times=int(line[6]), keys=line[7])]
        return ctx
    if kind == TraceType.SubAfter.value:
        ctx = TraceContext(TraceType.SubAfter, request_id=line[1], time_stamp=0, group_name="")
        ctx.trace_beans = [TraceBean(msg_id=line[2], keys=line[5])]
        ctx.cost_time = int(line[3])
        ctx.success = _bool(line[4])
        if len(line) >= 7:
            ctx.context_code = int(line[6])
        if len(line) >= 9:
            ctx.time_stamp = int(line[7])
            ctx.group_name = line[8]
        return ctx
    if kind == TraceType.EndTransaction.value:
        ctx, bean = _decode_message_head(TraceType.EndTransaction, line)
        bean.msg_type = MessageType(int(line[9]))
        bean.transaction_id = line[10]
        bean.transaction_state = line[11]
        bean.from_transaction_check = _bool(line[12])
        ctx.trace_beans = [bean]
        return ctx
    return None


def decode(data: str) -> list[TraceContext]:
    """``TraceDataEncoder.decoderFromTraceDataString``, skipping records it cannot read."""
    out: list[TraceContext] = []
    if not data:
        return out
    for record in java_split(data, FIELD_SPLITOR):
        line = java_split(record, CONTENT_SPLITOR)
        if not line:
            continue
        try:
            ctx = _decode_one(line)
        except (IndexError, ValueError):
            continue  # Java would throw; one bad record must not hide the others
        if ctx is not None:
            out.append(ctx)
    return out


__all__ = [
    "CONTENT_SPLITOR",
    "DEFAULT_TRACE_REGION_ID",
    "FIELD_SPLITOR",
    "GROUP_NAME_PREFIX",
    "ConsumeReturnType",
    "MessageType",
    "TraceBean",
    "TraceContext",
    "TraceTransferBean",
    "TraceType",
    "decode",
    "encode",
    "java_split",
]
