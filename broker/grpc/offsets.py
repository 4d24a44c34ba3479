"""GetOffset, QueryOffset, UpdateOffset and PullMessage: consumption by offset over gRPC, as
the 4.x requests QUERY_CONSUMER_OFFSET, GET_MIN/MAX_OFFSET, SEARCH_OFFSET_BY_TIMESTAMP,
UPDATE_CONSUMER_OFFSET and PULL_MESSAGE against this broker (its own processors, through
local_broker.py, so every check and the long polling are the 4.x ones).

RocketMQ 5's proxy declares these calls (rocketmq-apis ``service.proto``) but its gRPC
application implements none of them (grpc-java answers UNIMPLEMENTED), and no official 5.x
client calls them (docs/grpc-clients.md); we serve them for a client that consumes by offset
(a 5.x "pull consumer" keeping its own offsets, or tools).

PullMessage is server-streaming, as the proto shapes its response (``oneof {status, message,
next_offset}``): one ``status``, then one ``message`` per message found, then ``next_offset``,
the offset to pull from next. The outcomes:

* messages found: OK, the messages (each with its queue offset), next_offset after the last;
* nothing (yet) at the offset, after the long poll (``long_polling_timeout``, cut to leave
  3 s of the call's deadline, as ReceiveMessage does): MESSAGE_NOT_FOUND and next_offset, the
  same offset at the queue's end, or past records the filter skipped;
* an offset outside the queue (past its end or below its first message): ILLEGAL_OFFSET and
  next_offset, where the store suggests to go on (RocketMQ's ``DefaultMessageStore.getMessage``
  rule: past the end, the queue's start while it still begins at 0, else its end; below the
  start, the start);
* an unknown topic TOPIC_NOT_FOUND, a queue id outside the topic BAD_REQUEST, a filter that
  does not compile ILLEGAL_FILTER_EXPRESSION; these answer the status alone.

The filter is the request's ``filter_expression`` (TAG, or SQL92 where the broker enables
property filters), sent in the pull as a 4.x consumer's explicit subscription; a pull never
commits an offset (UpdateOffset does).
"""

from __future__ import annotations

from broker.grpc.client_manager import GrpcClientManager
from broker.grpc.converter import duration_ms, message_of, timestamp_ms, wrap_namespace
from broker.grpc.local_broker import LocalBroker
from broker.grpc.status import OK, ActivityError, remoting_status, status
from broker.processor.pull import PullSysFlag
from common.errors import RequestError
from common.grpc.service import CallContext, Send
from common.grpc.v2 import definition_pb2 as pb
from common.grpc.v2 import service_pb2 as spb
from common.message import decode_record
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand

# a pull's largest batch (RocketMQ's pull consumers ask 32 by default; the 4.x path caps a
# pull's bytes and count in the store itself)
MAX_PULL_BATCH = 1024
DEFAULT_PULL_BATCH = 32
# what a long poll leaves of the call's deadline (consumer.py: the same for ReceiveMessage)
DEADLINE_MARGIN_MS = 3_000

# the 4.x pull's answers that carry nextBeginOffset, as the v2 codes
_PULL_CODES: dict[int, tuple[pb.Code, str]] = {
    ResponseCode.PULL_NOT_FOUND: (pb.MESSAGE_NOT_FOUND, "no new message"),
    ResponseCode.PULL_RETRY_IMMEDIATELY: (pb.MESSAGE_NOT_FOUND, "no matched message"),
    ResponseCode.PULL_OFFSET_MOVED: (pb.ILLEGAL_OFFSET, "the offset is outside the queue"),
}


class OffsetActivity:
    def __init__(self, local: LocalBroker, clients: GrpcClientManager) -> None:
        self.local = local
        self.clients = clients

    async def _call(
        self, ctx: CallContext, code: int, fields: dict[str, object]
    ) -> RemotingCommand:
        channel = self.clients.channel(ctx)
        return await self.local.call(RemotingCommand.request(code, fields), channel)

    async def get_offset(
        self, req: spb.GetOffsetRequest, ctx: CallContext
    ) -> spb.GetOffsetResponse:
        try:
            answer = await self._call(
                ctx,
                RequestCode.QUERY_CONSUMER_OFFSET,
                {
                    "consumerGroup": wrap_namespace(req.group),
                    "topic": wrap_namespace(req.message_queue.topic),
                    "queueId": req.message_queue.id,
                },
            )
        except ActivityError as exc:
            return spb.GetOffsetResponse(status=exc.status)
        if answer.code == ResponseCode.QUERY_NOT_FOUND:
            return spb.GetOffsetResponse(status=status(pb.OFFSET_NOT_FOUND, answer.remark))
        if answer.code != ResponseCode.SUCCESS:
            return spb.GetOffsetResponse(status=remoting_status(answer.code, answer.remark))
        return spb.GetOffsetResponse(status=OK, offset=int(answer.ext_fields.get("offset", "0")))

    async def query_offset(
        self, req: spb.QueryOffsetRequest, ctx: CallContext
    ) -> spb.QueryOffsetResponse:
        topic = wrap_namespace(req.message_queue.topic)
        fields: dict[str, object] = {"topic": topic, "queueId": req.message_queue.id}
        if req.query_offset_policy == pb.BEGINNING:
            code = RequestCode.GET_MIN_OFFSET
        elif req.query_offset_policy == pb.END:
            code = RequestCode.GET_MAX_OFFSET
        else:
            code = RequestCode.SEARCH_OFFSET_BY_TIMESTAMP
            fields["timestamp"] = timestamp_ms(req.timestamp)
        try:
            answer = await self._call(ctx, code, fields)
        except ActivityError as exc:
            return spb.QueryOffsetResponse(status=exc.status)
        if answer.code != ResponseCode.SUCCESS:
            return spb.QueryOffsetResponse(status=remoting_status(answer.code, answer.remark))
        return spb.QueryOffsetResponse(status=OK, offset=int(answer.ext_fields.get("offset", "0")))

    async def update_offset(
        self, req: spb.UpdateOffsetRequest, ctx: CallContext
    ) -> spb.UpdateOffsetResponse:
        if req.offset < 0:
            return spb.UpdateOffsetResponse(status=status(pb.ILLEGAL_OFFSET, "offset is negative"))
        try:
            answer = await self._call(
                ctx,
                RequestCode.UPDATE_CONSUMER_OFFSET,
                {
                    "consumerGroup": wrap_namespace(req.group),
                    "topic": wrap_namespace(req.message_queue.topic),
                    "queueId": req.message_queue.id,
                    "commitOffset": req.offset,
                },
            )
        except ActivityError as exc:
            return spb.UpdateOffsetResponse(status=exc.status)
        return spb.UpdateOffsetResponse(status=remoting_status(answer.code, answer.remark))

    async def pull_message(
        self,
        req: spb.PullMessageRequest,
        ctx: CallContext,
        send: Send[spb.PullMessageResponse],
    ) -> None:
        try:
            answer, namespace = await self._pull(req, ctx)
        except ActivityError as exc:
            await send(spb.PullMessageResponse(status=exc.status))
            return
        ext = answer.ext_fields
        next_offset = int(ext.get("nextBeginOffset", req.offset))
        if answer.code != ResponseCode.SUCCESS:
            code, why = _PULL_CODES[answer.code]
            await send(spb.PullMessageResponse(status=status(code, answer.remark or why)))
            await send(spb.PullMessageResponse(next_offset=next_offset))
            return
        # decode now: the record buffers may be views of mapped files the store can let go
        buffers = answer.body if isinstance(answer.body, list | tuple) else [answer.body]
        messages = [
            message_of(decode_record(buf), namespace=namespace) for buf in buffers if len(buf)
        ]
        await send(spb.PullMessageResponse(status=OK))
        for message in messages:
            await send(spb.PullMessageResponse(message=message))
        await send(spb.PullMessageResponse(next_offset=next_offset))

    async def _pull(
        self, req: spb.PullMessageRequest, ctx: CallContext
    ) -> tuple[RemotingCommand, str]:
        """The broker's 4.x pull for this request: its answer (one of SUCCESS and the codes of
        _PULL_CODES) and the namespace of the topic; ActivityError for any other outcome."""
        group = wrap_namespace(req.group)
        topic = wrap_namespace(req.message_queue.topic)
        queue_id = req.message_queue.id
        if not group:
            raise ActivityError(pb.ILLEGAL_CONSUMER_GROUP, "consumer group is empty")
        if not topic:
            raise ActivityError(pb.ILLEGAL_TOPIC, "topic is empty")
        if req.offset < 0:
            raise ActivityError(pb.ILLEGAL_OFFSET, f"offset {req.offset} is negative")
        batch = req.batch_size or DEFAULT_PULL_BATCH
        if not 0 < batch <= MAX_PULL_BATCH:
            raise ActivityError(pb.BAD_REQUEST, f"batch size must be in [1, {MAX_PULL_BATCH}]")
        config = self.local.controller.topic_config_manager.select_topic_config(topic)
        if config is None:
            raise ActivityError(pb.TOPIC_NOT_FOUND, f"topic {topic} does not exist")
        if not 0 <= queue_id < config.readQueueNums:
            raise ActivityError(
                pb.BAD_REQUEST,
                f"queue {queue_id} is not a queue of {topic} (0 to {config.readQueueNums - 1})",
            )
        poll_ms = (
            duration_ms(req.long_polling_timeout) if req.HasField("long_polling_timeout") else 0
        )
        if ctx.timeout is not None:
            poll_ms = max(0, min(poll_ms, int(ctx.timeout * 1000) - DEADLINE_MARGIN_MS))
        expression = req.filter_expression
        sys_flag = PullSysFlag.SUBSCRIPTION | (PullSysFlag.SUSPEND if poll_ms > 0 else 0)
        fields: dict[str, object] = {
            "consumerGroup": group,
            "topic": topic,
            "queueId": queue_id,
            "queueOffset": req.offset,
            "maxMsgNums": batch,
            "sysFlag": sys_flag,
            "commitOffset": 0,
            "suspendTimeoutMillis": poll_ms,
            "subscription": expression.expression or "*",
            "subVersion": 0,
            "expressionType": "SQL92" if expression.type == pb.SQL else "TAG",
        }
        try:
            answer = await self._call(ctx, RequestCode.PULL_MESSAGE, fields)
        except RequestError as exc:
            answer = RemotingCommand.request(RequestCode.PULL_MESSAGE, {}).response(
                exc.code, exc.remark
            )
        if answer.code == ResponseCode.SUCCESS or answer.code in _PULL_CODES:
            return answer, req.message_queue.topic.resource_namespace
        if answer.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED:
            raise ActivityError(pb.ILLEGAL_FILTER_EXPRESSION, answer.remark or "bad filter")
        code = remoting_status(answer.code, answer.remark)
        raise ActivityError(code.code, code.message)
