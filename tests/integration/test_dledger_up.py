"""`rmq up --dledger 3` end to end: real processes on free loopback ports in tmp_path.

One test, in the order a user would go: start the group and wait for `ready`; produce and
consume through `rmq produce` / `rmq consume`; `rmq cluster` shows one LEADER (marked *) and
two FOLLOWERs; `rmq kill` the leader and see another member lead (and serve writes) within
seconds; `rmq restart` it and see it rejoin as a follower that catches up; move the leadership
to a chosen follower with `rmq dledger leadership-transfer`; read everything back.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tests.conftest import ClusterRunner, LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOPIC = "UpRaft"


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


def local(
    cluster: LocalCluster, *args: str, timeout: float = 30.0
) -> subprocess.CompletedProcess[str]:
    """A local-cluster command (`rmq kill/restart/status`) on the cluster's data dir."""
    return rmq(cluster, *args, "--data-dir", str(cluster.data_dir), timeout=timeout)


def members(cluster: LocalCluster) -> dict[str, dict[str, Any]]:
    """member id -> its `rmq cluster --json` entry (only members that answered)."""
    r = rmq(cluster, "cluster", "--json")
    assert r.returncode == 0, r.stderr
    return {
        b["raft"]["self_id"]: b
        for b in json.loads(r.stdout)["brokers"]
        if b.get("raft") and not b["error"]
    }


def wait_for(what: str, check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout} s (last: {last!r})")


def leader_serving(cluster: LocalCluster, not_this: str | None = None) -> str | None:
    """The member that leads and is the nameserver's brokerId 0, if any (and not `not_this`)."""
    found = members(cluster)
    leaders = [m for m, b in found.items() if b["raft"]["role"] == "LEADER" and b["broker_id"] == 0]
    if len(leaders) == 1 and leaders[0] != not_this:
        return leaders[0]
    return None


def topic_on_every_member(cluster: LocalCluster, addrs: list[str]) -> bool:
    """Whether every member knows TOPIC (followers copy it from the leader's metadata)."""
    import trio

    from common.remoting.client import open_remoting_client
    from common.remoting.codes import RequestCode
    from common.remoting.command import RemotingCommand
    from common.serde import loads

    async def main() -> bool:
        async with open_remoting_client() as client:
            for addr in addrs:
                cmd = RemotingCommand.request(RequestCode.GET_ALL_TOPIC_CONFIG)
                r = await client.invoke(addr, cmd, 3.0)
                if TOPIC not in loads(r.body_bytes()).get("topicConfigTable", {}):
                    return False
        return True

    return trio.run(main)


def produce(cluster: LocalCluster, *bodies: str) -> None:
    r = rmq(cluster, "produce", "--topic", TOPIC, *bodies)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("SEND_OK") == len(bodies), r.stdout


def test_rmq_up_dledger_3_fails_over_rejoins_and_transfers(
    cluster_runner: ClusterRunner, tmp_path: Path
) -> None:
    started = time.monotonic()
    with cluster_runner(tmp_path / "rmq", "--dledger", "3", ready_timeout=40) as cluster:
        out = cluster.output()
        bp = cluster.broker_port
        for k in range(3):
            port = bp + 10 * k
            assert re.search(
                rf"broker-a-n{k} +127\.0\.0\.1:{port} .*DLEDGER broker-a member n{k}, "
                rf"cluster DefaultCluster, listen {port}, dledger {port + 2}",
                out,
            ), out
        conf = (cluster.data_dir / "conf" / "broker-a-n1.conf").read_text()
        peers = ";".join(f"n{k}-127.0.0.1:{bp + 10 * k + 2}" for k in range(3))
        assert f"dLegerPeers={peers}\n" in conf and "dLegerSelfId=n1\n" in conf
        addrs = {f"n{k}": f"127.0.0.1:{bp + 10 * k}" for k in range(3)}

        # ready: one leader serving as master, two followers
        found = members(cluster)
        assert sorted(b["raft"]["role"] for b in found.values()) == [
            "FOLLOWER",
            "FOLLOWER",
            "LEADER",
        ]
        leader = leader_serving(cluster)
        assert leader is not None
        r = rmq(cluster, "cluster")
        assert r.returncode == 0, r.stderr
        assert f"{leader} LEADER *" in r.stdout and "DLedger groups" in r.stdout

        produce(cluster, "one", "two", "three")
        r = rmq(cluster, "consume", "--topic", TOPIC, "--from-beginning", "--count", "3")
        assert r.returncode == 0, r.stderr
        assert sorted(r.stdout.split()) == ["one", "three", "two"]
        wait_for(
            "the topic on every member",
            lambda: topic_on_every_member(cluster, list(addrs.values())),
            20,
        )

        # kill the leader: another member leads and serves writes within seconds
        r = local(cluster, "kill", f"broker-a-{leader}")
        assert r.returncode == 0, r.stderr
        killed_at = time.monotonic()
        new_leader = wait_for("a new leader", lambda: leader_serving(cluster, not_this=leader), 15)
        failover = time.monotonic() - killed_at
        produce(cluster, "four")
        print(f"failover to {new_leader} in {failover:.2f} s (seen through `rmq cluster`)")
        assert failover < 10

        # restart it: it rejoins as a follower and catches up
        r = local(cluster, "restart", f"broker-a-{leader}", "--timeout", "20", timeout=40)
        assert r.returncode == 0, r.stderr
        assert f"broker-a-{leader} restarted" in r.stdout

        def caught_up() -> bool:
            found = members(cluster)
            back = found.get(leader)
            return (
                back is not None
                and back["raft"]["role"] == "FOLLOWER"
                and back["raft"]["leader_id"] == new_leader
                and back["raft"]["lag"] == 0
            )

        wait_for("the restarted member following with no lag", caught_up, 15)
        r = local(cluster, "status", "--json")
        assert r.returncode == 0 and json.loads(r.stdout)["state"] == "ready", r.stdout

        # move the leadership to the follower that is neither leader nor the restarted one
        target = next(m for m in ("n0", "n1", "n2") if m not in (leader, new_leader))
        r = rmq(cluster, "dledger", "leadership-transfer", "--to", target)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith(f"broker-a: leadership moved {new_leader} -> {target}"), r.stdout
        assert wait_for(
            "the target serving as master", lambda: leader_serving(cluster) == target, 10
        )
        produce(cluster, "five")

        # every acknowledged message is there, once
        r = rmq(
            cluster,
            "consume",
            "--topic",
            TOPIC,
            "--group",
            "check",
            "--from-beginning",
            "--count",
            "5",
        )
        assert r.returncode == 0, r.stderr
        assert sorted(r.stdout.split()) == ["five", "four", "one", "three", "two"]

        # errors are one line
        r = rmq(cluster, "dledger", "leadership-transfer", "--to", "n9")
        assert (
            r.returncode == 1
            and r.stderr == "error: broker-a has no member n9 (members: n0, n1, n2)\n"
        )
        assert addrs[target] in rmq(cluster, "cluster").stdout
    print(f"whole test {time.monotonic() - started:.1f} s")
