import collections

from broker.broker_stats_manager import (
    BROKER_PUT_NUMS,
    GROUP_GET_NUMS,
    SNDBCK_PUT_NUMS,
    TOPIC_PUT_NUMS,
    TOPIC_PUT_SIZE,
    BrokerStatsManager,
    StatsItemSet,
)


def test_group_get_nums_is_a_sliding_minute_per_topic_and_group() -> None:
    stats = BrokerStatsManager()
    stats.inc_group_get("T", "g", 30, 300, now=100.2)
    stats.inc_group_get("T", "g", 30, 300, now=100.9)  # same second: one bucket
    stats.inc_group_get("T", "g", 60, 600, now=130.0)
    stats.inc_group_get("T", "other", 600, 6000, now=130.0)
    assert stats.tps_group_get_nums("T", "g", now=131.0) == 120 / 60
    assert stats.tps_group_get_nums("T", "other", now=131.0) == 10.0
    assert stats.tps_group_get_nums("U", "g", now=131.0) == 0.0
    # the 100 s bucket leaves the window at 160 s, the 130 s one at 190 s
    assert stats.tps_group_get_nums("T", "g", now=160.0) == 1.0
    assert stats.tps_group_get_nums("T", "g", now=190.0) == 0.0
    item = stats.get(GROUP_GET_NUMS, "T@g")
    assert item is not None and item.snapshot("minute", 190.0).sum == 0
    assert len(item.minute.buckets) == 0
    # the hour and the day still hold them
    assert item.snapshot("hour", 190.0).sum == 120 and item.snapshot("day", 190.0).sum == 120


def test_snapshot_sum_tps_and_average_per_increment() -> None:
    stats = BrokerStatsManager()
    for i in range(10):
        stats.inc_topic_put("T", 3, 30, now=1000.0 + i)
    item = stats.get(TOPIC_PUT_NUMS, "T")
    assert item is not None
    minute = item.snapshot("minute", 1010.0)
    assert (minute.sum, minute.tps, minute.avgpt) == (30, 0.5, 3.0)
    hour = item.snapshot("hour", 1010.0)
    assert hour.sum == 30 and hour.tps == 30 / 3600
    # an hour later the minute and the hour are empty, the day is not
    assert item.snapshot("hour", 1000.0 + 3660).sum == 0
    assert item.snapshot("day", 1000.0 + 3660).sum == 30
    assert item.snapshot("day", 1000.0 + 25 * 3600).sum == 0


def test_a_set_keeps_at_most_max_keys_dropping_the_least_recently_updated() -> None:
    s = StatsItemSet("X", max_keys=3)
    for key in "abc":
        s.add(key, 1, now=0.0)
    s.add("a", 1, now=1.0)  # a is fresh again
    s.add("d", 1, now=2.0)
    assert len(s) == 3 and s.get("b") is None and s.get("a") is not None
    for i in range(10_000):
        s.add(f"k{i}", 1, now=float(i))
    assert len(s) == 3


def test_send_back_is_counted_per_topic_and_group() -> None:
    stats = BrokerStatsManager()
    stats.inc_send_back("T", "g", now=5.0)
    stats.inc_send_back("T", "g", now=6.0)
    item = stats.get(SNDBCK_PUT_NUMS, "T@g")
    assert item is not None and item.snapshot("minute", 7.0).sum == 2
    assert stats.get("NO_SUCH_STATS", "T@g") is None


def test_increments_within_a_second_reach_the_rings_once() -> None:
    stats = BrokerStatsManager()
    for i in range(1000):
        stats.inc_topic_put("T", 1, 10, now=50.0 + i / 1000)
    item = stats.get(TOPIC_PUT_NUMS, "T")
    assert item is not None and item.minute.buckets == collections.deque()
    assert item.snapshot("minute", 50.9).sum == 1000  # read: folded in
    stats.inc_topic_put("T", 1, 10, now=50.95)  # the same second again
    stats.inc_topic_put("T", 1, 10, now=51.0)
    assert list(item.minute.buckets) == [[50, 1001, 1001]]
    assert item.snapshot("minute", 51.5).sum == 1002


def test_inc_put_counts_as_inc_topic_put_and_inc_broker_do() -> None:
    # the send path's one-call form (same-second branch inlined) against the general calls,
    # over new seconds, new keys and evictions of the least recently updated key
    fast, slow = BrokerStatsManager(max_keys=3), BrokerStatsManager(max_keys=3)
    steps = [("T", 100.1), ("T", 100.9), ("U", 100.9), ("T", 101.0), ("V", 101.5), ("W", 102.0)]
    steps += [("T", 102.2), ("U", 102.3), ("U", 163.0), ("T", 3700.0), ("T", 3700.5)]
    for i, (topic, now) in enumerate(steps):
        fast.inc_put(topic, "C", i + 1, 100 * (i + 1), now)
        slow.inc_topic_put(topic, i + 1, 100 * (i + 1), now)
        slow.inc_broker(BROKER_PUT_NUMS, "C", i + 1, now)
    for name in (TOPIC_PUT_NUMS, TOPIC_PUT_SIZE, BROKER_PUT_NUMS):
        assert list(fast.sets[name]._items) == list(slow.sets[name]._items)
        for key in slow.sets[name]._items:
            a, b = fast.get(name, key), slow.get(name, key)
            assert a is not None and b is not None
            for window in ("minute", "hour", "day"):
                assert a.snapshot(window, 3701.0) == b.snapshot(window, 3701.0)
    item = fast.get(BROKER_PUT_NUMS, "C")
    assert item is not None and item.snapshot("day", 3701.0).sum == sum(range(1, 12))
