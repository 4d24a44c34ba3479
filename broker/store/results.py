"""Outcomes of store operations: status enums and result values (RocketMQ store results).

Expected outcomes (an offset out of range, a flush that timed out) are statuses, not exceptions; the
broker maps them to response codes as ``broker/processor/SendMessageProcessor.java`` and
``PullMessageProcessor.java`` do.  ``GetMessageResult.buffers`` hold raw CommitLog records
(memoryviews into the mapped files for the file store), ready to be concatenated into a PULL body.
"""

from __future__ import annotations

import enum
from typing import Protocol

import attrs

# Bytes records are read from or copied into: a mapped file's view, an encoded put, an HA chunk.
Buffer = bytes | bytearray | memoryview
# A stored record as readers get it: a memoryview of a mapped file (file store) or a copy
# (in-memory store).
Record = bytes | memoryview


class PutMessageStatus(enum.Enum):
    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    CREATE_MAPEDFILE_FAILED = "CREATE_MAPEDFILE_FAILED"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    OS_PAGECACHE_BUSY = "OS_PAGECACHE_BUSY"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"


@attrs.frozen
class AppendMessageResult:
    wrote_offset: int  # physical offset of the (first) record
    wrote_bytes: int  # total bytes of the record(s)
    msg_id: str  # offset msgId; comma-joined for a batch
    store_timestamp: int
    logics_offset: int  # queue offset of the (first) message
    msg_num: int = 1


@attrs.frozen
class PutMessageResult:
    status: PutMessageStatus
    append: AppendMessageResult | None = None
    # Why it failed (for the response remark); None when PUT_OK.
    remark: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is PutMessageStatus.PUT_OK


class PutCompletion(Protocol):
    """What a :class:`PendingPut` waits on (the file store)."""

    async def wait_dispatched(self, end: int | None = None) -> None: ...

    async def wait_flushed(self, end: int) -> bool:
        """True once the CommitLog is on disk up to ``end``; False after sync_flush_timeout."""
        ...


class AwaitablePut(Protocol):
    """A put whose outcome is still to come: ``await wait()`` (once) gives the final result.

    What ``append_message(s)`` returns when it cannot answer at once: the file store's
    :class:`PendingPut` (flush, dispatch), the DLedger store's put waiting for the quorum
    commit and the apply (``broker/dledger/broker/message_store.py``).  Callers tell it from a final
    answer with ``isinstance(x, PutMessageResult)`` (a cheap class check on the send path)."""

    async def wait(self) -> PutMessageResult: ...


class PendingPut:
    """A put already appended to the CommitLog whose outcome waits on the store.

    ``store.append_message(s)`` returns one instead of a final :class:`PutMessageResult` when
    the records are not dispatched yet (reput is behind) or, under SYNC_FLUSH with WAIT
    true, until the group-commit flush covers them.  ``await wait()`` gives the final result:
    ``result`` itself, or FLUSH_DISK_TIMEOUT (the message is stored) when the flush did not
    come within ``sync_flush_timeout``.  Await it once.
    """

    __slots__ = ("_end", "_need_flush", "_store", "result")

    def __init__(self, store: PutCompletion, result: PutMessageResult, end: int, need_flush: bool):
        self._store = store
        self.result = result  # the append's PUT_OK result (offsets, msgId)
        self._end = end  # CommitLog offset just after the appended records
        self._need_flush = need_flush

    async def wait(self) -> PutMessageResult:
        store = self._store
        await store.wait_dispatched(self._end)
        if self._need_flush and not await store.wait_flushed(self._end):
            return PutMessageResult(
                PutMessageStatus.FLUSH_DISK_TIMEOUT, self.result.append, "flush disk timeout"
            )
        return self.result


class GetMessageStatus(enum.Enum):
    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


@attrs.frozen
class GetMessageResult:
    status: GetMessageStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    buffers: list[Record] = attrs.field(factory=list)  # raw records
    message_count: int = 0
    buffer_total_size: int = 0
    suggest_pulling_from_slave: bool = False
    # Queue offsets of the returned records (same order as buffers).
    queue_offsets: list[int] = attrs.field(factory=list)


@attrs.frozen
class QueryMessageResult:
    buffers: list[Record] = attrs.field(factory=list)  # raw records, ascending physical offset
    index_last_update_timestamp: int = 0
    index_last_update_phyoffset: int = 0

    @property
    def buffer_total_size(self) -> int:
        return sum(len(b) for b in self.buffers)


class MessageFilter(Protocol):
    """A pull's filter (RocketMQ ``MessageFilter``): by the ConsumeQueue unit's tags code first
    (tag subscriptions), then by the record itself (SQL92 subscriptions read its properties)."""

    def is_matched_by_consume_queue(self, tags_code: int) -> bool: ...

    def is_matched_by_commit_log(self, record: Record) -> bool: ...
