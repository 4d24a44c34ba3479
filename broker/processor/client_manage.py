"""HEART_BEAT, UNREGISTER_CLIENT, GET_CONSUMER_LIST_BY_GROUP, LOCK/UNLOCK_BATCH_MQ.

RocketMQ ``ClientManageProcessor`` + the rebalance half of ``ConsumerManageProcessor`` and
``AdminBrokerProcessor.lockBatchMQ``.

Theory of operation
-------------------
A heartbeat registers the connection under every producer and consumer group it names.  For a
consumer group the broker first makes sure the group's settings exist (auto-created by default)
and creates ``%RETRY%group`` with the group's retry queue count and perm READ|WRITE, so the
client can pull its retries before any message failed.  Then the consumer manager records the
member and its subscriptions; a change of membership or subscriptions makes the broker push a
oneway NOTIFY_CONSUMER_IDS_CHANGED to every member (wired in the broker service).

A heartbeat with a SQL92 subscription is accepted whatever the broker's ``enablePropertyFilter``,
as RocketMQ accepts it (its subscriptions of other groups must not be lost with it): consumers
ask CHECK_CLIENT_CONFIG at start, which refuses them (1, or 23 for a bad expression), and their
pulls are refused the same way.

GET_CONSUMER_LIST_BY_GROUP answers with the client ids of the group's live members - the C++
client allocates queues only if its own id is in that list.  Enum fields of the heartbeat arrive
as names (Java) or ints (C++); the model accepts both.
"""

from __future__ import annotations

import logging
from typing import TypeVar

from broker.consumer_manager import ClientChannelInfo
from broker.controller import BrokerController
from broker.filter.consumer_filter_manager import is_tag_type
from common import serde
from common.errors import RequestError
from common.model import (
    CheckClientRequestBody,
    GetConsumerListByGroupResponseBody,
    HeartbeatData,
    LockBatchRequestBody,
    LockBatchResponseBody,
    PermName,
    UnlockBatchRequestBody,
)
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from common.remoting.server import Channel, RequestDispatcher
from common.topics import retry_topic

log = logging.getLogger(__name__)


T = TypeVar("T")


def _parse_body(req: RemotingCommand, cls: type[T], what: str) -> T:
    body = req.body_bytes()
    if not body:
        raise RequestError(ResponseCode.SYSTEM_ERROR, f"{what}: request body is empty")
    try:
        return serde.from_json(body, cls)
    except ValueError as exc:
        raise RequestError(ResponseCode.SYSTEM_ERROR, f"{what}: bad body: {exc}") from None


class ClientManageProcessor:
    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker

    def register(self, dispatcher: RequestDispatcher) -> None:
        dispatcher.register(RequestCode.HEART_BEAT, self.heart_beat)
        dispatcher.register(RequestCode.UNREGISTER_CLIENT, self.unregister_client)
        dispatcher.register(RequestCode.CHECK_CLIENT_CONFIG, self.check_client_config)
        dispatcher.register(RequestCode.GET_CONSUMER_LIST_BY_GROUP, self.get_consumer_list)
        dispatcher.register(RequestCode.LOCK_BATCH_MQ, self.lock_batch_mq)
        dispatcher.register(RequestCode.UNLOCK_BATCH_MQ, self.unlock_batch_mq)

    async def heart_beat(self, req: RemotingCommand, channel: Channel) -> RemotingCommand:
        b = self.broker
        hb = _parse_body(req, HeartbeatData, "HEART_BEAT")
        channel.attrs["clientId"] = hb.clientID
        for cd in hb.consumerDataSet:
            sgc = b.subscription_group_manager.find_subscription_group_config(cd.groupName)
            notify = True
            if sgc is not None:
                notify = sgc.notifyConsumerIdsChangedEnable
                b.topic_config_manager.create_topic_in_send_message_back_method(
                    retry_topic(cd.groupName),
                    sgc.retryQueueNums,
                    PermName.READ | PermName.WRITE,
                )
            changed = b.consumer_manager.register_consumer(
                cd.groupName,
                ClientChannelInfo(channel, hb.clientID, req.language, req.version),
                cd.consumeType,
                cd.messageModel,
                cd.consumeFromWhere,
                cd.subscriptionDataSet,
                notify,
            )
            if changed:
                log.info("consumer group %s changed: %s", cd.groupName, hb.clientID)
        for pd in hb.producerDataSet:
            b.producer_manager.register_producer(
                pd.groupName, ClientChannelInfo(channel, hb.clientID, req.language, req.version)
            )
        return req.response(ResponseCode.SUCCESS)

    async def unregister_client(self, req: RemotingCommand, channel: Channel) -> RemotingCommand:
        b = self.broker
        req.get_str("clientID")
        pg = req.ext_fields.get("producerGroup")
        if pg:
            b.producer_manager.unregister_producer(pg, channel)
        cg = req.ext_fields.get("consumerGroup")
        if cg:
            sgc = b.subscription_group_manager.table.get(cg)
            notify = sgc.notifyConsumerIdsChangedEnable if sgc is not None else True
            b.consumer_manager.unregister_consumer(cg, channel, notify)
        return req.response(ResponseCode.SUCCESS)

    async def check_client_config(self, req: RemotingCommand, channel: Channel) -> RemotingCommand:
        """What a consumer asks at start for each non-TAG subscription (ClientManageProcessor.
        checkClientConfig): 1 when ``enablePropertyFilter`` is off, 23 with the parser's
        message (it says where) when the expression does not compile, else 0."""
        body = req.body_bytes()
        sub = (
            _parse_body(req, CheckClientRequestBody, "CHECK_CLIENT_CONFIG").subscriptionData
            if body
            else None
        )
        if sub is None or is_tag_type(sub.expressionType):
            return req.response(ResponseCode.SUCCESS)
        if not self.broker.config.enable_property_filter:
            return req.response(
                ResponseCode.SYSTEM_ERROR,
                f"The broker does not support consumer to filter message by {sub.expressionType}",
            )
        try:
            self.broker.consumer_filter_manager.get(sub.expressionType, sub.subString)
        except ValueError as exc:
            return req.response(ResponseCode.SUBSCRIPTION_PARSE_FAILED, str(exc))
        return req.response(ResponseCode.SUCCESS)

    async def get_consumer_list(self, req: RemotingCommand, channel: Channel) -> RemotingCommand:
        group = req.get_str("consumerGroup")
        info = self.broker.consumer_manager.get_consumer_group_info(group)
        ids = info.client_ids() if info is not None else []
        if not ids:
            return req.response(ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
        body = serde.to_json(GetConsumerListByGroupResponseBody(consumerIdList=ids))
        return req.response(ResponseCode.SUCCESS, body=body)

    async def lock_batch_mq(self, req: RemotingCommand, channel: Channel) -> RemotingCommand:
        body = _parse_body(req, LockBatchRequestBody, "LOCK_BATCH_MQ")
        ok = self.broker.lock_manager.try_lock_batch(body.consumerGroup, body.mqSet, body.clientId)
        out = serde.to_json(LockBatchResponseBody(lockOKMQSet=ok))
        return req.response(ResponseCode.SUCCESS, body=out)

    async def unlock_batch_mq(self, req: RemotingCommand, channel: Channel) -> RemotingCommand:
        body = _parse_body(req, UnlockBatchRequestBody, "UNLOCK_BATCH_MQ")
        self.broker.lock_manager.unlock_batch(body.consumerGroup, body.mqSet, body.clientId)
        return req.response(ResponseCode.SUCCESS)
