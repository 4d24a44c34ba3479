"""The shared ConfigManager load/persist: every table names its file on a bad shape, writes
atomically, and the offset tables skip unchanged writes."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

import pytest

from broker.config_manager import read_json_file
from broker.consumer_offset_manager import ConsumerOffsetManager
from broker.processor.pull_hold import PullRequestHoldService
from broker.schedule import ScheduleMessageService
from broker.subscription import SubscriptionGroupManager
from broker.topic_config import TopicConfigManager
from common.model import SubscriptionGroupConfig, TopicConfig

if TYPE_CHECKING:
    from broker.store.api import MessageStore


# the schedule tables' persistence never reaches the store
NO_STORE = cast("MessageStore", None)


def _tables() -> list[object]:
    return [
        TopicConfigManager(),
        SubscriptionGroupManager(),
        ConsumerOffsetManager(),
        ScheduleMessageService(store=NO_STORE, hold=PullRequestHoldService()),
    ]


@pytest.mark.parametrize("index", range(4))
def test_wrong_shape_names_the_file(tmp_path: Path, index: int) -> None:
    table = _tables()[index]
    path = tmp_path / "t.json"
    path.write_text('{"topicConfigTable": 5, "subscriptionGroupTable": 5, "offsetTable": 5}')
    with pytest.raises(ValueError, match=str(path)):
        table.load(path)  # type: ignore[attr-defined]


@pytest.mark.parametrize("index", range(4))
def test_missing_or_blank_file_loads_nothing(tmp_path: Path, index: int) -> None:
    table = _tables()[index]
    before = table.encode()  # type: ignore[attr-defined]
    table.load(tmp_path / "absent.json")  # type: ignore[attr-defined]
    (tmp_path / "blank.json").write_text("  \n")
    table.load(tmp_path / "blank.json")  # type: ignore[attr-defined]
    assert table.encode() == before  # type: ignore[attr-defined]


def test_versioned_tables_roundtrip_and_adopt(tmp_path: Path) -> None:
    tcm = TopicConfigManager()
    tcm.update_topic_config(TopicConfig("T", 4, 4, 6))
    path = tmp_path / "config" / "topics.json"
    tcm.persist(path)
    assert not (tmp_path / "config" / "topics.json.tmp").exists()
    loaded = TopicConfigManager()
    loaded.load(path)
    assert loaded.table["T"] == TopicConfig("T", 4, 4, 6)
    assert loaded.data_version == tcm.data_version

    master = SubscriptionGroupManager()
    master.update_subscription_group_config(SubscriptionGroupConfig(groupName="G"))
    slave = SubscriptionGroupManager()
    slave.adopt(master.wrapper())
    assert slave.table == master.table and slave.data_version == master.data_version
    assert slave.encode() == master.encode()


def test_dirty_tables_write_only_when_changed(tmp_path: Path) -> None:
    path = tmp_path / "consumerOffset.json"
    com = ConsumerOffsetManager()
    assert com.persist(path) is False and not path.exists()
    com.commit_offset("G", "T", 0, 5)
    assert com.persist(path) is True
    assert com.persist(path) is False
    assert com.persist(path, force=True) is True
    assert read_json_file(path) == {"offsetTable": {"T@G": {"0": 5}}}

    sched = ScheduleMessageService(store=NO_STORE, hold=PullRequestHoldService())
    sched.decode(b'{"offsetTable": {"3": 7}}')  # slave sync marks the table dirty
    dpath = tmp_path / "delayOffset.json"
    assert sched.persist(dpath) is True
    again = ScheduleMessageService(store=NO_STORE, hold=PullRequestHoldService())
    again.load(dpath)
    assert again.offset_table == {3: 7}
    assert again.persist(dpath) is False  # a freshly loaded table equals its file


def test_snapshot_marks_clean_and_a_failed_write_is_retried(tmp_path: Path) -> None:
    # The periodic offsets write encodes on the event loop and writes in a worker thread:
    # a snapshot marks the table clean, and a write that failed must be attempted again.
    offsets = ConsumerOffsetManager()
    offsets.commit_offset("g", "T", 0, 5)
    data = offsets.take_snapshot()
    assert data is not None and b"T@g" in data
    assert offsets.take_snapshot() is None  # nothing changed since
    offsets.mark_dirty()
    assert offsets.take_snapshot() == data
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the config directory should be")
    offsets.commit_offset("g", "T", 0, 6)
    with pytest.raises(OSError):
        offsets.persist(blocked / "consumerOffset.json")
    assert offsets.persist(tmp_path / "consumerOffset.json")  # still dirty, so written now
    written = read_json_file(tmp_path / "consumerOffset.json")
    assert written is not None and written["offsetTable"]["T@g"] == {"0": 6}
