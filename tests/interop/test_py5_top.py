"""`rmq top` and `rmq group describe` show RocketMQ 5 clients (the official Python client over
gRPC): the broker registers them with its producer and consumer managers like 4.x connections
(broker/grpc/client_manager.py), and the admin answers mark them `GRPC_V2`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.interop.py5_harness import Py5, grpc_endpoint, rmq

if TYPE_CHECKING:
    from tests.conftest import ClusterRunner, LocalCluster

pytestmark = [pytest.mark.interop, pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def cluster(
    cluster_runner: ClusterRunner, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalCluster]:
    d = tmp_path_factory.mktemp("py5top")
    with cluster_runner(d / "rmq", "--slaves", "0") as c:
        yield c


def _top(namesrv: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "cli.main", "-n", namesrv, "top", "--once", "--interval", "0.2"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "220"},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_a_5x_simple_consumer_shows_in_top_and_group_describe(
    tmp_path: Path, py5_python: Path, cluster: LocalCluster
) -> None:
    py5 = Py5(py5_python, grpc_endpoint(cluster.data_dir), cluster.namesrv_addr)
    topic, group = "Py5Top", "py5-top"
    py5.topic(topic)
    py5.group(group)
    # a SimpleConsumer that stays up (it waits for a message that never comes)
    consumer = py5.background(
        tmp_path, "simple-consume", "--topic", topic, "--group", group,
        "--expect", "1", "--timeout", "60", "--await", "5",
    )  # fmt: skip
    try:
        assert consumer.started.wait(60), consumer.events
        deadline = time.monotonic() + 30
        while True:  # registered by its first telemetry settings or heartbeat (1 s after start)
            shown = [ln for ln in _top(cluster.namesrv_addr).splitlines() if group in ln]
            rows = [ln for ln in shown if "GRPC_V2" in ln]
            if rows or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert rows, f"no 5.x client row for {group} in rmq top:\n{shown}"
        for want in ("simple consumer", "PYTHON", topic):
            assert want in rows[0], rows[0]
        described = json.loads(
            rmq("group", "describe", group, "-n", cluster.namesrv_addr, "--json")
        )
        text = json.dumps(described)
        assert "PYTHON" in text and '"protocol": "GRPC_V2"' in text, described
    finally:
        consumer.stop()
