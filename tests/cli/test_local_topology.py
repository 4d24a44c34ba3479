"""`rmq up` topology: a TOML file and flags resolved into a plan (pure, no processes)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cli.local.topology import TopologyError, resolve
from cli.local.up import (
    LOCAL_BROKER_DEFAULTS,
    node_command,
    node_config_path,
    write_node_config,
)
from cli.local.up_arguments import fast_up_arguments

TOML = """
cluster = "Local"
masters = 2
slaves = 1
role = "ASYNC_MASTER"
namesrv_port = 30060
broker_port = 30000
data_dir = "cluster-data"
ready_timeout = 12.5

[broker_conf]
flushDiskType = "SYNC_FLUSH"
maxMessageSize = 1048576

[nodes.broker-b]
port = 31000
broker_conf = { maxMessageSize = 2048, slaveReadEnable = true }
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.toml"
    path.write_text(text)
    return path


def test_a_file_describes_the_whole_cluster(tmp_path: Path) -> None:
    topo = resolve(write(tmp_path, TOML))
    assert topo.data_dir == Path("cluster-data") and topo.ready_timeout == 12.5
    plan = topo.plan()
    assert plan.namesrv.port == 30060
    got = [(b.name, b.role, b.broker_id, b.port, b.cluster) for b in plan.brokers]
    assert got == [
        ("broker-a", "ASYNC_MASTER", 0, 30000, "Local"),
        ("broker-b", "ASYNC_MASTER", 0, 31000, "Local"),  # its own port from [nodes.broker-b]
        ("broker-a-s1", "SLAVE", 1, 30020, "Local"),
        ("broker-b-s1", "SLAVE", 1, 30030, "Local"),
    ]
    props = {b.name: dict(b.properties) for b in plan.brokers}
    assert props["broker-a"] == {
        **LOCAL_BROKER_DEFAULTS,
        "flushDiskType": "SYNC_FLUSH",
        "maxMessageSize": "1048576",
    }
    # a node's own properties win over the cluster-wide ones
    assert props["broker-b"] == {
        **LOCAL_BROKER_DEFAULTS,
        "flushDiskType": "SYNC_FLUSH",
        "maxMessageSize": "2048",
        "slaveReadEnable": "true",
    }


def test_flags_override_the_file(tmp_path: Path) -> None:
    # the file's [nodes.broker-b] no longer names a node once --masters 1 wins: one line says so
    with pytest.raises(TopologyError, match="'broker-b', which is not a node"):
        resolve(write(tmp_path, TOML), masters=1).plan()
    no_nodes = TOML.split("[nodes.broker-b]")[0]
    topo = resolve(
        write(tmp_path, no_nodes),
        masters=1,
        slaves=2,
        namesrv_port=30090,
        data_dir=tmp_path / "d",
        role=None,
    )
    plan = topo.plan()
    assert topo.data_dir == tmp_path / "d"
    assert plan.namesrv.port == 30090
    assert [(b.name, b.role) for b in plan.brokers] == [
        ("broker-a", "ASYNC_MASTER"),
        ("broker-a-s1", "SLAVE"),
        ("broker-a-s2", "SLAVE"),
    ]


def test_no_file_and_no_flags_is_the_default_cluster():
    plan = resolve(None).plan()
    assert plan.namesrv.port == 9876
    assert [(b.name, b.role, b.port) for b in plan.brokers] == [
        ("broker-a", "SYNC_MASTER", 10911),
        ("broker-a-s1", "SLAVE", 10921),
    ]
    # only what every local broker gets (SQL92 filters on, for the README's example)
    assert all(dict(b.properties) == LOCAL_BROKER_DEFAULTS for b in plan.brokers)
    assert plan.namesrv.properties == ()


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("mastrs = 2", "mastrs"),
        ("masters = 'two'", "masters"),
        ("masters = true", "masters"),
        ("slaves = 1.5", "slaves"),
        ("[nodes.broker-a]\nprot = 1", "prot"),
        ("[nodes.broker-a]\nport = 'x'", "nodes.broker-a.port"),
        ("[nodes.broker-z]\nport = 30000", "broker-z"),
        ("[broker_conf]\nlistenPort = 1", "listenPort"),
        ("[broker_conf]\nnoSuchProperty = 1", "noSuchProperty"),
        ("[broker_conf]\nflushDiskType = 'SOMETIMES'", "flushDiskType"),
        ("[broker_conf]\nmaxMessageSize = [1]", "maxMessageSize"),
        ("broker_conf = 3", "broker_conf"),
        ("masters = ", "not valid TOML"),
        ("masters = 0", "masters"),
        ("role = 'SLAVE'", "SLAVE"),
        ("namesrv_port = 30000\nbroker_port = 30000", "30000"),
    ],
)
def test_a_bad_file_names_the_key(tmp_path: Path, text: str, names: str) -> None:
    with pytest.raises(TopologyError, match=names) as info:
        resolve(write(tmp_path, text)).plan()
    assert "\n" not in str(info.value)


def test_a_missing_file_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match="cannot read .*nope.toml"):
        resolve(tmp_path / "nope.toml")


def test_dledger_in_a_file_or_a_flag_plans_a_group_and_0_means_none(tmp_path: Path) -> None:
    from_file = resolve(write(tmp_path, "dledger = 3")).plan()
    from_flag = resolve(None, dledger=3).plan()
    assert from_file == from_flag
    assert [b.name for b in from_flag.brokers] == ["broker-a-n0", "broker-a-n1", "broker-a-n2"]
    plain = resolve(None, dledger=0).plan()  # 0 means "no DLedger"
    assert [b.name for b in plain.brokers] == ["broker-a", "broker-a-s1"]
    assert not any(b.is_dledger for b in plain.brokers)


def test_extra_properties_reach_the_broker_through_a_config_file(tmp_path: Path) -> None:
    plan = resolve(write(tmp_path, TOML)).plan()
    b = plan.brokers[1]
    cmd = node_command(b, plan, tmp_path)
    assert cmd[cmd.index("--config") + 1] == str(node_config_path(b, tmp_path))
    write_node_config(b, tmp_path)
    from namesrv.config import parse_properties

    assert parse_properties(node_config_path(b, tmp_path).read_text()) == dict(b.properties)
    # the plan's own flags are still on the command line, so they win over the file
    assert cmd[cmd.index("--port") + 1] == "31000"
    plain = resolve(None).plan()
    assert "--config" not in node_command(plain.namesrv, plain, tmp_path)
    assert node_command(plain.namesrv, plain, tmp_path)[:4] == [
        sys.executable,
        "-m",
        "cli.servers.node",
        "namesrv",
    ]


def test_the_fast_path_reads_the_new_options_as_typer_would():
    fast = fast_up_arguments(["up", "--masters", "2", "--detach", "--dledger", "0"])
    assert fast is not None
    assert fast["masters"] == 2 and fast["detach"] is True and fast["config"] is None
    # typer's defaults (slaves: not given, so 1 without --dledger, none with it)
    assert fast["slaves"] is None and fast["data_dir"] == Path(".rmq")
    parsed = fast_up_arguments(["up", "--slaves", "2"])
    assert parsed is not None and parsed["slaves"] == 2
    # with a file, which flags were typed matters: typer's parser tells (parameter sources)
    assert fast_up_arguments(["up", "--config", "c.toml", "--masters", "2"]) is None
    assert fast_up_arguments(["up", "--masters", "0"]) is None  # typer reports min=1
    assert fast_up_arguments(["up", "-d"]) is None  # short options: typer's job
    parsed = fast_up_arguments(["up", "--dledger", "3"])
    assert parsed is not None and parsed["dledger"] == 3
