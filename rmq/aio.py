"""The client for asyncio code: Producer, PullConsumer, LitePullConsumer, PushConsumer, Admin.

    import asyncio
    from rmq import Message
    from rmq.aio import Producer

    async def main():
        async with Producer("pg", "127.0.0.1:9876") as p:
            print(await p.send(Message("TopicTest", b"hello")))

    asyncio.run(main())

Same names, arguments and results as the Trio clients (`rmq.Producer` ...); every method that
is a coroutine there is a coroutine here (tests/rmq/test_public_signatures.py holds them equal).

Theory of operation (the bridge):

* What runs where. The real clients are the Trio ones. They run on the process-wide Trio
  "portal" thread of `rmq.sync` (one daemon thread running `trio.run`, started on first use).
  Each asyncio call hands its coroutine to that thread with `Portal.submit`, which starts
  it as a portal task at once without blocking the asyncio loop, and returns a
  `concurrent.futures.Future`; the asyncio side awaits it through `asyncio.wrap_future`.
  Connections, long polls, heartbeats and offset commits therefore all live on the portal
  thread; the asyncio loop only waits for results. Several asyncio loops (or threads) may
  use the bridge at once: each call is its own portal task.
* `async with` opens the Trio client in a "holder" task of the portal (a nursery must be
  entered and left by one task) and `__aexit__` releases it and awaits its exit, so
  connections and background tasks are closed when the `async with` ends.
* Errors propagate as themselves: the portal task's exception is set on the future and
  re-raised by `await` in the asyncio task (single-exception groups unwrapped), so
  `except MessageIllegalError` or `exc.retriable` work as on Trio.
* Cancellation propagates both ways. Cancelling the awaiting asyncio task (e.g.
  `asyncio.wait_for` timing out) cancels the wrapped future, whose done-callback cancels the
  portal task's cancel scope: the request is abandoned on the Trio side too. A portal task
  cancelled from the Trio side (shutdown) cancels the future, which raises
  `asyncio.CancelledError` in the awaiting task.
* Listeners. A PushConsumer listener here is an `async def` (or plain) function of the
  asyncio program; the Trio consumer calls a shim that schedules it on the caller's loop
  (the loop running at `register_listener`) with `asyncio.run_coroutine_threadsafe` and
  waits for it without blocking the portal; its return value (ConsumeStatus / None) or
  exception goes back to the consumer exactly as if a Trio listener had returned/raised.
  If the Trio side gives up on a call (shutdown), the asyncio coroutine is cancelled.
* `Producer.send_async(msg, on_result, on_error)` is the callback style on asyncio: the send
  becomes an asyncio task of the running loop and the callbacks run on that loop (plain
  functions or coroutines); `__aexit__` waits for sends still in flight.

Never use these from inside Trio (use `rmq` directly) and never block the asyncio loop
waiting for the portal: every call here is awaited.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any, Generic, ParamSpec, Self, TypeVar

import trio

from common.errors import RmqError
from common.message import MessageExt
from common.model import ClusterInfo, MessageQueue, PermName, TopicRouteData
from common.session_credentials import SessionCredentials
from rmq import admin as _admin
from rmq import lite_pull_consumer as _lite
from rmq import producer as _producer
from rmq import pull_consumer as _pull
from rmq import push_consumer as _push
from rmq import transaction_producer as _txn
from rmq.admin import QueueOffsets, StatsRow
from rmq.admin_api import (
    BrokerStatsData,
    ConsumeMessageDirectlyResult,
    ConsumerConnection,
    ConsumerRunningInfo,
    ConsumeStats,
    OffsetReset,
    ProducerInfo,
    QueueStats,
)
from rmq.consume_service import Listener
from rmq.errors import BrokerNotFoundError, ClientError, InvalidMessageError, NoRouteInfoError
from rmq.message import Message
from rmq.message_selector import MessageSelector
from rmq.portal import Lease, get_portal, hold, takes_arguments_of
from rmq.producer import MessageQueueSelector, SendResult, SendStatus
from rmq.pull_consumer import PullResult, PullStatus
from rmq.push_consumer import (
    ConsumeFromWhere,
    ConsumeStatus,
    MessageModel,
    OrderlyStatus,
    allocate_averagely,
)
from rmq.request_reply import create_reply_message
from rmq.trace.view import TraceView
from rmq.transaction_producer import LocalTransactionState, TransactionSendResult

log = logging.getLogger(__name__)

T = TypeVar("T")
P = ParamSpec("P")
# the Trio client a bridge object wraps
C = TypeVar("C", bound=AbstractAsyncContextManager[object])


async def _bridge(afn: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run the Trio coroutine function `afn` on the portal; await it from asyncio."""
    portal = get_portal()
    fut = portal.submit(functools.partial(afn, *args, **kwargs))
    return await asyncio.wrap_future(fut)


class _AioClient(Generic[C]):
    _async_cls: type[C]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._async: C = self._async_cls(*args, **kwargs)
        self._lease: Lease | None = None

    async def __aenter__(self) -> Self:
        if self._lease is not None:
            raise ClientError(f"{type(self).__name__} is already open")
        portal = get_portal()
        assert portal._nursery is not None
        self._lease = await _bridge(portal._nursery.start, hold, self._async)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        lease, self._lease = self._lease, None
        if lease is None:
            return
        portal = get_portal()
        portal.token.run_sync_soon(lease.release.set)
        await asyncio.shield(_bridge(lease.exited.wait))
        if lease.error is not None:
            raise lease.error

    async def _run(self, afn: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run the Trio client's coroutine method `afn` on the portal; await it from asyncio."""
        if self._lease is None:
            raise ClientError(f"{type(self).__name__} is not open: use `async with`")
        return await _bridge(afn, *args, **kwargs)


class Producer(_AioClient[_producer.Producer]):
    """asyncio twin of `rmq.Producer` (same constructor arguments)."""

    _async_cls = _producer.Producer

    @takes_arguments_of(_producer.Producer)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # send_async tasks not yet done; __aexit__ waits for them
        self._inflight: set[asyncio.Task[SendResult]] = set()

    @property
    def client_id(self) -> str:
        return self._async.client_id

    async def send(
        self,
        msg: Message,
        *,
        queue: MessageQueue | None = None,
        selector: MessageQueueSelector | None = None,
        arg: object = None,
        timeout: float | None = None,
    ) -> SendResult:
        return await self._run(
            self._async.send, msg, queue=queue, selector=selector, arg=arg, timeout=timeout
        )

    async def send_orderly(
        self, msg: Message, sharding_key: str, *, timeout: float | None = None
    ) -> SendResult:
        return await self._run(self._async.send_orderly, msg, sharding_key, timeout=timeout)

    async def request(self, msg: Message, timeout: float = 3.0) -> MessageExt:
        return await self._run(self._async.request, msg, timeout)

    async def send_batch(
        self,
        msgs: Iterable[Message],
        *,
        timeout: float | None = None,
        queue: MessageQueue | None = None,
    ) -> SendResult:
        return await self._run(self._async.send_batch, list(msgs), timeout=timeout, queue=queue)

    async def send_oneway(self, msg: Message, *, queue: MessageQueue | None = None) -> None:
        return await self._run(self._async.send_oneway, msg, queue=queue)

    def send_async(
        self,
        msg: Message,
        on_result: Callable[[SendResult], object],
        on_error: Callable[[BaseException], object] | None = None,
        *,
        timeout: float | None = None,
    ) -> asyncio.Task[SendResult]:
        """Start the send as a task of the running loop; callbacks run on that loop.

        Without `on_error` a failure stays in the returned task (await it to see it).
        """
        if self._lease is None:
            raise ClientError("Producer is not open: use `async with`")
        self._async._prepare(msg)  # invalid messages raise here, in the caller

        async def run() -> SendResult:
            try:
                result = await self.send(msg, timeout=timeout)
            except RmqError as exc:
                if on_error is not None:
                    await _maybe_await(on_error(exc))
                raise
            await _maybe_await(on_result(result))
            return result

        task = asyncio.get_running_loop().create_task(run())
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)
        return task

    async def __aexit__(self, *exc_info: object) -> None:
        if self._inflight:
            await asyncio.wait(list(self._inflight))
        await super().__aexit__(*exc_info)


class TransactionProducer(Producer):
    """asyncio twin of `rmq.TransactionProducer`: `execute_local` and `check_local` are
    functions or coroutine functions of the asyncio program, run on the caller's loop."""

    _async_cls = _txn.TransactionProducer
    _async: _txn.TransactionProducer

    @takes_arguments_of(_txn.TransactionProducer)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._execute_local = kwargs.pop("execute_local", None)
        self._check_local = kwargs.pop("check_local", None)
        super().__init__(*args, **kwargs)

    async def __aenter__(self) -> Self:
        if self._check_local is not None:
            self._async.check_local = _loop_call(self._check_local, asyncio.get_running_loop())
        return await super().__aenter__()

    async def send_in_transaction(
        self, msg: Message, arg: object = None, *, timeout: float | None = None
    ) -> TransactionSendResult:
        if self._execute_local is None:
            raise ClientError("send_in_transaction needs execute_local")
        sent = await self._run(self._async._send_half, msg, timeout=timeout)
        state, error = LocalTransactionState.ROLLBACK_MESSAGE, None
        if sent.status is SendStatus.SEND_OK:
            try:
                state = _txn.local_state(await _maybe_result(self._execute_local(msg, arg)))
            except Exception as exc:  # as the Trio producer: UNKNOW, the broker checks back
                state, error = LocalTransactionState.UNKNOW, exc
        await self._run(self._async._end_transaction, msg, sent, state, error)
        return _txn.transaction_result(sent, state)


def _loop_call(
    fn: Callable[[MessageExt], object], loop: asyncio.AbstractEventLoop
) -> Callable[[MessageExt], Awaitable[LocalTransactionState]]:
    """A Trio coroutine function that runs `fn(msg)` on the asyncio `loop` and waits."""
    listener = _loop_listener(lambda msgs: fn(msgs[0]), loop)

    async def call(msg: MessageExt) -> LocalTransactionState:
        return _txn.local_state(await listener([msg]))

    return call


async def _maybe_await(value: object) -> None:
    if inspect.isawaitable(value):
        await value


class PullConsumer(_AioClient[_pull.PullConsumer]):
    """asyncio twin of `rmq.PullConsumer`."""

    _async_cls = _pull.PullConsumer

    @takes_arguments_of(_pull.PullConsumer)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)

    @property
    def client_id(self) -> str:
        return self._async.client_id

    async def fetch_queues(self, topic: str) -> list[MessageQueue]:
        return await self._run(self._async.fetch_queues, topic)

    async def pull(
        self,
        mq: MessageQueue,
        offset: int,
        max_nums: int = 32,
        *,
        tags: str = "*",
        suspend: float = 0.0,
        timeout: float | None = None,
        selector: MessageSelector | None = None,
    ) -> PullResult:
        return await self._run(
            self._async.pull,
            mq,
            offset,
            max_nums,
            tags=tags,
            suspend=suspend,
            timeout=timeout,
            selector=selector,
        )

    async def check_selector(self, topic: str, selector: MessageSelector) -> None:
        return await self._run(self._async.check_selector, topic, selector)

    async def query_offset(self, mq: MessageQueue) -> int:
        return await self._run(self._async.query_offset, mq)

    async def commit_offset(self, mq: MessageQueue, offset: int) -> None:
        return await self._run(self._async.commit_offset, mq, offset)

    async def max_offset(self, mq: MessageQueue) -> int:
        return await self._run(self._async.max_offset, mq)

    async def min_offset(self, mq: MessageQueue) -> int:
        return await self._run(self._async.min_offset, mq)

    async def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        return await self._run(self._async.search_offset, mq, timestamp_ms)


class LitePullConsumer(_AioClient[_lite.LitePullConsumer]):
    """asyncio twin of `rmq.LitePullConsumer` (assign / seek / poll / commit)."""

    _async_cls = _lite.LitePullConsumer

    @takes_arguments_of(_lite.LitePullConsumer)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)

    async def fetch_queues(self, topic: str) -> list[MessageQueue]:
        return await self._run(self._async.fetch_queues, topic)

    def assign(self, mqs: Iterable[MessageQueue]) -> None:
        """Takes effect at once before `async with`; when open, on the portal (non-blocking:
        the next poll/seek is ordered after it, as both go through the same Trio token)."""
        mqs = list(mqs)
        for mq in mqs:
            if not isinstance(mq, MessageQueue):
                raise ClientError(f"assign wants MessageQueue objects, got {mq!r}")
        if self._lease is None:
            self._async.assign(mqs)
        else:
            get_portal().token.run_sync_soon(self._assign_on_portal, mqs)

    def _assign_on_portal(self, mqs: list[MessageQueue]) -> None:
        # runs as a Trio run_sync_soon callback, where an exception would kill the portal
        try:
            self._async.assign(mqs)
        except Exception:
            log.exception("assign(%s) failed", mqs)

    def assignment(self) -> frozenset[MessageQueue]:
        return self._async.assignment()

    def set_selector(self, topic: str, selector: str | MessageSelector) -> None:
        self._async.set_selector(topic, selector)

    async def seek(self, mq: MessageQueue, offset: int) -> None:
        return await self._run(self._async.seek, mq, offset)

    async def seek_to_begin(self, mq: MessageQueue) -> None:
        return await self._run(self._async.seek_to_begin, mq)

    async def seek_to_end(self, mq: MessageQueue) -> None:
        return await self._run(self._async.seek_to_end, mq)

    async def poll(self, timeout: float | None = None) -> list[MessageExt]:
        return await self._run(self._async.poll, timeout)

    async def commit(self) -> None:
        return await self._run(self._async.commit)

    async def committed(self, mq: MessageQueue) -> int:
        return await self._run(self._async.committed, mq)


def _loop_listener(
    fn: Callable[[list[MessageExt]], object], loop: asyncio.AbstractEventLoop
) -> Listener:
    """A Trio listener that runs `fn(msgs)` on the asyncio `loop` and waits for it."""

    async def on_loop(msgs: list[MessageExt]) -> object:
        return await _maybe_result(fn(msgs))

    async def listener(msgs: list[MessageExt]) -> object:
        fut = asyncio.run_coroutine_threadsafe(on_loop(msgs), loop)
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()
        fut.add_done_callback(lambda _f: token.run_sync_soon(done.set))
        try:
            await done.wait()
        except trio.Cancelled:
            fut.cancel()
            raise
        return fut.result()

    return listener


async def _maybe_result(value: object) -> object:
    if inspect.isawaitable(value):
        return await value
    return value


class PushConsumer(_AioClient[_push.PushConsumer]):
    """asyncio twin of `rmq.PushConsumer`; listeners run on the caller's asyncio loop."""

    _async_cls = _push.PushConsumer

    @takes_arguments_of(_push.PushConsumer)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)

    @property
    def client_id(self) -> str:
        return self._async.client_id

    def subscribe(self, topic: str, expression: str | MessageSelector = "*") -> None:
        self._async.subscribe(topic, expression)

    def register_listener(self, fn: Callable[[list[MessageExt]], object]) -> None:
        """`async def fn(msgs) -> ConsumeStatus | None`; call from inside the asyncio loop."""
        self._async.register_listener(_loop_listener(fn, asyncio.get_running_loop()))

    def register_orderly_listener(self, fn: Callable[[list[MessageExt]], object]) -> None:
        """`async def fn(msgs) -> OrderlyStatus | None`; call from inside the asyncio loop."""
        self._async.register_orderly_listener(_loop_listener(fn, asyncio.get_running_loop()))

    def assigned_queues(self) -> frozenset[MessageQueue]:
        return self._async.assigned_queues()


class Admin(_AioClient[_admin.Admin]):
    """asyncio twin of `rmq.Admin`."""

    _async_cls = _admin.Admin

    @takes_arguments_of(_admin.Admin)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)

    @property
    def client_id(self) -> str:
        return self._async.client_id

    async def cluster_info(self) -> ClusterInfo:
        return await self._run(self._async.cluster_info)

    async def topic_list(self) -> list[str]:
        return await self._run(self._async.topic_list)

    async def topic_route(self, topic: str) -> TopicRouteData:
        return await self._run(self._async.topic_route, topic)

    async def master_addrs(self, cluster: str | None = None) -> list[str]:
        return await self._run(self._async.master_addrs, cluster)

    async def create_topic(
        self,
        topic: str,
        *,
        queues: int = 8,
        cluster: str | None = None,
        broker_addr: str | None = None,
        perm: int = PermName.READ | PermName.WRITE,
        order: bool = False,
    ) -> list[str]:
        return await self._run(
            self._async.create_topic,
            topic,
            queues=queues,
            cluster=cluster,
            broker_addr=broker_addr,
            perm=perm,
            order=order,
        )

    async def max_offset(self, mq: MessageQueue) -> int:
        return await self._run(self._async.max_offset, mq)

    async def min_offset(self, mq: MessageQueue) -> int:
        return await self._run(self._async.min_offset, mq)

    async def consumer_offset(self, group: str, mq: MessageQueue) -> int:
        return await self._run(self._async.consumer_offset, group, mq)

    async def update_consumer_offset(self, group: str, mq: MessageQueue, offset: int) -> None:
        return await self._run(self._async.update_consumer_offset, group, mq, offset)

    async def topic_offsets(self, topic: str) -> list[QueueOffsets]:
        return await self._run(self._async.topic_offsets, topic)

    async def broker_runtime_info(self, addr: str) -> dict[str, str]:
        return await self._run(self._async.broker_runtime_info, addr)

    async def group_list(self, cluster: str | None = None) -> list[str]:
        return await self._run(self._async.group_list, cluster)

    async def offset_topics_by_group(
        self, cluster: str | None = None, *, topic: str | None = None
    ) -> dict[str, set[str]]:
        return await self._run(self._async.offset_topics_by_group, cluster, topic=topic)

    async def consume_stats(self, group: str, topic: str | None = None) -> ConsumeStats:
        return await self._run(self._async.consume_stats, group, topic)

    async def consumer_connections(self, group: str) -> list[ConsumerConnection]:
        return await self._run(self._async.consumer_connections, group)

    async def reset_offset(
        self, group: str, topic: str, timestamp: int, *, dry_run: bool = False
    ) -> list[OffsetReset]:
        return await self._run(self._async.reset_offset, group, topic, timestamp, dry_run=dry_run)

    async def consumer_status(
        self, group: str, topic: str, client_id: str | None = None
    ) -> dict[str, dict[MessageQueue, int]]:
        return await self._run(self._async.consumer_status, group, topic, client_id)

    async def consumer_running_info(
        self, group: str, client_id: str, *, jstack: bool = False
    ) -> ConsumerRunningInfo:
        return await self._run(self._async.consumer_running_info, group, client_id, jstack=jstack)

    async def consume_message_directly(
        self, group: str, client_id: str, msg_id: str
    ) -> ConsumeMessageDirectlyResult:
        return await self._run(self._async.consume_message_directly, group, client_id, msg_id)

    async def topic_stats(self, topic: str) -> list[QueueStats]:
        return await self._run(self._async.topic_stats, topic)

    async def delete_topic(self, topic: str, cluster: str | None = None) -> list[str]:
        return await self._run(self._async.delete_topic, topic, cluster)

    async def query_message_by_key(
        self, topic: str, key: str, max_num: int = 32
    ) -> list[MessageExt]:
        return await self._run(self._async.query_message_by_key, topic, key, max_num)

    async def view_message(self, msg_id: str, topic: str | None = None) -> MessageExt:
        return await self._run(self._async.view_message, msg_id, topic)

    async def query_trace(
        self, msg_id: str, trace_topic: str | None = None, max_num: int = 64
    ) -> list[TraceView]:
        return await self._run(self._async.query_trace, msg_id, trace_topic, max_num)

    async def message_at(self, mq: MessageQueue, offset: int) -> MessageExt:
        return await self._run(self._async.message_at, mq, offset)

    async def broker_config(self, addr: str) -> tuple[dict[str, str], str]:
        return await self._run(self._async.broker_config, addr)

    async def update_broker_config(
        self,
        props: dict[str, str],
        *,
        broker_addr: str | None = None,
        cluster: str | None = None,
    ) -> list[tuple[str, str | None]]:
        return await self._run(
            self._async.update_broker_config, props, broker_addr=broker_addr, cluster=cluster
        )

    async def producers(self, group: str | None = None) -> list[ProducerInfo]:
        return await self._run(self._async.producers, group)

    async def create_group(
        self,
        group: str,
        *,
        cluster: str | None = None,
        broker_addr: str | None = None,
        retry_max_times: int = 16,
        retry_queue_nums: int = 1,
        consume_broadcast: bool = True,
        consume_enable: bool = True,
        consume_message_orderly: bool = False,
    ) -> list[str]:
        return await self._run(
            self._async.create_group,
            group,
            cluster=cluster,
            broker_addr=broker_addr,
            retry_max_times=retry_max_times,
            retry_queue_nums=retry_queue_nums,
            consume_broadcast=consume_broadcast,
            consume_enable=consume_enable,
            consume_message_orderly=consume_message_orderly,
        )

    async def delete_group(
        self,
        group: str,
        *,
        cluster: str | None = None,
        broker_addr: str | None = None,
        remove_offset: bool = True,
    ) -> list[str]:
        return await self._run(
            self._async.delete_group,
            group,
            cluster=cluster,
            broker_addr=broker_addr,
            remove_offset=remove_offset,
        )

    async def write_perm(self, broker_name: str, *, wipe: bool) -> list[tuple[str, int]]:
        return await self._run(self._async.write_perm, broker_name, wipe=wipe)

    async def broker_stats(self, addr: str, name: str, key: str) -> BrokerStatsData | None:
        return await self._run(self._async.broker_stats, addr, name, key)

    async def stats_all(
        self, topic: str | None = None, *, include_system: bool = False
    ) -> list[StatsRow]:
        return await self._run(self._async.stats_all, topic, include_system=include_system)

    async def group_config(self, group: str) -> dict[str, Any] | None:
        return await self._run(self._async.group_config, group)


# Every public name of `rmq`: the clients above in their asyncio form, the rest as the same objects,
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
    "MessageSelector",
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
    "create_reply_message",
    "LocalTransactionState",
    "TransactionProducer",
    "TransactionSendResult",
]
