"""`rmq consume -v` names the node that served each message, not the record's store host.

A record keeps the address of the master that stored it; when the master is dead and its
slave serves the pull, `-v` must name the slave. A real `rmq up` (SYNC_MASTER + slave).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def rmq(ns: str, *args: str) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        [sys.executable, "-m", "cli.main", "-n", ns, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r


def test_verbose_consume_names_the_slave_once_the_master_is_dead(local_cluster):
    ns = local_cluster.namesrv_addr
    master = local_cluster.broker_addr
    slave = f"127.0.0.1:{local_cluster.broker_port + 10}"
    rmq(ns, "topic", "create", "ServedBy", "--queues", "1")
    rmq(ns, "produce", "--topic", "ServedBy", "m1", "m2", "m3")  # SYNC_MASTER: the slave has them

    before = rmq(
        ns,
        "consume",
        "--topic",
        "ServedBy",
        "--group",
        "g-before",
        "--from-beginning",
        "--count",
        "3",
        "-v",
    ).stdout.splitlines()
    assert len(before) == 3 and all(f" {master} brokerId=0 master " in line for line in before), (
        before
    )

    subprocess.run(
        [
            sys.executable,
            "-m",
            "cli.main",
            "kill",
            "broker-a",
            "--data-dir",
            str(local_cluster.data_dir),
        ],
        check=True,
        timeout=60,
    )
    after = rmq(
        ns,
        "consume",
        "--topic",
        "ServedBy",
        "--group",
        "g-after",
        "--from-beginning",
        "--count",
        "3",
        "-v",
    ).stdout.splitlines()
    assert len(after) == 3, after
    assert all(f" {slave} brokerId=1 slave " in line and master not in line for line in after), (
        after
    )
    assert [line.rsplit("body=", 1)[1] for line in after] == ["m1", "m2", "m3"]
