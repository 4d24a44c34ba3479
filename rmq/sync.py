"""Synchronous Producer, PullConsumer and Admin with the same shape as the async ones.

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

Do not call these from inside a Trio task (that would block the event loop); use the async
clients there.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterable
from typing import Any

import attrs
import trio

from common.errors import unwrap_group
from common.message import MessageExt
from common.model import ClusterInfo, MessageQueue, TopicRouteData
from rmq import admin as _admin
from rmq import producer as _producer
from rmq import pull_consumer as _pull
from rmq.errors import ClientError
from rmq.message import Message
from rmq.producer import SendResult
from rmq.pull_consumer import PullResult


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

    def run(self, afn, *args) -> Any:
        try:
            return trio.from_thread.run(afn, *args, trio_token=self._token)
        except BaseExceptionGroup as group:
            inner = unwrap_group(group)
            if inner is group:
                raise
            raise inner from None

    def enter(self, acm) -> _Lease:
        assert self._nursery is not None
        return self.run(self._nursery.start, _hold, acm)

    def exit(self, lease: _Lease) -> None:
        trio.from_thread.run_sync(lease.release.set, trio_token=self._token)
        self.run(lease.exited.wait)
        if lease.error is not None:
            raise lease.error


async def _hold(acm, task_status=trio.TASK_STATUS_IGNORED) -> None:
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


class _SyncClient:
    _async_cls: type

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._async = self._async_cls(*args, **kwargs)
        self._lease: _Lease | None = None

    def open(self):
        if self._lease is not None:
            raise ClientError(f"{type(self).__name__} is already open")
        self._lease = _get_portal().enter(self._async)
        return self

    def close(self) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            _get_portal().exit(lease)

    def __enter__(self):
        return self.open()

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if self._lease is None:
            raise ClientError(f"{type(self).__name__} is not open: use `with` or open()")
        return _get_portal().run(functools.partial(getattr(self._async, name), *args, **kwargs))


class Producer(_SyncClient):
    """Blocking twin of `rmq.Producer` (same constructor arguments)."""

    _async_cls = _producer.Producer

    def send(
        self, msg: Message, *, timeout: float | None = None, queue: MessageQueue | None = None
    ) -> SendResult:
        return self._call("send", msg, timeout=timeout, queue=queue)

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


__all__ = ["Admin", "Message", "MessageExt", "Producer", "PullConsumer"]
