"""ReceiveMessage, AckMessage, ChangeInvisibleDuration and ForwardMessageToDeadLetterQueue
(RocketMQ 5's consumer activities, local mode) over the broker's pop service
(``broker/pop/api.py``).

ReceiveMessage pops from the broker the queue names, from any of its queues (the proxy's
``ReceiveMessageQueueSelector`` picks the broker only, and pops with ConsumeInitMode.MAX), with:

* the invisible time: the request's ``invisible_duration`` (RocketMQ 5 refuses less than 10 s
  or more than 12 h: ILLEGAL_INVISIBLE_TIME), or with ``auto_renew`` (push consumers) the
  proxy's default, 60 s, renewed while the client holds the message (receipt_renewal.py);
* long polling: ``long_polling_timeout``, cut so the answer comes before the call's own
  deadline (``grpc-timeout`` less a 3 s margin, never below 0);
* the filter: TAG or SQL92 expression, checked by pop as the pull path checks it;
* FIFO when the consumer group consumes orderly.

The answer is a stream: ``status`` OK, ``delivery_timestamp`` (now), then one ``message`` per
message (each with its receipt handle, invisible duration and delivery attempt), or a single
status: MESSAGE_NOT_FOUND after
a poll that found nothing, and the codes of the other pop outcomes below.
"""

from __future__ import annotations

import trio

from broker.grpc.client_manager import GrpcClientManager
from broker.grpc.converter import (
    duration_ms,
    message_of,
    now_ms,
    timestamp_of_ms,
    wrap_namespace,
)
from broker.grpc.local_broker import LocalBroker
from broker.grpc.receipt_renewal import ReceiptRenewal
from broker.grpc.status import OK, ActivityError, status
from broker.pop.api import AckStatus, PopRequest, PopService, PopStatus
from common.grpc.service import CallContext, Send
from common.grpc.v2 import definition_pb2 as pb
from common.grpc.v2 import service_pb2 as spb
from common.message_properties import MessageConst

MIN_INVISIBLE_MS = 10_000
MAX_INVISIBLE_MS = 12 * 3600 * 1000
DEFAULT_INVISIBLE_MS = 60_000
# what the answer keeps of the client's deadline (the proxy's grpcClientConsumerLongPolling
# margin): time to pop, write and deliver
DEADLINE_MARGIN_MS = 3_000
MAX_BATCH = 32

_POP_CODES = {
    PopStatus.NO_NEW_MSG: (pb.MESSAGE_NOT_FOUND, "no new message"),
    PopStatus.POLLING_FULL: (pb.TOO_MANY_REQUESTS, "polling full"),
    PopStatus.TOPIC_NOT_EXIST: (pb.TOPIC_NOT_FOUND, "topic not found"),
    PopStatus.SUBSCRIPTION_GROUP_NOT_EXIST: (pb.CONSUMER_GROUP_NOT_FOUND, "group not found"),
    PopStatus.NO_PERMISSION: (pb.FORBIDDEN, "no permission"),
    PopStatus.BAD_REQUEST: (pb.BAD_REQUEST, "bad request"),
    PopStatus.FILTER_ERROR: (pb.ILLEGAL_FILTER_EXPRESSION, "illegal filter expression"),
    PopStatus.NOT_MASTER: (pb.INTERNAL_SERVER_ERROR, "not the master"),
}

_ACK_CODES = {
    AckStatus.OK: pb.OK,
    AckStatus.BAD_HANDLE: pb.INVALID_RECEIPT_HANDLE,
    AckStatus.EXPIRED: pb.INVALID_RECEIPT_HANDLE,
    AckStatus.TOPIC_NOT_EXIST: pb.TOPIC_NOT_FOUND,
    AckStatus.SUBSCRIPTION_GROUP_NOT_EXIST: pb.CONSUMER_GROUP_NOT_FOUND,
    AckStatus.NOT_MASTER: pb.INTERNAL_SERVER_ERROR,
}


class ConsumerActivity:
    def __init__(self, local: LocalBroker, clients: GrpcClientManager) -> None:
        self.local = local
        self.clients = clients
        # push consumers' messages whose invisible time the server renews (auto_renew)
        self.renewal: ReceiptRenewal | None = (
            ReceiptRenewal(local.pop) if local.pop is not None else None
        )
        self.default_invisible_ms = DEFAULT_INVISIBLE_MS

    def _pop(self) -> PopService:
        pop = self.local.pop
        if pop is None:
            raise ActivityError(pb.NOT_IMPLEMENTED, "pop consumption is not served here")
        return pop

    async def receive_message(
        self,
        req: spb.ReceiveMessageRequest,
        ctx: CallContext,
        send: Send[spb.ReceiveMessageResponse],
    ) -> None:
        try:
            await self._receive(req, ctx, send)
        except ActivityError as exc:
            await send(spb.ReceiveMessageResponse(status=exc.status))

    async def _receive(
        self,
        req: spb.ReceiveMessageRequest,
        ctx: CallContext,
        send: Send[spb.ReceiveMessageResponse],
    ) -> None:
        pop = self._pop()
        channel = self.clients.channel(ctx)
        b = self.local.controller
        group = wrap_namespace(req.group)
        topic = wrap_namespace(req.message_queue.topic)
        if not group:
            raise ActivityError(pb.ILLEGAL_CONSUMER_GROUP, "consumer group is empty")
        if not topic:
            raise ActivityError(pb.ILLEGAL_TOPIC, "topic is empty")
        if req.auto_renew or not req.HasField("invisible_duration"):
            invisible_ms = self.default_invisible_ms
        else:
            invisible_ms = duration_ms(req.invisible_duration)
            if not MIN_INVISIBLE_MS <= invisible_ms <= MAX_INVISIBLE_MS:
                raise ActivityError(
                    pb.ILLEGAL_INVISIBLE_TIME,
                    f"the invisible time must be in [{MIN_INVISIBLE_MS}, {MAX_INVISIBLE_MS}] "
                    f"ms, got {invisible_ms}",
                )
        batch = req.batch_size or MAX_BATCH
        if not 0 < batch <= MAX_BATCH:
            raise ActivityError(pb.BAD_REQUEST, f"batch size must be in [1, {MAX_BATCH}]")
        poll_ms = (
            duration_ms(req.long_polling_timeout) if req.HasField("long_polling_timeout") else 0
        )
        if ctx.timeout is not None:
            poll_ms = max(0, min(poll_ms, int(ctx.timeout * 1000) - DEADLINE_MARGIN_MS))
        expression = req.filter_expression
        cfg = b.subscription_group_manager.find_subscription_group_config(group)
        orderly = cfg is not None and cfg.consumeMessageOrderly
        result = await pop.pop(
            PopRequest(
                group=group,
                topic=topic,
                # the proxy's ReceiveMessageQueueSelector picks the broker only: any queue
                queue_id=-1,
                max_msgs=batch,
                invisible_time_ms=invisible_ms,
                poll_time_ms=poll_ms,
                expression_type="SQL92" if expression.type == pb.SQL else "TAG",
                expression=expression.expression or "*",
                order=orderly,
                client_id=channel.client_id,
            )
        )
        if result.status is not PopStatus.FOUND or not result.messages:
            code, why = _POP_CODES.get(result.status, (pb.MESSAGE_NOT_FOUND, "no new message"))
            raise ActivityError(code, result.remark or why)
        await send(spb.ReceiveMessageResponse(status=OK))
        # when the messages leave: the client's push consumer measures delivery latency from it
        # and fails the batch without it (rocketmq-python-client 5.1.2, ClientMetrics)
        await send(spb.ReceiveMessageResponse(delivery_timestamp=timestamp_of_ms(now_ms())))
        namespace = req.message_queue.topic.resource_namespace
        renewal = self.renewal if req.auto_renew else None
        for popped in result.messages:
            if renewal is not None:
                renewal.add(
                    channel.client_id,
                    group,
                    topic,
                    popped.msg.properties.get(MessageConst.UNIQ_KEY) or popped.msg.msg_id,
                    popped.receipt_handle,
                    popped.invisible_time_ms,
                )
            message = message_of(
                popped.msg,
                namespace=namespace,
                receipt_handle=popped.receipt_handle,
                delivery_attempt=popped.delivery_attempt,
                invisible_time_ms=popped.invisible_time_ms,
            )
            await send(spb.ReceiveMessageResponse(message=message))
        await trio.lowlevel.checkpoint()

    async def ack_message(
        self, req: spb.AckMessageRequest, ctx: CallContext
    ) -> spb.AckMessageResponse:
        try:
            pop = self._pop()
            channel = self.clients.channel(ctx)
        except ActivityError as exc:
            return spb.AckMessageResponse(status=exc.status)
        group, topic = wrap_namespace(req.group), wrap_namespace(req.topic)
        entries = []
        for entry in req.entries:
            handle = self._current_handle(
                channel.client_id, group, entry.message_id, entry.receipt_handle
            )
            result = await pop.ack(group, topic, handle)
            code = _ACK_CODES.get(result.status, pb.INTERNAL_SERVER_ERROR)
            entries.append(
                spb.AckMessageResultEntry(
                    message_id=entry.message_id,
                    receipt_handle=entry.receipt_handle,
                    status=status(code, result.remark or None),
                )
            )
        codes = {e.status.code for e in entries}
        overall = (
            status(pb.MULTIPLE_RESULTS)
            if len(codes) > 1
            else status(codes.pop() if codes else pb.OK)
        )
        return spb.AckMessageResponse(status=overall, entries=entries)

    def _current_handle(self, client_id: str, group: str, message_id: str, handle: str) -> str:
        if self.renewal is None:
            return handle
        return self.renewal.take(client_id, group, message_id, handle)

    async def change_invisible_duration(
        self, req: spb.ChangeInvisibleDurationRequest, ctx: CallContext
    ) -> spb.ChangeInvisibleDurationResponse:
        try:
            pop = self._pop()
            channel = self.clients.channel(ctx)
        except ActivityError as exc:
            return spb.ChangeInvisibleDurationResponse(status=exc.status)
        invisible_ms = duration_ms(req.invisible_duration)
        if not 0 <= invisible_ms <= MAX_INVISIBLE_MS:
            return spb.ChangeInvisibleDurationResponse(
                status=status(pb.ILLEGAL_INVISIBLE_TIME, f"illegal invisible time {invisible_ms}")
            )
        group = wrap_namespace(req.group)
        handle = self._current_handle(channel.client_id, group, req.message_id, req.receipt_handle)
        result = await pop.change_invisible_time(
            group, wrap_namespace(req.topic), handle, invisible_ms
        )
        code = _ACK_CODES.get(result.status, pb.INTERNAL_SERVER_ERROR)
        if code != pb.OK:
            return spb.ChangeInvisibleDurationResponse(status=status(code, result.remark or None))
        return spb.ChangeInvisibleDurationResponse(status=OK, receipt_handle=result.receipt_handle)

    async def forward_message_to_dead_letter_queue(
        self, req: spb.ForwardMessageToDeadLetterQueueRequest, ctx: CallContext
    ) -> spb.ForwardMessageToDeadLetterQueueResponse:
        try:
            pop = self._pop()
            channel = self.clients.channel(ctx)
        except ActivityError as exc:
            return spb.ForwardMessageToDeadLetterQueueResponse(status=exc.status)
        group = wrap_namespace(req.group)
        handle = self._current_handle(channel.client_id, group, req.message_id, req.receipt_handle)
        result = await pop.forward_to_dead_letter_queue(group, wrap_namespace(req.topic), handle)
        code = _ACK_CODES.get(result.status, pb.INTERNAL_SERVER_ERROR)
        return spb.ForwardMessageToDeadLetterQueueResponse(
            status=status(code, result.remark or None)
        )
