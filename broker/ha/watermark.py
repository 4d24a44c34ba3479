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

Invariants: ``value`` never decreases; every heap entry whose target is ``<= value`` has been
released (popped) before ``advance`` returns; a timed-out waiter leaves a dead entry that is
dropped when the watermark passes it or when dead entries outnumber live ones (so a slave that
never returns cannot grow the heap without bound).
"""

from __future__ import annotations

import heapq
import itertools

import attrs
import trio

from broker.store import PutMessageStatus


@attrs.define(eq=False)
class _Waiter:
    target: int
    event: trio.Event = attrs.field(factory=trio.Event)
    # the waiting task gave up (timeout/cancel); nobody will look at the event
    dead: bool = False


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
        while heap and heap[0][0] <= offset:
            _, _, w = heapq.heappop(heap)
            if w.dead:
                self._dead -= 1
            else:
                w.event.set()
                released += 1
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
        w = _Waiter(offset)
        heapq.heappush(self._heap, (offset, next(self._seq), w))
        try:
            with trio.move_on_after(timeout):
                await w.event.wait()
        finally:
            if not w.event.is_set():
                w.dead = True
                self._dead += 1
                self._prune()
        return PutMessageStatus.PUT_OK if w.event.is_set() else PutMessageStatus.FLUSH_SLAVE_TIMEOUT

    def _prune(self) -> None:
        if self._dead > 64 and self._dead * 2 > len(self._heap):
            self._heap = [e for e in self._heap if not e[2].dead]
            heapq.heapify(self._heap)
            self._dead = 0


__all__ = ["ReplicaWatermark"]
