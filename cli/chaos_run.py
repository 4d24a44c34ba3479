"""One chaos run: a cluster, a workload with unique ids, faults on a seeded schedule, a check.

The workload is one producer per queue (4 queues of topic ``ChaosTopic``), each sending one
message at a time to whichever node takes writes (chaos_cluster.py), with id ``queue + 4 *
seq`` in the body, and recording the outcome (checker's ``Send``).  Meanwhile the schedule,
drawn from ``random.Random(seed)``, injects ``faults`` faults one after another: a SIGKILL and
a restart, a SIGSTOP and a SIGCONT, or a partition of a node's replication links and its heal,
on any node including the nameserver.  Then every fault is ended, the run waits until a write
is acknowledged again and the replicas settle, reads every queue from the writer, and hands the
history to :func:`cli.chaos_checker.check`.
"""

from __future__ import annotations

import random
from pathlib import Path

import trio

from cli.chaos_checker import Fault, Outcome, Report, Send, Served, check
from cli.chaos_cluster import ChaosCluster
from common.remoting.client import RemotingClient, open_remoting_client
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from common.testing import pull_queue

TOPIC = "ChaosTopic"
QUEUES = 4
FAULT_KINDS = ("kill", "pause", "partition")


def _send_cmd(msg_id: int, queue: int) -> RemotingCommand:
    return RemotingCommand.request(
        RequestCode.SEND_MESSAGE_V2,
        {"a": "chaos-pg", "b": TOPIC, "c": "TBW102", "d": QUEUES, "e": queue}
        | {"f": 0, "g": 0, "h": 0, "i": ""},
        b"chaos-%d" % msg_id,
    )


async def _producer(
    client: RemotingClient,
    cluster: ChaosCluster,
    queue: int,
    sends: list[Send],
    t0: float,
    stop: trio.Event,
) -> None:
    seq = 0
    while not stop.is_set():
        addr = await cluster.writer(client)
        if addr is None:
            await trio.sleep(0.05)
            continue
        msg_id = queue + QUEUES * seq
        start = trio.current_time() - t0
        detail = ""
        try:
            r = await client.invoke(addr, _send_cmd(msg_id, queue), timeout=2.0)
        except Exception as exc:  # a timeout or a lost connection: outcome unknown
            client.close_channel(addr)
            outcome, detail = Outcome.UNKNOWN, type(exc).__name__
        else:
            outcome = Outcome.ACKED if r.code == ResponseCode.SUCCESS else Outcome.FAILED
            if outcome is Outcome.FAILED:
                detail = f"code {r.code}"
        sends.append(Send(msg_id, queue, seq, start, trio.current_time() - t0, outcome, detail))
        seq += 1
        if outcome is not Outcome.ACKED:
            await trio.sleep(0.05)


async def _faults(
    cluster: ChaosCluster, rng: random.Random, count: int, faults: list[Fault], t0: float
) -> None:
    for _ in range(count):
        await trio.sleep(rng.uniform(0.5, 1.5))
        kind = rng.choice(FAULT_KINDS)
        nodes = cluster.brokers if kind == "partition" else list(cluster.procs)
        node = rng.choice(nodes)
        proc = cluster.procs[node]
        start = trio.current_time() - t0
        if kind == "kill":
            proc.kill()
        elif kind == "pause":
            proc.pause()
        else:
            cluster.partition(node)
        await trio.sleep(rng.uniform(1.0, 2.5))
        if kind == "kill":
            proc.start()
        elif kind == "pause":
            proc.resume()
        else:
            cluster.heal()
        faults.append(Fault(kind, node, start, trio.current_time() - t0))


async def _read_all(client: RemotingClient, addr: str) -> list[Served]:
    served = []
    for queue in range(QUEUES):
        for m in await pull_queue(client, addr, TOPIC, queue, group="chaos-check"):
            served.append(Served(queue, m.queue_offset, int(m.body[len(b"chaos-") :])))
    return served


async def _until_writable(client: RemotingClient, cluster: ChaosCluster, timeout: float) -> str:
    """The writer's address once it acknowledges a probe send (queue 0, id -1 is not counted)."""
    with trio.fail_after(timeout):
        while True:
            addr = await cluster.writer(client)
            if addr is not None:
                try:
                    probe = _send_cmd(-1, 0)
                    probe.body = b"chaos--1"
                    r = await client.invoke(addr, probe, timeout=2.0)
                    if r.code == ResponseCode.SUCCESS:
                        return addr
                except Exception:
                    client.close_channel(addr)
            await trio.sleep(0.1)


async def run_schedule(
    root: Path,
    mode: str,
    seed: int,
    *,
    faults: int = 2,
    duration: float = 8.0,
    broker_extra: dict[str, str] | None = None,
) -> Report:
    """Start a cluster in ``root``, run the workload under ``faults`` faults, check, stop."""
    rng = random.Random(seed)
    cluster = ChaosCluster(root, mode, broker_extra=dict(broker_extra or {}))
    sends: list[Send] = []
    fault_log: list[Fault] = []
    try:
        async with trio.open_nursery() as nursery, open_remoting_client() as client:
            await cluster.start(nursery)
            await _until_writable(client, cluster, 60)
            t0 = trio.current_time()
            stop = trio.Event()
            async with trio.open_nursery() as work:
                for q in range(QUEUES):
                    work.start_soon(_producer, client, cluster, q, sends, t0, stop)
                await _faults(cluster, rng, faults, fault_log, t0)
                # load goes on after the last fault, so its recovery time is measured too
                await trio.sleep(max(1.5, duration - (trio.current_time() - t0)))
                stop.set()
            cluster.restore_all()
            addr = await _until_writable(client, cluster, 60)
            await trio.sleep(1.0)  # replicas settle; the reads below go to the writer
            served = [s for s in await _read_all(client, addr) if s.id >= 0]
            nursery.cancel_scope.cancel()
    finally:
        cluster.stop()
    return check(seed, mode, sends, fault_log, served)
