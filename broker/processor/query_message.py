"""Message lookup requests (RocketMQ ``QueryMessageProcessor``).

Theory of operation
-------------------
VIEW_MESSAGE_BY_ID takes the CommitLog offset decoded from an offset msgId and answers the raw
record; QUERY_MESSAGE looks keys (or, with ``_UNIQUE_KEY_QUERY``, a client unique id) up in the
index and answers the raw records found.
"""

from __future__ import annotations

from broker.controller import BrokerController
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from common.remoting.server import Channel, RequestDispatcher


class QueryMessageProcessor:
    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker

    def register(self, dispatcher: RequestDispatcher) -> None:
        dispatcher.register(RequestCode.VIEW_MESSAGE_BY_ID, self.view_message_by_id)
        dispatcher.register(RequestCode.QUERY_MESSAGE, self.query_message)

    async def view_message_by_id(self, req: RemotingCommand, channel: Channel) -> RemotingCommand:
        offset = req.get_int("offset")
        rec = self.broker.store.select_one_message_by_offset(offset)
        if rec is None:
            return req.response(
                ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {offset}"
            )
        return req.response(ResponseCode.SUCCESS, body=rec)

    async def query_message(self, req: RemotingCommand, channel: Channel) -> RemotingCommand:
        b = self.broker
        max_num = req.get_int("maxNum")
        if req.get_bool("_UNIQUE_KEY_QUERY", False):
            max_num = b.config.store.default_query_max_num
        result = b.store.query_message(
            req.get_str("topic"),
            req.get_str("key"),
            max_num,
            req.get_int("beginTimestamp"),
            req.get_int("endTimestamp"),
        )
        ext = {
            "indexLastUpdateTimestamp": result.index_last_update_timestamp,
            "indexLastUpdatePhyoffset": result.index_last_update_phyoffset,
        }
        if not result.buffers:
            return req.response(
                ResponseCode.QUERY_NOT_FOUND,
                "can not find message, maybe time range not correct",
                ext,
            )
        return req.response(ResponseCode.SUCCESS, None, ext, body=list(result.buffers))
