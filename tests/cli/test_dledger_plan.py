"""`rmq up --dledger N`: the plan of DLedger groups (names, ports, peers, properties, command
lines), the refusals, and the readiness rule (pure, no processes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.chaos.port_blocks import free_port_block
from cli.local.dledger_plan import LAPTOP_TIMING, peers_of
from cli.local.render import spec_json
from cli.local.topology import TopologyError, resolve
from cli.local.up import (
    LOCAL_BROKER_DEFAULTS,
    ClusterPlan,
    NodeSpec,
    busy_ports,
    dledger_ready,
    node_command,
)


def props(node: NodeSpec) -> dict[str, str]:
    return dict(node.properties)


def test_dledger_3_is_one_group_of_three_members_on_the_broker_blocks():
    plan = resolve(None, dledger=3).plan()
    assert plan.namesrv.addr == "127.0.0.1:9876"
    got = [(b.name, b.broker_name, b.dledger_self_id, b.port, b.dledger_port) for b in plan.brokers]
    assert got == [
        ("broker-a-n0", "broker-a", "n0", 10911, 10913),
        ("broker-a-n1", "broker-a", "n1", 10921, 10923),
        ("broker-a-n2", "broker-a", "n2", 10931, 10933),
    ]
    peers = "n0-127.0.0.1:10913;n1-127.0.0.1:10923;n2-127.0.0.1:10933"
    for k, b in enumerate(plan.brokers):
        assert b.cluster == "DefaultCluster" and b.is_dledger
        assert b.ha_port is None and b.vip_port == b.port - 2
        assert b.ports() == [b.port - 2, b.port, b.port + 1, b.port + 2, b.port + 3, b.port + 4]
        assert props(b) == {
            **LAPTOP_TIMING,
            **LOCAL_BROKER_DEFAULTS,
            "enableDLegerCommitLog": "true",
            "dLegerGroup": "broker-a",
            "dLegerPeers": peers,
            "dLegerSelfId": f"n{k}",
        }
        assert "preferredLeaderId" not in props(b)


def test_dledger_5_gives_five_members_all_with_the_same_peers():
    plan = resolve(None, dledger=5).plan()
    assert [b.dledger_self_id for b in plan.brokers] == ["n0", "n1", "n2", "n3", "n4"]
    assert [b.port for b in plan.brokers] == [10911, 10921, 10931, 10941, 10951]
    assert {props(b)["dLegerPeers"] for b in plan.brokers} == {peers_of(plan, "broker-a")}
    assert peers_of(plan, "broker-a").count(";") == 4


def test_two_masters_with_dledger_are_two_groups_each_with_its_own_peers():
    plan = resolve(None, masters=2, dledger=3).plan()
    assert [b.name for b in plan.brokers] == [
        "broker-a-n0",
        "broker-a-n1",
        "broker-a-n2",
        "broker-b-n0",
        "broker-b-n1",
        "broker-b-n2",
    ]
    b_group = [b for b in plan.brokers if b.broker_name == "broker-b"]
    assert [b.port for b in b_group] == [10941, 10951, 10961]
    assert {props(b)["dLegerGroup"] for b in b_group} == {"broker-b"}
    assert {props(b)["dLegerPeers"] for b in b_group} == {
        "n0-127.0.0.1:10943;n1-127.0.0.1:10953;n2-127.0.0.1:10963"
    }


def test_the_toml_file_says_the_same_and_can_move_a_member_and_tune_timing(tmp_path: Path) -> None:
    conf = tmp_path / "cluster.toml"
    conf.write_text(
        "dledger = 3\nbroker_port = 30000\nnamesrv_port = 30100\n"
        "[broker_conf]\nheartBeatTimeIntervalMs = 2000\n"
        "[nodes.broker-a-n1]\nport = 31000\nbroker_conf = { preferredLeaderId = 'n1' }\n"
    )
    plan = resolve(conf).plan()
    n0, n1, n2 = plan.brokers
    assert (n0.port, n1.port, n2.port) == (30000, 31000, 30020)
    # the moved member takes its DLedger port along, and every member is told about it
    assert props(n0)["dLegerPeers"] == "n0-127.0.0.1:30002;n1-127.0.0.1:31002;n2-127.0.0.1:30022"
    assert props(n0)["heartBeatTimeIntervalMs"] == "2000"  # the file wins over laptop timing
    assert props(n0)["minVoteIntervalMs"] == LAPTOP_TIMING["minVoteIntervalMs"]
    assert props(n1)["preferredLeaderId"] == "n1" and "preferredLeaderId" not in props(n2)


def test_a_member_is_started_without_a_fixed_id_or_role(tmp_path: Path) -> None:
    plan = resolve(None, dledger=3).plan()
    cmd = node_command(plan.brokers[1], plan, tmp_path)
    assert "--id" not in cmd and "--role" not in cmd
    assert cmd[cmd.index("--name") + 1] == "broker-a"
    assert cmd[cmd.index("--data-dir") + 1] == str(tmp_path / "broker-a-n1")  # its own store
    assert cmd[cmd.index("--config") + 1] == str(tmp_path / "conf" / "broker-a-n1.conf")
    classic = resolve(None).plan()
    assert "--role" in node_command(classic.brokers[0], classic, tmp_path)
    doc = spec_json(plan.brokers[1])
    assert doc["broker_id"] is None and doc["role"] == "DLEDGER"
    assert (doc["dledger_self_id"], doc["dledger_port"], doc["ha_port"]) == ("n1", 10923, None)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"slaves": 1}, r"--slaves 1 cannot be combined with --dledger 3"),
        ({"role": "ASYNC_MASTER"}, r"--role ASYNC_MASTER cannot be combined with --dledger"),
        ({"dledger": 10}, r"group size from 1 to 9 .*not 10"),
        ({"dledger": -1}, r"group size from 1 to 9 .*not -1"),
    ],
)
def test_what_a_dledger_topology_cannot_have_is_one_line(flags, message):
    with pytest.raises(TopologyError, match=message) as caught:
        resolve(None, **{"dledger": 3, **flags}).plan()
    assert "\n" not in str(caught.value)


def test_slaves_0_and_sync_master_refusals_and_planned_keys(tmp_path: Path) -> None:
    assert len(resolve(None, dledger=3, slaves=0).plan().brokers) == 3  # harmless
    with pytest.raises(TopologyError, match="--role SYNC_MASTER cannot"):
        resolve(None, dledger=3).plan(sync_master=True)
    conf = tmp_path / "c.toml"
    conf.write_text("dledger = 3\nslaves = 2\n")
    with pytest.raises(TopologyError, match="--slaves 2 cannot"):
        resolve(conf).plan()
    conf.write_text("dledger = 3\n[broker_conf]\ndLegerPeers = 'n0-127.0.0.1:1'\n")
    with pytest.raises(TopologyError, match="dLegerPeers is set by rmq up itself"):
        resolve(conf).plan()
    conf.write_text("dledger = 3\n[nodes.broker-a-n3]\nport = 40000\n")
    with pytest.raises(TopologyError, match="'broker-a-n3', which is not a node"):
        resolve(conf).plan()


def test_a_dledger_port_that_collides_is_refused_and_busy_ones_are_found():
    # broker-a-n1 moved so that its VIP port is n0's DLedger port
    with pytest.raises(TopologyError, match="broker-a-n1 and broker-a-n0 both need port 10913"):
        resolve(None, dledger=3, ports={"broker-a-n1": 10915}).plan()
    import socket

    # a block outside the ephemeral range: there no outgoing connection of another process can
    # take one of the plan's other ports and show up as busy too
    base = free_port_block(30)
    with socket.socket() as s:
        s.bind(("127.0.0.1", base + 2))
        s.listen()
        port = s.getsockname()[1]
        plan = resolve(None, dledger=1, broker_port=port - 2, namesrv_port=port + 20).plan()
        assert plan.brokers[0].dledger_port == port
        assert [(n.name, p) for n, p in busy_ports(plan)] == [("broker-a-n0", port)]


# --- readiness ---------------------------------------------------------------------------------


def cluster_info(addrs: dict[str, dict[int, str]]) -> dict[str, object]:
    """GET_BROKER_CLUSTER_INFO as parsed JSON (ids as the strings the parser hands back)."""
    return {
        "brokerAddrTable": {
            name: {"brokerName": name, "brokerAddrs": {str(k): v for k, v in ids.items()}}
            for name, ids in addrs.items()
        },
        "clusterAddrTable": {"DefaultCluster": sorted(addrs)},
    }


def tables(**roles: str) -> dict[str, dict[str, str]]:
    return {f"broker-a-{k}": {"dledgerRole": r, "dledgerSelfId": k} for k, r in roles.items()}


@pytest.fixture
def plan() -> ClusterPlan:
    return resolve(None, dledger=3).plan()


def test_ready_once_elected_registered_and_the_leader_is_master(plan: ClusterPlan) -> None:
    n0, n1, n2 = plan.brokers
    registered = cluster_info({"broker-a": {0: n1.addr, 1: n0.addr, 3: n2.addr}})
    members = plan.brokers
    assert dledger_ready(
        plan, members, registered, tables(n0="FOLLOWER", n1="LEADER", n2="FOLLOWER")
    )
    # a member still electing
    assert not dledger_ready(
        plan, members, registered, tables(n0="CANDIDATE", n1="LEADER", n2="FOLLOWER")
    )
    # a member that did not answer
    assert not dledger_ready(plan, members, registered, tables(n1="LEADER", n2="FOLLOWER"))
    # a member not registered yet
    partly = cluster_info({"broker-a": {0: n1.addr, 1: n0.addr}})
    assert not dledger_ready(
        plan, members, partly, tables(n0="FOLLOWER", n1="LEADER", n2="FOLLOWER")
    )
    # the leader is elected but not yet the nameserver's master (it is still catching up)
    no_master = cluster_info({"broker-a": {1: n0.addr, 2: n1.addr, 3: n2.addr}})
    assert not dledger_ready(
        plan, members, no_master, tables(n0="FOLLOWER", n1="LEADER", n2="FOLLOWER")
    )
    # brokerId 0 is someone who no longer says LEADER (an old registration)
    stale = cluster_info({"broker-a": {0: n0.addr, 2: n1.addr, 3: n2.addr}})
    assert not dledger_ready(
        plan, members, stale, tables(n0="FOLLOWER", n1="LEADER", n2="FOLLOWER")
    )


def test_a_member_restarted_alone_is_ready_once_it_follows_and_is_registered(
    plan: ClusterPlan,
) -> None:
    n0, n1, n2 = plan.brokers
    info = cluster_info({"broker-a": {0: n1.addr, 3: n2.addr}})
    assert not dledger_ready(plan, (n0,), info, {"broker-a-n0": {"dledgerRole": "FOLLOWER"}})
    info = cluster_info({"broker-a": {0: n1.addr, 1: n0.addr, 3: n2.addr}})
    assert not dledger_ready(plan, (n0,), info, {"broker-a-n0": {"dledgerRole": "CANDIDATE"}})
    assert dledger_ready(plan, (n0,), info, {"broker-a-n0": {"dledgerRole": "FOLLOWER"}})
