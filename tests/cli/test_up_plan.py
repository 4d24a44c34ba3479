"""The `rmq up` port plan and child command lines (pure, no processes)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cli.local.up import (
    PlanError,
    ha_connected,
    node_command,
    plan_cluster,
    registered_at,
    slaves_of,
)


def test_default_plan_is_a_sync_master_with_one_slave():
    plan = plan_cluster()
    assert plan.namesrv.addr == "127.0.0.1:9876"
    master, slave = plan.brokers
    assert (master.name, master.broker_id, master.role) == ("broker-a", 0, "SYNC_MASTER")
    assert (master.port, master.ha_port, master.vip_port) == (10911, 10912, 10909)
    assert master.cluster == "DefaultCluster"
    assert (slave.name, slave.broker_name, slave.broker_id, slave.role) == (
        "broker-a-s1",
        "broker-a",
        1,
        "SLAVE",
    )
    assert (slave.port, slave.ha_port, slave.vip_port) == (10921, 10922, 10919)


def test_n_slaves_take_the_next_blocks_with_ids_1_to_n(tmp_path: Path) -> None:
    plan = plan_cluster(slaves=3, master_role="ASYNC_MASTER")
    got = [(b.name, b.broker_id, b.role, b.port) for b in plan.brokers]
    assert got == [
        ("broker-a", 0, "ASYNC_MASTER", 10911),
        ("broker-a-s1", 1, "SLAVE", 10921),
        ("broker-a-s2", 2, "SLAVE", 10931),
        ("broker-a-s3", 3, "SLAVE", 10941),
    ]
    # each node its own store directory under the data dir
    dirs = [node_command(b, plan, tmp_path) for b in plan.brokers]
    data_dirs = [cmd[cmd.index("--data-dir") + 1] for cmd in dirs]
    assert data_dirs == [str(tmp_path / b.name) for b in plan.brokers]
    assert len(set(data_dirs)) == 4
    assert slaves_of(plan, plan.brokers[0]) == 3


def test_no_slaves_is_a_lone_master():
    plan = plan_cluster(slaves=0, master_role="ASYNC_MASTER")
    [master] = plan.brokers
    assert master.role == "ASYNC_MASTER" and slaves_of(plan, master) == 0


def test_ha_readiness_needs_a_connection_per_planned_slave():
    assert ha_connected({"haConnectionCount": "2"}, 2)
    assert ha_connected({"haConnectionCount": "3"}, 2)
    assert not ha_connected({"haConnectionCount": "1"}, 2)
    assert not ha_connected({}, 1)  # a broker without HA info is not ready for slaves
    assert ha_connected({}, 0)
    assert not ha_connected({"haConnectionCount": "x"}, 1)


def test_masters_take_first_blocks_then_slaves():
    plan = plan_cluster(masters=2, slaves=1)
    got = [(b.name, b.broker_name, b.broker_id, b.role, b.port) for b in plan.brokers]
    assert got == [
        ("broker-a", "broker-a", 0, "SYNC_MASTER", 10911),
        ("broker-b", "broker-b", 0, "SYNC_MASTER", 10921),
        ("broker-a-s1", "broker-a", 1, "SLAVE", 10931),
        ("broker-b-s1", "broker-b", 1, "SLAVE", 10941),
    ]


def test_custom_ports_shift_every_block():
    plan = plan_cluster(namesrv_port=20060, broker_port=20000, masters=3)
    assert [b.port for b in plan.brokers] == [20000, 20010, 20020, 20030, 20040, 20050]
    assert plan.namesrv_addr == "127.0.0.1:20060"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"namesrv_port": 10912},  # the broker's HA port
        {"namesrv_port": 10909},  # the broker's VIP port
        {"namesrv_port": 10921, "masters": 2},
        {"namesrv_port": 10921},  # the default slave's listen port
        {"namesrv_port": 10941, "slaves": 3},
        {"broker_port": 65535},  # HA port would be 65536
        {"masters": 0},
        {"slaves": -1},
        {"master_role": "SLAVE"},
        {"master_role": "sync_master"},
    ],
)
def test_impossible_plans_are_rejected(kwargs):
    with pytest.raises(PlanError):
        plan_cluster(**kwargs)


def test_child_commands_run_the_cli_module_with_planned_ports(tmp_path: Path) -> None:
    plan = plan_cluster(namesrv_port=20030, broker_port=20000, slaves=1)
    ns = node_command(plan.namesrv, plan, tmp_path)
    assert ns[:4] == [sys.executable, "-m", "cli.servers.node", "namesrv"]
    assert ns[ns.index("--port") + 1] == "20030"
    assert "--watch-stdin" in ns
    slave = node_command(plan.brokers[1], plan, tmp_path)
    opts = dict(zip(slave[4::2], slave[5::2], strict=False))
    assert opts["--name"] == "broker-a"
    assert opts["--id"] == "1"
    assert opts["--role"] == "SLAVE"
    assert opts["--port"] == "20010"
    assert opts["--namesrv"] == "127.0.0.1:20030"
    assert opts["--data-dir"] == str(tmp_path / "broker-a-s1")


def test_readiness_reads_the_nameserver_cluster_info_json():
    from common.model import BrokerData, ClusterInfo
    from common.serde import loads, to_json

    plan = plan_cluster(namesrv_port=20030, broker_port=20000, slaves=1)
    master, slave = plan.brokers
    info = ClusterInfo(
        {"broker-a": BrokerData("DefaultCluster", "broker-a", {0: "127.0.0.1:20000"})},
        {"DefaultCluster": ["broker-a"]},
    )
    parsed = loads(to_json(info))  # what our nameserver sends
    assert registered_at(parsed, master)
    assert not registered_at(parsed, slave)  # not registered yet
    # fastjson (a Java nameserver) writes the Long keys bare
    bare = loads('{"brokerAddrTable":{"broker-a":{"brokerAddrs":{1:"127.0.0.1:20010"}}}}')
    assert registered_at(bare, slave) and not registered_at(bare, master)
    # registered elsewhere, or answers of the wrong shape, are "not ready"
    moved = loads('{"brokerAddrTable":{"broker-a":{"brokerAddrs":{"0":"127.0.0.1:1"}}}}')
    assert not registered_at(moved, master)
    junk: object
    for junk in (None, [], {"brokerAddrTable": []}, {"brokerAddrTable": {"broker-a": 3}}):
        assert not registered_at(junk, master)


def test_every_broker_has_a_grpc_port_in_its_block() -> None:
    from cli.local.up import plan_cluster

    plan = plan_cluster(masters=2, slaves=1)
    seen: set[int] = set()
    for b in plan.brokers:
        assert b.grpc_port == b.port + 4 and b.grpc_addr == f"{b.host}:{b.port + 4}"
        assert b.grpc_port in b.ports()
        assert not seen & set(b.ports())
        seen |= set(b.ports())
    assert plan.namesrv.grpc_port is None
