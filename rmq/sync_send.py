"""The blocking producer's send path (Java's sendDefaultImpl in SYNC mode) without a thread hop.

Theory of operation
-------------------
`rmq.sync.Producer.send` (a plain send over TCP) calls :meth:`SyncSendPath.send`, which runs
on the caller's thread: it validates and encodes the message with the Trio producer's own
functions (`_prepare`, `_header`, `_request`, `_result`: the same bytes, the same checks), picks
the next queue of the topic's publish info, and sends over a
:class:`~rmq.blocking_remoting.BlockingChannel` to the queue's master. The topic's route is
fetched through the portal (`publish_info`, the masters' addresses) when it is unknown here or
older than the Trio client's `route_max_age`, so a steady sender crosses threads about once per
30 s. Two cases are handed, unsent, to the portal path (`Producer.send_prepared` in the Trio
thread, with what was prepared here, so the UNIQ_KEY stays):

* the message is near `maxMessageSize` (that check may need the route's cluster names);
* the connection to that master is in use by another thread.

After it sent, a failure is handed on the same way (the msgId survives the retry): a connection or
timeout error, or a retriable answer (SYSTEM_BUSY, ...), forgets the cached route and the
connection; the portal path retries with Java's policy, and waits out a failover within the
send timeout as `rmq.producer` describes; so does a route without a master here (so does a stored-but-not-OK answer
under `retry_another_broker_when_not_store_ok`). As in Java, a request that timed out may
have been stored: the retry can store it twice, never lose it. A non-retriable answer raises
here, as the portal path would.

Threads: the Trio producer's template table and the publish info's round-robin cursor are
touched from the caller's thread too; each touch is one dict or attribute operation (atomic
under the GIL), and a lost cursor increment only sends two messages to the same queue.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import attrs

from common.errors import RemotingError, RmqError
from common.model import MessageQueue
from rmq.blocking_remoting import BlockingChannel
from rmq.message import Message
from rmq.producer import _CLUSTER_NAME_ALLOWANCE, _UNSTORED, Producer, SendResult, SendStatus
from rmq.topic_publish_info import TopicPublishInfo

__all__ = ["SyncSendPath"]

# a blocking caller's way into the Trio thread: run this coroutine function there
RunInTrio = Callable[..., Any]


@attrs.define
class _Route:
    info: TopicPublishInfo
    masters: dict[str, str]  # brokerName -> master address
    expires: float  # time.monotonic()


async def _fetch_route(producer: Producer, topic: str) -> _Route:
    info = await producer.publish_info(topic)
    masters = {}
    for name in {mq.brokerName for mq in info.queues}:
        masters[name] = await producer.client.master_addr(name, topic)
    return _Route(info, masters, time.monotonic() + producer.client.route_max_age)


@attrs.define(eq=False)
class SyncSendPath:
    producer: Producer
    run_in_trio: RunInTrio
    _routes: dict[str, _Route] = attrs.field(factory=dict)
    _channels: dict[str, BlockingChannel] = attrs.field(factory=dict)
    _lock: threading.Lock = attrs.field(factory=threading.Lock)

    def send(self, msg: Message, timeout: float | None) -> SendResult:
        """Send ``msg`` directly if it can, else (or after a retriable failure) through the
        portal, with what was prepared here (see the module docstring)."""
        p = self.producer
        prepared = p._prepare(msg)
        timeout = p.send_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        result = None
        if len(prepared[0]) + _CLUSTER_NAME_ALLOWANCE <= p.max_message_size:
            result = self._try_direct(msg, prepared, deadline)
        if result is not None and (
            result.status is SendStatus.SEND_OK or not p.retry_another_broker_when_not_store_ok
        ):
            return result
        remaining = max(deadline - time.monotonic(), 0.001)
        sent: SendResult = self.run_in_trio(_send_prepared, p, msg, prepared, remaining)
        return sent

    def _try_direct(
        self, msg: Message, prepared: tuple[bytes, str, str], deadline: float
    ) -> SendResult | None:
        """The broker's answer, or None: nothing sent, or a failure the portal path retries."""
        p = self.producer
        body, props, uniq = prepared
        topic = msg.topic
        route = self._routes.get(topic)
        if route is None or time.monotonic() >= route.expires:
            try:
                route = self.run_in_trio(_fetch_route, p, topic)
            except _UNSTORED:
                return None  # no master now (a failover): the portal path waits for one
            self._routes[topic] = route
        mq = route.info.select_queue()
        addr = route.masters.get(mq.brokerName)
        channel = self._channel(addr) if addr is not None else None
        if channel is None or not channel.lock.acquire(blocking=False):
            return None
        flag = msg.flag

        def build(q: MessageQueue) -> tuple[dict[str, str], bytes]:
            return p._header(q, props, flag, batch=False), body

        try:
            cmd = p._request(mq, build)
            resp = channel.invoke(cmd, max(deadline - time.monotonic(), 0.001))
            return p._result(resp, cmd, mq, uniq)
        except RmqError as exc:
            if not (isinstance(exc, RemotingError) or exc.retriable):
                raise
            self._routes.pop(topic, None)
            return None
        finally:
            channel.lock.release()

    def _channel(self, addr: str) -> BlockingChannel:
        channel = self._channels.get(addr)
        if channel is None:
            with self._lock:
                channel = self._channels.setdefault(addr, BlockingChannel(addr))
        return channel

    def close(self) -> None:
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            with channel.lock:
                channel.close()


async def _send_prepared(
    p: Producer, msg: Message, prepared: tuple[bytes, str, str], timeout: float
) -> SendResult:
    return await p.send_prepared(msg, prepared, timeout=timeout)
