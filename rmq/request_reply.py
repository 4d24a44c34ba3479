"""Request-reply (RocketMQ 4.6+): the requester's wait for its reply, and the replier's reply.

Theory of operation
-------------------
``Producer.request(msg, timeout)`` puts three properties on the request, as Java's
``DefaultMQProducerImpl.prepareSendRequest``: CORRELATION_ID (a fresh UUID), REPLY_TO_CLIENT
(the producer's client id) and TTL (the timeout in ms).  It registers the correlation id in its
:class:`RequestFutureHolder`, makes sure the brokers know its connection (a heartbeat when the
topic's route was not known yet), sends the request as an ordinary message, and waits for the
reply until the deadline; the entry is removed however the wait ends, so the table holds only
calls in progress.

The consumer that handles the request answers with :func:`create_reply_message` (Java's
``MessageUtil.createReplyMessage``): a message to ``<cluster>_REPLY_TOPIC`` (the CLUSTER the
broker stamped on the request) with MSG_TYPE=reply and the request's CORRELATION_ID,
REPLY_TO_CLIENT and TTL.  A producer sends a MSG_TYPE=reply message with
SEND_REPLY_MESSAGE_V2 (325); the broker pushes it to the requester's connection with
PUSH_REPLY_MESSAGE_TO_CLIENT (326).

:meth:`RequestFutureHolder.handle_push` answers that push (Java's
``ClientRemotingProcessor.receiveReplyMessage``): it rebuilds the message from the
ReplyMessageRequestHeader (body inflated when the COMPRESSED sys flag is set, ARRIVE_TIME
added) and hands it to the waiting call with that CORRELATION_ID.  A reply nobody waits for
(it came after the timeout) is logged and dropped; the answer is SUCCESS either way, and
SYSTEM_ERROR "process reply message fail" only when the push cannot be read.
"""

from __future__ import annotations

import logging
import time
import zlib

import attrs
import trio

from common.message import MessageExt, MessageSysFlag
from common.message_properties import MessageConst, decode_properties
from common.remoting.channel import Channel
from common.remoting.codes import ResponseCode
from common.remoting.command import RemotingCommand
from common.topics import REPLY_TOPIC_POSTFIX
from rmq.errors import CreateReplyMessageError
from rmq.message import Message

log = logging.getLogger(__name__)

REPLY_MESSAGE_FLAG = "reply"  # MixAll.REPLY_MESSAGE_FLAG, the MSG_TYPE of a reply


def reply_topic(cluster: str) -> str:
    """MixAll.getReplyTopic."""
    return f"{cluster}_{REPLY_TOPIC_POSTFIX}"


def is_reply(properties: dict[str, str]) -> bool:
    return properties.get(MessageConst.MSG_TYPE) == REPLY_MESSAGE_FLAG


def create_reply_message(request: MessageExt | Message, body: bytes | str) -> Message:
    """The reply to `request` (a message a consumer received), to send with any Producer."""
    props = request.properties
    cluster = props.get(MessageConst.CLUSTER)
    if cluster is None:
        raise CreateReplyMessageError(
            "create reply message fail, requestMessage error, "
            f"property[{MessageConst.CLUSTER}] is null."
        )
    reply = {MessageConst.MSG_TYPE: REPLY_MESSAGE_FLAG}
    for name in (MessageConst.CORRELATION_ID, MessageConst.REPLY_TO_CLIENT, MessageConst.TTL):
        value = props.get(name)
        if value is not None:
            reply[name] = value
    return Message(reply_topic(cluster), body, properties=reply)


def _socket_address(s: str | None) -> tuple[str, int]:
    host, _, port = (s or "").rpartition(":")
    return (host, int(port)) if port.isdigit() else ("", 0)


def _int(fields: dict[str, str], name: str, default: int | None = None) -> int:
    v = fields.get(name)
    if v is None or v == "":
        if default is None:
            raise ValueError(f"the custom field <{name}> is null")
        return default
    return int(v)


def reply_message_from_push(cmd: RemotingCommand, arrived_ms: int) -> MessageExt:
    """The reply a PUSH_REPLY_MESSAGE_TO_CLIENT carries (ValueError when it is malformed)."""
    f = cmd.ext_fields
    topic = f.get("topic")
    if not topic:
        raise ValueError("the custom field <topic> is null")
    sys_flag = _int(f, "sysFlag")
    body = cmd.body_bytes()
    if sys_flag & MessageSysFlag.COMPRESSED:
        try:
            body = zlib.decompress(body)
        except zlib.error as exc:  # Java logs it and keeps the bytes as they came
            log.warning("reply body does not inflate: %s", exc)
    props = decode_properties(f.get("properties") or "")
    props[MessageConst.ARRIVE_TIME] = str(arrived_ms)
    return MessageExt(
        store_size=0,
        body_crc=0,
        queue_id=_int(f, "queueId"),
        flag=_int(f, "flag"),
        queue_offset=0,
        commit_log_offset=0,
        sys_flag=sys_flag,
        born_timestamp=_int(f, "bornTimestamp"),
        born_host=_socket_address(f.get("bornHost")),
        store_timestamp=_int(f, "storeTimestamp", 0),
        store_host=_socket_address(f.get("storeHost")),
        reconsume_times=_int(f, "reconsumeTimes", 0),
        prepared_transaction_offset=0,
        body=body,
        topic=topic,
        properties=props,
    )


@attrs.define(eq=False)
class _Waiting:
    done: trio.Event = attrs.Factory(trio.Event)
    reply: MessageExt | None = None


@attrs.define(eq=False)
class RequestFutureHolder:
    """The calls waiting for a reply, by correlation id (Java's ``RequestFutureHolder``)."""

    waiting: dict[str, _Waiting] = attrs.Factory(dict)
    unmatched: int = 0  # replies that came for no waiting call (late, or not ours)

    def open(self, correlation_id: str) -> _Waiting:
        w = self.waiting[correlation_id] = _Waiting()
        return w

    def close(self, correlation_id: str) -> None:
        self.waiting.pop(correlation_id, None)

    def deliver(self, reply: MessageExt) -> bool:
        cid = reply.properties.get(MessageConst.CORRELATION_ID, "")
        w = self.waiting.pop(cid, None)
        if w is None:
            self.unmatched += 1
            log.warning(
                "receive reply message, but not matched any request, CorrelationId: %s, "
                "reply from host: %s",
                cid,
                reply.born_host,
            )
            return False
        w.reply = reply
        w.done.set()
        return True

    async def handle_push(self, cmd: RemotingCommand, channel: Channel) -> RemotingCommand:
        """The answer to PUSH_REPLY_MESSAGE_TO_CLIENT (326)."""
        try:
            reply = reply_message_from_push(cmd, time.time_ns() // 1_000_000)
        except ValueError as exc:
            log.warning("unreadable reply push from %s: %s", channel.remote_addr, exc)
            return cmd.response(ResponseCode.SYSTEM_ERROR, "process reply message fail")
        self.deliver(reply)
        return cmd.response(ResponseCode.SUCCESS)


__all__ = [
    "REPLY_MESSAGE_FLAG",
    "RequestFutureHolder",
    "create_reply_message",
    "is_reply",
    "reply_message_from_push",
    "reply_topic",
]
