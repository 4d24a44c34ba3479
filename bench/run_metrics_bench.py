"""What counting for Prometheus costs on the send path: one broker with metrics off against one
with metrics on and scraped every second, in the same run (docs/benchmarks.md, "Metrics").

    .venv/bin/python bench/run_metrics_bench.py [--rounds 5]

Theory of operation: one nameserver and two ASYNC_MASTER brokers, started as `rmq up` starts
its nodes (`python -m cli.servers.node`), on free loopback ports in a temp dir: `broker-off`
without a metrics port, `broker-on` with one (its listen port + 3), scraped every second by a
thread of this process for the whole run.  Each broker holds its own topic, so
`rmq bench produce` (the public Producer, 1 KiB bodies) reaches one or the other.  Per round
and scenario (single sends one at a time; batches of 32, 4 in flight) both brokers are measured
back to back, the order alternating between rounds; each measurement reads the broker's CPU
time from /proc around the run (CPU microseconds per message).  Printed: every run, then per
scenario the medians and the on/off ratios.  The client and both brokers share the machine's
cores: compare ratios, not absolute rates, and run on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.cluster import _port_free, free_ports  # noqa: E402

SCENARIOS = {
    "single": ["--batch", "1", "--inflight", "1", "--count", "5000"],
    "batch32": ["--batch", "32", "--inflight", "4", "--count", "96000"],
}


def cpu_seconds(pid: int) -> float:
    """CPU time `pid`'s threads have run, in ns resolution (/proc/<pid>/schedstat's first field
    is the main thread's only, so the threads' are summed; /proc/<pid>/stat counts 10 ms ticks,
    too coarse for a few microseconds per message)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return total / 1e9


def rmq(ns: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", "--namesrv", ns, *args],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT,
    )  # fmt: skip


def start_node(args: list[str]) -> subprocess.Popen[bytes]:
    # --watch-stdin: the node stops when this process's end of the pipe closes
    return subprocess.Popen(
        [sys.executable, "-m", "cli.servers.node", *args, "--watch-stdin"],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
    )  # fmt: skip


def produce(ns: str, topic: str, scenario: list[str]) -> dict:
    out = rmq(ns, "bench", "produce", "--topic", topic, "--size", "1024", *scenario, "--json")
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    return json.loads(out.stdout)["runs"][0]


def scraper(url: str, stop: threading.Event, scrapes: list[int]) -> None:
    """Prometheus's part: GET /metrics every second."""
    while not stop.wait(1.0):
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                r.read()
            scrapes[0] += 1
        except OSError:
            scrapes[1] += 1


def micro() -> None:
    """What one request adds on the broker's thread, timed in this process: the put counter
    (SEND's path, once per request whatever the batch size) and the RPC latency observer
    (every answer)."""
    import timeit

    from broker.broker_metrics import BrokerMetrics
    from common.metrics.remoting_metrics import RpcLatency

    m, r = BrokerMetrics(), RpcLatency()
    props = "UNIQ_KEY\x017F0000011A2B18B4AAC2\x02WAIT\x01true\x02TAGS\x01paid"
    n = 200_000
    put = timeit.timeit(lambda: m.on_put("Orders", props, 1, 1200), number=n) / n * 1e6
    obs = timeit.timeit(lambda: r.observe(310, 0, 0.0003), number=n) / n * 1e6
    call = timeit.timeit(lambda: None, number=n) / n * 1e6
    print(f"per request: on_put {put - call:.2f} us, rpc observe {obs - call:.2f} us")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    micro()
    ns_port, base = free_ports(brokers=2)
    off_port, on_port = base, base + 10
    metrics_port = on_port + 3
    assert _port_free(metrics_port), metrics_port
    ns = f"127.0.0.1:{ns_port}"
    nodes: list[subprocess.Popen[bytes]] = []
    stop = threading.Event()
    with tempfile.TemporaryDirectory(prefix="rmq-metrics-bench-") as tmp:
        try:
            nodes.append(start_node(["namesrv", "--port", str(ns_port), "--data-dir", f"{tmp}/ns"]))
            pids = {}
            for name, port, extra in (
                ("broker-off", off_port, []),
                ("broker-on", on_port, ["--metrics-port", str(metrics_port)]),
            ):
                proc = start_node(
                    ["broker", "--name", name, "--cluster", "Bench", "--id", "0",
                     "--role", "ASYNC_MASTER", "--port", str(port), "--namesrv", ns,
                     "--data-dir", f"{tmp}/{name}", *extra]
                )  # fmt: skip
                nodes.append(proc)
                pids[name] = proc.pid
            topics = {"broker-off": "MetricsOff", "broker-on": "MetricsOn"}
            deadline = time.monotonic() + 60
            for name, port in (("broker-off", off_port), ("broker-on", on_port)):
                while True:
                    broker = f"127.0.0.1:{port}"
                    r = rmq(ns, "topic", "create", topics[name], "--broker", broker, "--json")
                    if r.returncode == 0:
                        break
                    if time.monotonic() > deadline:
                        raise RuntimeError(r.stderr)
                    time.sleep(0.5)
            scrapes = [0, 0]
            t = threading.Thread(
                target=scraper,
                args=(f"http://127.0.0.1:{metrics_port}/metrics", stop, scrapes),
                daemon=True,
            )
            t.start()
            for name in topics:  # warm-up: connections, routes, the first mapped file
                produce(ns, topics[name], ["--count", "500"])
            results: dict[str, dict[str, list[dict]]] = {
                s: {"broker-off": [], "broker-on": []} for s in SCENARIOS
            }
            for i in range(args.rounds):
                order = ["broker-off", "broker-on"] if i % 2 == 0 else ["broker-on", "broker-off"]
                for scenario, flags in SCENARIOS.items():
                    for name in order:
                        count = int(flags[flags.index("--count") + 1])
                        before = cpu_seconds(pids[name])
                        run = produce(ns, topics[name], flags)
                        cpu_us = (cpu_seconds(pids[name]) - before) / count * 1e6
                        m = {"msg_per_s": run["msg_per_s"], "cpu_us": cpu_us}
                        results[scenario][name].append(m)
                        print(
                            f"round {i + 1} {scenario} {name}: {m['msg_per_s']:,.0f} msg/s, "
                            f"broker CPU {cpu_us:.1f} us/msg",
                            flush=True,
                        )
            print(f"scrapes of broker-on: {scrapes[0]} answered, {scrapes[1]} failed")
            print("| scenario | metrics | msg/s (median) | broker CPU us/msg (median) |")
            print("|---|---|---:|---:|")
            for scenario, by_name in results.items():
                med = {
                    n: (
                        statistics.median(r["msg_per_s"] for r in runs),
                        statistics.median(r["cpu_us"] for r in runs),
                    )
                    for n, runs in by_name.items()
                }
                for n, (rate, cpu) in med.items():
                    label = "off" if n == "broker-off" else "on, scraped every 1 s"
                    print(f"| {scenario} | {label} | {rate:,.0f} | {cpu:.1f} |")
                off, on = med["broker-off"], med["broker-on"]
                print(f"| {scenario} | on/off | {on[0] / off[0]:.3f} | {on[1] / off[1]:.3f} |")
        finally:
            stop.set()
            for proc in nodes:
                if proc.stdin is not None:
                    proc.stdin.close()
            for proc in nodes:
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


if __name__ == "__main__":
    main()
