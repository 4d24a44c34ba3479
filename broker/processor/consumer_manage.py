"""Offset requests: consumer offsets and queue offsets (RocketMQ ``ConsumerManageProcessor`` and
the offset half of ``AdminBrokerProcessor``).

Theory of operation
-------------------
QUERY_CONSUMER_OFFSET answers the group's committed offset.  When the group never committed
for the queue, RocketMQ answers 0 if the queue still starts at offset 0 (a new group may read it
all) and QUERY_NOT_FOUND (22) otherwise, which makes the client fall back to its
consumeFromWhere policy (typically GET_MAX_OFFSET).  UPDATE_CONSUMER_OFFSET stores a commit and
may arrive oneway.  GET_MAX/MIN_OFFSET, SEARCH_OFFSET_BY_TIMESTAMP and
GET_EARLIEST_MSG_STORETIME are direct store reads.
"""

from __future__ import annotations

from broker.controller import BrokerController
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from common.remoting.server import Channel, RequestDispatcher


class ConsumerManageProcessor:
    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker

    def register(self, dispatcher: RequestDispatcher) -> None:
        dispatcher.register(RequestCode.QUERY_CONSUMER_OFFSET, self.query_consumer_offset)
        dispatcher.register(RequestCode.UPDATE_CONSUMER_OFFSET, self.update_consumer_offset)
        dispatcher.register(RequestCode.GET_MAX_OFFSET, self.get_max_offset)
        dispatcher.register(RequestCode.GET_MIN_OFFSET, self.get_min_offset)
        dispatcher.register(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, self.search_offset_by_timestamp)
        dispatcher.register(RequestCode.GET_EARLIEST_MSG_STORETIME, self.get_earliest_msg_storetime)

    async def query_consumer_offset(
        self, req: RemotingCommand, channel: Channel
    ) -> RemotingCommand:
        b = self.broker
        group = req.get_str("consumerGroup")
        topic = req.get_str("topic")
        queue_id = req.get_int("queueId")
        offset = b.consumer_offset_manager.query_offset(group, topic, queue_id)
        if offset >= 0:
            return req.response(ResponseCode.SUCCESS, None, {"offset": offset})
        if b.store.get_min_offset_in_queue(topic, queue_id) <= 0:
            return req.response(ResponseCode.SUCCESS, None, {"offset": 0})
        return req.response(
            ResponseCode.QUERY_NOT_FOUND,
            "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first",
        )

    async def update_consumer_offset(
        self, req: RemotingCommand, channel: Channel
    ) -> RemotingCommand:
        b = self.broker
        group, topic = req.get_str("consumerGroup"), req.get_str("topic")
        queue_id, offset = req.get_int("queueId"), req.get_int("commitOffset")
        b.consumer_offset_manager.commit_offset(group, topic, queue_id, offset)
        if b.slave_sync is not None:
            # a commit to a slave (its master is down or unknown to the client): hand it over
            b.slave_sync.note_commit(group, topic, queue_id, offset)
        return req.response(ResponseCode.SUCCESS)

    async def get_max_offset(self, req: RemotingCommand, channel: Channel) -> RemotingCommand:
        off = self.broker.store.get_max_offset_in_queue(
            req.get_str("topic"), req.get_int("queueId")
        )
        return req.response(ResponseCode.SUCCESS, None, {"offset": off})

    async def get_min_offset(self, req: RemotingCommand, channel: Channel) -> RemotingCommand:
        off = self.broker.store.get_min_offset_in_queue(
            req.get_str("topic"), req.get_int("queueId")
        )
        return req.response(ResponseCode.SUCCESS, None, {"offset": off})

    async def search_offset_by_timestamp(
        self, req: RemotingCommand, channel: Channel
    ) -> RemotingCommand:
        off = self.broker.store.get_offset_in_queue_by_time(
            req.get_str("topic"), req.get_int("queueId"), req.get_int("timestamp")
        )
        return req.response(ResponseCode.SUCCESS, None, {"offset": off})

    async def get_earliest_msg_storetime(
        self, req: RemotingCommand, channel: Channel
    ) -> RemotingCommand:
        ts = self.broker.store.get_earliest_message_time(
            req.get_str("topic"), req.get_int("queueId")
        )
        return req.response(ResponseCode.SUCCESS, None, {"timestamp": ts})
