"""Broker statistics by name and key (RocketMQ ``BrokerStatsManager`` and its ``StatsItemSet``).

Theory of operation
-------------------
RocketMQ counts what a broker does in named sets (``TOPIC_PUT_NUMS`` keyed by topic,
``GROUP_GET_NUMS`` keyed by ``topic@group``, ``BROKER_PUT_NUMS`` keyed by cluster, ...), and
VIEW_BROKER_STATS_DATA (315) answers one key's minute, hour and day: the sum, the rate (tps) and
the average per increment (avgpt).  mqadmin ``statsAll`` reads TOPIC_PUT_NUMS and
GROUP_GET_NUMS; GET_CONSUME_STATS reports GROUP_GET_NUMS' minute rate as ``consumeTps``.

Java samples cumulative counters on timers (every 10 s, minute, hour) and divides differences.
We keep, per key, three rings of buckets instead: 60 one-second buckets, 60 one-minute buckets
and 24 one-hour buckets, each ``[start, sum, times]``; a window's numbers are the buckets still
inside it, the rate being the sum over the whole window length.  Increments are summed per
second first and reach the rings once a second (or when read), so a send pays two additions.
No sampling task runs, idle keys cost nothing, and time comes from the caller (Trio's clock in
the broker), so tests drive it with plain numbers.

Memory is bounded twice: a key holds at most 144 buckets, and a set at most ``max_keys`` keys;
past that the key updated longest ago is dropped (RocketMQ lets the sets grow, or deletes unused
items on a timer with ``autoDeleteUnusedStats``).
"""

from __future__ import annotations

import collections

import attrs

# names as RocketMQ's BrokerStatsManager spells them
TOPIC_PUT_NUMS = "TOPIC_PUT_NUMS"
TOPIC_PUT_SIZE = "TOPIC_PUT_SIZE"
GROUP_GET_NUMS = "GROUP_GET_NUMS"
GROUP_GET_SIZE = "GROUP_GET_SIZE"
SNDBCK_PUT_NUMS = "SNDBCK_PUT_NUMS"
BROKER_PUT_NUMS = "BROKER_PUT_NUMS"
BROKER_GET_NUMS = "BROKER_GET_NUMS"

STATS_NAMES = (
    TOPIC_PUT_NUMS,
    TOPIC_PUT_SIZE,
    GROUP_GET_NUMS,
    GROUP_GET_SIZE,
    SNDBCK_PUT_NUMS,
    BROKER_PUT_NUMS,
    BROKER_GET_NUMS,
)

MAX_KEYS = 4096


@attrs.frozen
class StatsSnapshot:
    sum: int
    tps: float
    avgpt: float


@attrs.define(eq=False)
class _Ring:
    """Buckets of ``span`` seconds, at most ``count`` of them: a window of span * count."""

    span: int
    count: int
    buckets: collections.deque[list[int]] = attrs.field(factory=collections.deque)

    def add(self, value: int, times: int, now: float) -> None:
        start = int(now) // self.span * self.span
        b = self.buckets
        if b and b[-1][0] == start:
            b[-1][1] += value
            b[-1][2] += times
            return
        b.append([start, value, times])
        self._trim(start)

    def _trim(self, start: int) -> None:
        oldest = start - self.span * self.count
        while self.buckets and self.buckets[0][0] <= oldest:
            self.buckets.popleft()

    def snapshot(self, now: float) -> StatsSnapshot:
        self._trim(int(now) // self.span * self.span)
        total = sum(b[1] for b in self.buckets)
        times = sum(b[2] for b in self.buckets)
        return StatsSnapshot(total, total / (self.span * self.count), total / times if times else 0)


@attrs.define(eq=False)
class StatsItem:
    minute: _Ring = attrs.field(factory=lambda: _Ring(1, 60))
    hour: _Ring = attrs.field(factory=lambda: _Ring(60, 60))
    day: _Ring = attrs.field(factory=lambda: _Ring(3600, 24))
    # the second being counted, and its sum and increments so far: the send path adds here
    # (two additions), the rings see each second once, when the next one starts or a
    # snapshot is taken
    _second: int = -1
    _sum: int = 0
    _times: int = 0

    def add(self, value: int, times: int, now: float) -> bool:
        """Count ``value``; True when this started a new second (the caller's LRU hint)."""
        second = int(now)
        if second == self._second:
            self._sum += value
            self._times += times
            return False
        self._flush()
        self._second, self._sum, self._times = second, value, times
        return True

    def _flush(self) -> None:
        if self._times or self._sum:
            for ring in (self.minute, self.hour, self.day):
                ring.add(self._sum, self._times, self._second)
            self._sum = self._times = 0

    def snapshot(self, window: str, now: float) -> StatsSnapshot:
        """``window``: "minute", "hour" or "day"."""
        self._flush()
        ring: _Ring = getattr(self, window)
        return ring.snapshot(now)


@attrs.define(eq=False)
class StatsItemSet:
    name: str
    max_keys: int = MAX_KEYS
    # least recently updated first (updated: a new second started for it)
    _items: collections.OrderedDict[str, StatsItem] = attrs.field(factory=collections.OrderedDict)

    def add(self, key: str, value: int, now: float, times: int = 1) -> None:
        item = self._items.get(key)
        if item is None:
            item = self._items[key] = StatsItem()
            if len(self._items) > self.max_keys:
                self._items.popitem(last=False)
            item.add(value, times, now)
        elif item.add(value, times, now):
            self._items.move_to_end(key)

    def get(self, key: str) -> StatsItem | None:
        return self._items.get(key)

    def __len__(self) -> int:
        return len(self._items)


@attrs.define(eq=False)
class BrokerStatsManager:
    max_keys: int = MAX_KEYS
    sets: dict[str, StatsItemSet] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.sets = {name: StatsItemSet(name, self.max_keys) for name in STATS_NAMES}

    def get(self, name: str, key: str) -> StatsItem | None:
        s = self.sets.get(name)
        return s.get(key) if s is not None else None

    def inc_topic_put(self, topic: str, nums: int, size: int, now: float) -> None:
        self.sets[TOPIC_PUT_NUMS].add(topic, nums, now)
        self.sets[TOPIC_PUT_SIZE].add(topic, size, now)

    def inc_put(self, topic: str, cluster: str, nums: int, size: int, now: float) -> None:
        """One put: ``inc_topic_put`` + ``inc_broker(BROKER_PUT_NUMS)`` in one call.

        Runs once per send. Within a second every item already has, each count is two
        additions on the item (``StatsItem.add``'s same-second branch, inlined); anything else
        (a new second, a new key) takes the general path.
        """
        second = int(now)
        sets = self.sets
        for name, key, value in (
            (TOPIC_PUT_NUMS, topic, nums),
            (TOPIC_PUT_SIZE, topic, size),
            (BROKER_PUT_NUMS, cluster, nums),
        ):
            item_set = sets[name]
            item = item_set._items.get(key)
            if item is not None and item._second == second:
                item._sum += value
                item._times += 1
            else:
                item_set.add(key, value, now)

    def inc_group_get(self, topic: str, group: str, nums: int, size: int, now: float) -> None:
        key = f"{topic}@{group}"
        self.sets[GROUP_GET_NUMS].add(key, nums, now)
        self.sets[GROUP_GET_SIZE].add(key, size, now)

    def inc_send_back(self, topic: str, group: str, now: float) -> None:
        """One message a consumer of ``group`` sent back (its original topic)."""
        self.sets[SNDBCK_PUT_NUMS].add(f"{topic}@{group}", 1, now)

    def inc_broker(self, name: str, cluster: str, nums: int, now: float) -> None:
        self.sets[name].add(cluster, nums, now)

    def tps_group_get_nums(self, topic: str, group: str, now: float) -> float:
        """GROUP_GET_NUMS' minute rate: what GET_CONSUME_STATS calls consumeTps."""
        item = self.get(GROUP_GET_NUMS, f"{topic}@{group}")
        return item.snapshot("minute", now).tps if item is not None else 0.0
