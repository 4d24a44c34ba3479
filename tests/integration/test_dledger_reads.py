"""Reads in DLedger mode, on a real 3-member group (docs/guarantees.md, "Reads in DLedger mode").

* A leader cut off from both followers (every Raft link to and from it through a proxy the test
  blocks, tests/integration/conftest.py; its client port and the nameserver stay reachable)
  steps down within its lease, ``maxHeartBeatLeak x heartBeatTimeIntervalMs`` (3 x 500 ms here),
  measured by the server itself (its log line says how long it had gone without a heartbeat
  quorum); from then on it refuses writes with SERVICE_NOT_AVAILABLE (14), the nameserver lists
  it as a slave, and what it serves is committed entries only.  The other two elect a leader; a
  producer that kept sending through it all loses nothing it was told SEND_OK, after the heal,
  on any member.
* ``rmq consume -v`` on a group whose leader is gone names the follower that served each
  message: its address, brokerId and role.
"""

from __future__ import annotations

import datetime
import re
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import trio

from cli.chaos.queue_readback import pull_queue
from common.errors import BrokerResponseError
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from common.serde import loads
from rmq import Message, Producer
from rmq.client_api import ClientAPI
from rmq.producer import SendStatus

if TYPE_CHECKING:
    from common.remoting.client import RemotingClient
    from tests.integration.conftest import DLedgerFactory, DLedgerGroupProcs

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LEASE = 1.5  # FAST_TIMING: 3 x 500 ms
# a loaded 2-core CI box may run the server's lease timer late; the bound is still a few
# heartbeat intervals, far below what a lease-less leader would show (forever)
LATE = 1.5

STEP_DOWN = re.compile(
    r"lost its quorum: no heartbeat round was answered by a majority for ([\d.]+) s"
)
STOPPED = "stopped serving as master"


def log_lines(group: DLedgerGroupProcs, node: str, needle: str) -> list[str]:
    return [
        ln for ln in group.nodes[node].log.read_text(errors="replace").splitlines() if needle in ln
    ]


def logged_at(line: str) -> datetime.datetime:
    """The time a node's log line was written (cli/servers/node.py's LOG_FORMAT: asctime)."""
    return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float) -> None:
    with trio.fail_after(timeout):
        while True:
            if await check():
                return
            await trio.sleep(0.05)


async def wait_log(group: DLedgerGroupProcs, node: str, needle: str, timeout: float) -> str:
    with trio.fail_after(timeout):
        while True:
            found = log_lines(group, node, needle)
            if found:
                return found[0]
            await trio.sleep(0.05)


async def broker_ids(group: DLedgerGroupProcs, client: RemotingClient) -> dict[str, int]:
    """address -> brokerId of broker-a as the nameserver lists it."""
    r = await client.invoke(
        group.namesrv_addr, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO, {})
    )
    table = loads(r.body_bytes()).get("brokerAddrTable", {})
    addrs = table.get("broker-a", {}).get("brokerAddrs", {})
    return {addr: int(i) for i, addr in addrs.items()}


async def send_direct(client_api: ClientAPI, addr: str, topic: str, key: str) -> int:
    """SEND_MESSAGE straight to ``addr``; the response code."""
    header = ClientAPI.send_header(
        group="lease-pg", topic=topic, queue_id=0, properties={"KEYS": key}, born_timestamp=0
    )
    try:
        await client_api.send_message(addr, header, key.encode(), timeout=5.0)
    except BrokerResponseError as exc:
        return exc.code
    return ResponseCode.SUCCESS


async def keys_on(
    group: DLedgerGroupProcs, client: RemotingClient, node: str, topic: str
) -> list[str]:
    keys: list[str] = []
    for q in range(4):
        got = await pull_queue(client, group.addr(node), topic, q, group="lease-check")
        keys += [m.keys or "" for m in got]
    return keys


async def steady_producer(namesrv: str, topic: str, acked: list[str], stop: trio.Event) -> None:
    """Send one key after another until ``stop``; every SEND_OK key goes to ``acked``.  Sends
    that fail (the failover outlasting a send timeout) are not acknowledged: not counted."""
    async with Producer("lease-steady-pg", namesrv) as producer:
        n = 0
        while not stop.is_set():
            key = f"steady-{n}"
            n += 1
            try:
                r = await producer.send(Message(topic, key.encode(), keys=key))
            except Exception:
                continue
            if r.status is SendStatus.SEND_OK:
                acked.append(key)
            await trio.sleep(0.01)


@pytest.mark.timeout(240)
async def test_a_cut_off_leader_stops_serving_as_master_within_its_lease(
    dledger_factory: DLedgerFactory, raft_client: RemotingClient
) -> None:
    topic = "LeaseTopic"
    group = await dledger_factory(3)
    old = await group.leader(raft_client, timeout=60)
    await group.create_topic(raft_client, topic, queues=4)
    acked: list[str] = []
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(steady_producer, group.namesrv_addr, topic, acked, stop)

        async def acked_at_least(n: int) -> None:
            async def enough() -> bool:
                return len(acked) >= n

            await eventually(enough, 30)

        await acked_at_least(20)

        group.isolate(old)
        line = await wait_log(group, old, "lost its quorum", timeout=30)
        # the server's own measure: from the send of its last heartbeat round a majority
        # answered (at or before the cut) to its step-down
        match = STEP_DOWN.search(line)
        assert match, line
        assert LEASE <= float(match.group(1)) <= LEASE + LATE, line
        stopped = await wait_log(group, old, STOPPED, timeout=10)
        assert "writes are refused with SERVICE_NOT_AVAILABLE" in stopped
        assert (logged_at(stopped) - logged_at(line)).total_seconds() <= LATE, (line, stopped)

        # writes straight to it: refused with 14, not left waiting for a quorum
        async with Producer("lease-direct-pg", group.namesrv_addr) as direct:
            for n in range(3):
                with trio.fail_after(2.0):
                    code = await send_direct(direct.client.api, group.addr(old), topic, f"x{n}")
                assert code == ResponseCode.SERVICE_NOT_AVAILABLE

        # the nameserver lists it as a slave (its registration is not cut)
        async def listed_as_slave() -> bool:
            return (await broker_ids(group, raft_client)).get(group.addr(old), 0) != 0

        await eventually(listed_as_slave, 10)
        assert (await broker_ids(group, raft_client))[group.addr(old)] == int(old[1:]) + 1

        others = [i for i in group.ids if i != old]
        new = await group.leader(raft_client, among=others, timeout=30)
        # what the cut-off member serves meanwhile: its committed entries, never the tail it
        # appended while it still thought it led (checked against the final log below)
        served_while_cut = await keys_on(group, raft_client, old, topic)
        mark = len(acked)
        await acked_at_least(mark + 20)  # the new leader takes writes

        group.heal()
        await acked_at_least(mark + 40)
        stop.set()

    assert new != old
    # after the heal every member holds every acknowledged key (and the same log)
    held: dict[str, list[str]] = {}

    async def all_hold_all() -> bool:
        held.update({i: await keys_on(group, raft_client, i, topic) for i in group.ids})
        return all(set(acked) <= set(keys) for keys in held.values()) and (
            len({tuple(sorted(k)) for k in held.values()}) == 1
        )

    await eventually(all_hold_all, 60)
    final = set(held[new])
    assert set(served_while_cut) <= final, set(served_while_cut) - final
    assert not [k for k in final if k.startswith("x")]  # the refused direct writes


@pytest.mark.timeout(240)
async def test_verbose_consume_names_the_follower_that_served_each_message(
    dledger_factory: DLedgerFactory, raft_client: RemotingClient
) -> None:
    topic = "FollowerReads"
    group = await dledger_factory(3)
    leader = await group.leader(raft_client, timeout=60)
    await group.create_topic(raft_client, topic, queues=1)
    async with Producer("follower-reads-pg", group.namesrv_addr) as producer:
        for n in range(5):
            r = await producer.send(Message(topic, f"m{n}".encode()))
            assert r.status is SendStatus.SEND_OK
    survivor = next(i for i in group.ids if i != leader)

    # the survivor serves all five once it applied the commit (one push behind the leader)
    async def survivor_has_all() -> bool:
        return len(await keys_on(group, raft_client, survivor, topic)) == 5

    await eventually(survivor_has_all, 10)
    for i in group.ids:
        if i != survivor:
            group.kill(i)  # no quorum left: no leader, the survivor stays a slave
    addr = group.addr(survivor)

    async def only_the_survivor_listed() -> bool:
        return set((await broker_ids(group, raft_client)).values()) == {int(survivor[1:]) + 1}

    await eventually(only_the_survivor_listed, 30)

    def consume() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cli.main", "-n", group.namesrv_addr, "consume"]
            + ["--topic", topic, "--group", "g-follower", "--from-beginning", "-v"]
            + ["--count", "5"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=Path(__file__).resolve().parents[2],
        )

    done = await trio.to_thread.run_sync(consume)
    assert done.returncode == 0, (done.stdout, done.stderr)
    lines = done.stdout.splitlines()
    assert len(lines) == 5, lines
    role = f" {addr} brokerId={int(survivor[1:]) + 1} slave "
    assert all(role in line for line in lines), lines
    assert [line.rsplit("body=", 1)[1] for line in lines] == [f"m{n}" for n in range(5)]
