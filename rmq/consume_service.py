"""Running the user's listener over pulled messages (Java ConsumeMessageConcurrentlyService / ...OrderlyService).

Theory of operation
-------------------
Concurrent (`ConsumeMessageConcurrentlyService`): each pulled batch is cut into pieces of
`consume_batch_max_size` and each piece becomes a task in the consumer's nursery; a
`trio.CapacityLimiter(consume_concurrency)` bounds how many listener calls run at once (Java's
consume thread pool). The listener returns SUCCESS (or None) or RECONSUME_LATER; an exception
counts as RECONSUME_LATER and is logged. On RECONSUME_LATER in clustering mode each message is
sent back to the broker (CONSUMER_SEND_MSG_BACK, delay level 0 so the broker picks
3 + reconsumeTimes, and our max_reconsume_times so it goes to %DLQ%<group> past it). A message
the broker would not take back stays in the process queue and is consumed again here after
5 s (Java submitConsumeRequestLater). In broadcasting mode failures are logged and dropped.
Then the finished messages leave the ProcessQueue and the queue's offset becomes the smallest
offset still in flight; results for a dropped queue are not committed (its new owner goes on
from the persisted offset, so at worst a message is consumed twice, never lost).

Orderly (`ConsumeMessageOrderlyService`): one task per queue drains it in offset order, one
listener call at a time, holding the queue's `consume_lock`. In clustering mode the queue
must be locked on the broker (and the lock younger than 30 s); otherwise the task asks for the
lock again and waits. SUSPEND_CURRENT_QUEUE_A_MOMENT puts the messages back in front and
retries them after 1 s, counting reconsume times locally; a message that reached
max_reconsume_times is sent back with delay level -1, which the broker stores straight into
%DLQ%<group>, and the queue moves on (Java sends it to the retry topic past its limit, which
lands in the same place). The offset is committed after each successful call.

Messages pulled from %RETRY%<group> get their original topic back from the RETRY_TOPIC
property before the listener sees them (Java resetRetryAndNamespace).

With a `tracer` (the consumer's enable_trace), every listener call is framed by a SubBefore
and a SubAfter record (rmq/trace/hooks.py, Java's ConsumeMessageTraceHookImpl): success, and
how the call ended (returned, failed, raised) as ConsumeReturnType.
"""

from __future__ import annotations

import enum
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import trio

from common.message import MessageExt
from common.message_properties import MessageConst
from common.model import MessageQueue
from common.topics import RETRY_GROUP_TOPIC_PREFIX
from rmq.offset_store import OffsetStore
from rmq.process_queue import ProcessQueue
from rmq.rebalance import RebalanceImpl
from rmq.trace.encoder import ConsumeReturnType
from rmq.trace.hooks import ConsumeTracer

log = logging.getLogger(__name__)

SEND_BACK_RETRY_DELAY = 5.0  # Java submitConsumeRequestLater
SUSPEND_A_MOMENT = 1.0  # Java suspendCurrentQueueTimeMillis
LOCK_RETRY_DELAY = 3.0  # Java tryLockLaterAndReconsume (not locked yet)


class ConsumeStatus(enum.Enum):
    SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


class OrderlyStatus(enum.Enum):
    SUCCESS = "SUCCESS"
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"


# The user's listener, as the consumer calls it (sync and asyncio listeners are wrapped into
# one of these). What it returns is checked at run time: None, or the service's status enum.
Listener = Callable[[list[MessageExt]], Awaitable[object]]


class Consumer(Protocol):
    """What the consume services need of their push consumer."""

    # failed listener calls, counted here
    stats_failed: int

    @property
    def group(self) -> str: ...

    @property
    def consume_concurrency(self) -> int: ...

    @property
    def consume_batch_max_size(self) -> int: ...

    @property
    def max_reconsume_times(self) -> int: ...

    @property
    def broadcasting(self) -> bool: ...

    @property
    def offset_store(self) -> OffsetStore: ...

    @property
    def rebalance(self) -> RebalanceImpl: ...

    async def send_message_back(self, msg: MessageExt, delay_level: int, mq: MessageQueue) -> bool:
        """CONSUMER_SEND_MSG_BACK; False when the broker did not take the message."""
        ...


def reset_retry_topic(msgs: list[MessageExt], group: str) -> None:
    retry = RETRY_GROUP_TOPIC_PREFIX + group
    for m in msgs:
        original = m.properties.get(MessageConst.RETRY_TOPIC)
        if original and m.topic == retry:
            m.topic = original


_Status = TypeVar("_Status", ConsumeStatus, OrderlyStatus)


class _ConsumeService:
    """What both services share: the consumer, the user's listener and one traced call of it."""

    def __init__(
        self,
        consumer: Consumer,
        listener: Listener,
        nursery: trio.Nursery,
        tracer: ConsumeTracer | None = None,
    ) -> None:
        self.c = consumer
        self.listener = listener
        self.nursery = nursery
        self.tracer = tracer

    async def _call_listener(
        self, msgs: list[MessageExt], mq: MessageQueue, ok: _Status, failed: _Status
    ) -> _Status:
        """The listener's status: None is ``ok``; an exception or anything but a status of
        ``ok``'s kind is ``failed`` (the trace says which: EXCEPTION, or FAILED)."""
        tracer = self.tracer
        before = None if tracer is None else tracer.before(msgs)
        how = ConsumeReturnType.SUCCESS
        kind = type(ok)
        status: _Status
        try:
            returned = await self.listener(msgs)
        except Exception:
            log.exception("listener failed on %d message(s) of %s: %s", len(msgs), mq, failed.value)
            status, how = failed, ConsumeReturnType.EXCEPTION
        else:
            if returned is None:
                status = ok
            elif isinstance(returned, kind):
                status = returned
            else:
                log.warning(
                    "listener returned %r, not a %s: %s", returned, kind.__name__, failed.value
                )
                status = failed
        if status is not ok and how is ConsumeReturnType.SUCCESS:
            how = ConsumeReturnType.FAILED
        if tracer is not None and before is not None:
            tracer.after(before, len(msgs), status is ok, how)
        return status


class ConsumeMessageConcurrentlyService(_ConsumeService):
    @functools.cached_property
    def limiter(self) -> trio.CapacityLimiter:
        return trio.CapacityLimiter(self.c.consume_concurrency)

    def submit(self, msgs: list[MessageExt], pq: ProcessQueue, mq: MessageQueue) -> None:
        size = self.c.consume_batch_max_size
        for i in range(0, len(msgs), size):
            self.nursery.start_soon(self._consume, msgs[i : i + size], pq, mq)

    async def _consume(self, msgs: list[MessageExt], pq: ProcessQueue, mq: MessageQueue) -> None:
        async with self.limiter:
            if pq.dropped:
                return
            reset_retry_topic(msgs, self.c.group)
            status = await self._call_listener(
                msgs, mq, ConsumeStatus.SUCCESS, ConsumeStatus.RECONSUME_LATER
            )
        if pq.dropped:
            return  # the queue moved on: its new owner consumes from the persisted offset
        done = msgs
        if status is ConsumeStatus.RECONSUME_LATER:
            self.c.stats_failed += len(msgs)
            if self.c.broadcasting:
                for m in msgs:
                    log.warning("broadcasting: dropping failed message %s of %s", m.msg_id, mq)
            else:
                failed = [m for m in msgs if not await self.c.send_message_back(m, 0, mq)]
                if failed:
                    failed_ids = {id(m) for m in failed}
                    done = [m for m in msgs if id(m) not in failed_ids]
                    for m in failed:
                        m.reconsume_times += 1
                    self.nursery.start_soon(self._consume_later, failed, pq, mq)
        offset = pq.remove(done)
        if offset >= 0 and not pq.dropped:
            self.c.offset_store.update_offset(mq, offset, increase_only=True)

    async def _consume_later(
        self, msgs: list[MessageExt], pq: ProcessQueue, mq: MessageQueue
    ) -> None:
        await trio.sleep(SEND_BACK_RETRY_DELAY)
        await self._consume(msgs, pq, mq)


class ConsumeMessageOrderlyService(_ConsumeService):
    def submit(self, msgs: list[MessageExt], pq: ProcessQueue, mq: MessageQueue) -> None:
        if not pq.consuming_task:
            pq.consuming_task = True
            self.nursery.start_soon(self._consume_queue, pq, mq)

    async def _consume_queue(self, pq: ProcessQueue, mq: MessageQueue) -> None:
        try:
            await self._drain(pq, mq)
        finally:
            pq.consuming_task = False

    async def _drain(self, pq: ProcessQueue, mq: MessageQueue) -> None:
        c = self.c
        clustering = not c.broadcasting
        while not pq.dropped:
            if clustering and (not pq.locked or pq.lock_expired(trio.current_time())):
                if not await c.rebalance.lock(mq):
                    await trio.sleep(LOCK_RETRY_DELAY)
                    continue
            suspend = False
            async with pq.consume_lock:
                if pq.dropped:
                    return
                msgs = pq.take_messages(c.consume_batch_max_size)
                if not msgs:
                    return
                reset_retry_topic(msgs, c.group)
                status = await self._call_listener(
                    msgs, mq, OrderlyStatus.SUCCESS, OrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
                )
                if status is OrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT:
                    c.stats_failed += len(msgs)
                    again = await self._check_reconsume_times(msgs, mq)
                    if again:
                        suspend = True
                        for m in again:
                            m.reconsume_times += 1
                        # messages that went to the DLQ stay in `consuming`: committed with
                        # the next successful call, never before the retried ones
                        pq.make_messages_to_consume_again(again)
                if not suspend:
                    offset = pq.commit()
                    if offset >= 0 and not pq.dropped:
                        c.offset_store.update_offset(mq, offset, increase_only=False)
            if suspend:
                await trio.sleep(SUSPEND_A_MOMENT)

    async def _check_reconsume_times(
        self, msgs: list[MessageExt], mq: MessageQueue
    ) -> list[MessageExt]:
        """The messages to retry here; ones past max_reconsume_times go to the DLQ instead."""
        c = self.c
        again = []
        for m in msgs:
            if m.reconsume_times < c.max_reconsume_times:
                again.append(m)
            elif c.broadcasting:
                log.warning("broadcasting: dropping %s past max reconsume times", m.msg_id)
            elif not await c.send_message_back(m, -1, mq):
                again.append(m)  # the broker did not take it: keep trying here
        return again
