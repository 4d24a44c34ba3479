"""The in-memory timer wheel (RocketMQ 5 ``TimerWheel``, here over a window, not on disk).

Sans-I/O: the caller gives the time.  Entries are keyed by the ms at which their slot fires
(``transform.fire_ms``); one due beyond the window (``now + window_ms``) is put in the window's
last slot marked *roll*: when that fires, the service re-puts the record into the timer topic
instead of delivering it, and reads it back later, nearer its time (package doc, invariant 2).
"""

from __future__ import annotations

import heapq

import attrs


@attrs.frozen
class TimerEntry:
    """One timer record: where it is in the CommitLog and in the timer queue."""

    phys_offset: int
    size: int
    queue_offset: int
    fire_ms: int
    # fire at the window's end and roll the record back into the timer topic, not deliver it
    roll: bool = False


@attrs.define
class TimerWheel:
    precision_ms: int = 1000
    window_slots: int = 3600
    # fire ms -> entries of that slot, in the order added (timer-queue order)
    _slots: dict[int, list[TimerEntry]] = attrs.field(factory=dict)
    # fire ms of the slots (lazily pruned: a popped slot stays until it reaches the top)
    _heap: list[int] = attrs.field(factory=list)
    size: int = 0

    @property
    def window_ms(self) -> int:
        return self.window_slots * self.precision_ms

    def slot_for(self, fire_ms: int, now_ms: int) -> tuple[int, bool]:
        """The slot a timer firing at ``fire_ms`` goes in now, and whether it is a roll."""
        limit = (now_ms + self.window_ms) // self.precision_ms * self.precision_ms
        if fire_ms > limit:
            return limit, True
        return fire_ms, False

    def add(
        self, phys_offset: int, size: int, queue_offset: int, fire_ms: int, now_ms: int
    ) -> TimerEntry:
        slot, roll = self.slot_for(fire_ms, now_ms)
        entry = TimerEntry(phys_offset, size, queue_offset, slot, roll)
        bucket = self._slots.get(slot)
        if bucket is None:
            self._slots[slot] = bucket = []
            heapq.heappush(self._heap, slot)
        bucket.append(entry)
        self.size += 1
        return entry

    def next_fire_ms(self) -> int | None:
        while self._heap and self._heap[0] not in self._slots:
            heapq.heappop(self._heap)
        return self._heap[0] if self._heap else None

    def pop_due(self, now_ms: int) -> list[TimerEntry]:
        """Every entry whose slot fires at or before ``now_ms``, earliest slot first."""
        out: list[TimerEntry] = []
        while (first := self.next_fire_ms()) is not None and first <= now_ms:
            heapq.heappop(self._heap)
            out.extend(self._slots.pop(first))
        self.size -= len(out)
        return out

    def clear(self) -> None:
        self._slots.clear()
        self._heap.clear()
        self.size = 0
