from broker.broker_stats_manager import GroupGetNums


def test_group_get_nums_is_a_sliding_minute_per_topic_and_group() -> None:
    stats = GroupGetNums()
    stats.add("T", "g", 30, now=100.2)
    stats.add("T", "g", 30, now=100.9)  # same second: one bucket
    stats.add("T", "g", 60, now=130.0)
    stats.add("T", "other", 600, now=130.0)
    assert stats.tps("T", "g", now=131.0) == 120 / 60
    assert stats.tps("T", "other", now=131.0) == 10.0
    assert stats.tps("U", "g", now=131.0) == 0.0
    # the 100 s bucket leaves the window at 160 s, the 130 s one at 190 s
    assert stats.tps("T", "g", now=160.0) == 1.0
    assert stats.tps("T", "g", now=190.0) == 0.0
    assert len(stats._buckets[("T", "g")]) == 0
