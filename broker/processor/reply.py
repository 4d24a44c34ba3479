"""SEND_REPLY_MESSAGE (324) / SEND_REPLY_MESSAGE_V2 (325): the reply of a request-reply call
(RocketMQ ``broker/processor/ReplyMessageProcessor.java``, 4.6+).

Theory of operation
-------------------
A requester sends an ordinary message carrying CORRELATION_ID, REPLY_TO_CLIENT (its client
id) and TTL; the consumer that handles it answers with a reply message to
``<cluster>_REPLY_TOPIC`` carrying the same three properties and MSG_TYPE=reply, sent with
one of these codes (the header is SEND_MESSAGE's, in its long or V2 one-letter spelling).

The broker does not leave the reply for a consumer to pull: it pushes it at once with
PUSH_REPLY_MESSAGE_TO_CLIENT (326) to the connection of the client named by REPLY_TO_CLIENT,
found among the producers that sent heartbeats (``ProducerManager.find_channel``).  The push's
header is ReplyMessageRequestHeader: the send header's fields plus bornHost (the replier),
storeHost and storeTimestamp, and properties with PUSH_REPLY_TIME added.  The push waits for
the requester's answer (10 s, Java's ``Broker2Client.callClient``).

The answer: SYSTEM_ERROR with RocketMQ's remark when REPLY_TO_CLIENT is missing, the client
has no connection here, or the push failed; otherwise SUCCESS with msgId "0", queue offset 0.
Then, with ``storeReplyMessageEnable`` (default true), the reply is also stored in its topic
(properties as the replier sent them, no CLUSTER added) and a stored answer carries the real
msgId and queue offset, as Java does; the code stays the push's.  The store's own wait
(SYNC_FLUSH, a DLedger commit) is awaited, a SYNC_MASTER's slave ack is not: the reply has
already reached the requester, the stored copy is a record of it.  Checks are the send path's
(``msg_check``: permissions, topic, queue id) with its codes and remarks.
"""

from __future__ import annotations

import logging
import random
import time

from broker.processor.send import SendMessageProcessor
from broker.processor.send_header import header_bool, header_int, send_header
from broker.store.results import PutMessageResult, PutMessageStatus
from common.errors import RequestError, RmqError
from common.message import MessageExtBrokerInner
from common.message_properties import MessageConst, decode_properties, encode_properties
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from common.remoting.server import Channel, RequestDispatcher

log = logging.getLogger(__name__)

PUSH_REPLY_TIMEOUT = 10.0  # Broker2Client.callClient
_STORED = (
    PutMessageStatus.PUT_OK,
    PutMessageStatus.FLUSH_DISK_TIMEOUT,
    PutMessageStatus.FLUSH_SLAVE_TIMEOUT,
    PutMessageStatus.SLAVE_NOT_AVAILABLE,
)


def _host(addr: tuple[str, int]) -> str:
    return f"{addr[0]}:{addr[1]}"


class ReplyMessageProcessor(SendMessageProcessor):
    def register(self, dispatcher: RequestDispatcher) -> None:
        for code in (RequestCode.SEND_REPLY_MESSAGE, RequestCode.SEND_REPLY_MESSAGE_V2):
            dispatcher.register(code, self.process_reply)

    async def process_reply(self, req: RemotingCommand, channel: Channel) -> RemotingCommand:
        b = self.broker
        h = send_header(req)
        topic = h.get("topic")
        if not topic:
            raise RequestError(ResponseCode.SYSTEM_ERROR, "the custom field <topic> is null")
        # SendMessageRequestHeader's @CFNotNull fields, refused as its decoding refuses them
        for field in ("producerGroup", "defaultTopic"):
            if h.get(field) is None:
                raise RequestError(ResponseCode.SYSTEM_ERROR, f"the custom field <{field}> is null")
        header_int(h, "defaultTopicQueueNums")
        queue_id = header_int(h, "queueId")
        born_timestamp = header_int(h, "bornTimestamp", long=True)
        flag = header_int(h, "flag")
        sys_flag = header_int(h, "sysFlag")
        reconsume_times = header_int(h, "reconsumeTimes", 0)
        tc = self.msg_check(req, topic, queue_id)
        if queue_id < 0:
            queue_id = random.randrange(99999999) % max(tc.writeQueueNums, 1)
        body = req.body_bytes()
        raw_props = h.get("properties") or ""
        props = decode_properties(raw_props)
        msg = MessageExtBrokerInner(
            topic=topic,
            queue_id=queue_id,
            flag=flag,
            body=body,
            properties=props,
            sys_flag=sys_flag,
            born_timestamp=born_timestamp,
            born_host=self._born_host(channel),
            store_host=b.store_host,
            reconsume_times=reconsume_times,
            properties_string=raw_props,
        )
        push_ok, remark = await self._push_reply(h, msg)
        resp = req.response(ResponseCode.SUCCESS if push_ok else ResponseCode.SYSTEM_ERROR)
        resp.remark = None if push_ok else remark
        ext = {
            "MSG_REGION": str(b.config.region_id),
            "TRACE_ON": "true" if b.config.trace_on else "false",
        }
        if push_ok:
            ext.update(msgId="0", queueId=str(queue_id), queueOffset="0")
        if b.config.store_reply_message_enable:
            if len(body) > b.config.store.max_message_size:
                log.warning("reply to %s not stored: body of %d bytes", topic, len(body))
            else:
                appended = b.store.append_message(msg)
                result = (
                    appended if isinstance(appended, PutMessageResult) else await appended.wait()
                )
                if result.status in _STORED and result.append is not None:
                    ext.update(
                        msgId=str(result.append.msg_id),
                        queueId=str(queue_id),
                        queueOffset=str(result.append.logics_offset),
                    )
                    b.stats.put_count += result.append.msg_num
                else:
                    b.stats.put_failed += 1
                    log.warning("reply to %s not stored: %s", topic, result.status.name)
        resp.ext_fields = ext
        return resp

    async def _push_reply(self, h: dict[str, str], msg: MessageExtBrokerInner) -> tuple[bool, str]:
        """PUSH_REPLY_MESSAGE_TO_CLIENT to the requester; (pushed, the remark if not)."""
        sender = msg.properties.get(MessageConst.REPLY_TO_CLIENT)
        if sender is None:
            return False, f"reply message properties[{MessageConst.REPLY_TO_CLIENT}] is null"
        channel = self.broker.producer_manager.find_channel(sender)
        if channel is None:
            return False, f"push reply message fail, channel of <{sender}> not found."
        props = dict(msg.properties)
        props[MessageConst.PUSH_REPLY_TIME] = str(time.time_ns() // 1_000_000)
        fields = {
            "producerGroup": h.get("producerGroup", ""),
            "topic": msg.topic,
            "defaultTopic": h.get("defaultTopic", ""),
            "defaultTopicQueueNums": h.get("defaultTopicQueueNums", "0"),
            "queueId": h.get("queueId", "0"),
            "sysFlag": str(msg.sys_flag),
            "bornTimestamp": str(msg.born_timestamp),
            "flag": str(msg.flag),
            "properties": encode_properties(props),
            "reconsumeTimes": str(msg.reconsume_times),
            "unitMode": "true" if header_bool(h, "unitMode") else "false",
            "bornHost": _host(msg.born_host),
            "storeHost": _host(msg.store_host),
            "storeTimestamp": str(time.time_ns() // 1_000_000),
        }
        cmd = RemotingCommand.request(RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT, fields, msg.body)
        try:
            answer = await channel.invoke(cmd, PUSH_REPLY_TIMEOUT)
        except RmqError as exc:
            log.info("push reply to %s failed: %s", sender, exc)
            return False, f"push reply message to {sender}fail."
        if answer.code != ResponseCode.SUCCESS:
            return False, f"push reply message to {sender}fail."
        return True, ""


__all__ = ["ReplyMessageProcessor"]
