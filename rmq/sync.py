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
Every public method of the async clients has a twin here with the same parameters and result
(a coroutine there, a blocking call here; tests/rmq/test_public_signatures.py holds them equal),
so type checkers and editors see what each call takes and returns.

Do not call these from inside a Trio task (that would block the event loop); use the async
clients there.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any, Generic, ParamSpec, Self, TypeVar, TypeVarTuple

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
from rmq.portal import Lease, get_portal, takes_arguments_of
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
from rmq.sync_send import SyncSendPath
from rmq.trace.view import TraceView
from rmq.transaction_producer import LocalTransactionState, TransactionSendResult

log = logging.getLogger(__name__)

T = TypeVar("T")
P = ParamSpec("P")
Ts = TypeVarTuple("Ts")
# the Trio client a bridge object wraps
C = TypeVar("C", bound=AbstractAsyncContextManager[object])


class _SyncClient(Generic[C]):
    _async_cls: type[C]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._async: C = self._async_cls(*args, **kwargs)
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

    def _run(self, afn: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run the Trio client's coroutine method `afn` on the portal and wait for it."""
        if self._lease is None:
            raise ClientError(f"{type(self).__name__} is not open: use `with` or open()")
        return get_portal().run(functools.partial(afn, *args, **kwargs))


class Producer(_SyncClient[_producer.Producer]):
    """Blocking twin of `rmq.Producer` (same constructor arguments)."""

    _async_cls = _producer.Producer

    @takes_arguments_of(_producer.Producer)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # send_async futures not yet done; close() waits for them
        self._inflight: set[concurrent.futures.Future[SendResult]] = set()
        self._inflight_lock = threading.Lock()
        # plain sends run on the caller's thread when they can (no portal hop: sync_send.py)
        self._direct = SyncSendPath(self._async, self._run)

    @property
    def client_id(self) -> str:
        return self._async.client_id

    def send(
        self,
        msg: Message,
        *,
        queue: MessageQueue | None = None,
        selector: MessageQueueSelector | None = None,
        arg: object = None,
        timeout: float | None = None,
    ) -> SendResult:
        if (
            queue is None
            and selector is None
            and self._lease is not None
            and self._async.over_tcp
            and not self._async.enable_trace  # the trace records are written in the portal
        ):
            return self._direct.send(msg, timeout)
        return self._run(
            self._async.send, msg, queue=queue, selector=selector, arg=arg, timeout=timeout
        )

    def send_orderly(
        self, msg: Message, sharding_key: str, *, timeout: float | None = None
    ) -> SendResult:
        return self._run(self._async.send_orderly, msg, sharding_key, timeout=timeout)

    def request(self, msg: Message, timeout: float = 3.0) -> MessageExt:
        return self._run(self._async.request, msg, timeout)

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
        return self._run(self._async.send_batch, list(msgs), timeout=timeout, queue=queue)

    def send_oneway(self, msg: Message, *, queue: MessageQueue | None = None) -> None:
        return self._run(self._async.send_oneway, msg, queue=queue)


class TransactionProducer(Producer):
    """Blocking twin of `rmq.TransactionProducer`: `execute_local` runs in the calling thread,
    `check_local` (the broker's check-back) in a worker thread; both plain functions."""

    _async_cls = _txn.TransactionProducer
    _async: _txn.TransactionProducer

    @takes_arguments_of(_txn.TransactionProducer)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._execute_local = kwargs.pop("execute_local", None)
        check = kwargs.pop("check_local", None)
        if check is not None:
            kwargs["check_local"] = functools.partial(trio.to_thread.run_sync, check)
        super().__init__(*args, **kwargs)

    def send_in_transaction(
        self, msg: Message, arg: object = None, *, timeout: float | None = None
    ) -> TransactionSendResult:
        if self._execute_local is None:
            raise ClientError("send_in_transaction needs execute_local")
        sent = self._run(self._async._send_half, msg, timeout=timeout)
        state, error = LocalTransactionState.ROLLBACK_MESSAGE, None
        if sent.status is SendStatus.SEND_OK:
            try:
                state = _txn.local_state(self._execute_local(msg, arg))
            except Exception as exc:  # as the Trio producer: UNKNOW, the broker checks back
                state, error = LocalTransactionState.UNKNOW, exc
        self._run(self._async._end_transaction, msg, sent, state, error)
        return _txn.transaction_result(sent, state)


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


class PullConsumer(_SyncClient[_pull.PullConsumer]):
    """Blocking twin of `rmq.PullConsumer`."""

    _async_cls = _pull.PullConsumer

    @takes_arguments_of(_pull.PullConsumer)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)

    @property
    def client_id(self) -> str:
        return self._async.client_id

    def fetch_queues(self, topic: str) -> list[MessageQueue]:
        return self._run(self._async.fetch_queues, topic)

    def pull(
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
        return self._run(
            self._async.pull,
            mq,
            offset,
            max_nums,
            tags=tags,
            suspend=suspend,
            timeout=timeout,
            selector=selector,
        )

    def check_selector(self, topic: str, selector: MessageSelector) -> None:
        return self._run(self._async.check_selector, topic, selector)

    def query_offset(self, mq: MessageQueue) -> int:
        return self._run(self._async.query_offset, mq)

    def commit_offset(self, mq: MessageQueue, offset: int) -> None:
        return self._run(self._async.commit_offset, mq, offset)

    def max_offset(self, mq: MessageQueue) -> int:
        return self._run(self._async.max_offset, mq)

    def min_offset(self, mq: MessageQueue) -> int:
        return self._run(self._async.min_offset, mq)

    def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        return self._run(self._async.search_offset, mq, timestamp_ms)


class LitePullConsumer(_SyncClient[_lite.LitePullConsumer]):
    """Blocking twin of `rmq.LitePullConsumer` (assign / seek / poll / commit)."""

    _async_cls = _lite.LitePullConsumer

    @takes_arguments_of(_lite.LitePullConsumer)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)

    def fetch_queues(self, topic: str) -> list[MessageQueue]:
        return self._run(self._async.fetch_queues, topic)

    def assign(self, mqs: Iterable[MessageQueue]) -> None:
        # assign starts prefetch tasks in the consumer's nursery: run it on the portal
        mqs = list(mqs)
        if self._lease is None:
            self._async.assign(mqs)
        else:
            get_portal().run(_run_sync_in_trio, self._async.assign, mqs)

    def assignment(self) -> frozenset[MessageQueue]:
        return self._async.assignment()

    def set_selector(self, topic: str, selector: str | MessageSelector) -> None:
        self._async.set_selector(topic, selector)

    def seek(self, mq: MessageQueue, offset: int) -> None:
        return self._run(self._async.seek, mq, offset)

    def seek_to_begin(self, mq: MessageQueue) -> None:
        return self._run(self._async.seek_to_begin, mq)

    def seek_to_end(self, mq: MessageQueue) -> None:
        return self._run(self._async.seek_to_end, mq)

    def poll(self, timeout: float | None = None) -> list[MessageExt]:
        return self._run(self._async.poll, timeout)

    def commit(self) -> None:
        return self._run(self._async.commit)

    def committed(self, mq: MessageQueue) -> int:
        return self._run(self._async.committed, mq)


async def _run_sync_in_trio(fn: Callable[[*Ts], T], *args: *Ts) -> T:
    return fn(*args)


def _thread_listener(fn: Callable[[list[MessageExt]], object]) -> Listener:
    """A Trio listener that runs the plain function `fn` in a worker thread."""

    async def listener(msgs: list[MessageExt]) -> object:
        return await trio.to_thread.run_sync(fn, msgs)

    return listener


class PushConsumer(_SyncClient[_push.PushConsumer]):
    """Blocking twin of `rmq.PushConsumer`: subscribe, register a plain-function listener,
    then `with consumer:` consumes in the background until the block ends."""

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
        """`fn(msgs) -> ConsumeStatus | None`, called in a worker thread."""
        self._async.register_listener(_thread_listener(fn))

    def register_orderly_listener(self, fn: Callable[[list[MessageExt]], object]) -> None:
        """`fn(msgs) -> OrderlyStatus | None`, called in a worker thread."""
        self._async.register_orderly_listener(_thread_listener(fn))

    def assigned_queues(self) -> frozenset[MessageQueue]:
        return self._async.assigned_queues()


class Admin(_SyncClient[_admin.Admin]):
    """Blocking twin of `rmq.Admin`."""

    _async_cls = _admin.Admin

    @takes_arguments_of(_admin.Admin)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)

    @property
    def client_id(self) -> str:
        return self._async.client_id

    def cluster_info(self) -> ClusterInfo:
        return self._run(self._async.cluster_info)

    def topic_list(self) -> list[str]:
        return self._run(self._async.topic_list)

    def topic_route(self, topic: str) -> TopicRouteData:
        return self._run(self._async.topic_route, topic)

    def master_addrs(self, cluster: str | None = None) -> list[str]:
        return self._run(self._async.master_addrs, cluster)

    def create_topic(
        self,
        topic: str,
        *,
        queues: int = 8,
        cluster: str | None = None,
        broker_addr: str | None = None,
        perm: int = PermName.READ | PermName.WRITE,
        order: bool = False,
    ) -> list[str]:
        return self._run(
            self._async.create_topic,
            topic,
            queues=queues,
            cluster=cluster,
            broker_addr=broker_addr,
            perm=perm,
            order=order,
        )

    def max_offset(self, mq: MessageQueue) -> int:
        return self._run(self._async.max_offset, mq)

    def min_offset(self, mq: MessageQueue) -> int:
        return self._run(self._async.min_offset, mq)

    def consumer_offset(self, group: str, mq: MessageQueue) -> int:
        return self._run(self._async.consumer_offset, group, mq)

    def update_consumer_offset(self, group: str, mq: MessageQueue, offset: int) -> None:
        return self._run(self._async.update_consumer_offset, group, mq, offset)

    def topic_offsets(self, topic: str) -> list[QueueOffsets]:
        return self._run(self._async.topic_offsets, topic)

    def broker_runtime_info(self, addr: str) -> dict[str, str]:
        return self._run(self._async.broker_runtime_info, addr)

    def group_list(self, cluster: str | None = None) -> list[str]:
        return self._run(self._async.group_list, cluster)

    def offset_topics_by_group(
        self, cluster: str | None = None, *, topic: str | None = None
    ) -> dict[str, set[str]]:
        return self._run(self._async.offset_topics_by_group, cluster, topic=topic)

    def consume_stats(self, group: str, topic: str | None = None) -> ConsumeStats:
        return self._run(self._async.consume_stats, group, topic)

    def consumer_connections(self, group: str) -> list[ConsumerConnection]:
        return self._run(self._async.consumer_connections, group)

    def reset_offset(
        self, group: str, topic: str, timestamp: int, *, dry_run: bool = False
    ) -> list[OffsetReset]:
        return self._run(self._async.reset_offset, group, topic, timestamp, dry_run=dry_run)

    def consumer_status(
        self, group: str, topic: str, client_id: str | None = None
    ) -> dict[str, dict[MessageQueue, int]]:
        return self._run(self._async.consumer_status, group, topic, client_id)

    def consumer_running_info(
        self, group: str, client_id: str, *, jstack: bool = False
    ) -> ConsumerRunningInfo:
        return self._run(self._async.consumer_running_info, group, client_id, jstack=jstack)

    def consume_message_directly(
        self, group: str, client_id: str, msg_id: str
    ) -> ConsumeMessageDirectlyResult:
        return self._run(self._async.consume_message_directly, group, client_id, msg_id)

    def topic_stats(self, topic: str) -> list[QueueStats]:
        return self._run(self._async.topic_stats, topic)

    def delete_topic(self, topic: str, cluster: str | None = None) -> list[str]:
        return self._run(self._async.delete_topic, topic, cluster)

    def query_message_by_key(self, topic: str, key: str, max_num: int = 32) -> list[MessageExt]:
        return self._run(self._async.query_message_by_key, topic, key, max_num)

    def view_message(self, msg_id: str, topic: str | None = None) -> MessageExt:
        return self._run(self._async.view_message, msg_id, topic)

    def query_trace(
        self, msg_id: str, trace_topic: str | None = None, max_num: int = 64
    ) -> list[TraceView]:
        return self._run(self._async.query_trace, msg_id, trace_topic, max_num)

    def message_at(self, mq: MessageQueue, offset: int) -> MessageExt:
        return self._run(self._async.message_at, mq, offset)

    def broker_config(self, addr: str) -> tuple[dict[str, str], str]:
        return self._run(self._async.broker_config, addr)

    def update_broker_config(
        self,
        props: dict[str, str],
        *,
        broker_addr: str | None = None,
        cluster: str | None = None,
    ) -> list[tuple[str, str | None]]:
        return self._run(
            self._async.update_broker_config, props, broker_addr=broker_addr, cluster=cluster
        )

    def producers(self, group: str | None = None) -> list[ProducerInfo]:
        return self._run(self._async.producers, group)

    def create_group(
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
        return self._run(
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

    def delete_group(
        self,
        group: str,
        *,
        cluster: str | None = None,
        broker_addr: str | None = None,
        remove_offset: bool = True,
    ) -> list[str]:
        return self._run(
            self._async.delete_group,
            group,
            cluster=cluster,
            broker_addr=broker_addr,
            remove_offset=remove_offset,
        )

    def write_perm(self, broker_name: str, *, wipe: bool) -> list[tuple[str, int]]:
        return self._run(self._async.write_perm, broker_name, wipe=wipe)

    def broker_stats(self, addr: str, name: str, key: str) -> BrokerStatsData | None:
        return self._run(self._async.broker_stats, addr, name, key)

    def stats_all(
        self, topic: str | None = None, *, include_system: bool = False
    ) -> list[StatsRow]:
        return self._run(self._async.stats_all, topic, include_system=include_system)

    def group_config(self, group: str) -> dict[str, Any] | None:
        return self._run(self._async.group_config, group)


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
