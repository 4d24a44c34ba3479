"""Master -> slave HA with real processes on loopback.

Every broker is its own process (`python -m cli.servers.node broker -c <conf>`), found by the slave
through the nameserver (no haMasterAddress), so these tests exercise the byte-level HA
protocol, the SYNC_MASTER wait and the nameserver's slave registration answer together.
"""

from __future__ import annotations

import filecmp
import json
import os
import random
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio

from cli.chaos.queue_readback import pull_queue
from common.remoting.client import RemotingClient, open_remoting_client
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from rmq import Message, Producer
from rmq.producer import SendStatus
from tests.support.wire import wait_node_serving

if TYPE_CHECKING:
    from tests.conftest import Node, ProcessGroup

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SEGMENT = 1024 * 1024  # small CommitLog files so every run crosses several of them


async def runtime_info(client: RemotingClient, addr: str) -> dict[str, str]:
    r = await client.invoke(addr, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO, {}))
    assert r.code == ResponseCode.SUCCESS, r.remark
    return json.loads(r.body_bytes())["table"]


async def ha_connections(client: RemotingClient, master: Node) -> int:
    return int((await runtime_info(client, master.addr)).get("haConnectionCount", 0))


async def poll_until(
    predicate: Callable[[], Awaitable[bool]], *, timeout: float = 30.0, interval: float = 0.1
) -> None:
    """Poll another process's state (no Event can cross a process boundary)."""
    with trio.fail_after(timeout):
        while not await predicate():  # noqa: ASYNC110 - remote state, no Event to wait on
            await trio.sleep(interval)


async def wait_slave_connected(
    client: RemotingClient, master: Node, *watching: Node, timeout: float = 30.0
) -> None:
    """Until the master counts an HA connection; on timeout, the logs of the master and of the
    `watching` nodes (the slave) say which step of finding the master stalled."""

    async def connected() -> bool:
        return await ha_connections(client, master) >= 1

    try:
        await poll_until(connected, timeout=timeout)
    except trio.TooSlowError:
        logs = "\n".join(f"--- {n.name}:\n{n.log_tail()}" for n in (master, *watching))
        raise AssertionError(
            f"no slave connected to {master.name} in {timeout} s\n{logs}"
        ) from None


async def wait_caught_up(
    client: RemotingClient, master: Node, slave: Node, *, timeout: float = 60.0
) -> int:
    with trio.fail_after(timeout):
        while True:
            m = int((await runtime_info(client, master.addr))["commitLogMaxOffset"])
            s = int((await runtime_info(client, slave.addr))["commitLogMaxOffset"])
            if m == s:
                return m
            await trio.sleep(0.1)


# how a read of one queue may end; PULL_RETRY_IMMEDIATELY (records removed under the read)
# moves it on instead
PULL_ENDS = (
    ResponseCode.PULL_NOT_FOUND,
    ResponseCode.PULL_OFFSET_MOVED,
    ResponseCode.TOPIC_NOT_EXIST,
)
RETRY = (ResponseCode.PULL_RETRY_IMMEDIATELY,)


async def pull_all(
    client: RemotingClient, addr: str, topic: str, queue_id: int
) -> list[tuple[int, bytes, int]]:
    """(queue offset, body, physical offset) of every message in one queue of one broker."""
    got = await pull_queue(
        client, addr, topic, queue_id, group="ha-check", ends=PULL_ENDS, skip=RETRY
    )
    return [(m.queue_offset, m.body, m.commit_log_offset) for m in got]


def start_pair(
    procs: ProcessGroup,
    *,
    role: str = "SYNC_MASTER",
    name: str = "broker-a",
    ns: Node | None = None,
) -> tuple[Node, Node, Node]:
    ns = ns or procs.namesrv()
    # broker.conf properties (ProcessGroup.broker writes them as text)
    common: dict[str, Any] = {
        "brokerName": name,
        "namesrvAddr": ns.addr,
        "mapedFileSizeCommitLog": SEGMENT,
        "brokerClusterName": "HACluster",
    }
    master = procs.broker(f"{name}-master", brokerId=0, brokerRole=role, **common)
    slave = procs.broker(f"{name}-slave", brokerId=1, brokerRole="SLAVE", **common)
    return ns, master, slave


def commitlog_files(node: Node) -> dict[str, Path]:
    assert node.data_dir is not None
    return {p.name: p for p in sorted((node.data_dir / "commitlog").iterdir())}


async def test_sync_master_replicates_100k_messages_byte_identical(procs):
    ns, master, slave = start_pair(procs)
    topic, n, batch = "HABulk", 100_000, 100
    async with open_remoting_client() as client:
        await wait_node_serving(client, master)
        await wait_node_serving(client, slave)
        await wait_slave_connected(client, master, slave)
        async with Producer("ha-pg", ns.addr, send_timeout=10) as producer:
            statuses: dict[SendStatus, int] = {}

            async def sender(start: int) -> None:
                for first in range(start, n, batch * 4):
                    msgs = [
                        Message(topic, b"ha-%08d-" % i + b"p" * 200, keys=f"k{i}")
                        for i in range(first, min(first + batch, n))
                    ]
                    r = await producer.send_batch(msgs)
                    statuses[r.status] = statuses.get(r.status, 0) + len(msgs)

            async with trio.open_nursery() as nursery:
                for k in range(4):
                    nursery.start_soon(sender, k * batch)
        assert statuses == {SendStatus.SEND_OK: n}, statuses
        end = await wait_caught_up(client, master, slave)
        assert end > 20 * SEGMENT  # several files were crossed
        for qid in range(4):
            on_master = await pull_all(client, master.addr, topic, qid)
            on_slave = await pull_all(client, slave.addr, topic, qid)
            assert on_slave == on_master
        total = 0
        for q in range(4):
            total += len(await pull_all(client, master.addr, topic, q))
        assert total == n

        # An empty slave started now against a master holding many files starts at the
        # beginning of the master's last file (RocketMQ's offset-0 rule) and is identical there.
        late = procs.broker(
            "late-slave",
            brokerName="broker-a",
            brokerId=2,
            brokerRole="SLAVE",
            namesrvAddr=ns.addr,
            mapedFileSizeCommitLog=SEGMENT,
            brokerClusterName="HACluster",
        )
        await wait_node_serving(client, late)
        await wait_caught_up(client, master, late)
    for node in (late, slave, master):
        node.stop()
    mfiles, sfiles, lfiles = commitlog_files(master), commitlog_files(slave), commitlog_files(late)
    assert list(sfiles) == list(mfiles)
    for name in mfiles:
        assert filecmp.cmp(mfiles[name], sfiles[name], shallow=False), name
    assert list(lfiles) == [list(mfiles)[-1]]
    assert filecmp.cmp(lfiles[list(lfiles)[0]], mfiles[list(lfiles)[0]], shallow=False)


async def _kill_round(
    procs: ProcessGroup, ns: Node, rng: random.Random, round_no: int, role: str
) -> tuple[int, int]:
    """One producer run against a fresh master/slave pair; SIGKILL the master at a random
    moment; return (acknowledged, acknowledged but missing on the slave)."""
    name = f"broker-k{round_no}"
    _, master, slave = start_pair(procs, role=role, name=name, ns=ns)
    topic = f"HAKill{round_no}"
    acked: dict[tuple[int, int], bytes] = {}
    async with open_remoting_client() as client:
        await wait_node_serving(client, master)
        await wait_node_serving(client, slave)
        await wait_slave_connected(client, master, slave)
        async with Producer("ha-kill-pg", ns.addr, send_timeout=5, retry_times=0) as producer:
            # create the topic's queues before the clock starts
            r = await producer.send(Message(topic, b"warmup"))
            assert r.status == SendStatus.SEND_OK
            acked[(r.message_queue.queueId, r.queue_offset)] = b"warmup"
            # 1,250 batches of 16: a 20,000-message run, killed somewhere inside it
            counter = iter(range(1, 1251))

            async def sender() -> None:
                for first in counter:
                    bodies = [b"m-%d-%d" % (first, j) for j in range(16)]
                    try:
                        res = await producer.send_batch([Message(topic, b) for b in bodies])
                    except Exception:
                        return  # the master is gone
                    if res.status == SendStatus.SEND_OK:
                        for j, body in enumerate(bodies):
                            acked[(res.message_queue.queueId, res.queue_offset + j)] = body

            async with trio.open_nursery() as nursery:
                for _ in range(3):
                    nursery.start_soon(sender)
                # the kill lands once every queue had a batch acknowledged (a busy host can
                # take more than a fixed delay for them; a queue the slave never saw is one it
                # refuses to read, "queueId[3] is illegal"), then anywhere in the next 2.8 s
                with trio.fail_after(30):
                    while len({q for q, _ in acked}) < 4:  # noqa: ASYNC110 (the senders fill it)
                        await trio.sleep(0.01)
                await trio.sleep(rng.uniform(0.0, 2.8))
                master.kill()
                nursery.cancel_scope.deadline = trio.current_time() + 8

        # what the slave holds now is all there is, once its queues were built from it (the
        # replicated bytes reach the consume queues in a later step of the slave's)
        async def dispatched() -> bool:
            return (await runtime_info(client, slave.addr)).get("dispatchBehindBytes") == "0"

        await poll_until(dispatched)
        got: dict[tuple[int, int], bytes] = {}
        for qid in range(4):
            for qoff, body, _phys in await pull_all(client, slave.addr, topic, qid):
                got[(qid, qoff)] = body
    slave.stop()
    missing = [k for k, body in acked.items() if got.get(k) != body]
    # whatever the slave has is dense and in order per queue
    for qid in range(4):
        offs = sorted(o for q, o in got if q == qid)
        assert offs == list(range(len(offs))), f"queue {qid} has holes on the slave"
    return len(acked), len(missing)


async def test_sync_master_loses_no_acknowledged_message_when_killed(procs):
    rng = random.Random(int.from_bytes(os.urandom(4), "big"))
    ns = procs.namesrv()
    results = []
    for round_no in range(10):
        acked, missing = await _kill_round(procs, ns, rng, round_no, "SYNC_MASTER")
        results.append((acked, missing))
        assert missing == 0, f"round {round_no}: {missing} of {acked} acknowledged messages lost"
    assert min(a for a, _ in results) > 16, results


async def test_async_master_loss_is_measured(procs, record_property):
    """Under ASYNC_MASTER the same kill loses what the slave had not copied yet: measure it."""
    rng = random.Random(int.from_bytes(os.urandom(4), "big"))
    ns = procs.namesrv()
    results = [await _kill_round(procs, ns, rng, 100 + i, "ASYNC_MASTER") for i in range(5)]
    record_property("async_master_loss", json.dumps(results))
    print("ASYNC_MASTER (acknowledged, lost on the slave) per round:", results)
    assert all(acked > 16 for acked, _ in results), results


async def test_sync_master_answers_slave_not_available_and_flush_slave_timeout(procs):
    ns, master, slave = start_pair(procs)
    topic = "HAStates"
    async with open_remoting_client() as client:
        await wait_node_serving(client, master)
        await wait_node_serving(client, slave)
        await wait_slave_connected(client, master, slave)
        async with Producer("ha-states-pg", ns.addr, send_timeout=10, retry_times=0) as producer:
            r = await producer.send(Message(topic, b"ok"))
            assert r.status == SendStatus.SEND_OK

            slave.signal(signal.SIGSTOP)
            try:
                t0 = trio.current_time()
                r = await producer.send(Message(topic, b"paused"))
                took = trio.current_time() - t0
            finally:
                slave.signal(signal.SIGCONT)
            assert r.status == SendStatus.FLUSH_SLAVE_TIMEOUT
            # the master waited its 3 s for the slave, and answered well before the client's
            # 10 s timeout (the upper bound is loose: a busy host stretches the answer)
            assert 2.5 <= took <= 9.0, took
            paused_at = (r.message_queue.queueId, r.queue_offset)

            slave.stop()

            async def disconnected() -> bool:
                return await ha_connections(client, master) == 0

            await poll_until(disconnected)
            t0 = trio.current_time()
            r = await producer.send(Message(topic, b"alone"))
            took = trio.current_time() - t0
            assert r.status == SendStatus.SLAVE_NOT_AVAILABLE
            assert took < 2.5, took  # no 3 s wait for a slave that is gone
            alone_at = (r.message_queue.queueId, r.queue_offset)
        # both were stored on the master
        for (qid, qoff), body in ((paused_at, b"paused"), (alone_at, b"alone")):
            stored = {o: b for o, b, _ in await pull_all(client, master.addr, topic, qid)}
            assert stored.get(qoff) == body


async def test_our_pull_consumer_fails_over_to_the_slave(procs):
    """With the master dead, `rmq.PullConsumer` finds the slave through the route and reads,
    queries and commits offsets there (Java's offset store falls back to any node the same way)."""
    from common.model import MessageQueue
    from rmq import PullConsumer, PullStatus

    ns, master, slave = start_pair(procs)
    topic = "HAFailover"
    async with open_remoting_client() as client:
        await wait_node_serving(client, master)
        await wait_node_serving(client, slave)
        await wait_slave_connected(client, master, slave)
        async with Producer("ha-fo-pg", ns.addr) as producer:
            sent = [await producer.send(Message(topic, b"fo-%d" % i)) for i in range(8)]
        assert all(r.status == SendStatus.SEND_OK for r in sent)
        master.kill()

        async def master_gone() -> bool:
            r = await client.invoke(
                ns.addr,
                RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}),
            )
            return json.loads(r.body_bytes())["brokerDatas"][0]["brokerAddrs"].keys() == {"1"}

        await poll_until(master_gone)
    async with PullConsumer("ha-fo-cg", ns.addr) as consumer:
        got: list[bytes] = []
        for qid in range(4):
            mq = MessageQueue(topic, "broker-a", qid)
            result = await consumer.pull(mq, 0)
            if result.status == PullStatus.FOUND:
                got.extend(m.body for m in result.messages)
                await consumer.commit_offset(mq, result.next_begin_offset)
                assert await consumer.query_offset(mq) == result.next_begin_offset
    assert sorted(got) == sorted(b"fo-%d" % i for i in range(8))
