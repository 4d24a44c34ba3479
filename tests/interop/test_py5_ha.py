"""The official RocketMQ 5 Python client over a broker failure: a SYNC_MASTER killed and
restarted, and a DLedger leader killed (another member takes over).

A 5.x SimpleConsumer runs throughout in a subprocess, acking what it receives; a 5.x producer
sends before and during the failure, retrying a failed send (the same message) until the cluster
serves again. Afterwards every send the broker acknowledged was received and acked, and nothing
acked was acked twice: an ack the broker confirmed survives the failure (acks and checkpoints are
replicated as the messages are). A message received but not yet acked when the node died may
come again: that redelivery is the contract, and it is acked once.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.interop.py5_harness import Py5, acked_bodies, rmq

if TYPE_CHECKING:
    from tests.conftest import ClusterRunner

pytestmark = [pytest.mark.interop, pytest.mark.slow, pytest.mark.timeout(420)]

N = 80  # before the kill; as many again during and after it


def status(data_dir: Path) -> list[dict[str, Any]]:
    out = subprocess.run(
        [sys.executable, "-m", "cli.main", "status", "--data-dir", str(data_dir), "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return [n for n in json.loads(out.stdout)["nodes"] if n["kind"] == "broker"]


def endpoints(data_dir: Path) -> str:
    """Every broker node's gRPC endpoint, `;`-joined: the client's access point, so it still
    reaches one after the one it first used died."""
    nodes = status(data_dir)
    missing = [n["name"] for n in nodes if not n.get("grpc")]
    assert not missing, f"no gRPC endpoint in `rmq status --json` for {missing}"
    return ";".join(str(n["grpc"]) for n in nodes)


def wait_topic_everywhere(data_dir: Path, topic: str, timeout: float = 30.0) -> None:
    """Until every broker node holds ``topic``: followers and slaves copy the master's topics
    every few seconds, and a kill before that takes the topic with the old master (RocketMQ's
    behaviour too), so a 5.x client would then get TOPIC_NOT_FOUND from the new one."""
    import trio

    from common.remoting.client import open_remoting_client
    from common.remoting.codes import RequestCode
    from common.remoting.command import RemotingCommand
    from common.serde import loads

    addrs = [str(n["addr"]) for n in status(data_dir)]

    async def missing() -> list[str]:
        out = []
        async with open_remoting_client() as client:
            for addr in addrs:
                r = await client.invoke(
                    addr, RemotingCommand.request(RequestCode.GET_ALL_TOPIC_CONFIG, {})
                )
                if topic not in loads(r.body_bytes()).get("topicConfigTable", {}):
                    out.append(addr)
        return out

    deadline = time.monotonic() + timeout
    while lacking := trio.run(missing):
        assert time.monotonic() < deadline, f"{topic} never reached {lacking}"
        time.sleep(0.5)


def wait_acked(proc_events: list[dict[str, Any]], count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while sum(1 for e in proc_events if e["event"] == "ack") < count:
        assert time.monotonic() < deadline, f"fewer than {count} acked: {proc_events[-5:]}"
        time.sleep(0.1)


def run_failover(
    tmp_path: Path, py5: Py5, data_dir: Path, victim: str, *, restart: bool, topic: str
) -> None:
    group = f"{topic.lower()}-g"
    py5.topic(topic)
    py5.group(group)
    py5.produce(tmp_path, topic, N, "--prefix", "a-")
    consumer = py5.background(
        tmp_path, "simple-consume", "--topic", topic, "--group", group, "--expect", str(2 * N),
        "--invisible", "10", "--batch", "4", "--timeout", "240", "--linger", "6", "--ack-retry",
    )  # fmt: skip
    try:
        assert consumer.started.wait(60), "the 5.x consumer did not start"
        wait_acked(consumer.events, N // 2, 60)
        if not restart:  # the victim stays down: a member that takes over must hold the topic
            wait_topic_everywhere(data_dir, topic)
        rmq("kill", victim, "--data-dir", str(data_dir))
        if restart:
            time.sleep(1.0)
            rmq("restart", victim, "--data-dir", str(data_dir))
        # sends during the outage fail until the client's route shows a serving node again
        # (the client refreshes routes every 30 s): retried, the same message, for up to 90 s
        sent = py5.produce(tmp_path, topic, N, "--prefix", "b-", "--retry-for", "90", timeout=240)
        assert len([e for e in sent if e["event"] == "sent"]) == N
        events = consumer.wait(300)
    finally:
        consumer.stop()
    done = [e for e in events if e["event"] == "done"][0]
    assert done["complete"], (done, events[-5:])
    # an ack whose answer the failover lost was stored (the retry found the handle used up)
    acked = acked_bodies(events) + acked_bodies(events, "ack_stored")
    want = {f"a-body-{i}" for i in range(N)} | {f"b-body-{i}" for i in range(N)}
    assert set(acked) == want, sorted(want - set(acked))[:10]
    twice = {b: c for b, c in acked.items() if c > 1}
    assert not twice, f"acked twice across the failover: {list(twice.items())[:10]}"
    late = [e["body"] for e in events if e["event"] == "recv" and e.get("late")]
    assert not late, f"received again after its ack: {late[:10]}"


def test_sync_master_killed_and_restarted(
    tmp_path: Path, py5_python: Path, cluster_runner: ClusterRunner
) -> None:
    data_dir = tmp_path / "rmq"
    with cluster_runner(data_dir) as c:  # SYNC_MASTER broker-a + slave broker-a-s1
        py5 = Py5(py5_python, endpoints(data_dir), c.namesrv_addr)
        run_failover(tmp_path, py5, data_dir, "broker-a", restart=True, topic="Py5HaMaster")


def test_dledger_leader_killed(
    tmp_path: Path, py5_python: Path, cluster_runner: ClusterRunner
) -> None:
    data_dir = tmp_path / "rmq"
    with cluster_runner(data_dir, "--dledger", "3", ready_timeout=60) as c:
        py5 = Py5(py5_python, endpoints(data_dir), c.namesrv_addr)
        leader = raft_leader(c.namesrv_addr)
        run_failover(tmp_path, py5, data_dir, leader, restart=False, topic="Py5HaRaft")


def raft_leader(namesrv: str, timeout: float = 30.0) -> str:
    """The node name of the DLedger member that leads and serves as brokerId 0."""
    deadline = time.monotonic() + timeout
    while True:
        brokers = json.loads(rmq("cluster", "--json", "-n", namesrv))["brokers"]
        leaders = [
            f"{b['broker_name']}-{b['raft']['self_id']}"
            for b in brokers
            if b.get("raft") and not b.get("error")
            and b["raft"]["role"] == "LEADER" and b["broker_id"] == 0
        ]  # fmt: skip
        if len(leaders) == 1:
            return leaders[0]
        assert time.monotonic() < deadline, f"no single DLedger leader: {brokers}"
        time.sleep(0.2)
