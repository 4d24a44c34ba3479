"""`rmq bench` end to end: a real `rmq up` cluster (processes), the command as a subprocess.

Produce a small count with batches and several requests in flight, over two runs (so the
min/median/max summary appears), then consume the same topic back and check with --json that
every produced message (two runs and their warm-up messages) is pulled.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.conftest import LocalCluster

pytestmark = pytest.mark.integration


def rmq(
    cluster: LocalCluster, *args: str, timeout: float = 120.0
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", "--namesrv", cluster.namesrv_addr, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_bench_produce_then_consume(module_cluster):
    out = rmq(
        module_cluster,
        "bench",
        "produce",
        "--topic",
        "BenchCli",
        "--count",
        "300",
        "--size",
        "200",
        "--batch",
        "4",
        "--inflight",
        "4",
        "--runs",
        "2",
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("run 1: 300 msgs") and lines[1].startswith("run 2: 300 msgs")
    assert "msg/s" in lines[0] and "MB/s" in lines[0] and "p999=" in lines[0]
    assert any(line.startswith("over 2 runs") for line in lines)
    assert "Traceback" not in out.stderr

    got = rmq(module_cluster, "bench", "consume", "--topic", "BenchCli", "--json")
    assert got.returncode == 0, got.stderr
    doc = json.loads(got.stdout)
    [run] = doc["runs"]
    assert run["msgs"] == 2 * 300 + 2  # + one warm-up message per produce run
    assert doc["summary"]["msgs"]["median"] == 602
    assert doc["settings"]["topic"] == "BenchCli"

    some = rmq(
        module_cluster,
        "bench",
        "consume",
        "--topic",
        "BenchCli",
        "--count",
        "100",
        "--batch",
        "10",
        "--json",
    )
    assert some.returncode == 0, some.stderr
    assert json.loads(some.stdout)["runs"][0]["msgs"] >= 100


def test_bench_unknown_topic_is_one_line(module_cluster):
    out = rmq(module_cluster, "bench", "consume", "--topic", "NoSuchBenchTopic", "--count", "1")
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [out.stderr.strip()] and out.stderr.startswith(
        "error: topic does not exist"
    )
