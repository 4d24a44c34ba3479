"""The in-memory timer wheel and the roll window (RocketMQ 5 ``TimerWheel`` and
``timerRollWindowSlot``; here the wheel is in memory and holds only what is due soon).

Sans-I/O: the caller gives the times.  The wheel maps the ms at which a slot fires
(``transform.fire_ms``) to the entries of that slot.  The roll window decides what may enter
it (package doc, invariant 2):

* a timer record is *near* when it fires within the window of its own store time
  (``fire <= store + window``): the enqueue cursor puts it in the wheel when it reads it;
* any other is *far*: the far cursor looks at it once the window has passed since it was
  stored (``now >= store + window``); then it enters the wheel if it fires within the window
  from now, else it is *rolled*: re-put into the timer topic at once, with a new store time,
  to be looked at again one window later.  Between looks a far timer is only in the CommitLog.
"""

from __future__ import annotations

import enum
import heapq

import attrs


class FarAction(enum.Enum):
    WAIT = "not looked at yet"  # the window since its store time has not passed
    WHEEL = "enters the wheel"
    ROLL = "rolled into the timer topic"


def is_near(fire_ms: int, store_ms: int, window_ms: int) -> bool:
    return fire_ms <= store_ms + window_ms


def far_action(fire_ms: int, store_ms: int, now_ms: int, window_ms: int) -> FarAction:
    """What the far cursor does with a far timer now."""
    if now_ms < store_ms + window_ms:
        return FarAction.WAIT
    if fire_ms <= now_ms + window_ms:
        return FarAction.WHEEL
    return FarAction.ROLL


@attrs.frozen
class TimerEntry:
    """One timer record: where it is in the CommitLog and in the timer queue."""

    phys_offset: int
    size: int
    queue_offset: int
    fire_ms: int
    # re-put the record into the timer topic instead of delivering it
    roll: bool = False


@attrs.define
class TimerWheel:
    # fire ms -> entries of that slot, in the order added (timer-queue order)
    _slots: dict[int, list[TimerEntry]] = attrs.field(factory=dict)
    # fire ms of the slots (a popped slot is pruned when it reaches the top)
    _heap: list[int] = attrs.field(factory=list)
    size: int = 0

    def add(self, entry: TimerEntry) -> None:
        bucket = self._slots.get(entry.fire_ms)
        if bucket is None:
            self._slots[entry.fire_ms] = bucket = []
            heapq.heappush(self._heap, entry.fire_ms)
        bucket.append(entry)
        self.size += 1

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
