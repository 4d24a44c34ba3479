"""Pure broker tables: offsets, topics, subscription groups, consumers, producers, locks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import pytest
import trio

from broker.consumer_manager import (
    ClientChannelInfo,
    ConsumerManager,
    ProducerManager,
    RebalanceLockManager,
)
from broker.consumer_offset_manager import ConsumerOffsetManager
from broker.subscription import SubscriptionGroupManager, TagMessageFilter, build_subscription_data
from broker.topic_config import TopicConfigManager, validate_topic
from common.model import (
    ConsumeFromWhere,
    ConsumeType,
    MessageModel,
    MessageQueue,
    PermName,
    SubscriptionGroupConfig,
    TopicConfig,
)
from common.remoting.channel import Channel
from common.string_hash import java_string_hash

# --- offsets -------------------------------------------------------------------------------


def test_offsets_commit_query_and_persist(tmp_path: Path) -> None:
    m = ConsumerOffsetManager()
    assert m.query_offset("g", "T", 0) == -1
    m.commit_offset("g", "T", 0, 10)
    m.commit_offset("g", "T", 1, 7)
    m.commit_offset("g", "T", 2, -1)  # the C++ client's "nothing to commit"
    assert m.query_offset("g", "T", 0) == 10
    assert m.query_offset("g", "T", 2) == -1
    path = tmp_path / "config" / "consumerOffset.json"
    assert m.persist(path)
    assert not m.persist(path)  # unchanged -> not rewritten
    assert json.loads(path.read_text()) == {"offsetTable": {"T@g": {"0": 10, "1": 7}}}
    m2 = ConsumerOffsetManager()
    m2.load(path)
    assert m2.query_offset("g", "T", 1) == 7
    assert m2.groups_of_topic("T") == {"g"}
    assert m2.topics_of_group("g") == {"T"}


def test_offsets_load_fastjson_unquoted_keys(tmp_path: Path) -> None:
    path = tmp_path / "consumerOffset.json"
    path.write_text('{"offsetTable":{"TopicTest@cg":{0:10,1:7,2:0,3:3}}}')
    m = ConsumerOffsetManager()
    m.load(path)
    assert m.offsets_of("cg", "TopicTest") == {0: 10, 1: 7, 2: 0, 3: 3}


def test_offsets_corrupt_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "consumerOffset.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="consumerOffset.json"):
        ConsumerOffsetManager().load(path)


# --- topics --------------------------------------------------------------------------------


def test_system_topics_and_tbw102() -> None:
    t = TopicConfigManager(broker_name="bk", cluster_name="C", default_topic_queue_nums=8)
    tbw = t.select_topic_config("TBW102")
    assert tbw is not None and tbw.perm == 7 and tbw.writeQueueNums == 8
    schedule = t.select_topic_config("SCHEDULE_TOPIC_XXXX")
    assert schedule is not None and schedule.readQueueNums == 18
    assert "bk" in t and "C" in t
    assert "TBW102" not in TopicConfigManager(auto_create_topic_enable=False)


def test_auto_create_from_default_topic() -> None:
    changes = []
    t = TopicConfigManager(default_topic_queue_nums=8)
    t.on_change = lambda: changes.append(1)
    v0 = t.data_version
    tc = t.create_topic_in_send_message_method("New", "TBW102", 4)
    assert tc == TopicConfig("New", 4, 4, PermName.READ | PermName.WRITE)
    assert changes == [1] and t.data_version.counter == v0.counter + 1
    # capped by the template's write queues
    big = t.create_topic_in_send_message_method("Big", "TBW102", 64)
    assert big is not None and big.writeQueueNums == 8
    # a template without INHERIT creates nothing
    t.update_topic_config(TopicConfig("Plain", 4, 4, 6))
    assert t.create_topic_in_send_message_method("Other", "Plain", 4) is None
    assert t.create_topic_in_send_message_method("Other", "Missing", 4) is None


def test_auto_creation_stops_at_auto_create_topic_max() -> None:
    t = TopicConfigManager(auto_create_topic_max=3)
    t.update_topic_config(TopicConfig("ByAdmin", 4, 4, 6))
    assert t.create_topic_in_send_message_method("A", "TBW102", 4) is not None
    assert t.create_topic_in_send_message_method("B", "TBW102", 4) is not None
    assert t.create_topic_in_send_message_method("C", "TBW102", 4) is None  # 3 topics exist
    assert t.create_topic_in_send_message_method("A", "TBW102", 4) is not None  # existing
    assert t.auto_create_refused == 1
    t.update_topic_config(TopicConfig("ByAdmin2", 4, 4, 6))  # admins are not capped
    assert "ByAdmin2" in t.table


def test_topics_persist_roundtrip(tmp_path: Path) -> None:
    t = TopicConfigManager()
    t.update_topic_config(TopicConfig("A", 2, 3, 6))
    path = tmp_path / "topics.json"
    t.persist(path)
    t2 = TopicConfigManager()
    t2.load(path)
    assert t2.select_topic_config("A") == TopicConfig("A", 2, 3, 6)
    assert t2.data_version == t.data_version


@pytest.mark.parametrize(
    ("topic", "ok"),
    [("T-1_x", True), ("%RETRY%g", True), ("bad topic", False), ("", False), ("x" * 128, False)],
)
def test_validate_topic(topic: str, ok: bool) -> None:
    assert (validate_topic(topic) is None) is ok


# --- subscription groups and filters -------------------------------------------------------


def test_subscription_group_auto_create_and_persist(tmp_path: Path) -> None:
    m = SubscriptionGroupManager()
    cfg = m.find_subscription_group_config("cg")
    assert cfg == SubscriptionGroupConfig("cg")
    m.update_subscription_group_config(SubscriptionGroupConfig("cg2", retryMaxTimes=3))
    path = tmp_path / "subscriptionGroup.json"
    m.persist(path)
    m2 = SubscriptionGroupManager(auto_create_subscription_group=False)
    m2.load(path)
    cg2 = m2.find_subscription_group_config("cg2")
    assert cg2 is not None and cg2.retryMaxTimes == 3
    assert m2.find_subscription_group_config("nope") is None


def test_tag_filter() -> None:
    sub = build_subscription_data("T", "TagA || TagB")
    assert sub.tagsSet == ["TagA", "TagB"]
    f = TagMessageFilter.of(sub)
    assert f.is_matched_by_consume_queue(java_string_hash("TagA"))
    assert not f.is_matched_by_consume_queue(java_string_hash("TagC"))
    star = TagMessageFilter.of(build_subscription_data("T", "*"))
    assert star.is_matched_by_consume_queue(12345)
    # a heartbeat subscription without codeSet (C++ client) still filters by its tags
    from common.model import SubscriptionData

    f2 = TagMessageFilter.of(SubscriptionData("T", "TagA"))
    assert f2.is_matched_by_consume_queue(java_string_hash("TagA"))
    assert not f2.is_matched_by_consume_queue(java_string_hash("TagB"))


# --- consumers, producers, locks ------------------------------------------------------------


class FakeChannel:
    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = False

    def close(self) -> None:
        self.closed = True


def as_channel(ch: FakeChannel) -> Channel:
    # the managers keep a channel, compare it and close it: all a FakeChannel does
    return cast(Channel, ch)


def _register(
    cm: ConsumerManager, group: str, ch: FakeChannel, cid: str, topics: tuple[str, ...] = ("T",)
) -> bool:
    return cm.register_consumer(
        group,
        ClientChannelInfo(as_channel(ch), cid),
        ConsumeType.CONSUME_PASSIVELY,
        MessageModel.CLUSTERING,
        ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
        [build_subscription_data(t, "*") for t in topics],
    )


async def test_consumer_membership_notifications_and_expiry(autojump_clock: trio.abc.Clock) -> None:
    notes: list[tuple[str, list[str]]] = []
    cm = ConsumerManager(
        on_ids_changed=lambda g, chans: notes.append(
            (g, [cast(FakeChannel, c).name for c in chans])
        )
    )
    a, b = FakeChannel("a"), FakeChannel("b")
    assert _register(cm, "g", a, "A")
    assert notes == [("g", ["a"])]
    assert not _register(cm, "g", a, "A")  # plain heartbeat: no change, no notification
    assert _register(cm, "g", b, "B")
    assert notes[-1] == ("g", ["a", "b"])
    info = cm.get_consumer_group_info("g")
    assert info is not None and info.client_ids() == ["A", "B"]
    assert cm.find_subscription_data("g", "T") is not None
    # subscription change notifies too
    assert _register(cm, "g", b, "B", topics=("T", "U"))
    # close of a's connection: b is told
    assert cm.do_channel_close_event(as_channel(a)) == ["g"]
    assert notes[-1] == ("g", ["b"])
    # b goes silent: dropped after 120 s by the scan
    await trio.sleep(100)
    assert cm.scan_not_active_channel() == []
    await trio.sleep(21)
    assert cm.scan_not_active_channel() == [("g", "B")]
    assert b.closed and cm.get_consumer_group_info("g") is None


async def test_producer_expiry(autojump_clock: trio.abc.Clock) -> None:
    pm = ProducerManager()
    ch = FakeChannel("p")
    pm.register_producer("pg", ClientChannelInfo(as_channel(ch), "P"))
    await trio.sleep(121)
    assert pm.scan_not_active_channel() == [("pg", "P")]
    assert pm.groups == {}


async def test_lock_expiry(autojump_clock: trio.abc.Clock) -> None:
    lm = RebalanceLockManager()
    q0, q1 = MessageQueue("T", "b", 0), MessageQueue("T", "b", 1)
    assert lm.try_lock_batch("g", [q0, q1], "A") == [q0, q1]
    assert lm.try_lock_batch("g", [q0, q1], "B") == []
    await trio.sleep(30)
    assert lm.try_lock_batch("g", [q0], "A") == [q0]  # renew q0 only
    await trio.sleep(31)
    # q1's lock is 61 s old: expired; q0 was renewed 31 s ago
    assert lm.try_lock_batch("g", [q0, q1], "B") == [q1]
    lm.unlock_batch("g", [q0], "B")  # not B's lock: no effect
    assert lm.is_locked("g", q0, "A")
    lm.unlock_batch("g", [q0], "A")
    assert lm.try_lock_batch("g", [q0], "B") == [q0]
