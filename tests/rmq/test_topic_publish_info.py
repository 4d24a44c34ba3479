"""Queue selection from routes: writable masters only, round-robin, avoid the failed broker."""

from __future__ import annotations

from collections import Counter

from common.model import BrokerData, MessageQueue, QueueData, TopicRouteData
from rmq.topic_publish_info import (
    default_publish_info,
    find_broker_addr_in_subscribe,
    publish_info_from_route,
    subscribe_queues,
)


def route(*brokers: tuple[str, dict[int, str], int, int, int]) -> TopicRouteData:
    """(name, addrs, read, write, perm) per broker."""
    return TopicRouteData(
        queueDatas=[QueueData(n, r, w, p) for n, _, r, w, p in brokers],
        brokerDatas=[BrokerData("C", n, addrs) for n, addrs, *_ in brokers],
    )


TWO = route(
    ("broker-b", {0: "b:1"}, 2, 2, 6),
    ("broker-a", {0: "a:1", 1: "a2:1"}, 3, 3, 6),
)


def test_publish_queues_sorted_by_broker_then_id():
    info = publish_info_from_route("T", TWO)
    assert info.queues == [
        MessageQueue("T", "broker-a", 0),
        MessageQueue("T", "broker-a", 1),
        MessageQueue("T", "broker-a", 2),
        MessageQueue("T", "broker-b", 0),
        MessageQueue("T", "broker-b", 1),
    ]


def test_brokers_without_master_or_write_perm_get_no_sends():
    r = route(
        ("broker-a", {1: "slave:1"}, 4, 4, 6),  # master gone
        ("broker-b", {0: "b:1"}, 4, 4, 4),  # read-only
        ("broker-c", {0: "c:1"}, 4, 2, 6),
    )
    info = publish_info_from_route("T", r)
    assert {q.brokerName for q in info.queues} == {"broker-c"}
    assert len(info.queues) == 2
    # but a consumer still reads every readable queue, slave-only broker included
    assert len(subscribe_queues("T", r)) == 12


def test_round_robin_visits_every_queue_evenly():
    info = publish_info_from_route("T", TWO)
    picks = Counter(info.select_queue() for _ in range(50))
    assert set(picks) == set(info.queues)
    assert set(picks.values()) == {10}


def test_retry_avoids_the_broker_that_failed():
    info = publish_info_from_route("T", TWO)
    for _ in range(20):
        assert info.select_queue(last_broker="broker-a").brokerName == "broker-b"
        assert info.select_queue(last_broker="broker-b").brokerName == "broker-a"


def test_retry_with_a_single_broker_still_returns_a_queue():
    info = publish_info_from_route("T", route(("broker-a", {0: "a:1"}, 2, 2, 6)))
    assert info.select_queue(last_broker="broker-a").brokerName == "broker-a"


def test_default_route_caps_queue_count_at_default_topic_queue_nums():
    tbw = route(("broker-a", {0: "a:1"}, 8, 8, 7), ("broker-b", {0: "b:1"}, 8, 8, 7))
    info = default_publish_info("NewTopic", tbw, 4)
    assert info.from_default
    assert len(info.queues) == 8
    assert all(q.topic == "NewTopic" and q.queueId < 4 for q in info.queues)


def test_order_topic_conf_overrides_queue_datas():
    r = TWO
    r.orderTopicConf = "broker-b:2;broker-a:1"
    info = publish_info_from_route("T", r)
    assert info.order_topic
    assert [(q.brokerName, q.queueId) for q in info.queues] == [
        ("broker-b", 0),
        ("broker-b", 1),
        ("broker-a", 0),
    ]


def test_refresh_keeps_round_robin_position():
    old = publish_info_from_route("T", TWO)
    old.select_queue()
    new = publish_info_from_route("T", TWO).adopt_cursor(old)
    assert new.select_queue() == old.select_queue()


def test_subscribe_address_follows_suggestion_then_falls_back():
    addrs = {0: "m:1", 1: "s1:1"}
    assert find_broker_addr_in_subscribe(addrs, 0) == ("m:1", False)
    assert find_broker_addr_in_subscribe(addrs, 1) == ("s1:1", True)
    assert find_broker_addr_in_subscribe({0: "m:1", 2: "s2:1"}, 1) == ("s2:1", True)
    assert find_broker_addr_in_subscribe({1: "s1:1"}, 0) == ("s1:1", True)
    assert find_broker_addr_in_subscribe({1: "s1:1"}, 0, only_this=True) is None
    assert find_broker_addr_in_subscribe({}, 0) is None
