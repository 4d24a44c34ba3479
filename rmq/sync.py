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

`_Portal.submit` is the non-blocking form of `run`: it starts the coroutine as a task of the
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
import inspect
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any, Self, TypeVar, TypeVarTuple

import attrs
import trio

from common.errors import RmqError, unwrap_group
from common.message import MessageExt
from common.model import ClusterInfo, MessageQueue, TopicRouteData
from rmq import admin as _admin
from rmq import lite_pull_consumer as _lite
from rmq import producer as _producer
from rmq import pull_consumer as _pull
from rmq import push_consumer as _push
from rmq.admin import QueueOffsets
from rmq.consume_service import Listener
from rmq.errors import BrokerNotFoundError, ClientError, InvalidMessageError, NoRouteInfoError
from rmq.message import Message
from rmq.producer import SendResult, SendStatus
from rmq.pull_consumer import PullResult, PullStatus
from rmq.push_consumer import (
    ConsumeFromWhere,
    ConsumeStatus,
    MessageModel,
    OrderlyStatus,
    allocate_averagely,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


@attrs.define(eq=False)
class _Lease:
    value: Any
    release: trio.Event
    exited: trio.Event
    # set by the holder if leaving the `async with` raised
    error: BaseException | None = None


class _Portal:
    """A Trio loop in a daemon thread; `run` executes a coroutine function there."""

    def __init__(self) -> None:
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._thread = threading.Thread(target=self._main, name="rmq-sync-portal", daemon=True)
        self._thread.start()
        self._ready.wait()

    def _main(self) -> None:
        trio.run(self._amain)

    async def _amain(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._token = trio.lowlevel.current_trio_token()
            self._ready.set()
            await trio.sleep_forever()

    def run(self, afn: Callable[[*Ts], Awaitable[T]], *args: *Ts) -> T:
        try:
            return trio.from_thread.run(afn, *args, trio_token=self._token)
        except BaseExceptionGroup as group:
            inner = unwrap_group(group)
            if inner is group:
                raise
            raise inner from None

    @property
    def token(self) -> trio.lowlevel.TrioToken:
        assert self._token is not None
        return self._token

    def submit(
        self, afn: Callable[[*Ts], Awaitable[T]], *args: *Ts
    ) -> concurrent.futures.Future[T]:
        """Start `afn(*args)` as a portal task now; its outcome lands in the returned future.

        Never blocks (safe from an asyncio loop). Cancelling the future cancels the task; a
        task the portal itself cancels leaves the future cancelled, never pending forever.
        """
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        scope = trio.CancelScope()

        async def runner() -> None:
            try:
                with scope:
                    _settle(fut, result=await afn(*args))
            except Exception as exc:
                _settle(fut, error=unwrap_group(exc))
            finally:
                if not fut.done():
                    fut.cancel()

        def on_done(f: concurrent.futures.Future[T]) -> None:
            if f.cancelled():
                try:
                    self.token.run_sync_soon(scope.cancel)
                except trio.RunFinishedError:
                    pass

        fut.add_done_callback(on_done)
        assert self._nursery is not None
        self.token.run_sync_soon(self._nursery.start_soon, runner)
        return fut

    def enter(self, acm: AbstractAsyncContextManager[object]) -> _Lease:
        assert self._nursery is not None
        return self.run(self._nursery.start, _hold, acm)

    def exit(self, lease: _Lease) -> None:
        trio.from_thread.run_sync(lease.release.set, trio_token=self._token)
        self.run(lease.exited.wait)
        if lease.error is not None:
            raise lease.error


def _settle(
    fut: concurrent.futures.Future[Any],
    *,
    result: object = None,
    error: BaseException | None = None,
) -> None:
    """Complete `fut` unless its waiter cancelled it meanwhile (then the outcome is dropped)."""
    try:
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)
    except concurrent.futures.InvalidStateError:
        pass


async def _hold(
    acm: AbstractAsyncContextManager[object],
    task_status: trio.TaskStatus[_Lease] = trio.TASK_STATUS_IGNORED,
) -> None:
    lease: _Lease | None = None
    try:
        async with acm as value:
            lease = _Lease(value, trio.Event(), trio.Event())
            task_status.started(lease)
            await lease.release.wait()
    except Exception as exc:
        if lease is None:
            raise  # failed to open: nursery.start re-raises it in the caller
        lease.error = unwrap_group(exc)
    finally:
        if lease is not None:
            lease.exited.set()


_portal: _Portal | None = None
_portal_lock = threading.Lock()


def _get_portal() -> _Portal:
    global _portal
    with _portal_lock:
        if _portal is None:
            _portal = _Portal()
        return _portal


class _MirrorCoroutines:
    """Names a wrapper (sync here, asyncio in `rmq.aio`) does not define reach the wrapped
    Trio client: its coroutine methods through the wrapper's own `_call(name, ...)`, anything
    else as is. Shared so the two bridges cannot drift apart."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        value = getattr(self._async, name)
        if inspect.iscoroutinefunction(value):
            return functools.partial(self._call, name)
        return value


class _SyncClient:
    _async_cls: type

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._async = self._async_cls(*args, **kwargs)
        self._lease: _Lease | None = None

    def open(self) -> Self:
        if self._lease is not None:
            raise ClientError(f"{type(self).__name__} is already open")
        self._lease = _get_portal().enter(self._async)
        return self

    def close(self) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            _get_portal().exit(lease)

    def __enter__(self) -> Self:
        return self.open()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if self._lease is None:
            raise ClientError(f"{type(self).__name__} is not open: use `with` or open()")
        return _get_portal().run(functools.partial(getattr(self._async, name), *args, **kwargs))

    __getattr__ = _MirrorCoroutines.__getattr__


class Producer(_SyncClient):
    """Blocking twin of `rmq.Producer` (same constructor arguments)."""

    _async_cls = _producer.Producer

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # send_async futures not yet done; close() waits for them
        self._inflight: set[concurrent.futures.Future[SendResult]] = set()
        self._inflight_lock = threading.Lock()

    def send(
        self,
        msg: Message,
        *,
        queue: MessageQueue | None = None,
        selector: _producer.MessageQueueSelector | None = None,
        arg: object = None,
        timeout: float | None = None,
    ) -> SendResult:
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
        fut = _get_portal().submit(_send_then_call, self._async, msg, on_result, on_error, timeout)
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
        return self._call("pull", mq, offset, max_nums, tags=tags, suspend=suspend,
                          timeout=timeout)  # fmt: skip

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
            _get_portal().run(_run_sync_in_trio, self._async.assign, mqs)

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
    "allocate_averagely",
]
