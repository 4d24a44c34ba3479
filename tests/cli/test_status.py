"""Replication status: runtime-info parsing, rendering, and `rmq cluster` / `rmq up` option errors."""

from __future__ import annotations

import json
import socket

import pytest
from typer.testing import CliRunner

from cli.admin import render as admin_render
from cli.local.up import master_role
from cli.local.up_arguments import fast_up_arguments
from cli.main import app
from cli.runtime_info.status import (
    BrokerStatus,
    SlaveLag,
    StatusError,
    broker_role,
    parse_runtime_info,
    runtime_table,
)

runner = CliRunner()

MASTER_TABLE = {
    "commitLogMaxOffset": "5000",
    "push2SlaveMaxOffset": "4800",
    "haConnectionCount": "2",
    "haWaitingSends": "1",
    "haSlave0Addr": "127.0.0.1:40001",
    "haSlave0AckOffset": "4800",
    "haSlave0LagBytes": "200",
    "haSlave0LagMillis": "12",
    "haSlave1Addr": "127.0.0.1:40002",
    "haSlave1AckOffset": "1000",
    "haSlave1LagBytes": "4000",
    "haSlave1LagMillis": "3500",
    "brokerVersionDesc": "V4_9_7",
}
SLAVE_TABLE = {
    "commitLogMaxOffset": "4800",
    "push2SlaveMaxOffset": "0",
    "haConnectionCount": "0",
    "haMasterAddress": "127.0.0.1:10912",
    "haClientConnected": "true",
    "haClientReportedOffset": "4800",
}


def test_master_runtime_info_gives_every_slave_with_its_lag():
    s = parse_runtime_info(
        MASTER_TABLE,
        broker_name="broker-a",
        broker_id=0,
        addr="127.0.0.1:10911",
        role="SYNC_MASTER",
    )
    assert (s.max_offset, s.push2slave_max_offset, s.ha_connections) == (5000, 4800, 2)
    assert s.slaves == (
        SlaveLag("127.0.0.1:40001", 4800, 200, 12),
        SlaveLag("127.0.0.1:40002", 1000, 4000, 3500),
    )
    assert s.ha_master_addr is None and s.ha_client_connected is None


def test_slave_runtime_info_gives_its_master_and_reported_offset():
    s = parse_runtime_info(SLAVE_TABLE, broker_name="broker-a", broker_id=1, addr="a:1")
    assert s.ha_master_addr == "127.0.0.1:10912"
    assert s.ha_client_connected is True
    assert s.ha_reported_offset == 4800
    assert s.slaves == ()
    down = parse_runtime_info(
        {**SLAVE_TABLE, "haClientConnected": "false", "haMasterAddress": ""},
        broker_name="broker-a",
        broker_id=1,
        addr="a:1",
    )
    assert down.ha_client_connected is False and down.ha_master_addr is None


def test_a_broker_without_ha_keys_has_none_not_zero():
    s = parse_runtime_info({"brokerVersionDesc": "V4_9_7"}, broker_name="b", broker_id=0, addr="x")
    assert s.push2slave_max_offset is None and s.ha_connections is None and s.slaves == ()


def test_garbage_runtime_info_is_a_status_error():
    with pytest.raises(StatusError, match="haConnectionCount"):
        parse_runtime_info({"haConnectionCount": "two"}, broker_name="b", broker_id=0, addr="x")
    junk: object
    for junk in (None, [], {"table": []}, {"nottable": {}}):
        with pytest.raises(StatusError, match="no table"):
            runtime_table(junk)
    assert runtime_table({"table": {"a": 1}}) == {"a": "1"}


def test_role_comes_from_the_broker_config_text():
    assert broker_role("brokerName=broker-a\nbrokerRole=SYNC_MASTER\nbrokerId=0\n") == "SYNC_MASTER"
    assert broker_role("brokerName=broker-a\n") == ""


def statuses() -> list[BrokerStatus]:
    master = parse_runtime_info(
        MASTER_TABLE,
        broker_name="broker-a",
        broker_id=0,
        addr="127.0.0.1:10911",
        cluster="DefaultCluster",
        role="SYNC_MASTER",
    )
    slave = parse_runtime_info(
        SLAVE_TABLE,
        broker_name="broker-a",
        broker_id=1,
        addr="127.0.0.1:10921",
        cluster="DefaultCluster",
        role="SLAVE",
    )
    dead = BrokerStatus("broker-a", 2, "127.0.0.1:10931", "DefaultCluster", error="refused")
    return [master, slave, dead]


def test_text_rendering_shows_roles_offsets_and_each_slave_lag(capsys):
    admin_render.cluster_status(statuses())
    out = capsys.readouterr().out
    assert "SYNC_MASTER" in out and "SLAVE" in out
    assert "push2SlaveMaxOffset 4800" in out
    assert "127.0.0.1:10912 connected" in out
    assert "error: refused" in out
    rows = [line for line in out.splitlines() if "127.0.0.1:4000" in line]
    assert len(rows) == 2
    assert all(v in rows[0] for v in ("4800", "200", "12"))
    assert all(v in rows[1] for v in ("1000", "4000", "3500"))


def test_json_rendering_is_machine_readable(capsys):
    admin_render.cluster_status(statuses(), as_json=True)
    doc = json.loads(capsys.readouterr().out)
    master, slave, dead = doc["brokers"]
    assert master["role"] == "SYNC_MASTER" and master["push2slave_max_offset"] == 4800
    assert master["slaves"][1] == {
        "addr": "127.0.0.1:40002",
        "ack_offset": 1000,
        "lag_bytes": 4000,
        "lag_ms": 3500,
    }
    assert slave["ha_client_connected"] is True and slave["ha_reported_offset"] == 4800
    assert dead["error"] == "refused"


def test_no_slaves_says_so(capsys):
    admin_render.cluster_status([BrokerStatus("broker-a", 0, "x:1", role="ASYNC_MASTER")])
    assert "no slave connections" in capsys.readouterr().out


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("extra", [[], ["--json"]])
def test_cluster_broker_refused_is_one_line(extra):
    result = runner.invoke(app, ["cluster", "--broker", f"127.0.0.1:{closed_port()}", *extra])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: cannot connect")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--role", "SLAVE"], "master role must be ASYNC_MASTER or SYNC_MASTER, not SLAVE"),
        (["--role", "ASYNC_MASTER", "--sync-master"], "--sync-master contradicts --role"),
    ],
)
def test_up_role_errors_are_one_line(tmp_path, args, message):
    argv = ["up", "--data-dir", str(tmp_path / "rmq"), *args]
    result = runner.invoke(app, argv)
    assert result.exit_code == 1
    assert result.stderr.strip() == f"error: {message}" or message in result.stderr
    assert result.stderr.count("\n") == 1
    assert not (tmp_path / "rmq").exists()  # nothing spawned
    # the fast path parses the same options the same way
    fast = fast_up_arguments(argv)
    assert fast is not None and fast["role"] == args[1]


def test_up_defaults_are_sync_master_with_one_slave():
    fast = fast_up_arguments(["up"])
    assert fast is not None
    # slaves not given: one per master (none with --dledger)
    assert (fast["role"], fast["slaves"], fast["masters"]) == ("auto", None, 1)
    from cli.local.topology import resolve

    plan = resolve(None, role=fast["role"], slaves=fast["slaves"], masters=fast["masters"]).plan()
    assert [b.role for b in plan.brokers] == ["SYNC_MASTER", "SLAVE"]
    assert master_role(fast["role"], slaves=1) == "SYNC_MASTER"


@pytest.mark.parametrize(
    ("role", "slaves", "sync_master", "expected"),
    [
        ("auto", 1, False, "SYNC_MASTER"),
        ("auto", 3, False, "SYNC_MASTER"),
        ("auto", 0, False, "ASYNC_MASTER"),  # a SYNC_MASTER alone would refuse every send
        ("auto", 0, True, "SYNC_MASTER"),  # ... unless asked for
        ("SYNC_MASTER", 0, False, "SYNC_MASTER"),
        ("async_master", 1, False, "ASYNC_MASTER"),
        ("SYNC_MASTER", 1, True, "SYNC_MASTER"),
    ],
)
def test_master_role_resolution(role, slaves, sync_master, expected):
    assert master_role(role, slaves=slaves, sync_master=sync_master) == expected
    assert fast_up_arguments(["up", "--slaves", "-1"]) is None  # typer reports it
    result = runner.invoke(app, ["up", "--slaves", "-1"])
    assert result.exit_code == 2
