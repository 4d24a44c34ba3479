"""GetOffset, QueryOffset, UpdateOffset and PullMessage (RocketMQ 5's offset activities for
its PullConsumer), as the 4.x requests QUERY_CONSUMER_OFFSET, GET_MIN/MAX_OFFSET,
SEARCH_OFFSET_BY_TIMESTAMP and UPDATE_CONSUMER_OFFSET against this broker.

The official Python client never calls these (docs/grpc-clients.md); PullMessage answers
NOT_IMPLEMENTED: a 5.x client consumes by ReceiveMessage (pop) here.
"""

from __future__ import annotations

from broker.grpc.client_manager import GrpcClientManager
from broker.grpc.converter import timestamp_ms, wrap_namespace
from broker.grpc.local_broker import LocalBroker
from broker.grpc.status import OK, ActivityError, remoting_status, status
from common.grpc.service import CallContext, Send
from common.grpc.v2 import definition_pb2 as pb
from common.grpc.v2 import service_pb2 as spb
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand


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
        await send(
            spb.PullMessageResponse(
                status=status(pb.NOT_IMPLEMENTED, "PullMessage is not served; use ReceiveMessage")
            )
        )
