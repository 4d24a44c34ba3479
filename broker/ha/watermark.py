"""SYNC_MASTER replica waiters (RocketMQ ``GroupTransferService`` + ``HAService.isSlaveOK``).

Theory of operation
-------------------
``push2SlaveMaxOffset`` is the highest CommitLog offset any slave has acknowledged.  It only
grows (``advance`` ignores smaller values, like Java's CAS loop in ``notifyTransferSome``).

A SYNC_MASTER send that stored a message ending at physical offset ``end`` calls
``await wait_for(end, timeout)`` in its own request task:

* ``end <= push2SlaveMaxOffset`` already -> ``PUT_OK`` without suspending;
* no slave connected, or the master is ``haSlaveFallbehindMax`` (256 MiB) or more ahead of the
  watermark (``isSlaveOK`` false) -> ``SLAVE_NOT_AVAILABLE`` at once;
* else the task parks on an event held in a min-heap keyed by ``end``.  Each ack that raises the
  watermark pops and releases every waiter at or below it (group transfer: one ack, many sends),
  so there is no task and no polling per message; a waiter not released within ``timeout``
  (``slaveTimeout``, 3 s) answers ``FLUSH_SLAVE_TIMEOUT``.

The send path does not even park a task: :meth:`ReplicaWatermark.watch` takes a callback
instead, called with ``PUT_OK`` from ``advance`` (synchronously, in the task that read the
slave's ack) or with ``FLUSH_SLAVE_TIMEOUT`` by :meth:`ReplicaWatermark.run_expiry`, the one
task that keeps every watch's deadline.  A thousand SYNC_MASTER sends in flight are then a
thousand heap entries, not a thousand tasks with cancel scopes.

The deadlines are a FIFO (a deque kept in deadline order), not a heap: the send path watches
with one timeout (``slaveTimeout``), in the order it appended, so each new deadline is the
latest and each ack releases a prefix of the FIFO.  ``advance`` drops that released prefix at
once, while it is still in the cache.  Before, the released entries stayed in a deadline heap
until the expiry task next woke (up to ``slaveTimeout`` later): 3 s of sends, some 12,000
entries at 4,000 sends/s, which it then popped one ``heappop`` each, walking cold memory.
py-spy of the master at 32 in flight put 5.6 % of its samples in that loop and 2.3 % in
``watch`` (docs/benchmarks.md, "Send path against its floor").  A deadline out of order (a
changed timeout) is inserted in its place (``bisect.insort``, rare).

Invariants: ``value`` never decreases; every heap entry whose target is ``<= value`` has been
released (popped) before ``advance`` returns; a timed-out waiter leaves a dead entry that is
dropped when the watermark passes it or when dead entries outnumber live ones (so a slave that
never returns cannot grow the heap without bound); a waiter is told its outcome exactly once
(released or timed out, whichever comes first marks it done); the deadline FIFO is in
nondecreasing deadline order, and after ``advance`` its front entry (if any) is live.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import logging
from collections import deque
from collections.abc import Callable

import attrs
import trio

from broker.store import PutMessageStatus
from common.remoting.deferred_answer import flush_batch

log = logging.getLogger(__name__)


@attrs.define(eq=False)
class _Waiter:
    target: int
    event: trio.Event | None = None
    # watch(): told PUT_OK or FLUSH_SLAVE_TIMEOUT, once
    on_done: Callable[[PutMessageStatus], None] | None = None
    # the waiter gave up (timeout/cancel) or was told: nobody will look at it again
    dead: bool = False

    def release(self) -> None:
        if self.event is not None:
            self.event.set()
        elif self.on_done is not None:
            done, self.on_done = self.on_done, None
            try:
                done(PutMessageStatus.PUT_OK)
            except Exception:
                log.exception("a replica waiter's callback failed")


@attrs.define(eq=False)
class ReplicaWatermark:
    fallbehind_max: int = 256 * 1024 * 1024
    # push2SlaveMaxOffset: the largest offset acknowledged by any slave; only grows
    value: int = 0
    # number of connected slaves (the master's HA service keeps it current)
    connections: int = 0
    # (target, seq, waiter); every live waiter has target > value
    _heap: list[tuple[int, int, _Waiter]] = attrs.field(factory=list)
    _seq: itertools.count = attrs.field(factory=itertools.count)
    # entries in _heap whose waiter is dead
    _dead: int = 0
    # (deadline, seq, waiter) of every watch() still waiting, in deadline order (run_expiry's;
    # released entries at its front are dropped by advance)
    _deadlines: deque[tuple[float, int, _Waiter]] = attrs.field(factory=deque)
    # set when a watch may have moved the earliest deadline
    _new_deadline: trio.Event | None = None
    # when run_expiry wakes next (inf: only when a watch sets _new_deadline)
    _expiry_at: float = float("inf")

    @property
    def waiting(self) -> int:
        """Number of sends currently waiting for a slave."""
        return len(self._heap) - self._dead

    def advance(self, offset: int) -> int:
        """A slave acknowledged ``offset``: raise the watermark and release waiters; returns how
        many live waiters were released."""
        if offset <= self.value:
            return 0
        self.value = offset
        released = 0
        heap = self._heap
        if not heap or heap[0][0] > offset:
            return 0
        with flush_batch():  # their answers leave when the loop is done
            while heap and heap[0][0] <= offset:
                _, _, w = heapq.heappop(heap)
                if w.dead:
                    self._dead -= 1
                else:
                    w.dead = True  # told: its deadline entry is now dead too
                    w.release()
                    released += 1
        # the deadlines of the waiters just released (a prefix, in the usual order): drop them
        # now, so a send leaves nothing behind it (module doc)
        deadlines = self._deadlines
        while deadlines and deadlines[0][2].dead:
            deadlines.popleft()
        return released

    def is_slave_ok(self, master_max_offset: int) -> bool:
        """``HAService.isSlaveOK``: a slave is connected and not too far behind."""
        return self.connections > 0 and master_max_offset - self.value < self.fallbehind_max

    async def wait_for(
        self, offset: int, timeout: float, master_max_offset: int | None = None
    ) -> PutMessageStatus:
        """Wait until a slave acknowledged ``offset`` (see the module docstring)."""
        if offset <= self.value:
            return PutMessageStatus.PUT_OK
        if not self.is_slave_ok(offset if master_max_offset is None else master_max_offset):
            return PutMessageStatus.SLAVE_NOT_AVAILABLE
        event = trio.Event()
        w = _Waiter(offset, event=event)
        heapq.heappush(self._heap, (offset, next(self._seq), w))
        try:
            with trio.move_on_after(timeout):
                await event.wait()
        finally:
            if not event.is_set():
                w.dead = True
                self._dead += 1
                self._prune()
        return PutMessageStatus.PUT_OK if event.is_set() else PutMessageStatus.FLUSH_SLAVE_TIMEOUT

    def watch(
        self,
        offset: int,
        timeout: float,
        on_done: Callable[[PutMessageStatus], None],
        master_max_offset: int | None = None,
    ) -> PutMessageStatus | None:
        """``wait_for`` without a task: the status now if it is already decided, else None and
        ``on_done(status)`` later, once (from ``advance``, or ``run_expiry`` at the deadline)."""
        if offset <= self.value:
            return PutMessageStatus.PUT_OK
        if not self.is_slave_ok(offset if master_max_offset is None else master_max_offset):
            return PutMessageStatus.SLAVE_NOT_AVAILABLE
        w = _Waiter(offset, on_done=on_done)
        seq = next(self._seq)
        heapq.heappush(self._heap, (offset, seq, w))
        deadline = trio.current_time() + timeout
        if deadline < self._expiry_at and self._new_deadline is not None:
            # run_expiry sleeps past this deadline (or without one): wake it, once
            self._expiry_at = deadline
            self._new_deadline.set()
        deadlines = self._deadlines
        if not deadlines or deadlines[-1][0] <= deadline:
            deadlines.append((deadline, seq, w))
        else:
            bisect.insort(deadlines, (deadline, seq, w))
        return None

    async def run_expiry(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Time out the watches whose deadline passed (FLUSH_SLAVE_TIMEOUT); runs until cancelled."""
        task_status.started()
        deadlines = self._deadlines
        while True:
            now = trio.current_time()
            with flush_batch():
                while deadlines and (deadlines[0][0] <= now or deadlines[0][2].dead):
                    _, _, w = deadlines.popleft()
                    if w.dead:
                        continue  # released by an ack
                    w.dead = True
                    self._dead += 1
                    done, w.on_done = w.on_done, None
                    if done is not None:
                        try:
                            done(PutMessageStatus.FLUSH_SLAVE_TIMEOUT)
                        except Exception:
                            log.exception("a replica waiter's callback failed")
            self._prune()
            self._new_deadline = trio.Event()
            # a front released meanwhile only makes this wake early, once, to find nothing
            self._expiry_at = deadlines[0][0] if deadlines else float("inf")
            with trio.move_on_at(self._expiry_at):
                await self._new_deadline.wait()

    def _prune(self) -> None:
        if self._dead > 64 and self._dead * 2 > len(self._heap):
            self._heap = [e for e in self._heap if not e[2].dead]
            heapq.heapify(self._heap)
            self._dead = 0
        if len(self._deadlines) > 64 and len(self._deadlines) > 2 * len(self._heap):
            # watches released out of deadline order leave their entries behind; drop them in
            # bulk, in place (run_expiry holds the deque), keeping the order
            live = [e for e in self._deadlines if not e[2].dead]
            self._deadlines.clear()
            self._deadlines.extend(live)


__all__ = ["ReplicaWatermark"]
