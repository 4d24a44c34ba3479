"""HA benchmark: SYNC_MASTER vs ASYNC_MASTER with one slave, lag, and 1 GiB catch-up.

    .venv/bin/python bench/run_ha_bench.py [--runs 3] [--quick] [--no-write]

Theory of operation. Each run has two parts, on this one host (every process shares its CPUs):

1. Sends, once per master role, in the same run: a fresh `rmq up --slaves 1 --role R`
   (R = SYNC_MASTER and ASYNC_MASTER; the order alternates between runs so neither always
   gets the warmer machine). `ready` already means the slave's HA connection is up. Then,
   1 KiB bodies, from this process:
   * batch-pipelined: `Producer.send_batch` of 64 messages, 4 batches in flight (the
     pipelined/batched headline figure);
   * pipelined: 64 single `Producer.send` calls in flight;
   * sync: one `Producer.send` at a time, per-send latency percentiles.
   Every send must answer SEND_OK (a SYNC_MASTER answers FLUSH_SLAVE_TIMEOUT or
   SLAVE_NOT_AVAILABLE when the slave did not ack: that fails the run). During both
   pipelined scenarios a sampler asks the master for GET_BROKER_RUNTIME_INFO every 50 ms
   and records slave 0's `haSlave0LagBytes` / `haSlave0LagMillis`: the replication lag under
   load, as p50/p99. CPU time of the master, the slave and this process is read from /proc
   around each timed part. After the sends, the slave must have acknowledged the master's
   whole CommitLog.
2. Catch-up of an existing 1 GiB CommitLog. Once per invocation, a master store is filled
   in-process through the store API (`DefaultMessageStore.append_messages`, 1 KiB bodies,
   batches of 512) up to just under 1 GiB: CommitLog segments are 1 GiB, so all of it sits in
   the first segment. An empty slave reports offset 0 and a master answers that by streaming
   from the start of its *last* segment (the offset-0 rule), which here is the first and only
   one: the slave is sent the whole ~1 GiB. Per run: start a nameserver and that master
   (`python -m cli.servers.node broker -c ...`, ASYNC_MASTER), wait until it serves, start a slave
   with an empty store and `haMasterAddress` set, and sample the master's runtime info every
   10 ms: the clock runs from the first sample that counts the slave's HA connection to the
   first sample where `haSlave0AckOffset` reaches the master's max offset. MB/s = bytes /
   that time (1 MB = 1e6 bytes). Also reported: when the slave's own reput had built its
   ConsumeQueues (`dispatchBehindBytes` 0 on the slave), CPU of both sides, and a check that
   sampled 1 MiB slices of the slave's segment equal the master's.

Min / median / max over the runs go into docs/benchmarks.md between this script's markers.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # `python bench/run_ha_bench.py` from anywhere

import trio  # noqa: E402

from bench.cluster import Cluster, cpu_seconds, free_ports, start_cluster  # noqa: E402
from bench.run_broker_bench import (  # noqa: E402
    BODY,
    TOPIC,
    BenchError,
    _check_ok,
    _loadavg,
    create_topic,
    machine,
    percentile,
)

if TYPE_CHECKING:
    from rmq import Producer
    from rmq.remoting import Invoker

DOC = ROOT / "docs" / "benchmarks.md"
BEGIN = "<!-- bench:run_ha_bench:begin (generated; edit outside the markers) -->"
END = "<!-- bench:run_ha_bench:end -->"
ROLES = ("SYNC_MASTER", "ASYNC_MASTER")
SEGMENT = 1024 * 1024 * 1024  # the default CommitLog segment size
SAMPLE_INTERVAL = 0.01  # catch-up: the master has nothing else to answer
LAG_INTERVAL = 0.05  # under load: each sample costs the measured master ~0.5 ms of CPU


def sizes(quick: bool) -> dict[str, int]:
    if quick:
        return dict(
            batch_total=6_400,
            pipelined_total=2_000,
            sync_total=500,
            warmup=50,
            batch_size=64,
            batch_inflight=4,
            concurrency=64,
            queues=8,
            fill_bytes=64 * 1024 * 1024,
        )
    return dict(
        batch_total=96_000,
        pipelined_total=20_000,
        sync_total=5_000,
        warmup=300,
        batch_size=64,
        batch_inflight=4,
        concurrency=64,
        queues=8,
        fill_bytes=SEGMENT - 2 * 1024 * 1024,
    )


# --- measuring ------------------------------------------------------------------------------


class Meter:
    """Wall time and CPU time of the master, the slave and this process over a timed part."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids

    def __enter__(self) -> Meter:
        self.t0 = time.perf_counter()
        self.c0 = {who: cpu_seconds(pid) for who, pid in self.pids.items()}
        self.p0 = time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.t0
        self.cpu = {who: cpu_seconds(pid) - self.c0[who] for who, pid in self.pids.items()}
        self.cpu["client"] = time.process_time() - self.p0

    def result(self, msgs: int, **extra: object) -> dict:
        return {
            "msgs": msgs,
            "seconds": self.seconds,
            "rate": msgs / self.seconds,
            **{f"{who}_cpu_us": 1e6 * cpu / msgs for who, cpu in self.cpu.items()},
            **extra,
        }


async def runtime(remoting: Invoker, addr: str) -> dict[str, str]:
    from cli.runtime_info.status import fetch_runtime_table

    return await fetch_runtime_table(remoting, addr, 5.0)


class LagSampler:
    """Polls the master's runtime info while a scenario runs; keeps slave 0's lag."""

    def __init__(self, master_addr: str) -> None:
        self.addr = master_addr
        self.lag_bytes: list[int] = []
        self.lag_ms: list[int] = []
        self.missing = 0  # samples without a connected slave (must stay 0)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        from common.remoting.client import open_remoting_client

        async with open_remoting_client() as remoting:
            task_status.started()
            while True:
                t = await runtime(remoting, self.addr)
                if "haSlave0LagBytes" in t:
                    self.lag_bytes.append(int(t["haSlave0LagBytes"]))
                    self.lag_ms.append(int(t["haSlave0LagMillis"]))
                else:
                    self.missing += 1
                await trio.sleep(LAG_INTERVAL)

    def summary(self) -> dict:
        b, m = sorted(self.lag_bytes), sorted(self.lag_ms)
        return {
            "lag_samples": len(b),
            "lag_missing": self.missing,
            "lag_bytes_p50": percentile(b, 50),
            "lag_bytes_p99": percentile(b, 99),
            "lag_bytes_max": b[-1] if b else float("nan"),
            "lag_ms_p50": percentile(m, 50),
            "lag_ms_p99": percentile(m, 99),
            "lag_ms_max": m[-1] if m else float("nan"),
        }


# --- send scenarios (each one trio.run) -------------------------------------------------------


async def _warmup(producer: Producer, n: int) -> None:
    from rmq import Message

    for _ in range(n):
        _check_ok(await producer.send(Message(TOPIC, BODY)))


async def scenario(cluster: Cluster, pids: dict[str, int], kind: str, sz: dict[str, int]) -> dict:
    from rmq import Message, Producer

    lat: list[float] = []
    sampler = LagSampler(cluster.broker_addr(0)) if kind != "sync" else None
    async with Producer("bench_ha_pg", cluster.namesrv_addr, send_timeout=10) as p:
        await _warmup(p, sz["warmup"])
        async with trio.open_nursery() as outer:
            if sampler is not None:
                await outer.start(sampler.run)
            with Meter(pids) as meter:
                if kind == "batch-pipelined":
                    batch, n_batches = sz["batch_size"], sz["batch_total"] // sz["batch_size"]
                    total = batch * n_batches
                    issued = 0

                    async def batch_worker() -> None:
                        nonlocal issued
                        while issued < n_batches:
                            issued += 1
                            msgs = [Message(TOPIC, BODY) for _ in range(batch)]
                            _check_ok(await p.send_batch(msgs))

                    async with trio.open_nursery() as nursery:
                        for _ in range(sz["batch_inflight"]):
                            nursery.start_soon(batch_worker)
                elif kind == "pipelined":
                    total = sz["pipelined_total"]
                    issued = 0

                    async def single_worker() -> None:
                        nonlocal issued
                        while issued < total:
                            issued += 1
                            s = time.perf_counter()
                            r = await p.send(Message(TOPIC, BODY))
                            lat.append(time.perf_counter() - s)
                            _check_ok(r)

                    async with trio.open_nursery() as nursery:
                        for _ in range(sz["concurrency"]):
                            nursery.start_soon(single_worker)
                else:  # sync: one at a time
                    total = sz["sync_total"]
                    for _ in range(total):
                        s = time.perf_counter()
                        r = await p.send(Message(TOPIC, BODY))
                        lat.append(time.perf_counter() - s)
                        _check_ok(r)
            outer.cancel_scope.cancel()
    extra: dict = {}
    if lat:
        lat.sort()
        extra.update(
            p50_ms=percentile(lat, 50) * 1000,
            p99_ms=percentile(lat, 99) * 1000,
            max_ms=lat[-1] * 1000,
        )
    if sampler is not None:
        extra.update(sampler.summary())
        if sampler.missing:
            raise BenchError(f"{kind}: {sampler.missing} samples saw no slave connection")
    return meter.result(total, **extra)


async def wait_replicated(master: str, *, timeout: float = 60.0) -> dict[str, int]:
    """Wait until slave 0 acknowledged the master's whole CommitLog; return the offsets."""
    from common.remoting.client import open_remoting_client

    async with open_remoting_client() as remoting:
        with trio.move_on_after(timeout):
            while True:
                t = await runtime(remoting, master)
                top = int(t["commitLogMaxOffset"])
                ack = int(t.get("haSlave0AckOffset", -1))
                if ack == top:
                    return {"max_offset": top, "ack_offset": ack}
                await trio.sleep(0.05)
    raise BenchError(f"slave did not catch up with {master} within {timeout} s: {ack} < {top}")


SEND_KINDS = ("batch-pipelined", "pipelined", "sync")


def send_part(index: int, role: str, sz: dict[str, int]) -> dict:
    data_dir = Path(tempfile.mkdtemp(prefix=f"rmq-habench-{index}-{role}-"))
    out: dict = {"load_before": _loadavg()}
    try:
        with start_cluster(data_dir, "--slaves", "1", "--role", role, brokers=2) as cluster:
            out["up_ready_s"] = cluster.ready_seconds
            pids = {"master": cluster.pid_of("broker-a"), "slave": cluster.pid_of("broker-a-s1")}
            trio.run(create_topic, cluster, sz["queues"])
            for kind in SEND_KINDS:
                r = trio.run(scenario, cluster, pids, kind, sz)
                out[kind] = r
                extra = ""
                if "p99_ms" in r:
                    extra += f", p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms"
                if "lag_bytes_p50" in r:
                    extra += (
                        f"; lag p50/p99 {r['lag_bytes_p50']:,.0f}/{r['lag_bytes_p99']:,.0f} B,"
                        f" {r['lag_ms_p50']:.0f}/{r['lag_ms_p99']:.0f} ms"
                        f" ({r['lag_samples']} samples)"
                    )
                print(
                    f"run {index} {role:<12} {kind:<16} {r['msgs']:>7} msgs "
                    f"{r['rate']:>9,.0f} msg/s{extra}; CPU us/msg master "
                    f"{r['master_cpu_us']:.1f} slave {r['slave_cpu_us']:.1f} client "
                    f"{r['client_cpu_us']:.1f}",
                    flush=True,
                )
            out["replicated"] = trio.run(wait_replicated, cluster.broker_addr(0))
            out["load_after"] = _loadavg()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    return out


# --- catch-up -------------------------------------------------------------------------------


def fill_store(store_dir: Path, target: int) -> int:
    """Append 1 KiB messages to a fresh store at `store_dir` until just before `target` bytes;
    queues and index are built as the broker would. Returns the CommitLog max offset."""
    from broker.store.config import MessageStoreConfig
    from broker.store.message_store import run_message_store
    from common.message import MessageExtBrokerInner

    async def main() -> int:
        cfg = MessageStoreConfig(store_path_root_dir=str(store_dir))
        async with trio.open_nursery() as nursery:
            store = await nursery.start(run_message_store, cfg)
            batch = 512
            n = 0
            while True:
                msgs = [
                    MessageExtBrokerInner(
                        topic=TOPIC,
                        queue_id=(n + j) % 8,
                        body=BODY,
                        properties={"TAGS": "fill"},
                        born_host=("127.0.0.1", 1),
                        store_host=("127.0.0.1", 10911),
                    )
                    for j in range(batch)
                ]
                per = 1200 * batch  # a generous upper bound of one batch's bytes
                if store.get_max_phy_offset() + per > target:
                    break
                r = store.append_messages(msgs)
                if type(r).__name__ == "PendingPut":
                    r = await r.wait()
                if not r.ok:
                    raise BenchError(f"fill: store answered {r.status}")
                n += batch
                if n % (batch * 64) == 0:
                    await trio.lowlevel.checkpoint()  # let reput/flush run
            top = store.get_max_phy_offset()
            nursery.cancel_scope.cancel()  # run_message_store flushes and closes on the way out
        return top

    return trio.run(main)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def node(args: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli.servers.node", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.PIPE,
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdin is not None:
            proc.stdin.close()


def _conf(path: Path, **props: object) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    return path


async def _wait_serving(addr: str, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    from common.remoting.client import open_remoting_client

    with trio.fail_after(timeout):
        while True:
            if proc.poll() is not None:
                raise BenchError(f"node {addr} exited with {proc.returncode}")
            try:
                async with open_remoting_client(connect_timeout=1) as remoting:
                    await runtime(remoting, addr)
                    return
            except OSError:
                pass
            except Exception as exc:  # RemotingConnectError and friends: not up yet
                if "connect" not in type(exc).__name__.lower() and "connect" not in str(exc):
                    raise
            await trio.sleep(0.05)


def _slices_equal(a: Path, b: Path, size: int) -> bool:
    """Compare 1 MiB slices at the start, middle and end of the first `size` bytes."""
    mib = 1024 * 1024
    with open(a, "rb") as fa, open(b, "rb") as fb:
        for pos in (0, max(0, size // 2 - mib // 2), max(0, size - mib)):
            n = min(mib, size - pos)
            fa.seek(pos)
            fb.seek(pos)
            if hashlib.sha256(fa.read(n)).digest() != hashlib.sha256(fb.read(n)).digest():
                return False
    return True


def catchup_part(index: int, master_store: Path, work: Path) -> dict:
    ns_port = _free_port()
    _, base = free_ports(2)
    master_addr, slave_addr = f"127.0.0.1:{base}", f"127.0.0.1:{base + 10}"
    slave_store = work / f"slave-{index}"
    logs = work / f"logs-{index}"
    logs.mkdir(parents=True, exist_ok=True)
    common = dict(
        brokerName="bench-ha",
        brokerClusterName="BenchCluster",
        brokerIP1="127.0.0.1",
        namesrvAddr=f"127.0.0.1:{ns_port}",
        flushDiskType="ASYNC_FLUSH",
    )
    mconf = _conf(
        work / "master.conf",
        brokerId=0,
        brokerRole="ASYNC_MASTER",
        listenPort=base,
        storePathRootDir=master_store,
        **common,
    )
    sconf = _conf(
        work / f"slave-{index}.conf",
        brokerId=1,
        brokerRole="SLAVE",
        listenPort=base + 10,
        storePathRootDir=slave_store,
        haMasterAddress=f"127.0.0.1:{base + 1}",
        **common,
    )
    out: dict = {"load_before": _loadavg()}
    try:
        with (
            node(
                ["namesrv", "--port", str(ns_port), "--data-dir", str(work / "ns")],
                logs / "namesrv.log",
            ),
            node(["broker", "-c", str(mconf), "--watch-stdin"], logs / "master.log") as master,
        ):
            trio.run(_wait_serving, master_addr, master)
            with node(["broker", "-c", str(sconf), "--watch-stdin"], logs / "slave.log") as slave:
                out.update(trio.run(_measure_catchup, master_addr, slave_addr, master, slave))
        mfile = master_store / "commitlog" / ("0" * 20)
        sfile = slave_store / "commitlog" / ("0" * 20)
        out["slices_equal"] = _slices_equal(mfile, sfile, out["bytes"])
        if not out["slices_equal"]:
            raise BenchError("the slave's CommitLog differs from the master's")
        out["load_after"] = _loadavg()
    finally:
        shutil.rmtree(slave_store, ignore_errors=True)
    return out


async def _measure_catchup(
    master_addr: str,
    slave_addr: str,
    master: subprocess.Popen[bytes],
    slave: subprocess.Popen[bytes],
) -> dict:
    from common.remoting.client import open_remoting_client

    async with open_remoting_client() as remoting:
        top = int((await runtime(remoting, master_addr))["commitLogMaxOffset"])
        t_conn = t_done = None
        cpu0 = None
        with trio.fail_after(600):
            while True:
                t = await runtime(remoting, master_addr)
                now = time.perf_counter()
                if t_conn is None and int(t.get("haConnectionCount", "0")) >= 1:
                    t_conn = now
                    cpu0 = (cpu_seconds(master.pid), cpu_seconds(slave.pid))
                if t_conn is not None and int(t.get("haSlave0AckOffset", "-1")) >= top:
                    t_done = now
                    cpu1 = (cpu_seconds(master.pid), cpu_seconds(slave.pid))
                    break
                if slave.poll() is not None:
                    raise BenchError(f"the slave exited with {slave.returncode}")
                await trio.sleep(SAMPLE_INTERVAL)
            # the slave's own queues (its reput task) may still be behind the bytes
            while True:
                st = await runtime(remoting, slave_addr)
                if (
                    int(st.get("dispatchBehindBytes", "1")) == 0
                    and int(st.get("commitLogMaxOffset", "0")) >= top
                ):
                    t_dispatched = time.perf_counter()
                    break
                await trio.sleep(0.05)
    assert t_conn is not None and t_done is not None and cpu0 is not None
    seconds = t_done - t_conn
    return {
        "bytes": top,
        "seconds": seconds,
        "mb_s": top / seconds / 1e6,
        "dispatched_s": t_dispatched - t_conn,
        "master_cpu_s": cpu1[0] - cpu0[0],
        "slave_cpu_s": cpu1[1] - cpu0[1],
    }


# --- report ---------------------------------------------------------------------------------


def _get(run: dict, *path: str) -> Any:
    for key in path:
        if not isinstance(run, dict) or key not in run:
            return None
        run = run[key]
    return run


def _ratio(run: dict, kind: str) -> float | None:
    s, a = _get(run, "SYNC_MASTER", kind, "rate"), _get(run, "ASYNC_MASTER", kind, "rate")
    return s / a if s and a else None


# (label, unit, extractor, target text, met(median) or None)
def metrics() -> list[tuple]:
    m: list[tuple] = [
        (
            "SYNC_MASTER batch send pipelined (x64, 4 in flight)",
            "msg/s",
            lambda r: _get(r, "SYNC_MASTER", "batch-pipelined", "rate"),
            ">= 40,000",
            lambda v: v >= 40_000,
        ),
        (
            "ASYNC_MASTER batch send pipelined (x64, 4 in flight)",
            "msg/s",
            lambda r: _get(r, "ASYNC_MASTER", "batch-pipelined", "rate"),
            "",
            None,
        ),
        (
            "  SYNC / ASYNC (same run)",
            "ratio",
            lambda r: _ratio(r, "batch-pipelined"),
            ">= 0.80",
            lambda v: v >= 0.8,
        ),
        (
            "SYNC_MASTER pipelined single sends (64 in flight)",
            "msg/s",
            lambda r: _get(r, "SYNC_MASTER", "pipelined", "rate"),
            "",
            None,
        ),
        (
            "ASYNC_MASTER pipelined single sends (64 in flight)",
            "msg/s",
            lambda r: _get(r, "ASYNC_MASTER", "pipelined", "rate"),
            "",
            None,
        ),
        ("  SYNC / ASYNC (same run)", "ratio", lambda r: _ratio(r, "pipelined"), "", None),
        (
            "SYNC_MASTER one-at-a-time send p50",
            "ms",
            lambda r: _get(r, "SYNC_MASTER", "sync", "p50_ms"),
            "",
            None,
        ),
        (
            "SYNC_MASTER one-at-a-time send p99",
            "ms",
            lambda r: _get(r, "SYNC_MASTER", "sync", "p99_ms"),
            "< 3.000",
            lambda v: v < 3.0,
        ),
        (
            "SYNC_MASTER one-at-a-time send rate",
            "msg/s",
            lambda r: _get(r, "SYNC_MASTER", "sync", "rate"),
            "",
            None,
        ),
        (
            "ASYNC_MASTER one-at-a-time send p99",
            "ms",
            lambda r: _get(r, "ASYNC_MASTER", "sync", "p99_ms"),
            "",
            None,
        ),
    ]
    for role in ROLES:
        for kind in ("batch-pipelined", "pipelined"):
            short = "batch x64" if kind == "batch-pipelined" else "single sends"
            for stat, unit in (
                ("bytes_p50", "B"),
                ("bytes_p99", "B"),
                ("ms_p50", "ms"),
                ("ms_p99", "ms"),
            ):
                m.append(
                    (
                        f"{role} lag under load ({short}) {stat.replace('_', ' ')}",
                        unit,
                        lambda r, role=role, kind=kind, stat=stat: _get(
                            r, role, kind, f"lag_{stat}"
                        ),
                        "",
                        None,
                    )
                )
    m += [
        (
            "catch-up of the existing CommitLog",
            "MB/s",
            lambda r: _get(r, "catchup", "mb_s"),
            ">= 500",
            lambda v: v >= 500,
        ),
        (
            "  bytes transferred",
            "MiB",
            lambda r: (_get(r, "catchup", "bytes") or 0) / 2**20 or None,
            "",
            None,
        ),
        (
            "  seconds (slave connected -> acked all)",
            "s",
            lambda r: _get(r, "catchup", "seconds"),
            "",
            None,
        ),
        (
            "  slave's queues built after",
            "s",
            lambda r: _get(r, "catchup", "dispatched_s"),
            "",
            None,
        ),
        ("  master CPU per GiB", "s", lambda r: _per_gib(r, "master_cpu_s"), "", None),
        ("  slave CPU per GiB", "s", lambda r: _per_gib(r, "slave_cpu_s"), "", None),
        (
            "`rmq up` (SYNC_MASTER + slave) to `ready`",
            "s",
            lambda r: _get(r, "SYNC_MASTER", "up_ready_s"),
            "< 1.500",
            lambda v: v < 1.5,
        ),
    ]
    return m


def _per_gib(run: dict, key: str) -> float | None:
    c = _get(run, "catchup")
    if not c:
        return None
    return c[key] / (c["bytes"] / 2**30)


def _fmt(v: float, unit: str) -> str:
    if unit == "msg/s":
        return f"{v:,.0f}"
    if unit == "B":
        return f"{v:,.0f}"
    if unit in ("ms", "s", "ratio"):
        return f"{v:.3f}" if unit != "ratio" else f"{v:.2f}"
    return f"{v:,.1f}"


def table(runs: list[dict]) -> list[dict]:
    rows = []
    for label, unit, get, target, ok in metrics():
        vals = [v for v in (get(r) for r in runs) if v is not None]
        if not vals:
            continue
        med = statistics.median(vals)
        rows.append(
            dict(
                label=label,
                unit=unit,
                n=len(vals),
                min=min(vals),
                median=med,
                max=max(vals),
                target=target,
                met="" if ok is None else ("yes" if ok(med) else "NO"),
            )
        )
    return rows


def print_table(rows: list[dict]) -> None:
    w = max(len(r["label"]) for r in rows)
    print(f"\n{'scenario':<{w}}  {'unit':<5} {'min':>12} {'median':>12} {'max':>12}  target")
    for r in rows:
        print(
            f"{r['label']:<{w}}  {r['unit']:<5} {_fmt(r['min'], r['unit']):>12} "
            f"{_fmt(r['median'], r['unit']):>12} {_fmt(r['max'], r['unit']):>12}  "
            f"{r['target']} {r['met']}"
        )


def markdown(
    rows: list[dict], info: dict, command: str, sz: dict[str, int], runs: list[dict]
) -> str:
    today = datetime.date.today().isoformat()
    start = min(r["started"] for r in runs)
    out = [
        BEGIN,
        "",
        f"Generated {today} (runs started {start} UTC) by `{command}` ({len(runs)} runs; "
        "min / median / max over the runs; a target is judged on the median).",
        "",
        f"Machine: {info['nproc']} CPUs ({info['cpu']}), {info['memory']} RAM, "
        f"Linux {info['kernel']}, Python {info['python']}, trio {info['trio']}; "
        f"commit {info['commit']}. Nameserver, master, slave and the client all on this host.",
        "",
        "Per run and role: a fresh `rmq up --slaves 1 --role SYNC_MASTER|ASYNC_MASTER` "
        f"(ASYNC_FLUSH), topic `{TOPIC}` with {sz['queues']} queues, 1 KiB bodies; "
        f"{sz['batch_total']:,} msgs as batches of {sz['batch_size']} with "
        f"{sz['batch_inflight']} in flight, {sz['pipelined_total']:,} single sends with "
        f"{sz['concurrency']} in flight, {sz['sync_total']:,} sends one at a time "
        f"({sz['warmup']} untimed warm-up sends each); every send answered SEND_OK and the "
        "slave acknowledged the whole CommitLog afterwards. Lag: the master's "
        "`haSlave0LagBytes` / `haSlave0LagMillis` sampled every 50 ms during the pipelined "
        "scenarios. Catch-up: an ASYNC_MASTER whose store was filled beforehand with "
        f"{sz['fill_bytes'] / 2**20:,.0f} MiB at most of 1 KiB messages (all in the first 1 GiB "
        "segment, so an empty slave, which is fed from the start of the master's last "
        "segment, receives all of it), and a slave started with an empty store and "
        "`haMasterAddress`; timed from the first runtime-info sample (10 ms apart) that counts "
        "the slave's connection to the first in which its acked offset reaches the master's "
        "max offset; 1 MB = 10^6 bytes.",
        "",
        "| scenario | unit | min | median | max | target | met |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['label'].strip()} | {r['unit']} | {_fmt(r['min'], r['unit'])} | "
            f"{_fmt(r['median'], r['unit'])} | {_fmt(r['max'], r['unit'])} | "
            f"{r['target']} | {r['met']} |"
        )
    out += [
        "",
        "CPU time per message (microseconds, median over the runs; /proc utime+stime of the "
        "master and slave processes, process time of the client, during the timed part):",
        "",
        "| role | scenario | master | slave | client |",
        "|---|---|---:|---:|---:|",
    ]
    for role in ROLES:
        for kind in SEND_KINDS:
            vals = {
                who: [_get(r, role, kind, f"{who}_cpu_us") for r in runs]
                for who in ("master", "slave", "client")
            }
            if all(v is not None for v in vals["master"]):
                med = {w: statistics.median(v) for w, v in vals.items()}
                out.append(
                    f"| {role} | {kind} | {med['master']:.1f} | {med['slave']:.1f} | "
                    f"{med['client']:.1f} |"
                )
    loads = [
        part[k]
        for r in runs
        for part in (r.get("SYNC_MASTER"), r.get("ASYNC_MASTER"), r.get("catchup"))
        if part
        for k in ("load_before", "load_after")
        if k in part
    ]
    load_text = f"{min(loads):.2f} .. {max(loads):.2f}" if loads else "not recorded"
    out += [
        "",
        f"1-minute load average around the parts of the runs: {load_text}.",
        "",
        END,
    ]
    return "\n".join(out)


def write_doc(section: str, doc: Path = DOC) -> None:
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        text = head + section + tail
    else:
        text = (
            text.rstrip("\n")
            + "\n\n## HA: SYNC_MASTER + slave (`bench/run_ha_bench.py`)\n\n"
            + section
            + "\n"
        )
    doc.write_text(text)


# --- main -----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="small sizes (writes nothing)")
    ap.add_argument("--no-write", action="store_true", help="do not update docs/benchmarks.md")
    ap.add_argument("--skip-catchup", action="store_true")
    ap.add_argument("--skip-sends", action="store_true")
    ap.add_argument("--json", type=Path, default=None, help="also write raw results here")
    ap.add_argument(
        "--doc",
        type=Path,
        default=None,
        help="write the results section into this file instead (even with --quick)",
    )
    ap.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="where the filled master store goes (default: a temp dir, removed)",
    )
    ap.add_argument(
        "--from-json",
        type=Path,
        default=None,
        help="no runs: write the doc section from a --json file of earlier runs",
    )
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be >= 1")
    if args.from_json:
        raw = json.loads(args.from_json.read_text())
        rows = table(raw["runs"])
        print_table(rows)
        doc = args.doc or DOC
        write_doc(markdown(rows, raw["machine"], raw["command"], raw["sizes"], raw["runs"]), doc)
        print(f"\nwrote {doc}")
        return 0
    sz = sizes(args.quick)
    info = machine()
    print(f"machine: {info}", flush=True)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="rmq-habench-"))
    work.mkdir(parents=True, exist_ok=True)
    runs: list[dict] = []
    try:
        master_store = work / "master"
        if not args.skip_catchup:
            if (master_store / "commitlog" / ("0" * 20)).exists() and args.work_dir:
                print(f"reusing the filled master store in {master_store}", flush=True)
            else:
                shutil.rmtree(master_store, ignore_errors=True)
                t = time.perf_counter()
                top = fill_store(master_store, sz["fill_bytes"])
                print(
                    f"filled {master_store}: {top / 2**20:,.1f} MiB in "
                    f"{time.perf_counter() - t:.1f} s",
                    flush=True,
                )
        for i in range(1, args.runs + 1):
            run: dict = {"started": datetime.datetime.now(datetime.UTC).strftime("%H:%M")}
            if not args.skip_sends:
                order = ROLES if i % 2 else ROLES[::-1]
                for role in order:
                    run[role] = send_part(i, role, sz)
            if not args.skip_catchup:
                c = catchup_part(i, master_store, work)
                run["catchup"] = c
                print(
                    f"run {i} catch-up: {c['bytes'] / 2**20:,.1f} MiB in {c['seconds']:.3f} s "
                    f"= {c['mb_s']:,.0f} MB/s; slave queues built after "
                    f"{c['dispatched_s']:.2f} s; CPU master {c['master_cpu_s']:.2f} s, "
                    f"slave {c['slave_cpu_s']:.2f} s",
                    flush=True,
                )
            runs.append(run)
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    rows = table(runs)
    print_table(rows)
    command = ".venv/bin/python bench/run_ha_bench.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    command = command.strip()
    if args.json:
        args.json.write_text(
            json.dumps(
                {"machine": info, "sizes": sz, "runs": runs, "table": rows, "command": command},
                indent=2,
            )
        )
    if args.doc or not (args.no_write or args.quick or args.skip_catchup or args.skip_sends):
        doc = args.doc or DOC
        write_doc(markdown(rows, info, command, sz, runs), doc)
        print(f"\nwrote {doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
