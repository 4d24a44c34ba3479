"""What the broker asks its clients on an admin's behalf (RocketMQ ``broker/client/net/Broker2Client``
and the AdminBrokerProcessor entries that use it).

Theory of operation
-------------------
Four admin requests are answered by talking to the members of a consumer group over the
connections they opened to this broker (their heartbeats put them in the ConsumerManager):

* INVOKE_BROKER_TO_RESET_OFFSET (222; header topic, group, timestamp, isForce): per write
  queue of the topic, the offset of `timestamp` (the store's offset-by-time lookup; -1 means the
  queue's max offset, i.e. mqadmin skipAccumulatedMessage; a negative lookup reads as 0).
  Without isForce a queue only moves back (RocketMQ: the new offset is taken when it is smaller
  than the group's, else the group's stays). The table is pushed oneway as
  RESET_CONSUMER_CLIENT_OFFSET (220) to every member connection, whose client drops what it has
  in flight and pulls on from there, and the answer is the same table (ResetOffsetBody).
* INVOKE_BROKER_TO_GET_CONSUMER_STATUS (223): GET_CONSUMER_STATUS_FROM_CLIENT (221) to every
  member (or the one named by clientAddr), merged into GetConsumerStatusBody.consumerTable.
* GET_CONSUMER_RUNNING_INFO (307) and CONSUME_MESSAGE_DIRECTLY (309): relayed to the one member
  named by clientId (``callConsumer``), its answer passed back as it is; for 309 the broker first
  puts the stored record of the offset msgId into the body.

Deviations from RocketMQ 4.9, each a superset of what it accepts:

* The broker writes the new offsets into its own table as well (and hands them to the master
  when it is a slave, as UPDATE_CONSUMER_OFFSET does), so an offline group's next start begins
  there and the answer is SUCCESS with the table; RocketMQ answers CONSUMER_NOT_ONLINE (206)
  and leaves that to mqadmin's fallback (one UPDATE_CONSUMER_OFFSET per queue, which still
  works against us and writes the same offsets).
* Which body a member gets depends on that member's language (CPP: ResetOffsetBodyForC, which
  is all the C++ client can parse), not on the language of the admin that asked.
* RocketMQ refuses the whole reset when the group has no offset for any one queue ("THe
  consumer group <G> not exist"); we refuse only when it has none on any queue of the topic on
  this broker, and take the timestamp's offset for the queues it never committed.
* A timestamp below -1 is refused (RocketMQ would search for it and land on the first message).

Pushes are oneway and bounded (5 s per connection); the relays wait at most
`CALL_CLIENT_TIMEOUT` (RocketMQ's 10 s) for a client, 5 s per member for 221, members asked
concurrently. A member that does not answer costs its slot and nothing else.
"""

from __future__ import annotations

import logging

import trio

from broker.consumer_manager import ClientChannelInfo
from broker.controller import BrokerController
from common.errors import RemotingTimeoutError, RmqError
from common.message_id import decode_offset_msg_id
from common.model import MessageQueue
from common.remoting.channel import Channel
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from common.remoting.server import RequestDispatcher
from common.reset_offset_body import (
    OffsetTable,
    decode_offset_table,
    encode_consumer_table,
    encode_reset_offset_body,
    encode_reset_offset_body_for_c,
)

log = logging.getLogger(__name__)

CALL_CLIENT_TIMEOUT = 10.0  # Broker2Client.callClient
CONSUMER_STATUS_TIMEOUT = 5.0  # Broker2Client.getConsumeStatus
PUSH_TIMEOUT = 5.0  # invokeOneway of RESET_CONSUMER_CLIENT_OFFSET


class Broker2Client:
    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker

    def register(self, dispatcher: RequestDispatcher) -> None:
        r = dispatcher.register
        r(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, self.reset_offset)
        r(RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS, self.get_consumer_status)
        r(RequestCode.GET_CONSUMER_RUNNING_INFO, self.get_consumer_running_info)
        r(RequestCode.CONSUME_MESSAGE_DIRECTLY, self.consume_message_directly)

    # --- reset ---------------------------------------------------------------------------------

    def compute_reset_table(
        self, topic: str, group: str, timestamp: int, force: bool
    ) -> OffsetTable | str:
        """The new offset of each write queue, or why not (a remark for SYSTEM_ERROR)."""
        b = self.broker
        if timestamp < -1:
            return f"[reset-offset] invalid timestamp {timestamp} (-1 for the latest offset)"
        tc = b.topic_config_manager.select_topic_config(topic)
        if tc is None:
            return f"[reset-offset] reset offset failed, no topic in this broker. topic={topic}"
        table: OffsetTable = {}
        known = False
        for q in range(tc.writeQueueNums):
            current = b.consumer_offset_manager.query_offset(group, topic, q)
            known |= current >= 0
            if timestamp == -1:
                target = b.store.get_max_offset_in_queue(topic, q)
            else:
                target = b.store.get_offset_in_queue_by_time(topic, q, timestamp)
            target = max(target, 0)
            mq = MessageQueue(topic, b.config.broker_name, q)
            table[mq] = target if force or current < 0 or target < current else current
        if not known:
            return f"THe consumer group <{group}> not exist"
        return table

    async def reset_offset(self, req: RemotingCommand, channel: Channel) -> RemotingCommand:
        b = self.broker
        topic, group = req.get_str("topic"), req.get_str("group")
        timestamp = req.get_int("timestamp")
        force = req.get_bool("isForce", False)
        found = self.compute_reset_table(topic, group, timestamp, force)
        if isinstance(found, str):
            return req.response(ResponseCode.SYSTEM_ERROR, found)
        log.info(
            "[reset-offset] by %s: topic=%s group=%s timestamp=%d force=%s",
            channel.remote_addr,
            topic,
            group,
            timestamp,
            force,
        )
        for mq, offset in found.items():
            b.consumer_offset_manager.commit_offset(group, topic, mq.queueId, offset)
            if b.slave_sync is not None:
                b.slave_sync.note_commit(group, topic, mq.queueId, offset)
        await self._push_reset(topic, group, timestamp, found)
        return req.response(ResponseCode.SUCCESS, body=encode_reset_offset_body(found))

    async def _push_reset(self, topic: str, group: str, timestamp: int, table: OffsetTable) -> None:
        info = self.broker.consumer_manager.get_consumer_group_info(group)
        if info is None:
            return
        header = {"topic": topic, "group": group, "timestamp": timestamp, "isForce": False}
        bodies = {
            False: encode_reset_offset_body(table),
            True: encode_reset_offset_body_for_c(table),
        }

        async def push(ch: Channel, member: ClientChannelInfo) -> None:
            cmd = RemotingCommand.request(
                RequestCode.RESET_CONSUMER_CLIENT_OFFSET,
                header,
                bodies[member.language == "CPP"],
                oneway=True,
            )
            try:
                with trio.move_on_after(PUSH_TIMEOUT):
                    await ch.send_oneway(cmd)
            except RmqError as exc:
                log.info("[reset-offset] push to %s of %s failed: %s", member.client_id, group, exc)

        async with trio.open_nursery() as nursery:
            for ch, member in list(info.channels.items()):
                if not ch.closed:
                    nursery.start_soon(push, ch, member)

    # --- consumer status -----------------------------------------------------------------------

    async def get_consumer_status(self, req: RemotingCommand, channel: Channel) -> RemotingCommand:
        topic, group = req.get_str("topic"), req.get_str("group")
        only = req.ext_fields.get("clientAddr") or ""
        info = self.broker.consumer_manager.get_consumer_group_info(group)
        if info is None or not info.channels:
            return req.response(
                ResponseCode.SYSTEM_ERROR,
                f"No Any Consumer online in the consumer group: [{group}]",
            )
        members = [
            (ch, m)
            for ch, m in info.channels.items()
            if not ch.closed and (not only or m.client_id == only)
        ]
        tables: dict[str, OffsetTable] = {}

        async def ask(ch: Channel, member: ClientChannelInfo) -> None:
            cmd = RemotingCommand.request(
                RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT, {"topic": topic, "group": group}
            )
            try:
                resp = await ch.invoke(cmd, CONSUMER_STATUS_TIMEOUT)
                if resp.code == ResponseCode.SUCCESS and resp.body_bytes():
                    tables[member.client_id] = decode_offset_table(
                        resp.body_bytes(), "messageQueueTable"
                    )
            except RmqError as exc:
                log.info("[get-consumer-status] %s of %s: %s", member.client_id, group, exc)

        async with trio.open_nursery() as nursery:
            for ch, member in members:
                nursery.start_soon(ask, ch, member)
        return req.response(ResponseCode.SUCCESS, body=encode_consumer_table(tables))

    # --- relays to one client (callConsumer) ---------------------------------------------------

    async def get_consumer_running_info(
        self, req: RemotingCommand, channel: Channel
    ) -> RemotingCommand:
        group, client_id = req.get_str("consumerGroup"), req.get_str("clientId")
        relayed = RemotingCommand.request(
            RequestCode.GET_CONSUMER_RUNNING_INFO, dict(req.ext_fields), req.body_bytes()
        )
        return await self._call_consumer(req, group, client_id, relayed)

    async def consume_message_directly(
        self, req: RemotingCommand, channel: Channel
    ) -> RemotingCommand:
        group = req.get_str("consumerGroup")
        client_id = req.ext_fields.get("clientId", "")
        msg_id = req.ext_fields.get("msgId", "")
        try:
            _, phys = decode_offset_msg_id(msg_id)
        except ValueError as exc:
            return req.response(ResponseCode.SYSTEM_ERROR, str(exc))
        record = self.broker.store.select_one_message_by_offset(phys)
        if record is None:
            return req.response(
                ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {phys}"
            )
        relayed = RemotingCommand.request(
            RequestCode.CONSUME_MESSAGE_DIRECTLY,
            {**req.ext_fields, "brokerName": self.broker.config.broker_name},
            bytes(record),
        )
        return await self._call_consumer(req, group, client_id, relayed)

    async def _call_consumer(
        self, req: RemotingCommand, group: str, client_id: str, relayed: RemotingCommand
    ) -> RemotingCommand:
        """`relayed` to the member `client_id` of `group`; its answer as the answer to `req`."""
        member = self.broker.consumer_manager.find_channel(group, client_id)
        if member is None or member.channel.closed:
            return req.response(
                ResponseCode.SYSTEM_ERROR, f"The Consumer <{group}> <{client_id}> not online"
            )
        try:
            resp = await member.channel.invoke(relayed, CALL_CLIENT_TIMEOUT)
        except RemotingTimeoutError as exc:
            return req.response(
                ResponseCode.CONSUME_MSG_TIMEOUT, f"consumer <{group}> <{client_id}> Timeout: {exc}"
            )
        except RmqError as exc:
            return req.response(
                ResponseCode.SYSTEM_ERROR,
                f"invoke consumer <{group}> <{client_id}> Exception: {exc}",
            )
        return req.response(resp.code, resp.remark, dict(resp.ext_fields), resp.body_bytes())


__all__ = ["Broker2Client"]
