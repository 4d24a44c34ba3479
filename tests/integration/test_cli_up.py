"""`rmq up` end to end: real processes on free loopback ports in tmp_path.

Start `rmq up` (through the suite's `local_cluster` fixture: the default cluster, a nameserver
plus a SYNC_MASTER and its slave), wait for `ready`, produce and consume through
`rmq produce` / `rmq consume` and through the Python client, read a message back from the
slave's own address, look at the replication state with `rmq cluster`, then stop it with
SIGTERM (or kill it outright) and check that no node process is left behind.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING

import pytest

from cli.chaos.port_blocks import free_port_block
from common.model import MessageQueue
from rmq import Message, PullStatus, SendStatus, sync

if TYPE_CHECKING:
    from cli.local.up import UpEvent
    from common.message import MessageExt
    from tests.conftest import LocalCluster

pytestmark = pytest.mark.integration


def rmq(
    cluster: LocalCluster, *args: str, input: str | None = None, timeout: float = 30.0
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", "--namesrv", cluster.namesrv_addr, *args],
        capture_output=True,
        text=True,
        input=input,
        timeout=timeout,
    )


def child_pids(cluster: LocalCluster, nodes: int = 3) -> list[int]:
    pids = [int(m.group(1)) for line in cluster.lines if (m := re.search(r" pid (\d+) ", line))]
    assert len(pids) == nodes, cluster.output()
    return pids


def pull_from(
    addr: str, topic: str, queue_id: int, offset: int, *, timeout: float = 15.0
) -> list[MessageExt]:
    """The messages one broker node (by address, master or slave) returns for one pull; retried
    until it finds some (a slave builds its queues from replicated bytes, and learns a new
    topic from its master's config within a few seconds)."""
    import trio

    from common.message import decode_records
    from common.remoting.client import open_remoting_client
    from common.remoting.codes import RequestCode, ResponseCode
    from common.remoting.command import RemotingCommand

    header = {
        "consumerGroup": "up-check",
        "topic": topic,
        "queueId": queue_id,
        "queueOffset": offset,
        "maxMsgNums": 32,
        "sysFlag": 4,
        "commitOffset": 0,
        "suspendTimeoutMillis": 0,
        "subscription": "*",
        "subVersion": 0,
    }
    # sysFlag 4: the subscription travels with the pull (no consumer heartbeat needed)

    async def main():
        codes = []
        async with open_remoting_client() as client:
            with trio.move_on_after(timeout):
                while True:
                    r = await client.invoke(
                        addr, RemotingCommand.request(RequestCode.PULL_MESSAGE, header), 5
                    )
                    if r.code == ResponseCode.SUCCESS:
                        return decode_records(r.body_bytes(), check_crc=True)
                    codes.append(r.code)
                    await trio.sleep(0.2)
        raise AssertionError(f"{addr} found nothing for {topic}:{queue_id}@{offset}: {codes[-3:]}")

    return trio.run(main)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def close_output(cluster: LocalCluster) -> None:
    """Join the fixture's reader thread (it ends at EOF) and close the pipe it read.

    Works around tests/conftest.py leaving `proc.stdout` open, which the suite's
    filterwarnings=error turns into a ResourceWarning failure once the process is gone.
    """
    for thread in threading.enumerate():
        if thread.name.endswith("(_pump)"):
            thread.join(timeout=5)
    if cluster.proc.stdout is not None:
        cluster.proc.stdout.close()


def test_up_produce_consume_and_clean_stop(local_cluster):
    cluster = local_cluster
    out = cluster.output()
    assert f"127.0.0.1:{cluster.namesrv_port}" in out
    assert f"127.0.0.1:{cluster.broker_port}" in out
    slave_addr = f"127.0.0.1:{cluster.broker_port + 10}"
    bp = cluster.broker_port
    assert re.search(rf"SYNC_MASTER broker-a id 0, .*listen {bp}, ha {bp + 1}, vip {bp - 2}", out)
    assert re.search(rf"broker-a-s1 +{slave_addr} .*SLAVE broker-a id 1,", out)
    pids = child_pids(cluster)
    assert all(alive(p) for p in pids)
    logs = cluster.data_dir / "logs"
    for node in ("namesrv", "broker-a", "broker-a-s1"):
        assert (logs / f"{node}.log").exists()
    # each broker has its own store under the data dir
    assert (cluster.data_dir / "broker-a" / "lock").exists()
    assert (cluster.data_dir / "broker-a-s1" / "lock").exists()

    # `ready` means the slave already replicates: the master counts its HA connection
    r = rmq(cluster, "cluster", "--json")
    assert r.returncode == 0, r.stderr
    brokers = {b["broker_id"]: b for b in json.loads(r.stdout)["brokers"]}
    assert brokers[0]["role"] == "SYNC_MASTER" and brokers[0]["ha_connections"] == 1
    assert brokers[1]["role"] == "SLAVE" and brokers[1]["addr"] == slave_addr
    assert brokers[1]["ha_master_addr"] == f"127.0.0.1:{cluster.broker_port + 1}"
    assert brokers[1]["ha_client_connected"] is True

    # CLI: produce three messages (arguments) and two more (stdin lines)
    r = rmq(cluster, "produce", "--topic", "UpTopic", "--tags", "TagA", "one", "two", "three")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("SEND_OK") == 3
    r = rmq(cluster, "produce", "--topic", "UpTopic", input="four\nfive\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("SEND_OK") == 2

    r = rmq(cluster, "consume", "--topic", "UpTopic", "--from-beginning", "--count", "5")
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split()) == sorted(["one", "two", "three", "four", "five"])

    r = rmq(cluster, "topic", "list")
    assert r.returncode == 0 and "UpTopic" in r.stdout.split()
    r = rmq(cluster, "topic", "route", "NoSuchTopic")
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "NoSuchTopic" in r.stderr

    # Python client (sync flavour) against the same cluster
    with sync.Producer("py-pg", cluster.namesrv_addr) as p:
        sent = p.send(Message("UpTopic", b"from-python", keys="pk"))
    assert sent.status is SendStatus.SEND_OK
    with sync.PullConsumer("py-cg", cluster.namesrv_addr) as c:
        mq = MessageQueue("UpTopic", "broker-a", sent.message_queue.queueId)
        res = c.pull(mq, sent.queue_offset)
    assert res.status is PullStatus.FOUND
    assert res.messages[0].body == b"from-python" and res.messages[0].uniq_key == sent.msg_id

    # replication: the same message, read from the slave's own address
    on_slave = pull_from(slave_addr, "UpTopic", sent.message_queue.queueId, sent.queue_offset)
    assert on_slave[0].body == b"from-python" and on_slave[0].uniq_key == sent.msg_id
    # and the master saw the slave acknowledge everything: ack == push2SlaveMaxOffset == max
    r = rmq(cluster, "cluster", "--broker", f"127.0.0.1:{cluster.broker_port}", "--json")
    assert r.returncode == 0, r.stderr
    [master] = json.loads(r.stdout)["brokers"]
    [lag] = master["slaves"]
    assert lag["ack_offset"] == master["push2slave_max_offset"] == master["max_offset"] > 0
    assert lag["lag_bytes"] == 0
    r = rmq(cluster, "cluster")
    assert r.returncode == 0 and "push2SlaveMaxOffset" in r.stdout and "SLAVE" in r.stdout
    for node in ("broker-a", "broker-a-s1"):
        [segment] = (cluster.data_dir / node / "commitlog").iterdir()
        assert segment.name == "0" * 20

    # SIGTERM: the supervisor stops every node and exits 0
    cluster.proc.send_signal(signal.SIGTERM)
    assert cluster.proc.wait(timeout=20) == 0
    assert wait_gone(pids, 5) == []
    close_output(cluster)
    assert "stopped" in cluster.output().splitlines()[-1]


def test_nodes_stop_by_themselves_when_the_supervisor_is_killed(local_cluster):
    pids = child_pids(local_cluster)
    local_cluster.proc.kill()  # no chance to clean up: children must notice stdin EOF
    local_cluster.proc.wait(timeout=5)
    close_output(local_cluster)
    left = wait_gone(pids, 15)
    for pid in left:  # only our own grandchildren, by pid; the test fails anyway
        os.kill(pid, signal.SIGKILL)
    assert left == []


def test_node_entry_point_serves_without_typer_pydantic_or_rich(tmp_path):
    """What `rmq up` spawns: serves, stops on stdin EOF, and never imports the slow CLI stack."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-X",
            "importtime",
            "-m",
            "cli.servers.node",
            "namesrv",
            "--port",
            "0",
            "--data-dir",
            str(tmp_path / "ns"),
            "--watch-stdin",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    try:
        line = proc.stdout.readline()
        assert re.match(r"namesrv listening on 127\.0\.0\.1:\d+$", line.strip()), line
        proc.stdin.close()  # the supervisor is gone: the node stops by itself
        assert proc.wait(timeout=15) == 0
        imported = {
            entry.split("|")[-1].strip().split(".")[0]
            for entry in proc.stderr.read().splitlines()
            if entry.startswith("import time:")
        }
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    assert "trio" in imported and "namesrv" in imported  # the check sees real imports
    assert not imported & {"typer", "pydantic", "rich", "click"}


def test_rmq_up_does_not_go_through_pydantic(tmp_path):
    """`python -m cli.main up ...` parses its plain options without typer's pydantic path (a
    busy port makes it stop with its usual one-line error before spawning anything)."""
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run(
            [
                sys.executable,
                "-X",
                "importtime",
                "-m",
                "cli.main",
                "up",
                "--data-dir",
                str(tmp_path / "rmq"),
                "--namesrv-port",
                str(port),
                "--broker-port",
                str(port + 20 if port < 60000 else 20000),
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
    imported = {
        line.split("|")[-1].strip().split(".")[0]
        for line in proc.stderr.splitlines()
        if line.startswith("import time:")
    }
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert proc.returncode == 1, proc.stderr
    assert errors == [
        f"error: port {port} (namesrv) is already in use; is another `rmq up` running?"
    ]
    assert "typer" in imported  # the check sees real imports
    assert "pydantic" not in imported
    assert not (tmp_path / "rmq" / "logs").exists()


def free_block(width: int) -> int:
    """A free port block outside the ephemeral range (cli.chaos.port_blocks)."""
    return free_port_block(width)


async def test_two_slaves_of_an_async_master_are_ready_and_replicating(tmp_path):
    """`--slaves 2 --role ASYNC_MASTER` through the real supervisor and nodes: `ready` only
    once the master counts both HA connections; each slave has its id, port and store."""
    import trio

    from cli.local.supervisor import run_up
    from cli.local.up import plan_cluster
    from cli.runtime_info.status import cluster_status

    base = free_block(40)
    plan = plan_cluster(
        namesrv_port=base + 35, broker_port=base, slaves=2, master_role="ASYNC_MASTER"
    )
    events: list[UpEvent] = []
    async with trio.open_nursery() as nursery:
        with trio.fail_after(60):
            await nursery.start(
                lambda task_status: run_up(
                    plan, tmp_path, report=events.append, task_status=task_status
                )
            )
        # right at `ready`: no waiting, the replication state is already complete
        statuses = await cluster_status(plan.namesrv_addr)
        nursery.cancel_scope.cancel()
    by_id = {s.broker_id: s for s in statuses}
    assert sorted(by_id) == [0, 1, 2]
    master = by_id[0]
    assert master.role == "ASYNC_MASTER" and master.ha_connections == 2
    assert len(master.slaves) == 2
    for i in (1, 2):
        s = by_id[i]
        assert s.role == "SLAVE" and s.addr == f"127.0.0.1:{base + 10 * i}"
        assert s.ha_master_addr == f"127.0.0.1:{base + 1}" and s.ha_client_connected
        assert (tmp_path / f"broker-a-s{i}" / "lock").exists()
    stopped = [e for e in events if e.kind == "stopped"]
    assert len(stopped) == 4 and all(e.returncode == 0 for e in stopped)
