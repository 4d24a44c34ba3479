"""What the broker asks of a message store (RocketMQ ``MessageStore``), as a Protocol.

Processors, the HA service, the schedule service, the slave sync and the pull hold service depend
on :class:`MessageStore`, never on a concrete store.  Two implementations keep it today, judged by
one conformance suite (``tests/broker/store/``): the file store (``DefaultMessageStore``, RocketMQ's
on-disk format) and the in-memory store of tests (``MemoryMessageStore``).  DLedger mode adds a
third (``broker/dledger/broker/message_store.py``) whose writes go through a Raft log; it keeps
this surface.

Contract, in words the type checker cannot hold:

* ``append_message(s)`` is synchronous: the record is in the CommitLog (and, with ASYNC_FLUSH and
  an idle reput, dispatched) when it returns, so processors that call it without an ``await``
  between receiving and appending store pipelined sends in arrival order.  An ``AwaitablePut`` is
  the rest (flush, dispatch; in DLedger mode the quorum commit and the apply) to await.
* offsets are RocketMQ's: physical offsets are CommitLog byte positions, queue offsets count
  ConsumeQueue units; ``get_max_offset_in_queue`` is one past the last unit.
* ``append_to_commit_log`` (a slave's HA path) accepts bytes only at exactly
  ``get_max_phy_offset()`` and answers False otherwise.  With ``wake_reput=False`` their dispatch
  waits for the caller's ``dispatch_appended()`` (a slave acknowledges first, then dispatches on
  the same turn); a caller that passes it must call that before its next ``await``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from broker.store.config import MessageStoreConfig
from broker.store.results import (
    AwaitablePut,
    GetMessageResult,
    MessageFilter,
    PutMessageResult,
    QueryMessageResult,
)
from broker.store.running_flags import RunningFlags
from common.message import MessageExt, MessageExtBrokerInner

# called with (topic, queue_id, logic offset, tags code) for each dispatched unit (long polls
# wake on it; the HA master learns of new bytes)
ArrivalListener = Callable[[str, int, int, int], None]

__all__ = ["ArrivalListener", "MessageStore"]


class MessageStore(Protocol):
    config: MessageStoreConfig
    # "ASYNC_MASTER" | "SYNC_MASTER" | "SLAVE"
    broker_role: str

    # --- writes -----------------------------------------------------------------------------
    def append_message(self, msg: MessageExtBrokerInner) -> PutMessageResult | AwaitablePut: ...

    def append_messages(
        self, msgs: list[MessageExtBrokerInner]
    ) -> PutMessageResult | AwaitablePut: ...

    async def put_message(self, msg: MessageExtBrokerInner) -> PutMessageResult: ...

    async def put_messages(self, msgs: list[MessageExtBrokerInner]) -> PutMessageResult: ...

    def append_to_commit_log(
        self, start_offset: int, data: bytes | memoryview, *, wake_reput: bool = True
    ) -> bool: ...

    def dispatch_appended(self) -> None: ...

    async def wait_dispatched(self, end: int | None = None) -> None: ...

    def add_arrival_listener(self, fn: ArrivalListener) -> None: ...

    def add_write_listener(self, fn: Callable[[], None]) -> None:
        """``fn()`` right after a put's bytes are in the CommitLog, before their dispatch."""

    def delete_topics(self, topics: Iterable[str]) -> None: ...

    # --- reads ------------------------------------------------------------------------------
    def get_message(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_msg_nums: int,
        message_filter: MessageFilter | None = None,
    ) -> GetMessageResult: ...

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int: ...

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int: ...

    def get_commit_log_offset_in_queue(self, topic: str, queue_id: int, cq_offset: int) -> int: ...

    # (commit log offset, size, tagsCode) of one consume queue unit; None outside the queue
    def get_queue_unit(
        self, topic: str, queue_id: int, cq_offset: int
    ) -> tuple[int, int, int] | None: ...

    def get_offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int: ...

    def get_earliest_message_time(self, topic: str, queue_id: int) -> int: ...

    def select_one_message_by_offset(
        self, phys_offset: int, size: int | None = None
    ) -> bytes | memoryview | None: ...

    # the record at ``phys_offset`` decoded (RocketMQ ``lookMessageByOffset``: send-back re-stores
    # it, admin stats read its store time); None when there is none or it does not decode
    def look_message_by_offset(
        self, phys_offset: int, size: int | None = None
    ) -> MessageExt | None: ...

    def query_message(
        self, topic: str, key: str, max_num: int, begin_ts: int, end_ts: int
    ) -> QueryMessageResult: ...

    def get_max_phy_offset(self) -> int: ...

    @property
    def flags(self) -> RunningFlags:
        """Why puts are refused now (running_flags.py): a full disk, a failed queue write."""
        ...

    def get_min_phy_offset(self) -> int: ...

    def get_commit_log_data(self, offset: int) -> memoryview | None: ...

    @property
    def dispatch_behind_bytes(self) -> int: ...

    def topic_queues(self) -> dict[str, list[int]]: ...

    def runtime_info(self) -> dict[str, str]: ...
