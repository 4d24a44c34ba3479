"""RouteInfoManager unit tests: pure tables, a fake clock, opaque channel objects."""

from __future__ import annotations

import attrs
import pytest

from common.model import PermName
from namesrv.routeinfo import (
    QueueData,
    RouteInfoManager,
    TopicQueueConfig,
    topic_queue_configs,
)


@attrs.define
class FakeClock:
    t: float = 1000.0

    def __call__(self) -> float:
        return self.t


class Chan:
    """A stand-in for a connection: compared by identity only."""


MASTER = "10.0.0.1:10911"
SLAVE = "10.0.0.2:10911"
HA_MASTER = "10.0.0.1:10912"
HA_SLAVE = "10.0.0.2:10912"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def rim(clock: FakeClock) -> RouteInfoManager:
    return RouteInfoManager(now=clock)


def tcs(*specs: tuple[str, int]) -> dict[str, TopicQueueConfig]:
    return topic_queue_configs(TopicQueueConfig(t, n, n) for t, n in specs)


def reg(
    rim,
    addr=MASTER,
    name="broker-a",
    bid=0,
    ha=HA_MASTER,
    version=(1, 1),
    topics=None,
    cluster="DefaultCluster",
    chan=None,
    filters=None,
):
    return rim.register_broker(
        cluster,
        addr,
        name,
        bid,
        ha,
        version,
        tcs(("TopicTest", 4)) if topics is None else topics,
        filters,
        chan,
    )


def test_master_then_slave_gets_master_and_ha_addr(rim):
    assert reg(rim).master_addr is None  # masters never get them
    res = reg(rim, addr=SLAVE, bid=1, ha=HA_SLAVE)
    assert res.master_addr == MASTER
    assert res.ha_server_addr == HA_MASTER
    route = rim.pickup_topic_route_data("TopicTest")
    assert route is not None
    assert route.broker_datas[0].broker_addrs == {0: MASTER, 1: SLAVE}
    assert route.queue_datas == [QueueData("broker-a", 4, 4, 6, 0)]


def test_slave_before_master_gets_nulls_then_learns_master(rim):
    res = reg(rim, addr=SLAVE, bid=1, ha=HA_SLAVE)
    assert (res.master_addr, res.ha_server_addr) == (None, None)
    # a slave alone defines no queues: no route yet
    assert rim.pickup_topic_route_data("TopicTest") is None
    reg(rim)
    res = reg(rim, addr=SLAVE, bid=1, ha=HA_SLAVE)
    assert (res.master_addr, res.ha_server_addr) == (MASTER, HA_MASTER)


def test_slave_gets_nulls_when_master_entry_is_not_live(rim):
    reg(rim)
    reg(rim, addr=SLAVE, bid=1, ha=HA_SLAVE)
    # master's live info gone (e.g. expired) but a stale id 0 could only be there transiently;
    # simulate by unregistering the master: the slave is left alone
    rim.unregister_broker("DefaultCluster", MASTER, "broker-a", 0)
    res = reg(rim, addr=SLAVE, bid=1, ha=HA_SLAVE)
    assert (res.master_addr, res.ha_server_addr) == (None, None)
    assert rim.get_all_cluster_info().broker_addr_table["broker-a"].broker_addrs == {1: SLAVE}


def test_same_addr_new_broker_id_replaces_old_entry(rim):
    reg(rim)
    reg(rim, addr=SLAVE, bid=1, ha=HA_SLAVE)
    # master gone, slave promoted: same address comes back as brokerId 0
    rim.unregister_broker("DefaultCluster", MASTER, "broker-a", 0)
    res = reg(rim, addr=SLAVE, bid=0, ha=HA_SLAVE)
    assert res.master_addr is None
    addrs = rim.get_all_cluster_info().broker_addr_table["broker-a"].broker_addrs
    assert addrs == {0: SLAVE}


def test_queue_data_rebuilt_only_for_master_on_version_change(rim):
    reg(rim, version=(1, 1), topics=tcs(("T", 4)))
    # same version, different topics: ignored (a plain heartbeat)
    reg(rim, version=(1, 1), topics=tcs(("T", 8), ("U", 2)))
    assert rim.get_all_topic_list() == ["T"]
    assert rim.pickup_topic_route_data("T").queue_datas[0].write_queue_nums == 4
    # a slave never defines queues, whatever its version
    reg(rim, addr=SLAVE, bid=1, version=(9, 9), topics=tcs(("S", 4)))
    assert rim.get_all_topic_list() == ["T"]
    # new version: rebuilt
    reg(rim, version=(1, 2), topics=tcs(("T", 8), ("U", 2)))
    assert rim.get_all_topic_list() == ["T", "U"]
    assert rim.pickup_topic_route_data("T").queue_datas[0].write_queue_nums == 8


def test_first_registration_of_new_id_rebuilds_even_with_known_version(rim):
    # a slave is promoted in place: the live table already holds its DataVersion, yet the
    # first registration under brokerId 0 must still build the queues
    reg(rim, name="broker-b", addr=SLAVE, bid=1, version=(5, 5), topics=tcs(("X", 1)))
    assert rim.get_all_topic_list() == []
    reg(rim, name="broker-b", addr=SLAVE, bid=0, version=(5, 5), topics=tcs(("X", 1)))
    assert rim.get_all_topic_list() == ["X"]


def test_expiry_after_channel_expired_time(rim, clock):
    reg(rim)
    reg(rim, addr=SLAVE, bid=1)
    clock.t += 60
    reg(rim, addr=SLAVE, bid=1)  # the slave keeps registering, the master stops
    clock.t += 60
    assert rim.scan_not_active_broker() == []  # exactly 120 s: not yet expired
    clock.t += 1
    expired = rim.scan_not_active_broker()
    assert [e.broker_addr for e in expired] == [MASTER]
    assert rim.get_all_cluster_info().broker_addr_table["broker-a"].broker_addrs == {1: SLAVE}
    # queue data stays while the brokerName still has an address
    assert rim.get_all_topic_list() == ["TopicTest"]
    clock.t += 121
    assert [e.broker_addr for e in rim.scan_not_active_broker()] == [SLAVE]
    info = rim.get_all_cluster_info()
    assert info.broker_addr_table == {} and info.cluster_addr_table == {}
    assert rim.get_all_topic_list() == []
    assert rim.pickup_topic_route_data("TopicTest") is None


def test_query_data_version_heartbeat_refreshes(rim, clock):
    reg(rim, version=(1, 1))
    assert not rim.is_broker_topic_config_changed(MASTER, (1, 1))
    assert rim.is_broker_topic_config_changed(MASTER, (1, 2))
    assert rim.is_broker_topic_config_changed(SLAVE, (1, 1))  # unknown broker
    clock.t += 100
    rim.update_broker_info_update_timestamp(MASTER)
    clock.t += 100
    assert rim.scan_not_active_broker() == []
    assert rim.query_broker_topic_config(MASTER) == (1, 1)
    assert rim.query_broker_topic_config(SLAVE) is None


def test_channel_close_drops_only_brokers_registered_over_it(rim):
    c1, c2, c3 = Chan(), Chan(), Chan()
    reg(rim, chan=c1)
    reg(rim, addr=SLAVE, bid=1, chan=c2)
    reg(
        rim, name="broker-b", addr="10.0.0.3:10911", chan=c3, topics=tcs(("TopicTest", 2), ("B", 1))
    )
    assert rim.on_channel_destroy(Chan()) == []
    assert rim.on_channel_destroy(c1) == [MASTER]
    route = rim.pickup_topic_route_data("TopicTest")
    assert {b.broker_name: b.broker_addrs for b in route.broker_datas} == {
        "broker-a": {1: SLAVE},
        "broker-b": {0: "10.0.0.3:10911"},
    }
    assert rim.on_channel_destroy(c3) == ["10.0.0.3:10911"]
    # broker-b empty: its name leaves the cluster, its queues leave every topic, topic B goes
    assert rim.get_all_topic_list() == ["TopicTest"]
    assert [q.broker_name for q in rim.pickup_topic_route_data("TopicTest").queue_datas] == [
        "broker-a"
    ]
    assert rim.get_all_cluster_info().cluster_addr_table == {"DefaultCluster": ["broker-a"]}


def test_reregistration_over_new_channel_survives_old_channel_close(rim):
    old, new = Chan(), Chan()
    reg(rim, chan=old)
    reg(rim, chan=new)
    assert rim.on_channel_destroy(old) == []
    assert rim.live_broker_addrs() == [MASTER]
    assert rim.channel_in_use(new) and not rim.channel_in_use(old)


def test_unregister_last_address_cleans_cluster_and_topics(rim):
    reg(rim, topics=tcs(("A", 4), ("B", 4)))
    reg(rim, name="broker-b", addr="10.0.0.3:10911", topics=tcs(("A", 2)), cluster="C2")
    rim.unregister_broker("DefaultCluster", MASTER, "broker-a", 0)
    assert rim.get_all_topic_list() == ["A"]
    assert rim.get_all_cluster_info().cluster_addr_table == {"C2": ["broker-b"]}
    assert rim.live_broker_addrs() == ["10.0.0.3:10911"]


def test_delete_topic_all_and_by_cluster(rim):
    reg(rim, topics=tcs(("A", 4), ("B", 4)))
    reg(rim, name="broker-b", addr="10.0.0.3:10911", topics=tcs(("A", 2)), cluster="C2")
    rim.delete_topic("A", "C2")
    assert [q.broker_name for q in rim.pickup_topic_route_data("A").queue_datas] == ["broker-a"]
    rim.delete_topic("A", "DefaultCluster")
    assert rim.pickup_topic_route_data("A") is None
    rim.delete_topic("B")
    assert rim.get_all_topic_list() == []
    rim.delete_topic("nope")  # unknown topic: no error


def test_wipe_and_add_write_perm(rim):
    reg(rim, topics=tcs(("A", 4), ("B", 4)))
    reg(rim, name="broker-b", addr="10.0.0.3:10911", topics=tcs(("A", 2)))
    assert rim.wipe_write_perm_of_broker("broker-a") == 2
    perms = {q.broker_name: q.perm for q in rim.pickup_topic_route_data("A").queue_datas}
    assert perms == {"broker-a": PermName.READ, "broker-b": PermName.READ | PermName.WRITE}
    assert rim.pickup_topic_route_data("B").queue_datas[0].perm == PermName.READ
    assert rim.add_write_perm_of_broker("broker-a") == 2
    assert rim.pickup_topic_route_data("B").queue_datas[0].perm == PermName.READ | PermName.WRITE
    assert rim.wipe_write_perm_of_broker("nobody") == 0


def test_topics_by_cluster_system_and_unit_lists(rim):
    unit = {
        "U": TopicQueueConfig("U", 1, 1, topic_sys_flag=1),
        "S": TopicQueueConfig("S", 1, 1, topic_sys_flag=2),
        "US": TopicQueueConfig("US", 1, 1, topic_sys_flag=3),
        "P": TopicQueueConfig("P", 1, 1),
    }
    reg(rim, topics=unit)
    reg(rim, name="broker-b", addr="10.0.0.3:10911", topics=tcs(("Q", 2)), cluster="C2")
    assert rim.get_topics_by_cluster("DefaultCluster") == ["P", "S", "U", "US"]
    assert rim.get_topics_by_cluster("C2") == ["Q"]
    assert rim.get_topics_by_cluster("none") == []
    topics, addr = rim.get_system_topic_list()
    assert topics == ["C2", "broker-b", "DefaultCluster", "broker-a"]
    assert addr == MASTER
    assert rim.get_unit_topics() == ["U", "US"]
    assert rim.get_has_unit_sub_topic_list() == ["S", "US"]
    assert rim.get_has_unit_sub_ununit_topic_list() == ["S"]


def test_filter_servers_in_route(rim):
    reg(rim, filters=["10.0.0.1:3000"])
    assert rim.pickup_topic_route_data("TopicTest").filter_server_table == {
        MASTER: ["10.0.0.1:3000"]
    }
    reg(rim, filters=[])
    assert rim.pickup_topic_route_data("TopicTest").filter_server_table == {}


def test_route_snapshot_is_detached_from_tables(rim):
    reg(rim)
    route = rim.pickup_topic_route_data("TopicTest")
    route.broker_datas[0].broker_addrs[5] = "x"
    assert rim.pickup_topic_route_data("TopicTest").broker_datas[0].broker_addrs == {0: MASTER}
