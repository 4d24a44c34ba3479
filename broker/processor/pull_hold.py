"""Long polling: PULL requests parked until a message arrives (RocketMQ ``PullRequestHoldService``).

Theory of operation
-------------------
A push consumer pulls with the SUSPEND flag and a suspend timeout (15 s).  When the queue has
nothing new, RocketMQ parks the request and re-runs it when ``ReputMessageService`` reports an
arrival for that (topic, queue) or when the timeout passes; the re-run is not allowed to park
again, so it answers whatever it finds (usually PULL_NOT_FOUND on timeout).

Here "parking" is just awaiting: :meth:`PullRequestHoldService.park` registers a waiter (an
Event plus the offset it waits beyond and the subscription filter) under the (topic, queue) key,
synchronously, and :meth:`wait_parked` waits on it under ``move_on_after(timeout)`` and always
unregisters it (:meth:`wait_for_arrival` does both).  The PULL handler runs inline in the
connection's read loop, parks in the same synchronous step in which it saw the empty queue, and
leaves the waiting to a task.  The store's arrival listener calls :meth:`notify_message_arriving`
synchronously after the consume queue was extended; it sets the Event of every waiter whose
offset is now behind the queue's max offset and whose filter accepts the arriving tags code.  No
polling, no lost wake-ups: an arrival between the check and the wait finds the waiter parked.

The delay-level scheduler (``broker/schedule.py``) waits on its SCHEDULE_TOPIC_XXXX queues
through the same object.
"""

from __future__ import annotations

import math

import attrs
import trio

from broker.store.results import MessageFilter


@attrs.define(eq=False)
class _Waiter:
    offset: int  # woken once the queue's max offset is > this
    message_filter: MessageFilter | None
    event: trio.Event = attrs.field(factory=trio.Event)


@attrs.frozen
class ParkedPull:
    """A waiter registered by :meth:`PullRequestHoldService.park`."""

    topic: str
    queue_id: int
    waiter: _Waiter


@attrs.define(eq=False)
class PullRequestHoldService:
    # (topic, queueId) -> parked waiters; an entry is removed by its own waiter when it stops
    # waiting (woken, timed out or cancelled), and the key when its list becomes empty
    _waiters: dict[tuple[str, int], list[_Waiter]] = attrs.field(factory=dict, init=False)

    def waiting_count(self, topic: str | None = None, queue_id: int | None = None) -> int:
        if topic is None:
            return sum(len(v) for v in self._waiters.values())
        return len(self._waiters.get((topic, queue_id if queue_id is not None else 0), ()))

    def notify_message_arriving(
        self, topic: str, queue_id: int, max_offset: int, tags_code: int | None = None
    ) -> None:
        """Store arrival listener: ``max_offset`` is the queue's new next offset."""
        waiters = self._waiters.get((topic, queue_id))
        if not waiters:
            return
        for w in waiters:
            if w.event.is_set() or max_offset <= w.offset:
                continue
            if (
                tags_code is not None
                and w.message_filter is not None
                and not w.message_filter.is_matched_by_consume_queue(tags_code)
            ):
                continue
            w.event.set()

    def wake_all(self) -> None:
        """Release every parked request (they re-run their pull), e.g. on a role change."""
        for waiters in self._waiters.values():
            for w in waiters:
                w.event.set()

    def park(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        message_filter: MessageFilter | None = None,
    ) -> ParkedPull:
        """Register a waiter now; the caller must then ``await wait_parked(...)`` on it."""
        w = _Waiter(offset, message_filter)
        self._waiters.setdefault((topic, queue_id), []).append(w)
        return ParkedPull(topic, queue_id, w)

    async def wait_parked(self, parked: ParkedPull, timeout: float) -> bool:
        """Wait until the parked waiter is woken (True) or ``timeout`` passes; unregisters it."""
        w = parked.waiter
        try:
            with trio.move_on_after(timeout if timeout >= 0 else math.inf):
                await w.event.wait()
        finally:
            key = (parked.topic, parked.queue_id)
            lst = self._waiters.get(key)
            if lst is not None and w in lst:
                lst.remove(w)
                if not lst:
                    del self._waiters[key]
        return w.event.is_set()

    async def wait_for_arrival(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        timeout: float,
        message_filter: MessageFilter | None = None,
    ) -> bool:
        """Wait until a matching message lands beyond ``offset``; False on timeout."""
        return await self.wait_parked(self.park(topic, queue_id, offset, message_filter), timeout)
