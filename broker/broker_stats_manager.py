"""Per-group consume rates (RocketMQ ``BrokerStatsManager``, the GROUP_GET_NUMS item).

GET_CONSUME_STATS answers a group's ``consumeTps``: messages that group pulled per second over
the last minute, summed over its topics. Java samples cumulative counters every 10 s and
divides the last minute's difference; we keep one counter per second instead (a deque of at
most 60 buckets per topic@group), which gives the same number without a sampling task.
Time comes from the caller (Trio's clock in the broker), so tests drive it with a fake clock.
"""

from __future__ import annotations

import collections

import attrs

WINDOW_SECONDS = 60


@attrs.define(eq=False)
class GroupGetNums:
    """Messages found by pulls, per (topic, group), over a sliding minute."""

    window: int = WINDOW_SECONDS
    _buckets: dict[tuple[str, str], collections.deque[list[int]]] = attrs.field(factory=dict)

    def add(self, topic: str, group: str, count: int, now: float) -> None:
        second = int(now)
        buckets = self._buckets.get((topic, group))
        if buckets is None:
            buckets = self._buckets[(topic, group)] = collections.deque()
        if buckets and buckets[-1][0] == second:
            buckets[-1][1] += count
        else:
            buckets.append([second, count])
            self._trim(buckets, second)

    def tps(self, topic: str, group: str, now: float) -> float:
        """Messages per second over the last `window` seconds (0.0 when none)."""
        buckets = self._buckets.get((topic, group))
        if not buckets:
            return 0.0
        self._trim(buckets, int(now))
        return sum(count for _, count in buckets) / self.window

    def _trim(self, buckets: collections.deque[list[int]], second: int) -> None:
        oldest = second - self.window
        while buckets and buckets[0][0] <= oldest:
            buckets.popleft()
