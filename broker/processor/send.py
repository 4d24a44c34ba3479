"""SEND_MESSAGE / SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE (and the route to CONSUMER_SEND_MSG_BACK).

RocketMQ ``SendMessageProcessor`` + ``AbstractSendMessageProcessor.msgCheck``.

Theory of operation
-------------------
A send is validated (``msg_check``: broker/topic permissions, topic name, auto-creation from the
``defaultTopic`` template, queue id range), turned into a ``MessageExtBrokerInner`` and appended
with the store's synchronous ``append_message(s)``.  The SEND codes are registered *inline*: the
connection's read loop calls :meth:`SendMessageProcessor.send_inline` itself, in arrival order,
with no task in between (Trio may start a batch of new tasks in any order), so the CommitLog
order of one producer's pipelined sends is the order in which they arrived.  The SEND requests
that one read delivers in a row come to :meth:`SendMessageProcessor.send_run` together: each is
checked alone, and the plain single sends among them go to the file store as one group
(``append_message_group``: one CommitLog write, the same records and offsets).  When the store's
answer is final (ASYNC_FLUSH, dispatched on the spot) the response is built right there; when it
is an ``AwaitablePut`` (SYNC_FLUSH flush, reput behind; in DLedger mode the quorum commit) the
read loop gets an awaitable for the rest, which a task awaits while the read loop goes on
reading.  On a SYNC_MASTER (WAIT absent or "true") the answer also waits for a slave's ack and
is FLUSH_SLAVE_TIMEOUT (12) / SLAVE_NOT_AVAILABLE (11) when it does not come; the message stays
stored either way.  With nothing else to wait for (ASYNC_FLUSH, the usual case) that wait holds
no task: the read loop gets a ``DeferredAnswer`` that the replica watermark sets from the task
that read the slave's ack (``controller.ha.watch_replica``), and every answer one ack releases
on a connection leaves in one write.

The header's two spellings (long names, and V2's one-letter names) are read through
``send_header.py``.  Whether the body is a batch is decided by the header's ``batch`` / ``m``
flag, not by the request code, like Java.

Retry topics and the DLQ are ``send_back.py``'s: a message sent to ``%RETRY%group`` whose
reconsumeTimes reached the group's maximum is diverted to ``%DLQ%group`` on this path (still
without an await), and CONSUMER_SEND_MSG_BACK, registered here like Java's processor does, is
answered there.

Every OK-family answer carries ``MSG_REGION`` and ``TRACE_ON``: Java clients dereference them.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from typing import cast

import trio

from broker.config import BrokerConfig
from broker.controller import BrokerController
from broker.ha.service import HAService
from broker.processor.send_back import consumer_send_msg_back, handle_retry_and_dlq
from broker.processor.send_header import header_bool, header_int, plain_send_v2, send_header
from broker.store.results import AwaitablePut, PutMessageResult, PutMessageStatus
from broker.timer.transform import (
    TIMER_QUEUE_ID,
    TimerVerdict,
    has_timer_property,
    illegal_remark,
    not_enabled_remark,
    transform_timer_message,
)
from broker.topic_config import validate_topic
from common.batch_body import split_batch_body
from common.errors import RequestError
from common.message import MessageExtBrokerInner, RecordDecodeError
from common.message_properties import (
    NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
    MessageConst,
    decode_properties,
    encode_properties,
)
from common.model import PermName, TopicConfig
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RESPONSE_FLAG, RemotingCommand
from common.remoting.deferred_answer import DeferredAnswer
from common.remoting.server import Channel, RequestDispatcher
from common.topics import (
    AUTO_CREATE_TOPIC_KEY_TOPIC,
    RETRY_GROUP_TOPIC_PREFIX,
    SCHEDULE_TOPIC,
    TIMER_TOPIC,
)

log = logging.getLogger(__name__)

# What the inline SEND handler gives the read loop: the answer; a DeferredAnswer the replica
# watermark sets (a SYNC_MASTER send: no task waits); or an awaitable of it (flush, DLedger
# commit or config wait) that a task awaits
SendAnswer = RemotingCommand | DeferredAnswer | Awaitable[RemotingCommand]

# A store's append_message_group (the file store's; DLedger and the memory store have none)
GroupAppend = Callable[[list[MessageExtBrokerInner]], list[PutMessageResult | AwaitablePut]]

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


# Bound of the per-processor caches below (cleared when reached).
_CACHE_MAX = 4096


class SendMessageProcessor:
    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker
        # Topic names that passed validate_topic (a pure check of the name).
        self._valid_topics: set[str] = set()
        # remote_addr -> (ip, port) of the producer (bornHost), parsed once per connection.
        self._born_hosts: dict[str, tuple[str, int]] = {}
        # single sends seen with chaos_ack_before_store (the test-only broken mode)
        self._chaos_sends = 0
        # the answer's fixed fields, made once per BrokerConfig (frozen: an update replaces it)
        self._answer_config: BrokerConfig | None = None
        self._answer_fields: dict[str, str] = {}

    def register(self, dispatcher: RequestDispatcher) -> None:
        for code in (
            RequestCode.SEND_MESSAGE,
            RequestCode.SEND_MESSAGE_V2,
            RequestCode.SEND_BATCH_MESSAGE,
        ):
            dispatcher.register(code, self.send_inline, inline=True)
        dispatcher.register_run(
            (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE),
            self.send_run,
        )
        dispatcher.register(RequestCode.CONSUMER_SEND_MSG_BACK, self.process_send_back)

    # --- checks -----------------------------------------------------------------------------
    def _response(
        self, req: RemotingCommand, code: int, remark: str | None = None
    ) -> RemotingCommand:
        return req.response(code, remark)

    def msg_check(self, req: RemotingCommand, topic: str, queue_id: int) -> TopicConfig:
        """AbstractSendMessageProcessor.msgCheck: returns the TopicConfig or raises RequestError."""
        b = self.broker
        cfg = b.config
        if not cfg.broker_permission & PermName.WRITE:  # (PermName.is_writeable, inlined)
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
        if topic in (SCHEDULE_TOPIC, TIMER_TOPIC):
            raise RequestError(
                ResponseCode.NO_PERMISSION, f"Sending message to topic[{topic}] is forbidden."
            )
        tcm = b.topic_config_manager
        tc = tcm.select_topic_config(topic)
        if tc is None:
            sys_flag = 0
            h = send_header(req)
            tc = tcm.create_topic_in_send_message_method(
                topic,
                h.get("defaultTopic") or AUTO_CREATE_TOPIC_KEY_TOPIC,
                header_int(h, "defaultTopicQueueNums", 4),
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
        if not tc.perm & PermName.WRITE:
            raise RequestError(
                ResponseCode.NO_PERMISSION, f"the topic[{topic}] sending message is forbidden"
            )
        if queue_id >= max(tc.writeQueueNums, tc.readQueueNums):
            group = req.ext_fields.get("producerGroup") or send_header(req).get("producerGroup")
            raise RequestError(
                ResponseCode.SYSTEM_ERROR,
                f"request queueId[{queue_id}] is illegal, topic:{topic} "
                f"writeQueueNums:{tc.writeQueueNums} readQueueNums:{tc.readQueueNums} "
                f"Producer:{group}",
            )
        return tc

    @staticmethod
    def _header_numbers(h: dict[str, str], flag: int | None = None) -> tuple[int, int, int, int]:
        """(flag, sysFlag, bornTimestamp, reconsumeTimes) of the long-name header, in the
        order they are read; ``flag`` when the message's own (a batch's) replaces the header's."""
        return (
            header_int(h, "flag", 0) if flag is None else flag,
            header_int(h, "sysFlag", 0),
            header_int(h, "bornTimestamp", 0, long=True),
            header_int(h, "reconsumeTimes", 0),
        )

    def _inner(
        self,
        channel: Channel,
        topic: str,
        queue_id: int,
        body: bytes,
        props: dict[str, str],
        numbers: tuple[int, int, int, int],
    ) -> MessageExtBrokerInner:
        b = self.broker
        props[MessageConst.CLUSTER] = b.config.broker_cluster_name
        flag, sys_flag, born_timestamp, reconsume_times = numbers
        return MessageExtBrokerInner(
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
        )

    def _born_host(self, channel: Channel) -> tuple[str, int]:
        addr = channel.remote_addr
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
    async def process_send(self, req: RemotingCommand, channel: Channel) -> RemotingCommand:
        """The awaitable form of :meth:`send_inline` (for callers outside a read loop)."""
        result = self.send_inline(req, channel)
        if isinstance(result, RemotingCommand):
            return result
        if isinstance(result, DeferredAnswer):
            return await result.wait()
        return await result

    def send_inline(self, req: RemotingCommand, channel: Channel) -> SendAnswer:
        """Validate and append now; the response, or an awaitable of it (see module doc)."""
        put = self._checked_send(req, channel, whole=True)
        if isinstance(put, tuple):
            msg, queue_id = put
            appended = self.broker.store.append_message(msg)
            # Java answers the queue the request chose (queueIdInt), not the SCHEDULE_TOPIC queue
            # the store moved a delayed message to
            return self._answer_append(req, appended, queue_id, self._replica_to_wait(msg))
        assert put is not None
        return put

    def send_run(
        self, reqs: list[RemotingCommand], channel: Channel
    ) -> list[SendAnswer | Exception]:
        """The SEND requests one read delivered in a row (issue 28): the answer of each, as
        :meth:`send_inline` would give it, or the exception it raised (answered alone).

        Each request's header, checks and message are its own; the plain single sends among
        them (no batch, transaction, timer or retry topic) go to the store together
        (``append_message_group``: one CommitLog reservation and write).  Any other request
        first appends the plain ones before it, then takes :meth:`send_inline`, so the CommitLog
        order is the arrival order.  A request refused before the store appends nothing and is
        answered alone.  Each answer then waits for what its own send waits for (its flush,
        its replica ack) as a single send's does.  A store without groups (DLedger, memory)
        gets one ``send_inline`` per request.
        """
        store = self.broker.store
        group: GroupAppend | None = getattr(store, "append_message_group", None)
        out: list[SendAnswer | Exception | None] = [None] * len(reqs)
        msgs: list[MessageExtBrokerInner] = []
        where: list[tuple[int, int]] = []  # (index in reqs, queue id to answer)
        for i, req in enumerate(reqs):
            try:
                put = self._checked_send(req, channel, whole=False) if group else None
                if isinstance(put, tuple):
                    msgs.append(put[0])
                    where.append((i, put[1]))
                    continue
                if put is None:  # not a plain single send: the ones before it go first
                    if msgs:
                        assert group is not None
                        self._append_group(group, reqs, msgs, where, out)
                        msgs, where = [], []
                    put = self.send_inline(req, channel)
                out[i] = put
            except Exception as exc:
                out[i] = exc
        if msgs:
            assert group is not None
            self._append_group(group, reqs, msgs, where, out)
        return cast(list[SendAnswer | Exception], out)

    def _append_group(
        self,
        group: GroupAppend,
        reqs: list[RemotingCommand],
        msgs: list[MessageExtBrokerInner],
        where: list[tuple[int, int]],
        out: list[SendAnswer | Exception | None],
    ) -> None:
        try:
            results = group(msgs)
        except Exception as exc:  # (what append_message would have raised for each)
            for i, _ in where:
                out[i] = exc
            return
        for appended, msg, (i, queue_id) in zip(results, msgs, where, strict=True):
            try:
                out[i] = self._answer_append(
                    reqs[i], appended, queue_id, self._replica_to_wait(msg)
                )
            except Exception as exc:
                out[i] = exc

    def _checked_send(
        self, req: RemotingCommand, channel: Channel, *, whole: bool
    ) -> SendAnswer | tuple[MessageExtBrokerInner, int] | None:
        """A SEND request checked and turned into what to store: the single message and the
        queue id to answer, or the answer itself (refused; with ``whole``, also a batch, a
        transaction half, a timer or retry-topic message, stored by this call); None (only
        without ``whole``) for those, which the caller then sends with :meth:`send_inline`."""
        b = self.broker
        # the usual send's fields at once; any other header is read field by field, each where
        # the checks below first need it, so its errors come in the order they always have
        plain = plain_send_v2(req)
        h: dict[str, str] | None = None
        numbers: tuple[int, int, int, int] | None = None
        if plain is None:
            h = send_header(req)
            topic = h.get("topic")
            if not topic:
                raise RequestError(ResponseCode.SYSTEM_ERROR, "the custom field <topic> is null")
            queue_id = header_int(h, "queueId")
            raw_props = ""
        else:
            topic, queue_id, raw_props = plain[0], plain[1], plain[2]
            numbers = plain[3:]
        tc = self.msg_check(req, topic, queue_id)
        if queue_id < 0:
            queue_id = random.randrange(99999999) % max(tc.writeQueueNums, 1)
        body = req.body_bytes()
        if len(body) > b.config.store.max_message_size:
            return self._response(
                req,
                ResponseCode.MESSAGE_ILLEGAL,
                f"the message body size {len(body)} is over max {b.config.store.max_message_size}",
            )
        if h is not None:
            if header_bool(h, "batch"):
                if not whole:
                    return None
                return self._send_batch(req, h, channel, topic, queue_id, body)
            raw_props = h.get("properties") or ""
        props = decode_properties(raw_props)
        if props.get(MessageConst.TRAN_MSG, "").lower() == "true":
            if b.config.reject_transaction_message:
                return self._response(
                    req,
                    ResponseCode.NO_PERMISSION,
                    f"the broker[{b.config.broker_ip1}] sending transaction message is forbidden",
                )
            if has_timer_property(props):
                # RocketMQ 5's clients refuse a transactional message with a delivery time
                return self._response(
                    req, ResponseCode.MESSAGE_ILLEGAL, "transaction messages cannot be timed"
                )
            if not whole:
                return None
            header = h if h is not None else send_header(req)
            return self._send_half(req, header, channel, topic, queue_id, body, props)
        stored = None
        store_topic, store_qid = topic, queue_id
        if has_timer_property(props):
            if not whole:
                return None
            # a timer message (broker/timer): stored in rmq_sys_wheel_timer until it is due
            timers = b.timer_service
            verdict = transform_timer_message(
                topic, queue_id, props, timers.clock_ms(), timers.settings
            )
            if verdict is TimerVerdict.ILLEGAL:
                return self._response(
                    req, ResponseCode.MESSAGE_ILLEGAL, illegal_remark(timers.settings)
                )
            if verdict is TimerVerdict.NOT_ENABLED:
                return self._response(
                    req, ResponseCode.SYSTEM_ERROR, not_enabled_remark(timers.settings)
                )
            if verdict is TimerVerdict.TIMER:
                store_topic, store_qid = TIMER_TOPIC, TIMER_QUEUE_ID
        elif not topic.startswith(RETRY_GROUP_TOPIC_PREFIX):  # (may be diverted to the DLQ)
            stored = _stored_properties(raw_props, props, b.config.broker_cluster_name)
        if not whole and (stored is None or b.config.chaos_ack_before_store):
            return None
        if h is not None:
            numbers = self._header_numbers(h)
        assert numbers is not None
        msg = self._inner(channel, store_topic, store_qid, body, props, numbers)
        if stored is None:
            handle_retry_and_dlq(b, req, h if h is not None else send_header(req), msg)
            self._strip_wait(msg)
        else:
            msg.properties_string = stored
        if b.config.chaos_ack_before_store:
            self._chaos_sends += 1
            if self._chaos_sends % 5 == 0:  # broken on purpose: SEND_OK, nothing stored
                fake = req.response(ResponseCode.SUCCESS)
                fake.ext_fields = {"queueId": str(queue_id), "queueOffset": "-1", "msgId": ""}
                return fake
        return msg, queue_id

    def _send_half(
        self,
        req: RemotingCommand,
        h: dict[str, str],
        channel: Channel,
        topic: str,
        queue_id: int,
        body: bytes,
        props: dict[str, str],
    ) -> SendAnswer:
        """TRAN_MSG=true: stored as a half message (broker/transaction), answered like a send
        (the producer's END_TRANSACTION names the offsets of this answer)."""
        b = self.broker
        msg = self._inner(channel, topic, queue_id, body, props, self._header_numbers(h))
        half = b.transaction_service.prepare_message(msg)
        appended = b.store.append_message(half)
        return self._answer_append(req, appended, queue_id, self._replica_to_wait(half))

    def _send_batch(
        self,
        req: RemotingCommand,
        h: dict[str, str],
        channel: Channel,
        topic: str,
        queue_id: int,
        body: bytes,
    ) -> SendAnswer:
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            return self._response(
                req,
                ResponseCode.MESSAGE_ILLEGAL,
                f"batch request does not support retry group {topic}",
            )
        try:
            parts = split_batch_body(body)
        except RecordDecodeError as exc:
            return self._response(req, ResponseCode.MESSAGE_ILLEGAL, f"bad batch body: {exc}")
        if not parts:
            return self._response(req, ResponseCode.MESSAGE_ILLEGAL, "empty batch")
        batch_props = decode_properties(h.get("properties") or "")
        batch_props[MessageConst.CLUSTER] = self.broker.config.broker_cluster_name
        # Java (CommitLog.MessageExtBatchEncoder) stores each message's own properties string as
        # it came, then a separator if it lacks one, then the batch's properties (CLUSTER, and
        # WAIT as the client set it): spliced, not re-encoded; read back, the batch's win
        batch_str = encode_properties(batch_props)
        msgs = []
        for flag, mbody, raw in parts:
            props = decode_properties(raw)
            props.update(batch_props)
            if props.get(MessageConst.TRAN_MSG, "").lower() == "true":
                # RocketMQ's store refuses a batch of transactional messages (CommitLog)
                return self._response(
                    req, ResponseCode.MESSAGE_ILLEGAL, "batch messages cannot be transactional"
                )
            if props.get(MessageConst.DELAY, "0") not in ("", "0"):
                return self._response(
                    req, ResponseCode.MESSAGE_ILLEGAL, "batch messages cannot be delayed"
                )
            if has_timer_property(props):
                return self._response(
                    req, ResponseCode.MESSAGE_ILLEGAL, "batch messages cannot be timed"
                )
            m = self._inner(channel, topic, queue_id, mbody, props, self._header_numbers(h, flag))
            if raw and not raw.endswith(PROPERTY_SEPARATOR):
                raw += PROPERTY_SEPARATOR
            m.properties_string = raw + batch_str
            msgs.append(m)
        appended = self.broker.store.append_messages(msgs)
        return self._answer_append(req, appended, queue_id, self._replica_to_wait(msgs[0]))

    def _replica_to_wait(self, msg: MessageExtBrokerInner) -> HAService | None:
        """SYNC_MASTER: the HA service whose slave ack the answer waits for (unless WAIT=false),
        like Java; None when the answer does not wait for a replica."""
        b = self.broker
        if (
            b.ha is not None
            and b.store.broker_role == "SYNC_MASTER"
            and msg.properties.get(MessageConst.WAIT) != "false"
        ):
            return b.ha
        return None

    def _answer_append(
        self,
        req: RemotingCommand,
        appended: PutMessageResult | AwaitablePut,
        queue_id: int,
        replica: HAService | None = None,
    ) -> SendAnswer:
        answer: SendAnswer
        if isinstance(appended, PutMessageResult) and (replica is None or not appended.ok):
            answer = self._answer_put(req, appended, queue_id)
        elif isinstance(appended, PutMessageResult) and replica is not None:
            answer = self._answer_on_replica(req, appended, queue_id, replica)
        else:
            answer = self._answer_later(req, appended, queue_id, replica)
        refused = isinstance(answer, RemotingCommand) and answer.code != ResponseCode.SUCCESS
        if self.broker.config_pending() and not refused:
            # this send auto-created a topic (or came right after a topic change) whose config
            # is still being written: acknowledge only what a restart would find again (a
            # refusal acknowledges nothing, and on a full disk that write may wait for room)
            return self._answer_when_config_durable(answer)
        return answer

    def _answer_on_replica(
        self,
        req: RemotingCommand,
        result: PutMessageResult,
        queue_id: int,
        replica: HAService,
    ) -> RemotingCommand | DeferredAnswer:
        """Stored, no store wait: the answer once a slave holds it, with no task waiting (the
        watermark calls back when an ack raises it, or at slaveTimeout)."""
        append = result.append
        assert append is not None
        # Made now, while the slave works, not on the path from its ack to the client.  Its
        # counts are the put's whatever the slave does: Java counts a send whose replica wait
        # failed too (sendOK for FLUSH_SLAVE_TIMEOUT and SLAVE_NOT_AVAILABLE)
        ok = self._answer_put(req, result, queue_id)

        def answer(status: PutMessageStatus) -> RemotingCommand:
            if status is PutMessageStatus.PUT_OK:
                return ok
            # Java: a failed replica wait overrides the flush outcome; the message stays stored
            return self._answer_put(req, PutMessageResult(status, append), queue_id, count=False)

        deferred = DeferredAnswer(likely=ok)
        status = replica.watch_replica(
            append.wrote_offset + append.wrote_bytes, lambda st: deferred.set(answer(st))
        )
        return deferred if status is None else answer(status)

    async def _answer_when_config_durable(self, answer: SendAnswer) -> RemotingCommand:
        durable = await self.broker.wait_config_durable()
        if isinstance(answer, RemotingCommand):
            resp = answer
        elif isinstance(answer, DeferredAnswer):
            resp = await answer.wait()
        else:
            resp = await answer
        if not durable and resp.code == ResponseCode.SUCCESS:
            # stored in the CommitLog, but its topic's config is not on disk: say so as a flush
            # timeout does (the client may resend; a duplicate is possible, a loss is not)
            resp.code = ResponseCode.FLUSH_DISK_TIMEOUT
            resp.remark = "the topic config of this auto-created topic is not on disk yet"
        return resp

    async def _answer_later(
        self,
        req: RemotingCommand,
        appended: PutMessageResult | AwaitablePut,
        queue_id: int,
        replica: HAService | None,
    ) -> RemotingCommand:
        """The store's wait (SYNC_FLUSH flush, DLedger commit), then the replica wait."""
        result = appended if isinstance(appended, PutMessageResult) else await appended.wait()
        if replica is not None and result.append is not None:
            append = result.append
            status = await replica.wait_for_replica(append.wrote_offset + append.wrote_bytes)
            # Java: a failed replica wait overrides the flush outcome; the message stays stored
            if status is not PutMessageStatus.PUT_OK:
                result = PutMessageResult(status, append)
        return self._answer_put(req, result, queue_id)

    def _answer_put(
        self,
        req: RemotingCommand,
        result: PutMessageResult,
        queue_id_hint: int,
        *,
        count: bool = True,
    ) -> RemotingCommand:
        """The answer to a put; ``count``: add it to the stats and metrics (once per put)."""
        b = self.broker
        code, remark = _PUT_CODES.get(result.status, (ResponseCode.SYSTEM_ERROR, "UNKNOWN_ERROR"))
        if result.remark and code != ResponseCode.SUCCESS:
            remark = f"{remark} ({result.remark})" if remark else result.remark
        cfg = b.config
        if cfg is not self._answer_config:
            self._answer_config = cfg
            self._answer_fields = {
                "MSG_REGION": str(cfg.region_id),
                "TRACE_ON": "true" if cfg.trace_on else "false",
            }
        ext = self._answer_fields.copy()
        append = result.append
        if append is not None:
            ext["msgId"] = str(append.msg_id)
            ext["queueId"] = str(queue_id_hint)
            ext["queueOffset"] = str(append.logics_offset)
            if count:
                b.stats.put_count += append.msg_num
            # the topic as the header names it (SEND_MESSAGE_V2 shortens it to "b")
            topic = req.ext_fields.get("b") or req.ext_fields.get("topic")
            if topic and count:
                now = trio.current_time()
                stats = b.stats.manager
                stats.inc_put(
                    topic, cfg.broker_cluster_name, append.msg_num, append.wrote_bytes, now
                )
                metrics = b.metrics
                if metrics is not None:
                    props = req.ext_fields.get("i") or req.ext_fields.get("properties") or ""
                    metrics.on_put(topic, props, append.msg_num, append.wrote_bytes)
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

    # --- CONSUMER_SEND_MSG_BACK (send_back.py) ---------------------------------------------
    async def process_send_back(self, req: RemotingCommand, channel: Channel) -> RemotingCommand:
        return await consumer_send_msg_back(self.broker, req)


__all__ = ["SendAnswer", "SendMessageProcessor"]
