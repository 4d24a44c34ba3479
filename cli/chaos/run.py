"""One chaos run: a cluster, a workload with unique ids, faults on a seeded schedule, a check.

The workload is one producer per queue (4 queues of topic ``ChaosTopic``), each sending one
message at a time to whichever node takes writes (cluster.py), with id ``queue + 4 *
seq`` in the body, and recording the outcome (checker's ``Send``).  Meanwhile the schedule,
drawn from the seed (schedule.py), injects ``faults`` faults one after another, each
ended before the next: a SIGKILL and a restart, a SIGSTOP and a SIGCONT, a partition of a
node's replication links, a delayed or lossy link between two brokers (link_proxy.py), a slow
or full disk, or a SIGKILL with a torn segment tail before the restart (disk.py).  Each
fault is recorded as a checker ``Fault`` with its parameters.  Then every fault is ended, the
run waits until a write is acknowledged again and the replicas settle, reads every queue from
the writer, and hands the history to :func:`cli.chaos.checker.check`.

The disk shim is compiled (gcc) only when the schedule draws a disk fault, so a run
of kills, pauses and link faults needs no compiler; nothing needs root.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import attrs
import trio

from cli.chaos.checker import Fault, Outcome, Report, Send, Served, check, failed
from cli.chaos.cluster import ChaosCluster
from cli.chaos.disk import build_shim
from cli.chaos.link_proxy import LinkFault
from cli.chaos.queue_readback import pull_queue
from cli.chaos.schedule import DISK_KINDS, FAULT_KINDS, PlannedFault, draw
from common.remoting.client import RemotingClient, open_remoting_client
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand

TOPIC = "ChaosTopic"
QUEUES = 4
# seconds the load goes on past the usual end while the last fault has not recovered
RECOVERY_WAIT = 10.0
# how long a cluster may take to accept a write: after its start, and after the last fault
WRITABLE_WAIT = 60.0


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


async def _inject(cluster: ChaosCluster, f: PlannedFault) -> str:
    """Start fault ``f``; returns its parameters in words, for the checker's excerpts."""
    if f.kind in ("kill", "torn"):
        await cluster.procs[f.node].kill()
        if f.kind == "torn":
            tears = await cluster.tear(f.node, f.tear_bytes, f.tear_fill, f.seed)
            return "; ".join(map(str, tears)) or "nothing written yet"
    elif f.kind == "pause":
        cluster.procs[f.node].pause()
    elif f.kind == "partition":
        cluster.partition(f.node)
    elif f.kind == "delay":
        cluster.degrade(f.node, f.peer or "", LinkFault(f.delay, f.jitter, seed=f.seed))
        return f"{f.delay * 1000:.0f} ms + U(0, {f.jitter * 1000:.0f}) ms per chunk"
    elif f.kind == "drop":
        cluster.degrade(f.node, f.peer or "", LinkFault(loss=f.loss, reset=f.reset, seed=f.seed))
        return f"loss {f.loss:.2f} per chunk, {f.reset:.2f} of losses reset"
    elif f.kind == "slow_disk":
        cluster.disk(f.node).slow(f.delay)
        return f"{f.delay * 1000:.0f} ms per sync call"
    elif f.kind == "full_disk":
        cluster.disk(f.node).full()
    return ""


def _end(cluster: ChaosCluster, f: PlannedFault) -> None:
    if f.kind in ("kill", "torn"):
        cluster.procs[f.node].start()
    elif f.kind == "pause":
        cluster.procs[f.node].resume()
    elif f.kind in ("partition", "delay", "drop"):
        cluster.heal()
    else:
        cluster.disk(f.node).ok()


async def _faults(
    cluster: ChaosCluster, plan: list[PlannedFault], faults: list[Fault], t0: float
) -> None:
    for f in plan:
        await trio.sleep(f.wait)
        start = trio.current_time() - t0
        detail = await _inject(cluster, f)
        await trio.sleep(f.hold)
        _end(cluster, f)
        faults.append(Fault(f.kind, f.label, start, trio.current_time() - t0, detail))


def _acked_since(sends: list[Send], t: float) -> bool:
    """Whether a send made at or after ``t`` was acknowledged.  ``sends`` is in answer order,
    so only its tail, answered after ``t``, is looked at."""
    for s in reversed(sends):
        if s.answered_at < t:
            return False
        if s.outcome is Outcome.ACKED and s.sent_at >= t:
            return True
    return False


async def _read_all(client: RemotingClient, addr: str) -> list[Served]:
    served = []
    for queue in range(QUEUES):
        for m in await pull_queue(client, addr, TOPIC, queue, group="chaos-check"):
            served.append(Served(queue, m.queue_offset, int(m.body[len(b"chaos-") :])))
    return served


async def _until_writable(
    client: RemotingClient, cluster: ChaosCluster, timeout: float
) -> tuple[str | None, str]:
    """The writer's address once it acknowledges a probe send (queue 0, id -1 is not counted),
    or None when none does within ``timeout``; with the last refusal seen, for a report."""
    last = "no writer found"
    with trio.move_on_after(timeout):
        while True:
            addr = await cluster.writer(client)
            if addr is not None:
                try:
                    probe = _send_cmd(-1, 0)
                    probe.body = b"chaos--1"
                    r = await client.invoke(addr, probe, timeout=2.0)
                    if r.code == ResponseCode.SUCCESS:
                        return addr, ""
                    last = f"{addr} answered {r.code}: {r.remark}"
                except Exception as exc:
                    last = f"{addr}: {exc}"
                    client.close_channel(addr)
            await trio.sleep(0.1)
    return None, last


async def _workload(
    client: RemotingClient,
    cluster: ChaosCluster,
    plan: list[PlannedFault],
    sends: list[Send],
    fault_log: list[Fault],
    duration: float,
    writable_wait: float,
) -> list[Served] | str:
    """Load under the planned faults, then everything the writer serves; or why not."""
    addr, last = await _until_writable(client, cluster, writable_wait)
    if addr is None:
        return f"the fresh cluster took no write within {writable_wait:g} s ({last})"
    t0 = trio.current_time()
    stop = trio.Event()
    async with trio.open_nursery() as work:
        for q in range(QUEUES):
            work.start_soon(_producer, client, cluster, q, sends, t0, stop)
        await _faults(cluster, plan, fault_log, t0)
        # load goes on after the last fault, so its recovery time is measured too: at least
        # 1.5 s, and until a send made after it is acknowledged (a full disk clears at the next
        # disk check), at most RECOVERY_WAIT more
        await trio.sleep(max(1.5, duration - (trio.current_time() - t0)))
        for _ in range(int(RECOVERY_WAIT / 0.1)):
            if not fault_log or _acked_since(sends, fault_log[-1].end):
                break
            await trio.sleep(0.1)
        stop.set()
    cluster.restore_all()
    addr, last = await _until_writable(client, cluster, writable_wait)
    if addr is None:
        return f"no writer took a write within {writable_wait:g} s after the faults ({last})"
    await trio.sleep(1.0)  # replicas settle; the reads below go to the writer
    return [s for s in await _read_all(client, addr) if s.id >= 0]


async def run_schedule(
    root: Path,
    mode: str,
    seed: int,
    *,
    faults: int = 2,
    duration: float = 8.0,
    kinds: Sequence[str] = FAULT_KINDS,
    broker_extra: dict[str, str] | None = None,
    shim_cache: Path | None = None,
    writable_wait: float = WRITABLE_WAIT,
) -> Report:
    """Start a cluster in ``root``, run the workload under ``faults`` faults of ``kinds``,
    check, stop.  The disk shim is built in ``shim_cache`` (default ``root/disk-shim``).  A
    cluster that takes no write, at the start or after the faults, ends the schedule as a
    failed report (with the tail of every node's log), not an exception."""
    plan = draw(seed, mode, faults, kinds)
    shim = None
    if any(f.kind in DISK_KINDS for f in plan):
        cache = shim_cache or root / "disk-shim"
        shim = await trio.to_thread.run_sync(build_shim, cache)
    cluster = ChaosCluster(root, mode, broker_extra=dict(broker_extra or {}), shim=shim)
    sends: list[Send] = []
    fault_log: list[Fault] = []
    try:
        async with trio.open_nursery() as nursery, open_remoting_client() as client:
            await cluster.start(nursery)
            outcome = await _workload(
                client, cluster, plan, sends, fault_log, duration, writable_wait
            )
            # while the nodes still run: a report says which were up
            tails: tuple[str, ...] = ()
            if isinstance(outcome, str):  # file reads: off the loop
                tails = tuple(await trio.to_thread.run_sync(lambda: list(cluster.log_tails(5))))
            nursery.cancel_scope.cancel()
    finally:
        # shielded and bounded: the processes go even when the run was cancelled
        with trio.CancelScope(shield=True), trio.move_on_after(60):
            await cluster.stop()
    if isinstance(outcome, str):
        report = failed(seed, mode, outcome, sends, fault_log)
        return attrs.evolve(report, excerpts=tails)
    return check(seed, mode, sends, fault_log, outcome)
