"""Broker benchmark: one `rmq up` cluster per run, driven through the `rmq` client.

    .venv/bin/python bench/run_broker_bench.py [--runs 3] [--quick] [--no-write]
    .venv/bin/python bench/run_broker_bench.py --runs 1 --profile broker,client --scenario pull

Theory of operation: every run starts a fresh cluster (new data dir, free ports) with
`python -m cli.main up --slaves 0 --role ASYNC_MASTER` (one broker alone: `rmq up` now starts
a SYNC_MASTER with a slave by default, which `bench/run_ha_bench.py` measures) and times the
`ready` line (the `rmq up` measurement), then runs the
scenarios below against it from this process, each in its own `trio.run` with its own client
and a short warm-up (connections, routes, the first mapped file) that is not timed:

* batch: `Producer.send_batch` of BATCH x 1 KiB, one request in flight;
* batch-pipelined: the same with several batches in flight;
* pipelined: many single `Producer.send` calls in flight (tasks of one nursery, one producer);
* sync: one `Producer.send` at a time; per-message latency percentiles;
* pull: `PullConsumer.pull` (32 a request) over every queue from offset 0 to the end, one task
  per queue; the count pulled must equal the count acknowledged by the sends.

After the scenarios the broker's VmRSS (and its anonymous / file-backed parts) is read from
/proc. The cluster is stopped in a `finally` (SIGTERM, SIGKILL after a bound). Each number is
reported as min / median / max over the runs and, unless --no-write (or --quick), written into
docs/benchmarks.md between the generated-section markers; notes outside them are kept.

`--profile broker,client` samples the broker process and/or this process with py-spy during
the chosen scenario(s) and prints where the time goes (file:function, % of samples); profiled
runs are slower, so they are never written to the docs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # `python bench/run_broker_bench.py` from anywhere

import trio  # noqa: E402

from bench import profile_summary  # noqa: E402
from bench.cluster import Cluster, cpu_seconds, memory_status, start_cluster  # noqa: E402

if TYPE_CHECKING:
    from common.model import MessageQueue
    from rmq import Producer, SendResult

DOC = ROOT / "docs" / "benchmarks.md"
BEGIN = "<!-- bench:run_broker_bench:begin (generated; edit outside the markers) -->"
END = "<!-- bench:run_broker_bench:end -->"
TOPIC = "BenchTopic"
BODY = bytes(range(256)) * 4  # 1 KiB
assert len(BODY) == 1024

SCENARIOS = ("batch", "batch-pipelined", "pipelined", "sync", "pull")
# These scenarios measure one broker alone (`rmq up` defaults to SYNC_MASTER + slave;
# bench/run_ha_bench.py measures that).
SINGLE_BROKER = ("--slaves", "0", "--role", "ASYNC_MASTER")


class BenchError(RuntimeError):
    """A scenario produced a wrong result (not just a slow one)."""


# --- sizes ---------------------------------------------------------------------------------


def sizes(quick: bool) -> dict[str, int]:
    if quick:
        return dict(
            batch_total=3_200,
            pipelined_total=2_000,
            sync_total=500,
            warmup=50,
            batch_size=64,
            batch_inflight=4,
            concurrency=64,
            queues=8,
            pull_batch=32,
        )
    return dict(
        batch_total=64_000,
        pipelined_total=40_000,
        sync_total=10_000,
        warmup=300,
        batch_size=64,
        batch_inflight=4,
        concurrency=64,
        queues=8,
        pull_batch=32,
    )


# --- client scenarios (each one trio.run) ---------------------------------------------------


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return math.nan
    k = max(0, math.ceil(p / 100.0 * len(sorted_values)) - 1)
    return sorted_values[k]


class Meter:
    """Wall time, and CPU time of the broker and of this process, over the timed part."""

    def __init__(self, cluster: Cluster) -> None:
        self.pid = cluster.broker_pid

    def __enter__(self) -> Meter:
        self.t0 = time.perf_counter()
        self.b0 = cpu_seconds(self.pid)
        self.c0 = time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.t0
        self.broker_cpu = cpu_seconds(self.pid) - self.b0
        self.client_cpu = time.process_time() - self.c0

    def result(self, msgs: int, **extra: object) -> dict:
        return {
            "msgs": msgs,
            "seconds": self.seconds,
            "rate": msgs / self.seconds,
            "broker_cpu_us": 1e6 * self.broker_cpu / msgs,
            "client_cpu_us": 1e6 * self.client_cpu / msgs,
            **extra,
        }


def _check_ok(result: SendResult) -> None:
    from rmq import SendStatus

    if result.status is not SendStatus.SEND_OK:
        raise BenchError(f"send answered {result.status}, expected SEND_OK")


async def create_topic(cluster: Cluster, queues: int) -> None:
    """Create the topic on the broker and wait until the nameserver routes it."""
    from rmq import Admin, PullConsumer

    async with Admin(cluster.namesrv_addr) as admin:
        await admin.create_topic(TOPIC, queues=queues)
    async with PullConsumer("bench_probe", cluster.namesrv_addr) as c:
        with trio.fail_after(10):
            while True:
                try:
                    found = await c.fetch_queues(TOPIC)
                    if len(found) == queues:
                        return
                except Exception:  # the route appears after the broker re-registers
                    pass
                await trio.sleep(0.05)


async def _warmup(producer: Producer, n: int) -> int:
    from rmq import Message

    for _ in range(n):
        _check_ok(await producer.send(Message(TOPIC, BODY)))
    return n


async def scenario_batch(cluster: Cluster, sz: dict[str, int], inflight: int) -> dict:
    from rmq import Message, Producer

    batch = sz["batch_size"]
    n_batches = sz["batch_total"] // batch
    async with Producer("bench_pg", cluster.namesrv_addr, send_timeout=10) as p:
        sent = await _warmup(p, sz["warmup"])
        next_batch = 0

        async def worker() -> None:
            nonlocal next_batch
            while next_batch < n_batches:
                next_batch += 1
                _check_ok(await p.send_batch([Message(TOPIC, BODY) for _ in range(batch)]))

        with Meter(cluster) as meter:
            async with trio.open_nursery() as nursery:
                for _ in range(inflight):
                    nursery.start_soon(worker)
    total = n_batches * batch
    return meter.result(total, sent=sent + total)


async def scenario_pipelined(cluster: Cluster, sz: dict[str, int]) -> dict:
    from rmq import Message, Producer

    total = sz["pipelined_total"]
    async with Producer("bench_pg", cluster.namesrv_addr, send_timeout=10) as p:
        sent = await _warmup(p, sz["warmup"])
        issued = 0

        lat: list[float] = []

        async def worker() -> None:
            nonlocal issued
            while issued < total:
                issued += 1
                s = time.perf_counter()
                result = await p.send(Message(TOPIC, BODY))
                lat.append(time.perf_counter() - s)
                _check_ok(result)

        with Meter(cluster) as meter:
            async with trio.open_nursery() as nursery:
                for _ in range(sz["concurrency"]):
                    nursery.start_soon(worker)
    lat.sort()
    return meter.result(
        total,
        sent=sent + total,
        p50_ms=percentile(lat, 50) * 1000,
        p99_ms=percentile(lat, 99) * 1000,
        max_ms=lat[-1] * 1000,
    )


async def scenario_sync(cluster: Cluster, sz: dict[str, int]) -> dict:
    from rmq import Message, Producer

    total = sz["sync_total"]
    lat: list[float] = []
    async with Producer("bench_pg", cluster.namesrv_addr, send_timeout=10) as p:
        sent = await _warmup(p, sz["warmup"])
        with Meter(cluster) as meter:
            for _ in range(total):
                s = time.perf_counter()
                result = await p.send(Message(TOPIC, BODY))
                lat.append(time.perf_counter() - s)
                _check_ok(result)
    lat.sort()
    return meter.result(
        total,
        sent=sent + total,
        p50_ms=percentile(lat, 50) * 1000,
        p99_ms=percentile(lat, 99) * 1000,
        max_ms=lat[-1] * 1000,
    )


async def scenario_pull(cluster: Cluster, sz: dict[str, int], expected: int) -> dict:
    from rmq import PullConsumer, PullStatus

    async with PullConsumer("bench_cg", cluster.namesrv_addr, timeout=10) as c:
        queues = await c.fetch_queues(TOPIC)
        ends = {mq: await c.max_offset(mq) for mq in queues}
        if sum(ends.values()) != expected:
            raise BenchError(
                f"queues hold {sum(ends.values())} messages, the sends acknowledged {expected}"
            )
        # warm-up: one pull per queue, not timed (connection, route, first pages)
        for mq in queues:
            await c.pull(mq, 0, 1)
        counts: dict = {}
        bad_bodies = 0

        async def drain(mq: MessageQueue) -> None:
            nonlocal bad_bodies
            offset, n = 0, 0
            while offset < ends[mq]:
                r = await c.pull(mq, offset, sz["pull_batch"])
                if r.status is not PullStatus.FOUND or not r.messages:
                    raise BenchError(f"pull {mq.queueId}@{offset} gave {r.status}")
                n += len(r.messages)
                bad_bodies += sum(1 for m in r.messages if len(m.body) != 1024)
                offset = r.next_begin_offset
            counts[mq] = n

        with Meter(cluster) as meter:
            async with trio.open_nursery() as nursery:
                for mq in queues:
                    nursery.start_soon(drain, mq)
    total = sum(counts.values())
    if total != expected:
        raise BenchError(f"pulled {total} messages, expected {expected}")
    if bad_bodies:
        raise BenchError(f"{bad_bodies} pulled bodies are not 1 KiB")
    return meter.result(total, queues=len(queues))


# --- one run -----------------------------------------------------------------------------


class Profiler:
    """Which processes to sample (py-spy) during which scenarios; collects summaries."""

    def __init__(self, targets: set[str], scenarios: set[str], out_dir: Path, gil: bool) -> None:
        self.gil = gil
        self.targets = targets
        self.scenarios = scenarios
        self.out_dir = out_dir
        self.reports: list[str] = []

    def run(self, name: str, cluster: Cluster, fn: Callable[[], dict]) -> dict:
        if not self.targets or name not in self.scenarios:
            return fn()
        import contextlib

        pids = {}
        if "broker" in self.targets:
            pids["broker"] = cluster.broker_pid
        if "client" in self.targets:
            pids["client"] = os.getpid()
        paths = {}
        with contextlib.ExitStack() as stack:
            for who, pid in pids.items():
                path = self.out_dir / f"{name}-{who}.txt"
                paths[who] = stack.enter_context(profile_summary.sample(pid, path, gil=self.gil))
            time.sleep(0.3)  # py-spy attaches before the scenario starts
            result = fn()
        for who, path in paths.items():
            summary = profile_summary.summarise(path, top=30)
            text = profile_summary.format_summary(f"{name}: {who} ({path})", summary)
            self.reports.append(text)
            print(text, flush=True)
        return result


def _cpu(r: dict) -> str:
    return f"CPU per msg: broker {r['broker_cpu_us']:.1f} us, client {r['client_cpu_us']:.1f} us"


def _loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def one_run(
    index: int, sz: dict[str, int], selected: set[str], profiler: Profiler, keep_data: bool
) -> dict:
    data_dir = Path(tempfile.mkdtemp(prefix=f"rmq-bench-{index}-"))
    out: dict = {"load_before": _loadavg()}
    try:
        with start_cluster(data_dir, *SINGLE_BROKER, brokers=1) as cluster:
            out["up_ready_s"] = cluster.ready_seconds
            print("  " + "; ".join(f"{t:.3f} s {line.split()[0]}" for t, line in cluster.timeline))
            spawned = [t for t, line in cluster.timeline if " pid " in line]
            if spawned:
                out["up_spawned_s"] = spawned[0]
            print(
                f"run {index}: `rmq up` ready in {cluster.ready_seconds:.3f} s "
                f"(broker pid {cluster.broker_pid})",
                flush=True,
            )
            trio.run(create_topic, cluster, sz["queues"])
            sent = 0
            plan = [
                ("batch", lambda: trio.run(scenario_batch, cluster, sz, 1)),
                (
                    "batch-pipelined",
                    lambda: trio.run(scenario_batch, cluster, sz, sz["batch_inflight"]),
                ),
                ("pipelined", lambda: trio.run(scenario_pipelined, cluster, sz)),
                ("sync", lambda: trio.run(scenario_sync, cluster, sz)),
            ]
            for name, fn in plan:
                if name not in selected:
                    continue
                r = profiler.run(name, cluster, fn)
                sent += r["sent"]
                out[name] = r
                extra = ""
                if "p50_ms" in r:
                    extra = (
                        f", p50 {r['p50_ms']:.3f} ms, p99 {r['p99_ms']:.3f} ms, "
                        f"max {r['max_ms']:.3f} ms"
                    )
                print(
                    f"run {index}: {name:<16} {r['msgs']:>7} msgs in {r['seconds']:.3f} s "
                    f"= {r['rate']:,.0f} msg/s{extra}; {_cpu(r)}",
                    flush=True,
                )
            out["rss_before_pull"] = memory_status(cluster.broker_pid)
            if "pull" in selected and sent:
                r = profiler.run(
                    "pull", cluster, lambda: trio.run(scenario_pull, cluster, sz, sent)
                )
                out["pull"] = r
                print(
                    f"run {index}: {'pull':<16} {r['msgs']:>7} msgs in {r['seconds']:.3f} s "
                    f"= {r['rate']:,.0f} msg/s ({r['queues']} queues); {_cpu(r)}",
                    flush=True,
                )
            mem = memory_status(cluster.broker_pid)
            out["rss"] = mem
            out["load_after"] = _loadavg()
            pre = out["rss_before_pull"]
            print(
                f"run {index}: broker before the pull: VmRSS {pre['VmRSS'] / 1024:.1f} MiB "
                f"(file {pre.get('RssFile', 0) / 1024:.1f})"
            )
            print(
                f"run {index}: broker VmRSS {mem['VmRSS'] / 1024:.1f} MiB (anon "
                f"{mem.get('RssAnon', 0) / 1024:.1f}, file {mem.get('RssFile', 0) / 1024:.1f}), "
                f"peak {mem['VmHWM'] / 1024:.1f} MiB",
                flush=True,
            )
    finally:
        if not keep_data:
            shutil.rmtree(data_dir, ignore_errors=True)
    return out


def _imports(text: str) -> list[tuple[int, int, str, int]]:
    """(self_us, cumulative_us, module, depth) of every `-X importtime` line in `text`."""
    out = []
    for line in text.splitlines():
        if not line.startswith("import time:") or "[us]" in line:
            continue
        self_us, cum_us, name = line[len("import time:") :].split("|", 2)
        depth = (len(name) - len(name.lstrip(" "))) // 2
        out.append((int(self_us), int(cum_us), name.strip(), depth))
    return out


def profile_startup(prof_dir: Path) -> str:
    """One `rmq up` with PYTHONPROFILEIMPORTTIME=1: a timeline and each process's imports."""
    data_dir = Path(tempfile.mkdtemp(prefix="rmq-bench-startup-"))
    try:
        with start_cluster(data_dir, env={"PYTHONPROFILEIMPORTTIME": "1"}) as cluster:
            timeline = [
                (t, line) for t, line in cluster.timeline if not line.startswith("import time:")
            ]
            texts = {"rmq up (supervisor)": cluster.output()}
            for node in ("namesrv", "broker-a"):
                texts[node] = (data_dir / "logs" / f"{node}.log").read_text(errors="replace")
        report = [
            "### startup (one `rmq up` with PYTHONPROFILEIMPORTTIME=1, so slower)",
            "",
            "timeline (s since spawning `rmq up`):",
        ]
        report += [f"  {t:6.3f}  {line[:90]}" for t, line in timeline]
        for who, text in texts.items():
            imports = _imports(text)
            total = sum(cum for _, cum, _, depth in imports if depth == 0)
            report.append(f"{who}: imports take {total / 1e6:.3f} s in all; the largest:")
            top = sorted((i for i in imports if i[3] <= 1), key=lambda i: -i[1])[:12]
            report += [
                f"  {cum / 1e3:7.1f} ms  {'  ' * depth}{name}" for _, cum, name, depth in top
            ]
        text = "\n".join(report)
        (prof_dir / "startup.txt").write_text(text + "\n")
        return text
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


# --- report ------------------------------------------------------------------------------


def machine() -> dict[str, str]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "unknown"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    except OSError:
        pass
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
        if dirty:
            commit += " + uncommitted changes"
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    import trio as _trio

    return {
        "nproc": str(os.cpu_count()),
        "cpu": cpu,
        "memory": mem,
        "python": platform.python_version(),
        "trio": _trio.__version__,
        "kernel": platform.release(),
        "commit": commit,
    }


# (key, label, unit, extractor, target, op): op "ge" target is a minimum, "le" a maximum
METRICS: list[tuple[str, str, str, Callable[[dict], float | None], float | None, str]] = [
    (
        "batch",
        "batch send (send_batch x64, 1 in flight)",
        "msg/s",
        lambda r: r.get("batch", {}).get("rate"),
        50_000,
        "ge",
    ),
    (
        "batch-pipelined",
        "batch send pipelined (x64, 4 in flight)",
        "msg/s",
        lambda r: r.get("batch-pipelined", {}).get("rate"),
        50_000,
        "ge",
    ),
    (
        "pipelined",
        "pipelined send (64 single sends in flight)",
        "msg/s",
        lambda r: r.get("pipelined", {}).get("rate"),
        50_000,
        "ge",
    ),
    (
        "sync",
        "sync send, one at a time",
        "msg/s",
        lambda r: r.get("sync", {}).get("rate"),
        5_000,
        "ge",
    ),
    (
        "sync-p50",
        "sync send latency p50",
        "ms",
        lambda r: r.get("sync", {}).get("p50_ms"),
        None,
        "",
    ),
    (
        "sync-p99",
        "sync send latency p99",
        "ms",
        lambda r: r.get("sync", {}).get("p99_ms"),
        2.0,
        "lt",
    ),
    (
        "sync-max",
        "sync send latency max",
        "ms",
        lambda r: r.get("sync", {}).get("max_ms"),
        None,
        "",
    ),
    (
        "pull",
        "pull (32 per request, all queues concurrently)",
        "msg/s",
        lambda r: r.get("pull", {}).get("rate"),
        100_000,
        "ge",
    ),
    ("up", "`rmq up` to `ready`", "s", lambda r: r.get("up_ready_s"), 1.5, "lt"),
    (
        "up-spawn",
        "  of which until the first node was spawned",
        "s",
        lambda r: r.get("up_spawned_s"),
        None,
        "",
    ),
    (
        "rss",
        "broker VmRSS after the benchmark",
        "MiB",
        lambda r: r["rss"]["VmRSS"] / 1024 if "rss" in r else None,
        80.0,
        "lt",
    ),
    (
        "rss-anon",
        "  of which RssAnon (heap)",
        "MiB",
        lambda r: r["rss"].get("RssAnon", 0) / 1024 if "rss" in r else None,
        None,
        "",
    ),
    (
        "rss-file",
        "  of which RssFile (mapped store files)",
        "MiB",
        lambda r: r["rss"].get("RssFile", 0) / 1024 if "rss" in r else None,
        None,
        "",
    ),
    (
        "rss-prepull",
        "broker VmRSS after the sends, before the pull",
        "MiB",
        lambda r: r["rss_before_pull"]["VmRSS"] / 1024 if "rss_before_pull" in r else None,
        None,
        "",
    ),
    (
        "hwm",
        "broker peak RSS (VmHWM)",
        "MiB",
        lambda r: r["rss"]["VmHWM"] / 1024 if "rss" in r else None,
        None,
        "",
    ),
]


def _fmt(value: float, unit: str) -> str:
    if unit == "msg/s":
        return f"{value:,.0f}"
    if unit == "s":
        return f"{value:.3f}"
    if unit == "ms":
        return f"{value:.3f}"
    return f"{value:.1f}"


def table(runs: list[dict]) -> list[dict]:
    rows = []
    for key, label, unit, get, target, op in METRICS:
        values = [v for v in (get(r) for r in runs) if v is not None]
        if not values:
            continue
        med = statistics.median(values)
        if target is None:
            verdict, target_s = "", ""
        else:
            # throughput: judged on the median; latency/startup/memory: on the median too,
            # with the worst run shown beside it in the table
            ok = med >= target if op == "ge" else med < target
            verdict = "yes" if ok else "NO"
            target_s = (">= " if op == "ge" else "< ") + _fmt(target, unit)
        rows.append(
            dict(
                key=key,
                label=label,
                unit=unit,
                n=len(values),
                min=min(values),
                median=med,
                max=max(values),
                target=target_s,
                met=verdict,
            )
        )
    return rows


def print_table(rows: list[dict]) -> None:
    w = max(len(r["label"]) for r in rows)
    print(
        f"\n{'scenario':<{w}}  {'unit':<5} {'runs':>4} {'min':>10} {'median':>10} "
        f"{'max':>10}  {'target':<12} met"
    )
    for r in rows:
        print(
            f"{r['label']:<{w}}  {r['unit']:<5} {r['n']:>4} {_fmt(r['min'], r['unit']):>10} "
            f"{_fmt(r['median'], r['unit']):>10} {_fmt(r['max'], r['unit']):>10}  "
            f"{r['target']:<12} {r['met']}"
        )


def markdown(
    rows: list[dict], info: dict[str, str], command: str, sz: dict[str, int], runs_raw: list[dict]
) -> str:
    runs = len(runs_raw)
    today = datetime.date.today().isoformat()
    out = [
        BEGIN,
        "",
        f"Generated {today} by `{command}` ({runs} runs, each with a fresh `rmq up` cluster "
        "and data dir; min / median / max over the runs; a target is judged on the median).",
        "",
        f"Machine: {info['nproc']} CPUs ({info['cpu']}), {info['memory']} RAM, "
        f"Linux {info['kernel']}, Python {info['python']}, trio {info['trio']}; "
        f"commit {info['commit']}.",
        "",
        "Setup per run: one nameserver + one ASYNC_MASTER broker (ASYNC_FLUSH; "
        f"`rmq up --slaves 0 --role ASYNC_MASTER`), topic `{TOPIC}` with {sz['queues']} queues, 1 KiB bodies, the client "
        "(`rmq.Producer` / `rmq.PullConsumer`) in the benchmark process on the same host. "
        f"Per run: batch {sz['batch_total']:,} msgs in batches of {sz['batch_size']} "
        f"(then again with {sz['batch_inflight']} batches in flight), pipelined "
        f"{sz['pipelined_total']:,} single sends with {sz['concurrency']} in flight, sync "
        f"{sz['sync_total']:,} sends one at a time, then every message pulled back "
        f"({sz['pull_batch']} per pull, one task per queue); {sz['warmup']} untimed sync sends "
        "warm up each send scenario.",
        "",
        "| scenario | unit | min | median | max | target | met |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['label']} | {r['unit']} | {_fmt(r['min'], r['unit'])} | "
            f"{_fmt(r['median'], r['unit'])} | {_fmt(r['max'], r['unit'])} | "
            f"{r['target']} | {r['met']} |"
        )
    out += [
        "",
        "CPU time per message (microseconds; median over the runs; from /proc utime+stime of "
        "the broker and process time of the client during the timed part). On 2 cores the "
        "broker and the client each have at most one, so 1e6 / max(broker, client) bounds "
        "the rate:",
        "",
        "| scenario | broker CPU/msg | client CPU/msg |",
        "|---|---:|---:|",
    ]
    for name in SCENARIOS:
        b = [r[name]["broker_cpu_us"] for r in runs_raw if name in r]
        c = [r[name]["client_cpu_us"] for r in runs_raw if name in r]
        if b:
            out.append(f"| {name} | {statistics.median(b):.1f} | {statistics.median(c):.1f} |")
    loads = [r["load_before"] for r in runs_raw] + [r.get("load_after", 0.0) for r in runs_raw]
    out += [
        "",
        f"1-minute load average around the runs: {min(loads):.2f} .. {max(loads):.2f} "
        "(other work on the host shares the 2 CPUs).",
        "",
        END,
    ]
    return "\n".join(out)


DOC_HEADER = """# Benchmarks

Numbers measured on the project's benchmark machine; every table says the command that made
it. The targets: batch/pipelined send >= 50,000 msg/s, one
at a time sync send >= 5,000 msg/s with p99 < 2 ms, pull >= 100,000 msg/s, `rmq up` ready in
< 1.5 s, broker RSS < 80 MB after the benchmark; the numbers are reported even where they
fall short.

## Broker: send, pull, startup, memory (`bench/run_broker_bench.py`)

"""


def write_doc(section: str, doc: Path = DOC) -> None:
    text = doc.read_text() if doc.exists() else DOC_HEADER + BEGIN + "\n" + END + "\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        text = head + section + tail
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)


# --- main --------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="runs (fresh cluster each); default 3")
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke test")
    ap.add_argument("--no-write", action="store_true", help="do not update docs/benchmarks.md")
    ap.add_argument(
        "--scenario",
        action="append",
        choices=SCENARIOS,
        help="run only these scenarios (repeatable); default all",
    )
    ap.add_argument(
        "--profile",
        default="",
        help="comma list: broker, client (py-spy during the scenarios), "
        "startup (import times of one `rmq up`)",
    )
    ap.add_argument(
        "--profile-all-threads",
        action="store_true",
        help="sample every non-idle thread, not only the GIL holder",
    )
    ap.add_argument("--profile-dir", type=Path, default=None, help="where raw profiles go")
    ap.add_argument("--json", type=Path, default=None, help="also write raw results here")
    ap.add_argument(
        "--doc",
        type=Path,
        default=None,
        help="write the results section into this file (even with --quick)",
    )
    ap.add_argument("--keep-data", action="store_true", help="keep each run's data dir")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be >= 1")

    sz = sizes(args.quick)
    selected = set(args.scenario or SCENARIOS)
    targets = {t.strip() for t in args.profile.split(",") if t.strip()}
    if targets - {"broker", "client", "startup"}:
        ap.error("--profile takes a comma list of broker, client, startup")
    prof_dir = args.profile_dir or Path(tempfile.mkdtemp(prefix="rmq-bench-prof-"))
    prof_dir.mkdir(parents=True, exist_ok=True)
    profiler = Profiler(targets, selected, prof_dir, gil=not args.profile_all_threads)

    info = machine()
    print(f"machine: {info}", flush=True)
    if "startup" in targets:
        print(profile_startup(prof_dir), flush=True)
        targets.discard("startup")
        if not targets:
            return 0
    runs = []
    for i in range(1, args.runs + 1):
        runs.append(one_run(i, sz, selected, profiler, args.keep_data))
    rows = table(runs)
    print_table(rows)

    command = ".venv/bin/python bench/run_broker_bench.py " + " ".join(
        a for a in (argv if argv is not None else sys.argv[1:])
    )
    command = command.strip()
    if args.json:
        args.json.write_text(
            json.dumps(
                {"machine": info, "sizes": sz, "runs": runs, "table": rows, "command": command},
                indent=2,
            )
        )
    write = not (args.no_write or args.quick or targets or args.scenario)
    if args.doc or write:
        doc = args.doc or DOC
        write_doc(markdown(rows, info, command, sz, runs), doc)
        print(f"\nwrote {doc}")
    if targets:
        print(f"\nraw profiles in {prof_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
