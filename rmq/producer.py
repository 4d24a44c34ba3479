"""Producer: send, send_batch, send_oneway (DefaultMQProducerImpl.sendDefaultImpl).

Theory of operation:

* Route: the topic's publish queues come from the nameserver route (cached up to 30 s, see
  `client_instance`). If the nameserver has no route for the topic, the producer takes the
  route of TBW102 (`create_topic_key`) with each broker's queue count capped at
  `default_topic_queue_nums` (4) and sends there: the broker creates the topic on the first
  message (autoCreateTopicEnable), exactly as the Java and C++ clients do. A route the
  nameserver has but without a writable master queue (a DLedger group between two leaders)
  fails the send with NoRouteInfoError, as in Java, and is not replaced by TBW102's.
* Sync send is at most 1 + `retry_times` attempts that reached a broker, all within ONE time
  budget `timeout` (the Java sendMsgTimeout: the deadline covers all attempts). An attempt
  that fails with a retriable error (transport errors, and response codes 17, 14, 1, 16, 204,
  205, see `common.errors`) is repeated on a queue of another broker if there is one, and the
  topic's route is dropped so the next attempt asks the nameserver again. Any other error is
  raised at once. The four "stored" codes (0, 10, 12, 11) become a SendResult with that
  SendStatus. As in Java, a request that timed out or whose connection dropped after it was
  written is retried too, so it may be stored twice (never lost).
* Riding through a failover (a DLedger leader change, about 1-2 s): the failures after which
  the message is certainly not stored (`_UNSTORED`: the route has no master for the topic,
  the broker's master address is unknown, no connection could be made, or the store answered
  SERVICE_NOT_AVAILABLE as a member that is not or not yet the leader does) do not use up an
  attempt. The master that failed is left out of this send (Java's latency fault tolerance,
  per send here) and the send goes to another broker at once if there is one; else it waits
  50 ms, then 100 ms, ... (never past the deadline), asks the nameserver again and retries,
  until the new leader is in the route or the send timeout runs out. A steady producer so sees
  latency, not errors. At the deadline the last of those errors is raised, by its class: a
  master/slave broker whose SYNC_MASTER master is down (no slave takes writes) still fails, after
  the timeout. Java's own producer retries these at once and gives up after 1 + retryTimes
  tries, so it surfaces them during a failover; waiting cannot store anything twice. A send to a
  chosen queue (`queue`, `selector`) waits the same way for that queue's broker (its order is
  kept: the queue never changes) but takes only one attempt that may have been stored. Not
  waited for: a nameserver that cannot be reached, a topic the nameserver does not know, and a
  topic with no writable queue at all (read-only): those are not a failover.
* The message id users see is the client-made UNIQ_KEY (`msg_id`); the broker's offset
  msgId is `offset_msg_id`. A UNIQ_KEY already in `msg.properties` is kept, so a caller can
  re-send a message under the same id.
* Batches go in one SEND_BATCH_MESSAGE (header m=true) with the body of
  `MessageDecoder.encodeMessages` (`common.batch_body`); every message gets its own UNIQ_KEY and
  the result's `msg_id` joins them with commas, like Java.
* Oneway: one attempt, no answer; only local errors (no route, refused connection) surface.
* Ordered sends: `send(msg, selector=fn, arg=x)` asks `fn(queues, msg, x)` for the queue
  (MessageQueueSelector); `send_orderly(msg, key)` is the hash selector
  (SelectMessageQueueByHash: |String.hashCode(key)| mod the queue count), so one key always
  lands on one queue while the route is unchanged. A selected send is one attempt within the
  timeout and is never moved to another queue (that would break the order), as in Java.
* `send` is the async send on Trio (an awaitable); `send_async(msg, on_result, on_error,
  nursery=n)` is the callback style of Java's send(msg, SendCallback): the send runs as a task
  of the caller's nursery, so it cannot outlive the scope that asked for it.
* With `retry_another_broker_when_not_store_ok` (Java's retryAnotherBrokerWhenNotStoreOK,
  default off) a stored-but-not-flushed answer (10/12/11) is sent again elsewhere while
  attempts remain; the last answer is returned.
* Per message the client only validates, makes the UNIQ_KEY and the properties string, and
  copies a header prepared once per queue (`_header`): the send path is CPU-bound.
* `enable_trace=True` (Java's enableMsgTrace): every send the broker answered hands a Pub
  record to the trace writer (rmq/trace/), which never makes the send wait; the records leave
  through a producer of their own (`open_trace_dispatcher`), as Java's trace producer.
* `request(msg, timeout)`: request-reply (rmq/request_reply.py); the broker pushes the reply
  to this client's connection, answered through the client's request-handler table.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

import trio

from common.errors import (
    RemotingConnectFailedError,
    RemotingTimeoutError,
    RmqError,
    ServiceNotAvailableError,
    TopicNotExistError,
)
from common.message import MessageExt
from common.message_properties import MessageConst
from common.model import MessageQueue, PermName, TopicRouteData
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand, stringify_fields
from common.remoting.network import Network
from common.session_credentials import SessionCredentials
from common.string_hash import java_string_hash
from rmq.client_api import ClientAPI, send_answer, send_code
from rmq.client_instance import ClientBase
from rmq.errors import (
    BrokerNotFoundError,
    InvalidMessageError,
    NoRouteInfoError,
    NoWritableMasterError,
    RequestTimeoutError,
)
from rmq.message import (
    Message,
    _body_bytes,
    _keys_str,
    _topic_problem,
    check_record_size,
    default_generator,
    encode_batch_body,
    record_size_bound,
    stored_batch_record_size,
    stored_record_size,
)
from rmq.remoting import Remoting
from rmq.request_reply import RequestFutureHolder, reply_topic
from rmq.send_result import SendResult, SendStatus
from rmq.topic_publish_info import (
    TopicPublishInfo,
    default_publish_info,
    publish_info_from_route,
)
from rmq.trace.dispatcher import MAX_MSG_SIZE, SEND_TIMEOUT, AsyncTraceDispatcher, running
from rmq.trace.encoder import GROUP_NAME_PREFIX, now_ms
from rmq.trace.hooks import SendTracer

T = TypeVar("T")

MAX_MESSAGE_SIZE = 4 * 1024 * 1024
# Cluster names are far shorter: a message this far under the limit needs no route to be sure
_CLUSTER_NAME_ALLOWANCE = 4096
_MAX_HEADER_TEMPLATES = 4096  # a producer writing to many topics starts over past this
_BATCH_PROPERTIES = "WAIT\x01true"  # encode_properties({"WAIT": "true"})
# Failures after which the message is certainly not stored: no master to send to, no
# connection made, or the store refused it (SERVICE_NOT_AVAILABLE: a member that is not, or
# not yet, the leader).  The send waits them out within its timeout (module docstring).
_UNSTORED = (
    NoWritableMasterError,
    BrokerNotFoundError,
    RemotingConnectFailedError,
    ServiceNotAvailableError,
)
_BACKOFF_FIRST = 0.05  # s before asking the nameserver again; doubles up to
_BACKOFF_MAX = 0.1


# keyed by int: a response's code is the wire's int, not always a ResponseCode member
_STATUS_BY_CODE: dict[int, SendStatus] = {
    ResponseCode.SUCCESS: SendStatus.SEND_OK,
    ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}


MessageQueueSelector = Callable[[list[MessageQueue], Message, object], MessageQueue]
# A send's request for the queue it goes to: (extFields, body).
_Build = Callable[[MessageQueue], tuple[dict[str, str], bytes]]


def select_by_hash(mqs: list[MessageQueue], msg: Message, arg: object) -> MessageQueue:
    """SelectMessageQueueByHash: |hashCode(arg)| mod len(mqs) (String.hashCode for a str)."""
    value = java_string_hash(arg) if isinstance(arg, str) else hash(arg)
    return mqs[abs(value) % len(mqs)]


class Producer(ClientBase):
    """`async with Producer("pg", "127.0.0.1:9876") as p: await p.send(Message(...))`."""

    def __init__(
        self,
        group: str = "DEFAULT_PRODUCER",
        namesrv: str | list[str] = "127.0.0.1:9876",
        *,
        remoting: Remoting | None = None,
        network: Network | None = None,
        credentials: SessionCredentials | None = None,
        send_timeout: float = 3.0,
        retry_times: int = 2,
        default_topic_queue_nums: int = 4,
        create_topic_key: str = "TBW102",
        max_message_size: int = MAX_MESSAGE_SIZE,
        route_max_age: float = 30.0,
        retry_another_broker_when_not_store_ok: bool = False,
        heartbeat_interval: float = 30.0,
        instance_name: str | None = None,
        enable_trace: bool = False,
        trace_topic: str | None = None,
    ) -> None:
        super().__init__(
            namesrv,
            remoting=remoting,
            network=network,
            timeout=send_timeout,
            route_max_age=route_max_age,
            heartbeat_interval=heartbeat_interval,
            instance_name=instance_name,
            credentials=credentials,
        )
        if not group:
            raise InvalidMessageError("producer group is empty")
        self.group = group
        self.send_timeout = send_timeout
        self.retry_times = retry_times
        self.default_topic_queue_nums = default_topic_queue_nums
        self.create_topic_key = create_topic_key
        self.max_message_size = max_message_size
        self.retry_another_broker_when_not_store_ok = retry_another_broker_when_not_store_ok
        # topic -> publish info; replaced when the client's cached route is refetched
        self._publish: dict[str, TopicPublishInfo] = {}
        # (topic, brokerName, queueId, batch) -> request header with str values and placeholders for the
        # per-message fields g (born timestamp), i (properties), h (flag); never mutated
        self._headers: dict[tuple[str, str, int, bool], dict[str, str]] = {}
        # message trace (Java's enableMsgTrace / customizedTraceTopic): a Pub record per send
        self.enable_trace = enable_trace
        self.trace_topic = trace_topic
        self._send_tracer: SendTracer | None = None
        # request() calls waiting for their reply, by correlation id
        self._replies = RequestFutureHolder()

    async def __aenter__(self) -> Producer:
        await super().__aenter__()
        # replies to request() are pushed to this client's connections
        self.client.register_request_handler(
            RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT, self._replies.handle_push
        )
        if self.enable_trace:
            try:
                dispatcher = await open_trace_dispatcher(self, "PRODUCE", self.trace_topic)
            except BaseException:
                await self.__aexit__(None, None, None)
                raise
            self._send_tracer = SendTracer(dispatcher, self.group)
        return self

    def heartbeat_producer_group(self) -> str | None:
        # As Java's MQClientInstance: brokers list the producer group (ProducerData in
        # HEART_BEAT every 30 s) and forget it on UNREGISTER_CLIENT when we close.
        return self.group

    # --- routes ----------------------------------------------------------------------------

    def _cached_publish_info(self, topic: str) -> TopicPublishInfo | None:
        """The publish info of `topic` while the route it came from is fresh, else None."""
        client = self.client
        old = self._publish.get(topic)
        if old is not None and client.cached_route(topic) is not None:
            return old
        if old is not None and old.from_default and client.cached_route(self.create_topic_key):
            return old
        return None

    def _forget_route(self, topic: str) -> None:
        """After a retriable failure: the next send asks the nameserver again, for the default
        (auto-create) route too when `topic`'s publish info came from it.  Otherwise that
        route, fresh for 30 s, keeps the info and the failed broker address in use, and sends
        fail for up to 30 s while a new leader (a DLedger failover) already serves."""
        client = self.client
        client.invalidate(topic)
        old = self._publish.get(topic)
        if old is not None and old.from_default:
            client.invalidate(self.create_topic_key)

    async def publish_info(self, topic: str) -> TopicPublishInfo:
        """Writable queues of `topic`; the auto-create topic's route when the nameserver has
        no route for `topic`."""
        client = self.client
        cached = self._cached_publish_info(topic)
        if cached is not None:
            return cached
        old = self._publish.get(topic)
        try:
            route = await client.fetch_route(topic)
        except TopicNotExistError:
            route = None
        if route is not None:
            # a route without a writable master queue (a DLedger group between two leaders)
            # is the answer, as in DefaultMQProducerImpl.tryToFindTopicPublishInfo: the
            # auto-create route is for topics the nameserver does not know.  Fetched a moment
            # after this one it can name a master this one lacked, and an info taken from it
            # stays in use while that route is fresh (_cached_publish_info)
            info = publish_info_from_route(topic, route)
            if not info.ok:
                raise _no_writable_queue(topic, route)
        else:
            try:
                default_route = await client.fetch_route(self.create_topic_key)
            except TopicNotExistError:
                raise NoRouteInfoError(topic, "and no auto-create route") from None
            info = default_publish_info(topic, default_route, self.default_topic_queue_nums)
            if not info.ok:
                raise _no_writable_queue(topic, default_route)
        self._publish[topic] = info.adopt_cursor(old)
        return info

    # --- sending ---------------------------------------------------------------------------

    async def send(
        self,
        msg: Message,
        *,
        queue: MessageQueue | None = None,
        selector: MessageQueueSelector | None = None,
        arg: object = None,
        timeout: float | None = None,
    ) -> SendResult:
        """Send and wait for the broker's answer; retries on another broker when retriable.

        With `queue`, the message goes to exactly that queue; with `selector`, to the queue
        `selector(queues, msg, arg)` picks (ordered messages). Either way it is one attempt,
        never moved to another queue, as Java's send(msg, mq) / send(msg, selector, arg).
        """
        prepared = self._prepare(msg)
        if selector is not None and queue is not None:
            raise InvalidMessageError("give either queue or selector, not both")
        if selector is not None:
            deadline = trio.current_time() + (self.send_timeout if timeout is None else timeout)
            queue = await self._select(msg, selector, arg, deadline)
            timeout = max(deadline - trio.current_time(), 0.001)
        body, props, uniq = prepared
        if (
            self._send_tracer is None
            and len(body) + _CLUSTER_NAME_ALLOWANCE <= self.max_message_size
        ):
            # send_prepared's usual case, without its coroutine: a frame less in the await
            # chain, which is resumed each time the send waits (a send's client CPU, issue 28)
            flag = msg.flag

            def build(mq: MessageQueue) -> tuple[dict[str, str], bytes]:
                return self._header(mq, props, flag, batch=False), body

            return await self._send(msg.topic, build, uniq, timeout, queue)
        return await self.send_prepared(msg, prepared, timeout=timeout, queue=queue)

    async def send_prepared(
        self,
        msg: Message,
        prepared: tuple[bytes, str, str],
        *,
        timeout: float | None = None,
        queue: MessageQueue | None = None,
    ) -> SendResult:
        """`send` of `_prepare(msg)`'s result (rmq.sync's fallback: the msgId is kept)."""
        body, props, uniq = prepared
        flag = msg.flag
        if len(body) + _CLUSTER_NAME_ALLOWANCE > self.max_message_size:
            await self._check_near_limit(
                msg.topic, stored_record_size(msg.topic, len(body), props, "")
            )

        def build(mq: MessageQueue) -> tuple[dict[str, str], bytes]:
            return self._header(mq, props, flag, batch=False), body

        tracer = self._send_tracer
        if tracer is None:
            return await self._send(msg.topic, build, uniq, timeout, queue)
        start = now_ms()
        result = await self._send(msg.topic, build, uniq, timeout, queue)
        broker = self.client.cached_master_addr(result.message_queue.brokerName)
        tracer.record(msg, result, broker or "", start)
        return result

    async def request(self, msg: Message, timeout: float = 3.0) -> MessageExt:
        """Send `msg` as a request and return its reply (RocketMQ 4.6+ request-reply).

        The consumer of `msg` answers with ``create_reply_message(msg, body)`` sent by any
        producer; the broker pushes that reply to this producer's connection. `timeout`
        covers the send and the wait; RequestTimeoutError when the request was stored but no
        reply came in time (see rmq/request_reply.py).
        """
        deadline = trio.current_time() + timeout
        correlation_id = str(uuid.uuid4())
        msg.properties = {
            **msg.properties,
            MessageConst.CORRELATION_ID: correlation_id,
            MessageConst.REPLY_TO_CLIENT: self.client_id,
            MessageConst.TTL: str(int(timeout * 1000)),
        }
        client = self.client
        if client.cached_route(msg.topic) is None:
            # the broker pushes the reply to the connection our heartbeat named: make sure
            # every broker of the route has it before the first request (Java does the same)
            await self.publish_info(msg.topic)
            route = client.cached_route(msg.topic) or client.cached_route(self.create_topic_key)
            # the reply goes to a broker of the reply topic, which may hold none of msg.topic
            for cluster in sorted({bd.cluster for bd in route.brokerDatas} if route else ()):
                with contextlib.suppress(RmqError):
                    await client.fetch_route(reply_topic(cluster))
            await client.send_heartbeat_to_all_brokers()
        waiting = self._replies.open(correlation_id)
        try:
            await self.send(msg, timeout=max(deadline - trio.current_time(), 0.001))
            with trio.move_on_at(deadline):
                await waiting.done.wait()
        finally:
            self._replies.close(correlation_id)
        if waiting.reply is None:
            raise RequestTimeoutError(
                f"send request message to <{msg.topic}> OK, but wait reply message timeout, "
                f"{int(timeout * 1000)} ms."
            )
        return waiting.reply

    async def send_orderly(
        self, msg: Message, sharding_key: str, *, timeout: float | None = None
    ) -> SendResult:
        """Same `sharding_key` -> same queue (SelectMessageQueueByHash); one attempt."""
        if not isinstance(sharding_key, str):
            raise InvalidMessageError("sharding_key must be a str")
        return await self.send(msg, selector=select_by_hash, arg=sharding_key, timeout=timeout)

    def send_async(
        self,
        msg: Message,
        on_result: Callable[[SendResult], object],
        on_error: Callable[[BaseException], object] | None = None,
        *,
        nursery: trio.Nursery,
        timeout: float | None = None,
    ) -> None:
        """Java's send(msg, SendCallback): start the send in `nursery` and return at once.

        `on_result(result)` or `on_error(exc)` is called from that task (either may be a plain
        function or a coroutine function). Without `on_error` a failure is raised into the
        nursery, so it is never lost. The message is validated here, before the task starts.
        """
        self._prepare(msg)  # raises InvalidMessageError in the caller, like Java's send

        async def task() -> None:
            try:
                result = await self.send(msg, timeout=timeout)
            except RmqError as exc:
                if on_error is None:
                    raise
                await _call_back(on_error, exc)
                return
            await _call_back(on_result, result)

        nursery.start_soon(task)

    async def _select(
        self, msg: Message, selector: MessageQueueSelector, arg: object, deadline: float
    ) -> MessageQueue:
        pause = _BACKOFF_FIRST
        while True:
            try:
                info = self._cached_publish_info(msg.topic) or await self.publish_info(msg.topic)
                break
            except NoWritableMasterError:
                # the selector needs the whole queue list: wait for a master as _send does
                if trio.current_time() + pause >= deadline:
                    raise
                await trio.sleep(pause)
                pause = min(pause * 2, _BACKOFF_MAX)
        mqs = list(info.queues)
        mq = selector(mqs, msg, arg)
        if not isinstance(mq, MessageQueue) or mq.topic != msg.topic:
            raise InvalidMessageError(f"selector returned {mq!r}, not a queue of {msg.topic}")
        return mq

    async def send_batch(
        self,
        msgs: Iterable[Message],
        *,
        timeout: float | None = None,
        queue: MessageQueue | None = None,
    ) -> SendResult:
        """Send messages of one topic in one request; they get consecutive queue offsets."""
        msgs = list(msgs)
        if not msgs:
            raise InvalidMessageError("batch is empty")
        topic = msgs[0].topic
        problem = _topic_problem(topic)
        if problem is not None:
            raise InvalidMessageError(problem)
        items = []
        stored = 0  # bytes of the records the broker will write, cluster names aside
        uniqs = default_generator().create_many(len(msgs))
        for i, m in enumerate(msgs):
            if m.topic != topic:
                raise InvalidMessageError("all messages of a batch must have the same topic")
            if m.delay_level or m.deliver_at is not None or m.delay is not None:
                raise InvalidMessageError("delayed messages cannot be sent in a batch")
            if not m.wait_store_ok:
                raise InvalidMessageError("batch messages must wait for the store (WAIT=true)")
            body, props, uniqs[i] = self._prepare(m, check_size=False, uniq=uniqs[i])
            items.append((m.flag, body, props))
            stored += stored_batch_record_size(topic, len(body), props, _BATCH_PROPERTIES, "")
        check_record_size(stored, self.max_message_size, "batch")
        await self._check_near_limit(topic, stored, len(msgs))
        body = encode_batch_body(items)
        uniq = ",".join(uniqs)
        # The broker appends the batch's properties to each message's: only WAIT, no UNIQ_KEY

        def build(mq: MessageQueue) -> tuple[dict[str, str], bytes]:
            return self._header(mq, _BATCH_PROPERTIES, 0, batch=True), body

        return await self._send(topic, build, uniq, timeout, queue)

    async def send_oneway(self, msg: Message, *, queue: MessageQueue | None = None) -> None:
        """Fire and forget: one attempt, no answer."""
        body, props, _uniq = self._prepare(msg)
        mq = queue or (await self.publish_info(msg.topic)).select_queue()
        addr = await self.client.master_addr(mq.brokerName, msg.topic)
        header = self._header(mq, props, msg.flag, batch=False)
        await self.client.api.send_message_oneway(addr, header, body)

    def _prepare(
        self, msg: Message, *, check_size: bool = True, uniq: str | None = None
    ) -> tuple[bytes, str, str]:
        """(body, header `i` properties string, UNIQ_KEY) of a message that passed validation."""
        # a field assigned after construction is not converted by the Message itself
        if msg.body.__class__ is not bytes:
            msg.body = _body_bytes(msg.body)
        if msg.keys is not None and msg.keys.__class__ is not str:
            msg.keys = _keys_str(msg.keys)
        msg.validate()
        props, uniq = msg.wire_properties_string(uniq or default_generator().create())
        # the record the broker stores, not the body, is what maxMessageSize limits; the
        # broker's cluster name is added in send() when the message is near the limit. The
        # exact size only when the bound from the lengths alone is over the limit: not for the
        # usual message, which saves its encoding on every send (issue 28)
        body_len = len(msg.body)
        if check_size and record_size_bound(msg.topic, body_len, props) > self.max_message_size:
            check_record_size(
                stored_record_size(msg.topic, body_len, props, ""), self.max_message_size
            )
        return msg.body, props, uniq

    async def _check_near_limit(self, topic: str, size: int, count: int = 1) -> None:
        """`size` (`count` records as stored without a cluster name) plus the CLUSTER value
        the topic's brokers add to each, against maxMessageSize; the route is needed only
        near the limit."""
        if size + count * _CLUSTER_NAME_ALLOWANCE <= self.max_message_size:
            return
        if self._cached_publish_info(topic) is None:
            await self.publish_info(topic)  # caches the route (or the auto-create topic's)
        client = self.client
        route = client.cached_route(topic) or client.cached_route(self.create_topic_key)
        brokers = route.brokerDatas if route is not None else []
        longest = max((len(bd.cluster.encode()) for bd in brokers), default=0)
        check_record_size(
            size + count * longest, self.max_message_size, "batch" if count > 1 else "message"
        )

    def _header(self, mq: MessageQueue, props: str, flag: int, *, batch: bool) -> dict[str, str]:
        """SendMessageRequestHeaderV2 for `mq`: a copy of the queue's prepared header (every
        value already the string the wire carries) with the per-message fields set."""
        key = (mq.topic, mq.brokerName, mq.queueId, batch)
        template = self._headers.get(key)
        if template is None:
            template = stringify_fields(
                ClientAPI.send_header(
                    group=self.group,
                    topic=mq.topic,
                    queue_id=mq.queueId,
                    properties={},
                    born_timestamp=0,
                    flag=0,
                    default_topic=self.create_topic_key,
                    default_topic_queue_nums=self.default_topic_queue_nums,
                    batch=batch,
                    broker_name=mq.brokerName,
                )
            )
            if len(self._headers) >= _MAX_HEADER_TEMPLATES:
                self._headers.clear()
            self._headers[key] = template
        header = template.copy()
        header["g"] = str(time.time_ns() // 1_000_000)
        header["i"] = props
        if flag:
            header["h"] = str(flag)
        return header

    async def _send(
        self,
        topic: str,
        build: _Build,
        uniq: str,
        timeout: float | None,
        queue: MessageQueue | None,
    ) -> SendResult:
        # The await chain of a send is kept short (send -> _send -> RemotingClient.invoke):
        # every frame in it is resumed again each time the request waits for the network.
        # The retry rules are in the module docstring ("Riding through a failover").
        timeout = self.send_timeout if timeout is None else timeout
        deadline = trio.current_time() + timeout
        client = self.client
        if queue is not None and queue.topic != topic:
            raise InvalidMessageError(f"queue {queue} is not of topic {topic}")
        # requests that reached a broker and may have been stored: Java's timesTotal
        attempts = 1 if queue is not None else 1 + max(0, self.retry_times)
        failed_addrs: set[str] = set()  # masters that refused this message: not stored
        last_broker: str | None = None  # where a possibly stored attempt went
        last_error: RmqError | None = None
        stored: SendResult | None = None
        pause = _BACKOFF_FIRST
        wait = refetch = False
        # kept across attempts, as Java's sendDefaultImpl keeps its TopicPublishInfo; taken
        # again from the nameserver after a failure that says the route is stale
        info: TopicPublishInfo | None = None
        while attempts > 0:
            if wait:
                await trio.sleep(min(pause, max(deadline - trio.current_time(), 0.0)))
                pause = min(pause * 2, _BACKOFF_MAX)
                failed_addrs.clear()  # a route fetched after the pause is the one to trust
                wait = False
            remaining = deadline - trio.current_time()
            if remaining <= 0:
                break
            mq = queue
            addr: str | None = None
            try:
                if mq is None:
                    if info is None or refetch:
                        info = self._cached_publish_info(topic) or await self.publish_info(topic)
                    if not failed_addrs and last_broker is None:
                        # nothing to avoid (every first attempt): the plain round robin, what
                        # select_queue_avoiding(set()) picks, without the sorted broker names
                        # and the sets on every send (a send's client CPU, issue 28)
                        mq = info.select_queue()
                    else:
                        faulty = {
                            name
                            for name in info.broker_names()
                            if client.cached_master_addr(name) in failed_addrs
                        }
                        avoid = faulty | ({last_broker} if last_broker is not None else set())
                        mq = info.select_queue_avoiding(avoid)
                        if mq is None and not faulty:
                            mq = info.select_queue(last_broker)  # one broker: the same again
                        if mq is None:
                            wait = True  # every master refused it: ask the nameserver soon
                            continue
                elif refetch:
                    await client.fetch_route(topic)
                refetch = False
                addr = client.cached_master_addr(mq.brokerName)
                if addr is None:
                    addr = await client.master_addr(mq.brokerName, mq.topic)
                if addr in failed_addrs:
                    wait = refetch = True  # a chosen queue waits for its broker's new master
                    continue
                cmd = self._request(mq, build)
                resp = await client.remoting.invoke(addr, cmd, remaining)
                result = self._result(resp, cmd, mq, uniq)
            except RmqError as exc:
                # a nameserver that cannot be reached is not a failover: Java's attempts
                unstored = isinstance(exc, _UNSTORED) and (
                    addr is not None
                    or isinstance(exc, (NoWritableMasterError, BrokerNotFoundError))
                )
                if not (exc.retriable or unstored):
                    raise
                last_error = exc
                self._forget_route(topic)
                if unstored:
                    if addr is not None:
                        failed_addrs.add(addr)
                    refetch = True
                    # no master named at all: only the nameserver can change that
                    wait = addr is None or queue is not None
                    continue
                attempts -= 1
                last_broker = mq.brokerName if mq is not None else None
                continue
            if (
                result.status is SendStatus.SEND_OK
                or not self.retry_another_broker_when_not_store_ok
            ):
                return result
            attempts -= 1
            last_broker, stored = mq.brokerName, result
        if stored is not None:
            return stored  # every attempt was stored but not flushed/replicated: say so
        if last_error is not None and (
            trio.current_time() < deadline or isinstance(last_error, _UNSTORED)
        ):
            raise last_error  # its cause, by class: e.g. still no master at the deadline
        detail = f"; last error: {last_error}" if last_error else ""
        raise RemotingTimeoutError(f"send to topic {topic} timed out after {timeout:g} s{detail}")

    def _request(self, mq: MessageQueue, build: _Build) -> RemotingCommand:
        header, body = build(mq)
        # the prepared header holds the wire strings already: it becomes extFields as it is
        return RemotingCommand(code=send_code(header), ext_fields=header, body=body)

    def _result(
        self, resp: RemotingCommand, req: RemotingCommand, mq: MessageQueue, uniq: str
    ) -> SendResult:
        # send_response's fields without its SendResponse: one object less per send (issue 28)
        code, offset_msg_id, queue_id, queue_offset, region_id, trace_on, transaction_id = (
            send_answer(resp, req.ext_fields)
        )
        return SendResult(
            status=_STATUS_BY_CODE[code],
            msg_id=uniq,
            offset_msg_id=offset_msg_id,
            # the queue sent to, which the broker names again (a frozen object: shared)
            message_queue=mq
            if queue_id == mq.queueId
            else MessageQueue(mq.topic, mq.brokerName, queue_id),
            queue_offset=queue_offset,
            region_id=region_id,
            transaction_id=transaction_id,
            trace_on=trace_on,
        )


def _no_writable_queue(topic: str, route: TopicRouteData) -> NoRouteInfoError:
    """NoWritableMasterError when a writable queue lacks only its master (a failover: worth
    waiting for), else the plain NoRouteInfoError (a read-only topic: raised at once)."""
    if any(PermName.is_writeable(qd.perm) for qd in route.queueDatas):
        return NoWritableMasterError(topic)
    return NoRouteInfoError(topic, "no writable master queue")


_trace_seq = itertools.count(1)


async def open_trace_dispatcher(
    owner: ClientBase, kind: str, topic: str | None
) -> AsyncTraceDispatcher:
    """Start `owner`'s trace writer: its own producer (group
    ``_INNER_TRACE_PRODUCER-<group>-<kind>-<n>`` as Java names it) and the dispatcher task,
    both closed with `owner` (the dispatcher first, so the last traces still leave)."""
    group = getattr(owner, "group", "")
    carrier = Producer(
        f"{GROUP_NAME_PREFIX}-{group}-{kind}-{next(_trace_seq)}",
        owner._namesrv_addrs,
        network=owner._network,
        credentials=owner._credentials,
        send_timeout=SEND_TIMEOUT,
        max_message_size=MAX_MSG_SIZE,
    )
    stack = owner._stack
    assert stack is not None
    await stack.enter_async_context(carrier)

    async def send(trace_topic: str, body: bytes, keys: Sequence[str]) -> None:
        await carrier.send(Message(trace_topic, body, keys=list(keys)))

    return await stack.enter_async_context(running(AsyncTraceDispatcher(send, topic)))


async def _call_back(fn: Callable[[T], object], value: T) -> None:
    out = fn(value)
    if inspect.isawaitable(out):
        await out
