"""The records a traced client writes (RocketMQ ``SendMessageTraceHookImpl``,
``EndTransactionTraceHookImpl`` and ``ConsumeMessageTraceHookImpl``).

- A send that the broker answered (stored, flushed or not) gives one ``Pub`` record: the
  producer group, the message's topic, msgId (UNIQ_KEY), offsetMsgId, tags, keys and body
  length, the broker's address, the time from before the send to the answer, and whether it
  was SEND_OK.  A send that failed gives none, nor a send to the trace topic itself, nor one
  the broker answered with TRACE_ON=false; as in Java.  The message type is Trans_Msg_Half
  for a transaction's half message, Delay_Msg for one with a delay level, else Normal_Msg.
- Each END_TRANSACTION a transactional producer sends gives one ``EndTransaction`` record,
  written just before the request leaves (after the local transaction, or after the broker's
  check-back): the group, the message's topic, msgId, tags and keys, the broker it goes to,
  the state sent (``LocalTransactionState``'s name), the transactionId (the msgId, as Java's
  client sets it) and whether it answers a check.  Java writes the type Trans_msg_Commit
  whatever the state, and the region of the message's MSG_REGION, else DefaultRegion; so do
  we.  Unlike a Pub it does not wait for the broker (END_TRANSACTION is oneway), so it has no
  cost and counts as a success.
- A listener call gives a ``SubBefore`` record per message before the call (group, msgId,
  reconsume times, keys, and a request id shared by the call) and a ``SubAfter`` per message
  after it, with the call's time divided by the number of messages, whether it succeeded, and
  how (``ConsumeReturnType``'s ordinal).  Messages stored with TRACE_ON=false are left out.

Both only build records and hand them to the dispatcher, which never waits.
"""

from __future__ import annotations

from common.message import MessageExt
from common.message_properties import MessageConst
from rmq.message import Message
from rmq.send_result import SendResult, SendStatus
from rmq.trace.dispatcher import AsyncTraceDispatcher
from rmq.trace.encoder import (
    DEFAULT_TRACE_REGION_ID,
    ConsumeReturnType,
    MessageType,
    TraceBean,
    TraceContext,
    TraceType,
    now_ms,
)


class SendTracer:
    def __init__(self, dispatcher: AsyncTraceDispatcher, group: str) -> None:
        self.dispatcher = dispatcher
        self.group = group

    def traced(self, topic: str) -> bool:
        return not topic.startswith(self.dispatcher.topic)

    def record(
        self,
        msg: Message,
        result: SendResult,
        store_host: str,
        start_ms: int,
        msg_type: MessageType | None = None,
    ) -> None:
        """A ``Pub`` for a send that started at `start_ms` and got `result` from `store_host`
        (`msg_type`: Trans_Msg_Half for a half message; by default from the delay level)."""
        if not self.traced(msg.topic) or not result.trace_on:
            return
        if msg_type is None:
            msg_type = MessageType.Delay_Msg if msg.delay_level > 0 else MessageType.Normal_Msg
        cost = now_ms() - start_ms
        bean = TraceBean(
            topic=msg.topic,
            msg_id=result.msg_id,
            offset_msg_id=result.offset_msg_id,
            tags=msg.tags,
            keys=msg.keys,
            store_host=store_host,
            body_length=len(msg.body),
            msg_type=msg_type,
            store_time=start_ms + cost // 2,
        )
        self.dispatcher.append(
            TraceContext(
                TraceType.Pub,
                time_stamp=start_ms,
                region_id=result.region_id,
                group_name=self.group,
                cost_time=cost,
                success=result.status is SendStatus.SEND_OK,
                trace_beans=[bean],
            )
        )


class EndTransactionTracer:
    def __init__(self, dispatcher: AsyncTraceDispatcher, group: str) -> None:
        self.dispatcher = dispatcher
        self.group = group

    def record(
        self,
        *,
        topic: str,
        msg_id: str,
        tags: str | None,
        keys: str | None,
        store_host: str,
        state: str,
        transaction_id: str | None,
        from_check: bool,
        region_id: str | None = None,
    ) -> None:
        """An ``EndTransaction`` for the END_TRANSACTION about to go to `store_host`."""
        if topic.startswith(self.dispatcher.topic):
            return
        bean = TraceBean(
            topic=topic,
            msg_id=msg_id,
            tags=tags,
            keys=keys,
            store_host=store_host,
            msg_type=MessageType.Trans_msg_Commit,
            transaction_state=state,
            transaction_id=transaction_id,
            from_transaction_check=from_check,
        )
        self.dispatcher.append(
            TraceContext(
                TraceType.EndTransaction,
                region_id=region_id or DEFAULT_TRACE_REGION_ID,
                group_name=self.group,
                request_id=None,
                trace_beans=[bean],
            )
        )


class ConsumeTracer:
    def __init__(self, dispatcher: AsyncTraceDispatcher, group: str) -> None:
        self.dispatcher = dispatcher
        self.group = group

    def before(self, msgs: list[MessageExt]) -> TraceContext | None:
        """The ``SubBefore`` of a listener call (already queued), or None if nothing is traced."""
        beans = []
        region: str | None = None
        for m in msgs:
            props = m.properties
            if props.get(MessageConst.TRACE_ON) == "false":
                continue
            region = props.get(MessageConst.MSG_REGION)
            beans.append(
                TraceBean(
                    topic=m.topic,
                    msg_id=m.uniq_key or m.msg_id,
                    tags=m.tags,
                    keys=m.keys,
                    store_time=m.store_timestamp,
                    body_length=m.store_size,
                    retry_times=m.reconsume_times,
                )
            )
        if not beans:
            return None
        ctx = TraceContext(
            TraceType.SubBefore, region_id=region, group_name=self.group, trace_beans=beans
        )
        self.dispatcher.append(ctx)
        return ctx

    def after(
        self, before: TraceContext, count: int, success: bool, how: ConsumeReturnType
    ) -> None:
        """The ``SubAfter`` of the call `before` began (`count` messages were passed)."""
        self.dispatcher.append(
            TraceContext(
                TraceType.SubAfter,
                region_id=before.region_id,
                group_name=before.group_name,
                request_id=before.request_id,
                success=success,
                cost_time=(now_ms() - before.time_stamp) // max(count, 1),
                context_code=int(how),
                trace_beans=before.trace_beans,
            )
        )


__all__ = ["ConsumeTracer", "EndTransactionTracer", "SendTracer"]
