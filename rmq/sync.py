"""Synchronous Producer, PullConsumer, LitePullConsumer, PushConsumer and Admin with the same
shape as the async ones.

    from rmq.sync import Producer
    from rmq import Message
    with Producer("pg", "127.0.0.1:9876") as p:
        print(p.send(Message("TopicTest", b"hello")))

Theory of operation (the choice): ONE dedicated daemon thread per process runs `trio.run`
forever (the "portal"), started on first use. Every blocking call hands its coroutine to that
loop with `trio.from_thread.run(..., trio_token=...)` and waits for the result, so exceptions
arrive in the caller's thread as themselves. We chose a thread running a real Trio loop over
`trio.lowlevel.start_guest_run` because guest mode needs a host event loop, which plain sync
code does not have.

The async clients are async context managers whose connections live in a nursery, and a
nursery must be entered and exited by the same task. So each sync object owns a "holder" task
in the portal: it enters `async with <async client>`, reports the opened client back, and
waits for a release event; `close()` sets the event and waits until the holder has left the
`async with`, re-raising anything the exit raised. Calls from several threads may share one
object: each becomes its own task in the portal, like concurrent tasks sharing the client.

`Portal.submit` is the non-blocking form of `run`: it starts the coroutine as a task of the
portal and returns a `concurrent.futures.Future`; cancelling that future cancels the task.
`rmq.aio` builds the asyncio bridge on it, and `Producer.send_async` uses it here.

Listeners: a sync PushConsumer listener is a plain function; the portal runs each call in a
worker thread (`trio.to_thread.run_sync`), so a slow listener never stalls the pulls.
Methods of the async clients without an explicit twin here (e.g. new Admin calls) are
reached through `__getattr__`: any coroutine method becomes a blocking one.

Do not call these from inside a Trio task (that would block the event loop); use the async
clients there.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any, Self, TypeVar, TypeVarTuple

import trio

from common.errors import RmqError
from common.message import MessageExt
from common.model import ClusterInfo, MessageQueue, TopicRouteData
from common.session_credentials import SessionCredentials
from rmq import admin as _admin
from rmq import lite_pull_consumer as _lite
from rmq import producer as _producer
from rmq import pull_consumer as _pull
from rmq import push_consumer as _push
from rmq.admin import QueueOffsets
from rmq.consume_service import Listener
from rmq.errors import BrokerNotFoundError, ClientError, InvalidMessageError, NoRouteInfoError
from rmq.message import Message
from rmq.portal import Lease, MirrorCoroutines, get_portal
from rmq.producer import SendResult, SendStatus
from rmq.pull_consumer import PullResult, PullStatus
from rmq.push_consumer import (
    ConsumeFromWhere,
    ConsumeStatus,
    MessageModel,
    OrderlyStatus,
    allocate_averagely,
)
from rmq.sync_send import SyncSendPath

log = logging.getLogger(__name__)

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class _SyncClient:
    _async_cls: type

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._async = self._async_cls(*args, **kwargs)
        self._lease: Lease | None = None

    def open(self) -> Self:
        if self._lease is not None:
            raise ClientError(f"{type(self).__name__} is already open")
        self._lease = get_portal().enter(self._async)
        return self

    def close(self) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            get_portal().exit(lease)

    def __enter__(self) -> Self:
        return self.open()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if self._lease is None:
            raise ClientError(f"{type(self).__name__} is not open: use `with` or open()")
        return get_portal().run(functools.partial(getattr(self._async, name), *args, **kwargs))

    __getattr__ = MirrorCoroutines.__getattr__


class Producer(_SyncClient):
    """Blocking twin of `rmq.Producer` (same constructor arguments)."""

    _async_cls = _producer.Producer

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # send_async futures not yet done; close() waits for them
        self._inflight: set[concurrent.futures.Future[SendResult]] = set()
        self._inflight_lock = threading.Lock()
        # plain sends run on the caller's thread when they can (no portal hop: sync_send.py)
        self._direct = SyncSendPath(self._async, self._run_in_trio)

    def _run_in_trio(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self._lease is None:
            raise ClientError("Producer is not open: use `with` or open()")
        return get_portal().run(functools.partial(fn, *args))

    def send(
        self,
        msg: Message,
        *,
        queue: MessageQueue | None = None,
        selector: _producer.MessageQueueSelector | None = None,
        arg: object = None,
        timeout: float | None = None,
    ) -> SendResult:
        if queue is None and selector is None and self._lease is not None and self._async.over_tcp:
            return self._direct.send(msg, timeout)
        return self._call("send", msg, queue=queue, selector=selector, arg=arg, timeout=timeout)

    def send_orderly(
        self, msg: Message, sharding_key: str, *, timeout: float | None = None
    ) -> SendResult:
        return self._call("send_orderly", msg, sharding_key, timeout=timeout)

    def send_async(
        self,
        msg: Message,
        on_result: Callable[[SendResult], object],
        on_error: Callable[[BaseException], object] | None = None,
        *,
        timeout: float | None = None,
    ) -> concurrent.futures.Future[SendResult]:
        """Start the send and return at once; the callback runs in a worker thread.

        Without `on_error` a failure is logged (there is no caller left to raise it to) and
        is in the returned future. `close()` waits for sends still in flight.
        """
        if self._lease is None:
            raise ClientError("Producer is not open: use `with` or open()")
        self._async._prepare(msg)  # invalid messages raise here, in the caller
        fut = get_portal().submit(_send_then_call, self._async, msg, on_result, on_error, timeout)
        with self._inflight_lock:
            self._inflight.add(fut)
        fut.add_done_callback(self._forget)
        return fut

    def _forget(self, fut: concurrent.futures.Future[SendResult]) -> None:
        with self._inflight_lock:
            self._inflight.discard(fut)

    def close(self) -> None:
        with self._inflight_lock:
            pending = list(self._inflight)
        concurrent.futures.wait(pending)
        self._direct.close()
        super().close()

    def send_batch(
        self,
        msgs: Iterable[Message],
        *,
        timeout: float | None = None,
        queue: MessageQueue | None = None,
    ) -> SendResult:
        return self._call("send_batch", list(msgs), timeout=timeout, queue=queue)

    def send_oneway(self, msg: Message, *, queue: MessageQueue | None = None) -> None:
        return self._call("send_oneway", msg, queue=queue)


class PullConsumer(_SyncClient):
    """Blocking twin of `rmq.PullConsumer`."""

    _async_cls = _pull.PullConsumer

    def fetch_queues(self, topic: str) -> list[MessageQueue]:
        return self._call("fetch_queues", topic)

    def pull(
        self,
        mq: MessageQueue,
        offset: int,
        max_nums: int = 32,
        *,
        tags: str = "*",
        suspend: float = 0.0,
        timeout: float | None = None,
    ) -> PullResult:
        return self._call("pull", mq, offset, max_nums, tags=tags, suspend=suspend, timeout=timeout)

    def query_offset(self, mq: MessageQueue) -> int:
        return self._call("query_offset", mq)

    def commit_offset(self, mq: MessageQueue, offset: int) -> None:
        return self._call("commit_offset", mq, offset)

    def max_offset(self, mq: MessageQueue) -> int:
        return self._call("max_offset", mq)

    def min_offset(self, mq: MessageQueue) -> int:
        return self._call("min_offset", mq)

    def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        return self._call("search_offset", mq, timestamp_ms)


async def _send_then_call(
    producer: _producer.Producer,
    msg: Message,
    on_result: Callable[[SendResult], object],
    on_error: Callable[[BaseException], object] | None,
    timeout: float | None,
) -> SendResult:
    try:
        result = await producer.send(msg, timeout=timeout)
    except RmqError as exc:
        if on_error is None:
            log.warning("send_async of a message to %s failed: %s", msg.topic, exc)
        else:
            await trio.to_thread.run_sync(on_error, exc)
        raise
    await trio.to_thread.run_sync(on_result, result)
    return result


class LitePullConsumer(_SyncClient):
    """Blocking twin of `rmq.LitePullConsumer` (assign / seek / poll / commit)."""

    _async_cls = _lite.LitePullConsumer

    def fetch_queues(self, topic: str) -> list[MessageQueue]:
        return self._call("fetch_queues", topic)

    def assign(self, mqs: Iterable[MessageQueue]) -> None:
        # assign starts prefetch tasks in the consumer's nursery: run it on the portal
        mqs = list(mqs)
        if self._lease is None:
            self._async.assign(mqs)
        else:
            get_portal().run(_run_sync_in_trio, self._async.assign, mqs)

    def assignment(self) -> frozenset[MessageQueue]:
        return self._async.assignment()

    def seek(self, mq: MessageQueue, offset: int) -> None:
        return self._call("seek", mq, offset)

    def seek_to_begin(self, mq: MessageQueue) -> None:
        return self._call("seek_to_begin", mq)

    def seek_to_end(self, mq: MessageQueue) -> None:
        return self._call("seek_to_end", mq)

    def poll(self, timeout: float | None = None) -> list[MessageExt]:
        return self._call("poll", timeout)

    def commit(self) -> None:
        return self._call("commit")

    def committed(self, mq: MessageQueue) -> int:
        return self._call("committed", mq)


async def _run_sync_in_trio(fn: Callable[[*Ts], T], *args: *Ts) -> T:
    return fn(*args)


def _thread_listener(fn: Callable[[list[MessageExt]], object]) -> Listener:
    """A Trio listener that runs the plain function `fn` in a worker thread."""

    async def listener(msgs: list[MessageExt]) -> object:
        return await trio.to_thread.run_sync(fn, msgs)

    return listener


class PushConsumer(_SyncClient):
    """Blocking twin of `rmq.PushConsumer`: subscribe, register a plain-function listener,
    then `with consumer:` consumes in the background until the block ends."""

    _async_cls = _push.PushConsumer

    def subscribe(self, topic: str, expression: str = "*") -> None:
        self._async.subscribe(topic, expression)

    def register_listener(self, fn: Callable[[list[MessageExt]], object]) -> None:
        """`fn(msgs) -> ConsumeStatus | None`, called in a worker thread."""
        self._async.register_listener(_thread_listener(fn))

    def register_orderly_listener(self, fn: Callable[[list[MessageExt]], object]) -> None:
        """`fn(msgs) -> OrderlyStatus | None`, called in a worker thread."""
        self._async.register_orderly_listener(_thread_listener(fn))

    def assigned_queues(self) -> frozenset[MessageQueue]:
        return self._async.assigned_queues()

    @property
    def client_id(self) -> str:
        return self._async.client_id


class Admin(_SyncClient):
    """Blocking twin of `rmq.Admin`."""

    _async_cls = _admin.Admin

    def create_topic(self, topic: str, **kwargs: Any) -> list[str]:
        return self._call("create_topic", topic, **kwargs)

    def topic_route(self, topic: str) -> TopicRouteData:
        return self._call("topic_route", topic)

    def cluster_info(self) -> ClusterInfo:
        return self._call("cluster_info")

    def topic_list(self) -> list[str]:
        return self._call("topic_list")

    def max_offset(self, mq: MessageQueue) -> int:
        return self._call("max_offset", mq)

    def min_offset(self, mq: MessageQueue) -> int:
        return self._call("min_offset", mq)

    def consumer_offset(self, group: str, mq: MessageQueue) -> int:
        return self._call("consumer_offset", group, mq)

    def update_consumer_offset(self, group: str, mq: MessageQueue, offset: int) -> None:
        return self._call("update_consumer_offset", group, mq, offset)

    def topic_offsets(self, topic: str) -> list[_admin.QueueOffsets]:
        return self._call("topic_offsets", topic)


# Every public name of `rmq`: the clients above in their blocking form, the rest as the same objects,
# so moving code between flavours is one import line (tests/rmq/test_mirror_names.py).
__all__ = [
    "Admin",
    "BrokerNotFoundError",
    "ClientError",
    "ConsumeFromWhere",
    "ConsumeStatus",
    "InvalidMessageError",
    "LitePullConsumer",
    "Message",
    "MessageExt",
    "MessageModel",
    "MessageQueue",
    "NoRouteInfoError",
    "OrderlyStatus",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "QueueOffsets",
    "SendResult",
    "SendStatus",
    "SessionCredentials",
    "allocate_averagely",
]
