"""BrokerConfig.from_properties: RocketMQ broker.conf names, conversions and errors."""

from __future__ import annotations

import logging

import pytest

from broker.config import BrokerConfig, parse_properties

CONF = """
# a typical broker.conf
brokerClusterName = DefaultCluster
brokerName=broker-b
brokerId=0
brokerIP1 : 10.0.0.5
listenPort 10921
namesrvAddr=127.0.0.1:9876;127.0.0.1:9877
storePathRootDir=/data/store
storePathCommitLog=/data/store/commitlog
mapedFileSizeCommitLog=1048576
flushDiskType=SYNC_FLUSH
brokerRole=SYNC_MASTER
autoCreateTopicEnable=false
defaultTopicQueueNums=4
deleteWhen=04
fileReservedTime=48
registerNameServerPeriod=10000
syncFlushTimeout=2500
"""


def test_known_properties_map_to_fields() -> None:
    c = BrokerConfig.from_properties(CONF)
    assert c.broker_name == "broker-b"
    assert c.broker_ip1 == "10.0.0.5"
    assert c.listen_port == 10921
    assert c.namesrv_addrs == ["127.0.0.1:9876", "127.0.0.1:9877"]
    assert c.auto_create_topic_enable is False
    assert c.default_topic_queue_nums == 4
    assert c.register_name_server_period == 10.0
    s = c.store
    assert s.store_path_root_dir == "/data/store"
    assert s.store_path_commit_log == "/data/store/commitlog"
    assert s.mapped_file_size_commit_log == 1048576
    assert s.flush_disk_type == "SYNC_FLUSH"
    assert s.broker_role == "SYNC_MASTER"
    assert s.file_reserved_time == 48
    assert s.sync_flush_timeout == 2.5
    assert c.vip_port == 10919 and c.ha_port == 10922


def test_new_spelling_of_mapped_file_size() -> None:
    c = BrokerConfig.from_properties("mappedFileSizeCommitLog=4096\nstorePathRootDir=/x")
    assert c.store.mapped_file_size_commit_log == 4096


def test_crc_check_window_on_recover() -> None:
    c = BrokerConfig.from_properties("crcCheckWindowOnRecover=1048576\nstorePathRootDir=/x")
    assert c.store.crc_check_window_on_recover == 1 << 20
    assert BrokerConfig.from_properties("").store.crc_check_window_on_recover == 128 << 20


def test_unknown_property_warns_and_is_ignored(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        c = BrokerConfig.from_properties("brokerName=x\nsomethingNew=1\n")
    assert c.broker_name == "x"
    assert "somethingNew" in caplog.text


@pytest.mark.parametrize(
    ("line", "name"),
    [
        ("listenPort=abc", "listenPort"),
        ("autoCreateTopicEnable=yes", "autoCreateTopicEnable"),
        ("brokerRole=LEADER", "brokerRole"),
        ("flushDiskType=SOMETIMES", "flushDiskType"),
        ("messageDelayLevel=1s 5x", "messageDelayLevel"),
    ],
)
def test_bad_values_name_the_property(line: str, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        BrokerConfig.from_properties(line)


def test_slave_needs_positive_id_and_master_is_forced_to_zero() -> None:
    with pytest.raises(ValueError, match="brokerId"):
        BrokerConfig.from_properties("brokerRole=SLAVE\nbrokerId=0")
    assert BrokerConfig.from_properties("brokerRole=SLAVE\nbrokerId=2").broker_id == 2
    assert BrokerConfig.from_properties("brokerRole=ASYNC_MASTER\nbrokerId=3").broker_id == 0


def test_overrides_win() -> None:
    c = BrokerConfig.from_properties("listenPort=1", listen_port=0)
    assert c.listen_port == 0 and c.vip_port == 0 and c.ha_port == 0


def test_parse_properties_syntax() -> None:
    assert parse_properties("a=1\n! comment\n#x=2\n b : 3 \nc 4\nd=\n") == {
        "a": "1",
        "b": "3",
        "c": "4",
        "d": "",
    }
