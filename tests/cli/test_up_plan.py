"""The `rmq up` port plan and child command lines (pure, no processes)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cli.up import PlanError, node_command, plan_cluster, registered_at


def test_default_plan_is_one_namesrv_and_broker_a():
    plan = plan_cluster()
    assert plan.namesrv.addr == "127.0.0.1:9876"
    [broker] = plan.brokers
    assert (broker.name, broker.broker_id, broker.role) == ("broker-a", 0, "ASYNC_MASTER")
    assert (broker.port, broker.ha_port, broker.vip_port) == (10911, 10912, 10909)
    assert broker.cluster == "DefaultCluster"


def test_masters_take_first_blocks_then_slaves():
    plan = plan_cluster(masters=2, slaves=1)
    got = [(b.name, b.broker_name, b.broker_id, b.role, b.port) for b in plan.brokers]
    assert got == [
        ("broker-a", "broker-a", 0, "ASYNC_MASTER", 10911),
        ("broker-b", "broker-b", 0, "ASYNC_MASTER", 10921),
        ("broker-a-s1", "broker-a", 1, "SLAVE", 10931),
        ("broker-b-s1", "broker-b", 1, "SLAVE", 10941),
    ]


def test_custom_ports_shift_every_block():
    plan = plan_cluster(namesrv_port=20030, broker_port=20000, masters=3)
    assert [b.port for b in plan.brokers] == [20000, 20010, 20020]
    assert plan.namesrv_addr == "127.0.0.1:20030"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"namesrv_port": 10912},  # the broker's HA port
        {"namesrv_port": 10909},  # the broker's VIP port
        {"namesrv_port": 10921, "masters": 2},
        {"broker_port": 65535},  # HA port would be 65536
        {"masters": 0},
        {"slaves": -1},
        {"master_role": "SLAVE"},
    ],
)
def test_impossible_plans_are_rejected(kwargs):
    with pytest.raises(PlanError):
        plan_cluster(**kwargs)


def test_child_commands_run_the_cli_module_with_planned_ports(tmp_path: Path):
    plan = plan_cluster(namesrv_port=20030, broker_port=20000, slaves=1)
    ns = node_command(plan.namesrv, plan, tmp_path)
    assert ns[:4] == [sys.executable, "-m", "cli.node", "namesrv"]
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
    for junk in (None, [], {"brokerAddrTable": []}, {"brokerAddrTable": {"broker-a": 3}}):
        assert not registered_at(junk, master)
