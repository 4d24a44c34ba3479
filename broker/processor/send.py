"""SEND_MESSAGE / SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE / CONSUMER_SEND_MSG_BACK.

RocketMQ ``SendMessageProcessor`` + ``AbstractSendMessageProcessor.msgCheck``.

Theory of operation
-------------------
A send is validated (``msg_check``: broker/topic permissions, topic name, auto-creation from the
``defaultTopic`` template, queue id range), turned into a ``MessageExtBrokerInner`` and appended
with the store's synchronous ``append_message(s)``.  The SEND codes are registered *inline*: the
connection's read loop calls :meth:`SendMessageProcessor.send_inline` itself, in arrival order,
with no task in between (Trio may start a batch of new tasks in any order), so the CommitLog
order of one producer's pipelined sends is the order in which they arrived.  When the store's
answer is final (ASYNC_FLUSH, dispatched on the spot) the response is built right there; when it
is a ``PendingPut`` (SYNC_FLUSH flush, reput behind) the read loop gets an awaitable for the
rest, which a task awaits while the read loop goes on reading.  On a SYNC_MASTER (WAIT absent or
"true") that awaitable also waits for a slave's ack (``controller.ha.wait_for_replica``) and
answers FLUSH_SLAVE_TIMEOUT (12) / SLAVE_NOT_AVAILABLE (11) when it does not come; the message
stays stored either way.

Header names: SEND_MESSAGE carries long names (``topic``, ``queueId``...); SEND_MESSAGE_V2 and
SEND_BATCH_MESSAGE carry the one-letter names ``a``..``n`` (facts §2.2).  Whether the body is a
batch is decided by the header's ``batch`` / ``m`` flag, not by the request code, like Java.

Retry topics: a message sent to ``%RETRY%group`` whose reconsumeTimes reached the group's
maximum is diverted to ``%DLQ%group``.  CONSUMER_SEND_MSG_BACK (a consumer giving up on a
message for now) re-stores the original - looked up by its CommitLog offset - under
``%RETRY%group`` with reconsumeTimes + 1 and a delay level (3 + reconsumeTimes unless the client
chose one), or in the DLQ once the maximum is reached; the store turns the DELAY property into a
SCHEDULE_TOPIC_XXXX entry which the schedule service re-delivers when due.

Every OK-family answer carries ``MSG_REGION`` and ``TRACE_ON``: Java clients dereference them.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable
from typing import Any

from broker.controller import BrokerController
from broker.store.results import PendingPut, PutMessageResult, PutMessageStatus
from broker.topic_config import validate_topic
from common.batch_body import decode_batch_body
from common.errors import RequestError
from common.message import MessageExtBrokerInner, RecordDecodeError
from common.message_properties import (
    NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
    MessageConst,
    decode_properties,
    encode_properties,
)
from common.model import PermName
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RESPONSE_FLAG, RemotingCommand
from common.topics import (
    AUTO_CREATE_TOPIC_KEY_TOPIC,
    RETRY_GROUP_TOPIC_PREFIX,
    SCHEDULE_TOPIC,
    dlq_topic,
    retry_topic,
)

log = logging.getLogger(__name__)

DLQ_NUMS_PER_GROUP = 1
V3_4_9 = 121  # MQVersion ordinal from which the header's maxReconsumeTimes is honoured

# SendMessageRequestHeaderV2 one-letter names -> SendMessageRequestHeader names
V2_NAMES = {
    "a": "producerGroup",
    "b": "topic",
    "c": "defaultTopic",
    "d": "defaultTopicQueueNums",
    "e": "queueId",
    "f": "sysFlag",
    "g": "bornTimestamp",
    "h": "flag",
    "i": "properties",
    "j": "reconsumeTimes",
    "k": "unitMode",
    "l": "maxReconsumeTimes",
    "m": "batch",
    "n": "bname",
}

_PUT_CODES = {
    PutMessageStatus.PUT_OK: (ResponseCode.SUCCESS, None),
    PutMessageStatus.FLUSH_DISK_TIMEOUT: (ResponseCode.FLUSH_DISK_TIMEOUT, "flush disk timeout"),
    PutMessageStatus.FLUSH_SLAVE_TIMEOUT: (
        ResponseCode.FLUSH_SLAVE_TIMEOUT,
        "wait for slave flush timeout",
    ),
    PutMessageStatus.SLAVE_NOT_AVAILABLE: (ResponseCode.SLAVE_NOT_AVAILABLE, "slave not available"),
    PutMessageStatus.CREATE_MAPEDFILE_FAILED: (
        ResponseCode.SYSTEM_ERROR,
        "create mapped file failed, server is busy or broken.",
    ),
    PutMessageStatus.MESSAGE_ILLEGAL: (
        ResponseCode.MESSAGE_ILLEGAL,
        "the message is illegal, maybe msg body or properties length not matched.",
    ),
    PutMessageStatus.PROPERTIES_SIZE_EXCEEDED: (
        ResponseCode.MESSAGE_ILLEGAL,
        "the message is illegal, maybe msg properties length limit 32k.",
    ),
    PutMessageStatus.SERVICE_NOT_AVAILABLE: (
        ResponseCode.SERVICE_NOT_AVAILABLE,
        "service not available now. It may be caused by one of the following reasons: the broker's "
        "disk is full, messages are put to the slave, message store has been shut down, etc.",
    ),
    PutMessageStatus.OS_PAGECACHE_BUSY: (
        ResponseCode.SYSTEM_ERROR,
        "[PC_SYNCHRONIZED]broker busy, start flow control for a while",
    ),
    PutMessageStatus.UNKNOWN_ERROR: (ResponseCode.SYSTEM_ERROR, "UNKNOWN_ERROR"),
}


def send_header(req: RemotingCommand) -> dict[str, str]:
    """The request's header under the long (SendMessageRequestHeader) names."""
    ext = req.ext_fields
    if req.code in (
        RequestCode.SEND_MESSAGE_V2,
        RequestCode.SEND_BATCH_MESSAGE,
        RequestCode.SEND_REPLY_MESSAGE_V2,
    ) or ("b" in ext and "topic" not in ext):
        out = dict(ext)
        out.update({V2_NAMES[k]: v for k, v in ext.items() if k in V2_NAMES})
        return out
    return ext


def _stored_properties(raw: str, props: dict[str, str], cluster: str) -> str | None:
    """The stored properties string built by splicing the request's own string, or None.

    Same result as encoding ``props`` + CLUSTER without WAIT (the generic path), provided the
    request's string is canonical: ``len(props)`` segments, one \\x01 each, no duplicate keys
    (then encoding ``props`` gives ``raw`` back), and no CLUSTER in it yet.
    """
    n = len(props)
    if (
        raw.count(PROPERTY_SEPARATOR) != max(n - 1, 0)
        or raw.count(NAME_VALUE_SEPARATOR) != n
        or MessageConst.CLUSTER in props
        or NAME_VALUE_SEPARATOR in cluster
        or PROPERTY_SEPARATOR in cluster
    ):
        return None
    wait = props.get(MessageConst.WAIT)
    if wait is not None:
        seg = MessageConst.WAIT + NAME_VALUE_SEPARATOR + wait
        if raw == seg:
            raw = ""
        elif raw.startswith(seg + PROPERTY_SEPARATOR):
            raw = raw[len(seg) + 1 :]
        elif raw.endswith(PROPERTY_SEPARATOR + seg):
            raw = raw[: -len(seg) - 1]
        else:
            raw = raw.replace(PROPERTY_SEPARATOR + seg + PROPERTY_SEPARATOR, PROPERTY_SEPARATOR, 1)
    tail = MessageConst.CLUSTER + NAME_VALUE_SEPARATOR + cluster
    return raw + PROPERTY_SEPARATOR + tail if raw else tail


def _h_int(h: dict[str, str], name: str, default: Any = None) -> int:
    v = h.get(name)
    if v is None or v == "":
        if default is None:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"the custom field <{name}> is null")
        return default
    try:
        return int(v)
    except ValueError:
        raise RequestError(
            ResponseCode.SYSTEM_ERROR, f"the custom field <{name}> is not an integer: {v!r}"
        ) from None


def _h_bool(h: dict[str, str], name: str) -> bool:
    v = h.get(name)
    return v is not None and v.lower() in ("true", "1")


# Bound of the per-processor caches below (cleared when reached).
_CACHE_MAX = 4096


class SendMessageProcessor:
    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker
        # Topic names that passed validate_topic (a pure check of the name).
        self._valid_topics: set[str] = set()
        # remote_addr -> (ip, port) of the producer (bornHost), parsed once per connection.
        self._born_hosts: dict[str, tuple[str, int]] = {}

    def register(self, dispatcher: Any) -> None:
        for code in (
            RequestCode.SEND_MESSAGE,
            RequestCode.SEND_MESSAGE_V2,
            RequestCode.SEND_BATCH_MESSAGE,
        ):
            dispatcher.register(code, self.send_inline, inline=True)
        dispatcher.register(RequestCode.CONSUMER_SEND_MSG_BACK, self.process_send_back)

    # --- checks -----------------------------------------------------------------------------
    def _response(self, req: RemotingCommand, code: int, remark: str | None = None, **ext: Any):
        return req.response(code, remark, ext or None)

    def msg_check(self, req: RemotingCommand, h: dict[str, str], topic: str, queue_id: int):
        """AbstractSendMessageProcessor.msgCheck: returns the TopicConfig or raises RequestError."""
        b = self.broker
        cfg = b.config
        if not PermName.is_writeable(cfg.broker_permission):
            raise RequestError(
                ResponseCode.NO_PERMISSION,
                f"the broker[{cfg.broker_ip1}] sending message is forbidden",
            )
        if topic not in self._valid_topics:
            why = validate_topic(topic)
            if why is not None:
                raise RequestError(ResponseCode.SYSTEM_ERROR, why)
            if len(self._valid_topics) >= _CACHE_MAX:
                self._valid_topics.clear()
            self._valid_topics.add(topic)
        if topic == SCHEDULE_TOPIC:
            raise RequestError(
                ResponseCode.NO_PERMISSION, f"Sending message to topic[{topic}] is forbidden."
            )
        tcm = b.topic_config_manager
        tc = tcm.select_topic_config(topic)
        if tc is None:
            sys_flag = 0
            tc = tcm.create_topic_in_send_message_method(
                topic,
                h.get("defaultTopic") or AUTO_CREATE_TOPIC_KEY_TOPIC,
                _h_int(h, "defaultTopicQueueNums", 4),
                sys_flag,
            )
            if tc is None and topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                tc = tcm.create_topic_in_send_message_back_method(
                    topic, 1, PermName.READ | PermName.WRITE, sys_flag
                )
            if tc is None:
                raise RequestError(
                    ResponseCode.TOPIC_NOT_EXIST,
                    f"topic[{topic}] not exist, apply first please!",
                )
        if not PermName.is_writeable(tc.perm):
            raise RequestError(
                ResponseCode.NO_PERMISSION, f"the topic[{topic}] sending message is forbidden"
            )
        if queue_id >= max(tc.writeQueueNums, tc.readQueueNums):
            raise RequestError(
                ResponseCode.SYSTEM_ERROR,
                f"request queueId[{queue_id}] is illegal, topic:{topic} "
                f"writeQueueNums:{tc.writeQueueNums} readQueueNums:{tc.readQueueNums} "
                f"Producer:{req.ext_fields.get('producerGroup') or h.get('producerGroup')}",
            )
        return tc

    def _retry_or_dlq(self, req: RemotingCommand, h: dict[str, str], msg: MessageExtBrokerInner):
        """handleRetryAndDLQ: a retry-topic message over its max reconsume times goes to the DLQ."""
        topic = msg.topic
        if not topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            return
        group = topic[len(RETRY_GROUP_TOPIC_PREFIX) :]
        sgc = self.broker.subscription_group_manager.find_subscription_group_config(group)
        if sgc is None:
            raise RequestError(
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"subscription group not exist, {group}",
            )
        max_times = sgc.retryMaxTimes
        if req.version >= V3_4_9 and h.get("maxReconsumeTimes"):
            max_times = _h_int(h, "maxReconsumeTimes", max_times)
        if msg.reconsume_times >= max_times:
            dlq = dlq_topic(group)
            tc = self.broker.topic_config_manager.create_topic_in_send_message_back_method(
                dlq, DLQ_NUMS_PER_GROUP, PermName.READ | PermName.WRITE
            )
            if not PermName.is_writeable(tc.perm):
                raise RequestError(ResponseCode.NO_PERMISSION, f"the topic[{dlq}] is not writable")
            msg.topic = dlq
            msg.queue_id = random.randrange(99999999) % DLQ_NUMS_PER_GROUP
            msg.properties.pop(MessageConst.DELAY, None)

    def _inner(
        self,
        h: dict[str, str],
        channel: Any,
        topic: str,
        queue_id: int,
        body: bytes,
        props: dict[str, str],
        flag: int,
    ) -> MessageExtBrokerInner:
        b = self.broker
        props[MessageConst.CLUSTER] = b.config.broker_cluster_name
        return MessageExtBrokerInner(
            topic=topic,
            queue_id=queue_id,
            flag=flag,
            body=body,
            properties=props,
            sys_flag=_h_int(h, "sysFlag", 0),
            born_timestamp=_h_int(h, "bornTimestamp", 0),
            born_host=self._born_host(channel),
            store_host=b.store_host,
            reconsume_times=_h_int(h, "reconsumeTimes", 0),
        )

    def _born_host(self, channel: Any) -> tuple[str, int]:
        addr = getattr(channel, "remote_addr", "") or ""
        host = self._born_hosts.get(addr)
        if host is None:
            host = self.broker.peer_host(channel)
            if len(self._born_hosts) >= _CACHE_MAX:
                self._born_hosts.clear()
            self._born_hosts[addr] = host
        return host

    @staticmethod
    def _strip_wait(msg: MessageExtBrokerInner) -> None:
        # WAIT stays in the in-memory map (the store reads it) but is not stored
        stored = {k: v for k, v in msg.properties.items() if k != MessageConst.WAIT}
        msg.properties_string = encode_properties(stored)

    # --- SEND_MESSAGE(_V2) / SEND_BATCH_MESSAGE ---------------------------------------------
    async def process_send(self, req: RemotingCommand, channel: Any) -> RemotingCommand | None:
        """The awaitable form of :meth:`send_inline` (for callers outside a read loop)."""
        result = self.send_inline(req, channel)
        if isinstance(result, RemotingCommand):
            return result
        return await result

    def send_inline(self, req: RemotingCommand, channel: Any) -> Any:
        """Validate and append now; the response, or an awaitable of it (see module doc)."""
        b = self.broker
        h = send_header(req)
        topic = h.get("topic")
        if not topic:
            raise RequestError(ResponseCode.SYSTEM_ERROR, "the custom field <topic> is null")
        queue_id = _h_int(h, "queueId")
        tc = self.msg_check(req, h, topic, queue_id)
        if queue_id < 0:
            queue_id = random.randrange(99999999) % max(tc.writeQueueNums, 1)
        body = req.body_bytes()
        if len(body) > b.config.store.max_message_size:
            return self._response(
                req,
                ResponseCode.MESSAGE_ILLEGAL,
                f"the message body size {len(body)} is over max {b.config.store.max_message_size}",
            )
        if _h_bool(h, "batch"):
            return self._send_batch(req, h, channel, topic, queue_id, body)
        raw_props = h.get("properties") or ""
        props = decode_properties(raw_props)
        if props.get(MessageConst.TRAN_MSG, "").lower() == "true":
            return self._response(
                req,
                ResponseCode.NO_PERMISSION,
                f"the broker[{b.config.broker_ip1}] sending transaction message is forbidden",
            )
        stored = None
        if not topic.startswith(RETRY_GROUP_TOPIC_PREFIX):  # (may be diverted to the DLQ)
            stored = _stored_properties(raw_props, props, b.config.broker_cluster_name)
        msg = self._inner(h, channel, topic, queue_id, body, props, _h_int(h, "flag", 0))
        if stored is None:
            self._retry_or_dlq(req, h, msg)
            self._strip_wait(msg)
        else:
            msg.properties_string = stored
        appended = b.store.append_message(msg)
        # Java answers the queue the request chose (queueIdInt), not the SCHEDULE_TOPIC queue the
        # store moved a delayed message to
        return self._answer_append(req, appended, queue_id, self._wait_replica(msg))

    def _send_batch(self, req, h, channel, topic, queue_id, body) -> Any:
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            return self._response(
                req,
                ResponseCode.MESSAGE_ILLEGAL,
                f"batch request does not support retry group {topic}",
            )
        try:
            parts = decode_batch_body(body)
        except RecordDecodeError as exc:
            return self._response(req, ResponseCode.MESSAGE_ILLEGAL, f"bad batch body: {exc}")
        if not parts:
            return self._response(req, ResponseCode.MESSAGE_ILLEGAL, "empty batch")
        batch_props = decode_properties(h.get("properties") or "")
        msgs = []
        for flag, mbody, mprops in parts:
            props = {**mprops, **batch_props}
            if props.get(MessageConst.DELAY, "0") not in ("", "0"):
                return self._response(
                    req, ResponseCode.MESSAGE_ILLEGAL, "batch messages cannot be delayed"
                )
            m = self._inner(h, channel, topic, queue_id, mbody, props, flag)
            self._strip_wait(m)
            msgs.append(m)
        appended = self.broker.store.append_messages(msgs)
        return self._answer_append(req, appended, queue_id, self._wait_replica(msgs[0]))

    def _wait_replica(self, msg: MessageExtBrokerInner) -> bool:
        """SYNC_MASTER: the answer waits for a slave's ack (unless WAIT=false), like Java."""
        b = self.broker
        return (
            b.ha is not None
            and getattr(b.store, "broker_role", None) == "SYNC_MASTER"
            and msg.properties.get(MessageConst.WAIT) != "false"
        )

    def _answer_append(
        self,
        req: RemotingCommand,
        appended: PutMessageResult | PendingPut,
        queue_id: int,
        wait_replica: bool = False,
    ) -> Any:
        if type(appended) is PendingPut or (wait_replica and appended.ok):
            answer = self._answer_later(req, appended, queue_id, wait_replica)
        else:
            answer = self._answer_put(req, appended, queue_id)
        if self.broker.config_pending():
            # this send auto-created a topic (or came right after a topic change) whose config
            # is still being written: acknowledge only what a restart would find again
            return self._answer_when_config_durable(answer)
        return answer

    async def _answer_when_config_durable(
        self, answer: RemotingCommand | Awaitable[RemotingCommand]
    ) -> RemotingCommand:
        durable = await self.broker.wait_config_durable()
        resp = answer if isinstance(answer, RemotingCommand) else await answer
        if not durable and resp.code == ResponseCode.SUCCESS:
            # stored in the CommitLog, but its topic's config is not on disk: say so as a flush
            # timeout does (the client may resend; a duplicate is possible, a loss is not)
            resp.code = ResponseCode.FLUSH_DISK_TIMEOUT
            resp.remark = "the topic config of this auto-created topic is not on disk yet"
        return resp

    async def _answer_later(
        self,
        req: RemotingCommand,
        appended: PutMessageResult | PendingPut,
        queue_id: int,
        wait_replica: bool,
    ) -> RemotingCommand:
        """Flush wait (SYNC_FLUSH, in the store's PendingPut), then the replica wait."""
        result = await appended.wait() if type(appended) is PendingPut else appended
        if wait_replica and result.append is not None:
            append = result.append
            status = await self.broker.ha.wait_for_replica(append.wrote_offset + append.wrote_bytes)
            # Java: a failed replica wait overrides the flush outcome; the message stays stored
            if status is not PutMessageStatus.PUT_OK:
                result = PutMessageResult(status, append)
        return self._answer_put(req, result, queue_id)

    def _answer_put(
        self, req: RemotingCommand, result: PutMessageResult, queue_id_hint: int
    ) -> RemotingCommand:
        b = self.broker
        code, remark = _PUT_CODES.get(result.status, (ResponseCode.SYSTEM_ERROR, "UNKNOWN_ERROR"))
        if result.remark and code != ResponseCode.SUCCESS:
            remark = f"{remark} ({result.remark})" if remark else result.remark
        ext = {
            "MSG_REGION": str(b.config.region_id),
            "TRACE_ON": "true" if b.config.trace_on else "false",
        }
        append = result.append
        if append is not None:
            ext["msgId"] = str(append.msg_id)
            ext["queueId"] = str(queue_id_hint)
            ext["queueOffset"] = str(append.logics_offset)
            b.stats.put_count += append.msg_num
        else:
            b.stats.put_failed += 1
        # req.response() without stringify_fields: every value is a str already
        return RemotingCommand(
            code=int(code),
            opaque=req.opaque,
            flag=RESPONSE_FLAG,
            remark=remark,
            ext_fields=ext,
            serialize_type=req.serialize_type,
        )

    # --- CONSUMER_SEND_MSG_BACK -------------------------------------------------------------
    async def process_send_back(self, req: RemotingCommand, channel: Any) -> RemotingCommand:
        b = self.broker
        group = req.get_str("group")
        offset = req.get_int("offset")
        delay_level = req.get_int("delayLevel", 0)
        sgc = b.subscription_group_manager.find_subscription_group_config(group)
        if sgc is None:
            return req.response(
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group not exist, {group}"
            )
        if not PermName.is_writeable(b.config.broker_permission):
            return req.response(
                ResponseCode.NO_PERMISSION,
                f"the broker[{b.config.broker_ip1}] sending message is forbidden",
            )
        if sgc.retryQueueNums <= 0:
            return req.response(ResponseCode.SUCCESS)  # retry disabled for the group: drop
        new_topic = retry_topic(group)
        queue_id = random.randrange(99999999) % sgc.retryQueueNums
        tc = b.topic_config_manager.create_topic_in_send_message_back_method(
            new_topic, sgc.retryQueueNums, PermName.READ | PermName.WRITE
        )
        if not PermName.is_writeable(tc.perm):
            return req.response(
                ResponseCode.NO_PERMISSION, f"the topic[{new_topic}] sending message is forbidden"
            )
        orig = b.store.look_message_by_offset(offset)
        if orig is None:
            return req.response(
                ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {offset}"
            )
        props = dict(orig.properties)
        props.setdefault(MessageConst.RETRY_TOPIC, orig.topic)
        props.pop(MessageConst.WAIT, None)
        max_times = sgc.retryMaxTimes
        if req.version >= V3_4_9 and req.ext_fields.get("maxReconsumeTimes"):
            max_times = req.get_int("maxReconsumeTimes")
        if orig.reconsume_times >= max_times or delay_level < 0:
            new_topic = dlq_topic(group)
            queue_id = random.randrange(99999999) % DLQ_NUMS_PER_GROUP
            tc = b.topic_config_manager.create_topic_in_send_message_back_method(
                new_topic, DLQ_NUMS_PER_GROUP, PermName.READ | PermName.WRITE
            )
            props.pop(MessageConst.DELAY, None)
        else:
            if delay_level == 0:
                delay_level = 3 + orig.reconsume_times
            props[MessageConst.DELAY] = str(delay_level)
        origin_id = props.get(MessageConst.ORIGIN_MESSAGE_ID) or orig.msg_id
        props[MessageConst.ORIGIN_MESSAGE_ID] = origin_id
        msg = MessageExtBrokerInner(
            topic=new_topic,
            queue_id=queue_id,
            flag=orig.flag,
            body=orig.body,
            properties=props,
            sys_flag=orig.sys_flag,
            born_timestamp=orig.born_timestamp,
            born_host=orig.born_host,
            store_host=b.store_host,
            reconsume_times=orig.reconsume_times + 1,
        )
        result = await b.store.put_message(msg)
        if result.status is PutMessageStatus.PUT_OK:
            b.stats.send_back_count += 1
            return req.response(ResponseCode.SUCCESS)
        # Java answers SUCCESS only for PUT_OK (a flush timeout here is an error for the client)
        return req.response(ResponseCode.SYSTEM_ERROR, result.remark or result.status.name)


__all__ = ["SendMessageProcessor", "send_header"]
