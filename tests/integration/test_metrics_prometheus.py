"""A real Prometheus scrapes every node of `rmq up` and is asked with PromQL (docs/metrics.md).

Debian's `prometheus` binary (installed by .ci/run) runs on a free loopback port with a temp
config (scrape_interval 1 s) and a temp TSDB, killed by its pid at the end.  Its targets are
the `metrics` URLs `rmq status --json` lists.  Against the classic cluster (nameserver, master,
slave): messages in and out per topic and group equal what the test sent and read; the
consumer lag equals `rmq group progress --json`'s; the slave's lag rises while the slave is
stopped (SIGSTOP by its pid) and falls back once it runs again; and a flood of garbage, stalled
and 1,000 connections on the master's metrics port leaves the master serving sends and pulls
with its memory bounded.  Against `rmq up --dledger 3`: one leader, and every member's
committed index follows what is sent.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio

from common.model import MessageQueue
from common.remoting.client import open_remoting_client
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from rmq import Message, SendStatus, sync
from tests.conftest import free_port_block

if TYPE_CHECKING:
    from tests.conftest import ClusterRunner, LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]


def rmq(cluster: LocalCluster, *args: str, timeout: float = 30.0) -> Any:
    r = subprocess.run(
        [sys.executable, "-m", "cli.main", "--namesrv", cluster.namesrv_addr, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def status_nodes(cluster: LocalCluster) -> dict[str, dict[str, Any]]:
    doc = rmq(cluster, "status", "--data-dir", str(cluster.data_dir), "--json")
    return {n["name"]: n for n in doc["nodes"]}


@contextlib.contextmanager
def prometheus(tmp: Path, targets: list[str]) -> Iterator[str]:
    """A Prometheus scraping ``targets`` (host:port) every second; yields its base URL."""
    binary = shutil.which("prometheus")
    assert binary, "the prometheus binary is missing (.ci/run installs Debian's prometheus)"
    tmp.mkdir(parents=True, exist_ok=True)
    config = tmp / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: rmq\n    static_configs:\n"
        f"      - targets: {json.dumps(targets)}\n"
    )
    port = free_port_block(1)
    log = open(tmp / "prometheus.log", "wb")  # closed below, after the process
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None, (tmp / "prometheus.log").read_text()
            assert time.monotonic() < deadline, "prometheus did not get ready"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def query(url: str, promql: str) -> list[dict[str, Any]]:
    q = urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=5) as r:
        doc = json.load(r)
    assert doc["status"] == "success", doc
    return doc["data"]["result"]


def scalar(url: str, promql: str) -> float | None:
    """The value of a query with one result (None: no result)."""
    result = query(url, promql)
    assert len(result) <= 1, result
    return float(result[0]["value"][1]) if result else None


def eventually(
    url: str, promql: str, check: Callable[[float | None], bool], timeout: float = 20
) -> float | None:
    """Poll ``promql`` until ``check(value)``; its last value."""
    deadline = time.monotonic() + timeout
    while True:
        v = scalar(url, promql)
        if check(v):
            return v
        assert time.monotonic() < deadline, f"{promql}: last {v}"
        time.sleep(0.3)


def targets_of(nodes: dict[str, dict[str, Any]]) -> list[str]:
    out = []
    for n in nodes.values():
        assert n["metrics"] == f"http://127.0.0.1:{n['metrics_port']}/metrics", n
        out.append(f"127.0.0.1:{n['metrics_port']}")
    return out


def send(cluster: LocalCluster, topic: str, n: int, queue: MessageQueue | None = None) -> None:
    with sync.Producer("prom-pg", cluster.namesrv_addr) as p:
        for i in range(n):
            r = p.send(Message(topic, b"m%d" % i), queue=queue)
            assert r.status is SendStatus.SEND_OK


async def _pull_and_commit(addr: str, topic: str, group: str, max_nums: int, commit: int) -> int:
    """Pull queue 0 from its start as the Java client does, commit ``commit``; how many came."""
    async with open_remoting_client() as client:
        header = {
            "consumerGroup": group,
            "topic": topic,
            "queueId": 0,
            "queueOffset": 0,
            "maxMsgNums": max_nums,
            "sysFlag": 4,
            "commitOffset": 0,
            "suspendTimeoutMillis": 0,
            "subscription": "*",
            "subVersion": 0,
        }
        r = await client.invoke(addr, RemotingCommand.request(RequestCode.PULL_MESSAGE, header), 5)
        assert r.code == ResponseCode.SUCCESS, r
        from common.message import decode_records

        got = len(decode_records(r.body_bytes()))
        ext = {"consumerGroup": group, "topic": topic, "queueId": 0, "commitOffset": commit}
        r = await client.invoke(
            addr, RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, ext), 5
        )
        assert r.code == ResponseCode.SUCCESS, r
        return got


def vm_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def _flood(metrics_port: int, broker_addr: str, topic: str) -> dict[str, int]:
    """1,000 connections (some garbage, some stalled mid-request) on the metrics port; while
    they are open the broker still stores a send and answers a pull."""
    streams: list[trio.SocketStream] = []
    opened = refused = 0
    try:
        for i in range(1000):
            try:
                s = await trio.open_tcp_stream("127.0.0.1", metrics_port)
            except OSError:
                refused += 1
                continue
            opened += 1
            streams.append(s)
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                if i % 3 == 0:
                    await s.send_all(os.urandom(4096))  # garbage
                elif i % 3 == 1:
                    await s.send_all(b"GET /metrics HTTP/1.1\r\nX-Slow: ")  # never finished
        async with open_remoting_client() as client:
            ext = {
                "a": "prom-pg",
                "b": topic,
                "c": "TBW102",
                "d": 4,
                "e": 1,
                "f": 0,
                "g": int(time.time() * 1000),
                "h": 0,
                "i": "",
                "j": 0,
                "k": False,
            }
            r = await client.invoke(
                broker_addr,
                RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, ext, b"during the flood"),
                10,
            )
            assert r.code == ResponseCode.SUCCESS, r
            header = {
                "consumerGroup": "flood-check",
                "topic": topic,
                "queueId": 1,
                "queueOffset": 0,
                "maxMsgNums": 32,
                "sysFlag": 4,
                "commitOffset": 0,
                "suspendTimeoutMillis": 0,
                "subscription": "*",
                "subVersion": 0,
            }
            r = await client.invoke(
                broker_addr, RemotingCommand.request(RequestCode.PULL_MESSAGE, header), 10
            )
            assert r.code == ResponseCode.SUCCESS, r
    finally:
        for s in streams:
            await trio.aclose_forcefully(s)
    return {"opened": opened, "refused": refused}


def test_prometheus_scrapes_rmq_up(cluster_runner: ClusterRunner, tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    with cluster_runner(tmp_path / "rmq", ready_timeout=40) as cluster:
        # `rmq up` prints every node's metrics port with its other ports
        out = cluster.output()
        bp, np_ = cluster.broker_port, cluster.namesrv_port
        assert f"vip {bp - 2}, metrics {bp + 3}" in out, out
        assert f"nameserver, metrics {np_ + 1}" in out, out
        nodes = status_nodes(cluster)
        assert set(nodes) == {"namesrv", "broker-a", "broker-a-s1"}
        with prometheus(tmp_path / "prom", targets_of(nodes)) as prom:
            eventually(prom, 'sum(up{job="rmq"})', lambda v: v == 3)
            eventually(prom, "max(rocketmq_nameserver_live_brokers)", lambda v: v == 2)

            topic, group = "PromT", "PromG"
            rmq(cluster, "topic", "create", topic, "--queues", "2", "--json")
            send(cluster, topic, 10, MessageQueue(topic, "broker-a", 0))
            read = trio.run(_pull_and_commit, cluster.broker_addr, topic, group, 6, 4)
            assert read == 6
            eventually(
                prom,
                f'sum(rocketmq_messages_in_total{{topic="{topic}",message_type="normal"}})',
                lambda v: v == 10,
            )
            eventually(
                prom,
                f'sum(rocketmq_messages_out_total{{topic="{topic}",consumer_group="{group}"}})',
                lambda v: v == 6,
            )
            progress = rmq(cluster, "group", "progress", group, "--topic", topic, "--json")
            lag = progress["total"]["lag"]
            assert lag == 6  # 10 stored, 4 committed
            lag_q = (
                f'sum(rocketmq_consumer_lag_messages{{topic="{topic}",'
                f'consumer_group="{group}",broker_id="0"}})'
            )
            eventually(prom, lag_q, lambda v: v == lag)
            eventually(
                prom,
                f'sum(rocketmq_consumer_inflight_messages{{consumer_group="{group}",'
                'broker_id="0"})',
                lambda v: v == 2,
            )
            eventually(
                prom,
                'sum(rocketmq_rpc_latency_count{request_code="send_message_v2",'
                'response_code="success",node_type="broker"})',
                lambda v: v is not None and v >= 10,
            )

            # the slave's lag moves: it grows while the slave is stopped, and goes back to 0
            slave_lag = 'max(rocketmq_ha_slave_lag_bytes{node_id="broker-a",broker_id="0"})'
            eventually(prom, slave_lag, lambda v: v == 0)
            slave_pid = nodes["broker-a-s1"]["pid"]
            os.kill(slave_pid, signal.SIGSTOP)
            try:
                with sync.Producer("prom-pg", cluster.namesrv_addr) as p:
                    # SYNC_MASTER: stored, answered FLUSH_SLAVE_TIMEOUT once the slave is late
                    p.send_oneway(Message(topic, b"x" * 4096))
                eventually(prom, slave_lag, lambda v: v is not None and v > 4096)
                eventually(
                    prom,
                    'max(rocketmq_ha_slave_lag_ms{node_id="broker-a"})',
                    lambda v: v is not None and v > 0,
                )
            finally:
                os.kill(slave_pid, signal.SIGCONT)
            eventually(prom, slave_lag, lambda v: v == 0, timeout=30)

            # bad input on the master's metrics port: it keeps serving its RocketMQ clients,
            # its memory stays bounded, and it serves metrics again once the flood is gone
            master = nodes["broker-a"]
            rss_before = vm_rss_kib(master["pid"])
            for _ in range(2):
                counts = trio.run(_flood, master["metrics_port"], cluster.broker_addr, topic)
                assert counts["opened"] + counts["refused"] == 1000
            rss_growth = vm_rss_kib(master["pid"]) - rss_before
            assert rss_growth < 64 * 1024, f"master RSS grew {rss_growth} KiB"
            eventually(prom, 'sum(up{job="rmq"})', lambda v: v == 3, timeout=30)
            eventually(
                prom,
                f'sum(rocketmq_messages_in_total{{topic="{topic}"}})',
                lambda v: v == 13,
            )


def test_prometheus_scrapes_rmq_up_dledger(cluster_runner: ClusterRunner, tmp_path: Path) -> None:
    with cluster_runner(tmp_path / "rmq", "--dledger", "3", ready_timeout=60) as cluster:
        nodes = status_nodes(cluster)
        assert len(nodes) == 4
        with prometheus(tmp_path / "prom", targets_of(nodes)) as prom:
            eventually(prom, 'sum(up{job="rmq"})', lambda v: v == 4, timeout=30)
            eventually(
                prom, 'sum(rocketmq_dledger_role{role="leader"})', lambda v: v == 1, timeout=30
            )
            assert scalar(prom, 'count(rocketmq_dledger_role{role="follower"} == 1)') == 2
            before = eventually(
                prom, "min(rocketmq_dledger_committed_index)", lambda v: v is not None
            )
            assert before is not None
            send(cluster, "RaftT", 5)
            eventually(
                prom,
                "min(rocketmq_dledger_committed_index)",
                lambda v: v is not None and v >= before + 5,
            )
            eventually(
                prom,
                "min(rocketmq_dledger_ledger_end_index)",
                lambda v: v is not None and v >= before + 5,
            )
            eventually(prom, 'sum(rocketmq_messages_in_total{topic="RaftT"})', lambda v: v == 5)
            terms = query(prom, "rocketmq_dledger_term")
            assert len({r["value"][1] for r in terms}) == 1, terms  # one term for the group
