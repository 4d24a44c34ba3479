"""KVConfigManager persistence and NamesrvConfig's properties view."""

from __future__ import annotations

import json
import os

import pytest
import trio

from namesrv.config import NamesrvConfig, format_properties, parse_properties
from namesrv.kvconfig import KVConfigError, KVConfigManager


async def test_kv_put_get_delete_persist_across_restart(tmp_path):
    path = str(tmp_path / "sub" / "kvConfig.json")
    kv = KVConfigManager.load(path)  # missing file and directory: empty table
    assert kv.get("ns", "k") is None
    await kv.put("ns", "k", "v")
    await kv.put("ns", "k2", "v2")
    await kv.put("ORDER_TOPIC_CONFIG", "T", "broker-a:4")
    on_disk = json.loads(await trio.Path(path).read_text())
    assert on_disk == {
        "configTable": {"ORDER_TOPIC_CONFIG": {"T": "broker-a:4"}, "ns": {"k": "v", "k2": "v2"}}
    }
    await kv.delete("ns", "k")
    await kv.delete("ns", "absent")
    await kv.delete("absent", "k")

    again = KVConfigManager.load(path)
    assert again.get("ns", "k") is None
    assert again.get("ns", "k2") == "v2"
    assert again.get_namespace("ORDER_TOPIC_CONFIG") == {"T": "broker-a:4"}
    await again.delete("ns", "k2")
    assert KVConfigManager.load(path).get_namespace("ns") is None
    # no temp files left behind by the atomic writes
    assert sorted(os.listdir(tmp_path / "sub")) == ["kvConfig.json"]


def test_kv_reads_java_written_file(tmp_path):
    path = tmp_path / "kvConfig.json"
    path.write_text('{\n\t"configTable":{\n\t\t"ns":{\n\t\t\t"a":"1"\n\t\t}\n\t}\n}')
    assert KVConfigManager.load(str(path)).get("ns", "a") == "1"


def test_kv_corrupt_file_is_an_error_not_silently_replaced(tmp_path):
    path = tmp_path / "kvConfig.json"
    path.write_text("{not json")
    with pytest.raises(KVConfigError):
        KVConfigManager.load(str(path))
    assert path.read_text() == "{not json"


async def test_kv_failed_write_leaves_memory_unchanged(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    kv = KVConfigManager(str(blocker / "kvConfig.json"))  # parent is a file: writes fail
    with pytest.raises(OSError):
        await kv.put("ns", "k", "v")
    assert kv.get("ns", "k") is None


def test_properties_round_trip_and_update():
    cfg = NamesrvConfig(kv_config_path="/x/kv.json")
    props = cfg.to_properties()
    assert props["scanNotActiveBrokerInterval"] == "10000"
    assert props["brokerChannelExpiredTime"] == "120000"
    assert props["orderMessageEnable"] == "false"
    assert parse_properties(format_properties(props)) == props

    new = cfg.updated({"orderMessageEnable": "true", "brokerChannelExpiredTime": "30000", "x": "1"})
    assert new.order_message_enable is True
    assert new.broker_channel_expired_time == 30.0
    assert new.kv_config_path == "/x/kv.json"
    with pytest.raises(PermissionError):
        cfg.updated({"kvConfigPath": "/etc/passwd"})
    with pytest.raises(ValueError):
        cfg.updated({"listenPort": "abc"})
    with pytest.raises(ValueError):
        cfg.updated({"scanNotActiveBrokerInterval": "0"})


def test_parse_properties_java_syntax():
    text = "# comment\n! also\n a = 1\nb:2\nc 3\nd=multi\\\n   line\ne=x\\ty\\u0041\n\nf=\n"
    assert parse_properties(text) == {
        "a": "1",
        "b": "2",
        "c": "3",
        "d": "multiline",
        "e": "x\tyA",
        "f": "",
    }


async def test_kv_changes_are_serialised_and_none_is_lost(tmp_path):
    # the write runs in a worker thread: concurrent changes must not start from a stale table

    kv = KVConfigManager(str(tmp_path / "kvConfig.json"))
    async with trio.open_nursery() as n:
        for i in range(20):
            n.start_soon(kv.put, "ns", f"k{i}", str(i))
    on_disk = KVConfigManager.load(str(tmp_path / "kvConfig.json"))
    assert on_disk.get_namespace("ns") == {f"k{i}": str(i) for i in range(20)}
