"""A message's trace records, read back (RocketMQ ``TraceView.decodeFromTraceTransData``).

The trace messages that QUERY_MESSAGE finds under a msgId hold records of other messages too
(a trace message is a batch); :func:`trace_views` keeps the records of that msgId and adds
what the record does not say itself: the client that wrote it, which is the trace message's
born host (as Java's TraceView takes it).  The records come back ordered by time, with the
type order Pub, EndTransaction, SubBefore, SubAfter between equal times; one trace message
found twice (a hash collision of the index) counts once.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from common.message import MessageExt
from rmq.trace.encoder import MessageType, TraceType, decode

_ORDER = {
    TraceType.Pub: 0,
    TraceType.EndTransaction: 1,
    TraceType.SubBefore: 2,
    TraceType.SubAfter: 3,
}


@attrs.frozen
class TraceView:
    """One record of a message's trace."""

    trace_type: TraceType
    time_stamp: int  # ms; 0 when the record has none (a SubAfter of an old layout)
    group: str
    client_host: str  # "ip:port" of the client that wrote the trace message
    cost_time: int  # ms
    success: bool
    msg_id: str
    topic: str
    tags: str
    keys: str
    store_host: str
    offset_msg_id: str
    retry_times: int
    request_id: str  # ties a SubAfter to its SubBefore
    context_code: int  # SubAfter: ConsumeReturnType ordinal
    region_id: str
    trace_message_id: str  # offset msgId of the trace message that held the record
    # Pub: Normal_Msg, Trans_Msg_Half, Delay_Msg; EndTransaction: Trans_msg_Commit
    msg_type: MessageType | None = None
    # EndTransaction: the state sent (COMMIT_MESSAGE, ROLLBACK_MESSAGE, UNKNOW), the
    # transactionId, and whether it answered the broker's check rather than the local
    # transaction's first outcome
    transaction_state: str = ""
    transaction_id: str = ""
    from_transaction_check: bool = False

    @property
    def status(self) -> str:
        return "success" if self.success else "failed"


def _str(v: str | None) -> str:
    return "" if v is None else v


def trace_views(msg_id: str, trace_messages: Iterable[MessageExt]) -> list[TraceView]:
    """The records about `msg_id` in `trace_messages` (bodies that do not decode are skipped)."""
    out: list[TraceView] = []
    seen: set[tuple[tuple[str, int], int]] = set()
    for m in trace_messages:
        where = (m.store_host, m.commit_log_offset)
        if where in seen:
            continue
        seen.add(where)
        text = m.body.decode("utf-8", errors="replace")
        client = f"{m.born_host[0]}:{m.born_host[1]}"
        for ctx in decode(text):
            bean = ctx.trace_beans[0]
            if bean.msg_id != msg_id:
                continue
            out.append(
                TraceView(
                    trace_type=ctx.trace_type,
                    time_stamp=ctx.time_stamp,
                    group=_str(ctx.group_name),
                    client_host=client,
                    cost_time=ctx.cost_time,
                    success=ctx.success,
                    msg_id=msg_id,
                    topic=_str(bean.topic),
                    tags=_str(bean.tags),
                    keys=_str(bean.keys),
                    store_host=_str(bean.store_host),
                    offset_msg_id=_str(bean.offset_msg_id),
                    retry_times=bean.retry_times,
                    request_id=_str(ctx.request_id),
                    context_code=ctx.context_code,
                    region_id=_str(ctx.region_id),
                    trace_message_id=m.msg_id,
                    msg_type=bean.msg_type,
                    transaction_state=_str(bean.transaction_state),
                    transaction_id=_str(bean.transaction_id),
                    from_transaction_check=bean.from_transaction_check,
                )
            )
    out.sort(key=lambda v: (v.time_stamp, _ORDER[v.trace_type]))
    return out


__all__ = ["TraceView", "trace_views"]
