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
    from cli.top.model import TopSnapshot
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


async def _snapshots(namesrv: str, gap: float) -> tuple[TopSnapshot, TopSnapshot]:
    """Two collections of `rmq top`'s data source, `gap` seconds apart (as `top --once`)."""
    import trio

    from cli.top.model import AdminSource, TopCollector
    from rmq import Admin

    async with Admin(namesrv, timeout=5.0) as admin:
        collector = TopCollector(AdminSource(admin, 5.0), namesrv, timeout=5.0)
        first = await collector.collect()
        await trio.sleep(gap)
        return first, await collector.collect()


def test_a_5x_producer_shows_in_top_while_it_produces(
    tmp_path: Path, py5_python: Path, cluster: LocalCluster
) -> None:
    """The official 5.x Producer sending (a message every 100 ms) is listed by `rmq top` as a
    5.x producer (group = its topic, PYTHON, GRPC_V2), and the topic's messages grow meanwhile."""
    import trio

    py5 = Py5(py5_python, grpc_endpoint(cluster.data_dir), cluster.namesrv_addr)
    topic = "Py5TopProducer"
    py5.topic(topic)
    producer = py5.background(
        tmp_path, "produce", "--topic", topic, "--count", "600", "--interval-ms", "100",
        "--prefix", "top-", "--timeout", "120",
    )  # fmt: skip
    try:
        assert producer.started.wait(60), producer.events
        deadline = time.monotonic() + 30
        while True:  # registered by its telemetry settings or first heartbeat
            first, snap = trio.run(_snapshots, cluster.namesrv_addr, 1.0)
            mine = [c for c in snap.clients if c.kind == "producer" and c.group == topic]
            if mine or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert [(c.language, c.protocol, c.is_5x) for c in mine] == [("PYTHON", "GRPC_V2", True)]
        assert producer.proc.poll() is None, "the producer must still be sending"
        # it is producing while listed: the topic's messages grew between the two collections
        before = {t.topic: t.total for t in first.topics}
        after = {t.topic: t.total for t in snap.topics}
        assert after[topic] > before.get(topic, 0), (before.get(topic), after.get(topic))
        # and the frame people see says the same
        rows = [
            ln for ln in _top(cluster.namesrv_addr).splitlines()
            if topic in ln and "GRPC_V2" in ln
        ]  # fmt: skip
        assert rows, "no 5.x producer row in rmq top"
        for want in ("producer", "PYTHON"):
            assert want in rows[0], rows[0]
        sent = [e for e in producer.events if e["event"] == "sent"]
        assert sent and not [e for e in producer.events if e["event"] == "send_error"]
    finally:
        producer.stop()
