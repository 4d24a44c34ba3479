"""RocketMQ 5's gRPC path against the 4.x remoting path, in the same run on the same cluster:
sends one at a time, 32 in flight, and receive/ack throughput.

    .venv/bin/python bench/run_grpc_bench.py [--rounds 1] [--one 2000] [--many 10000]
        [--base /path/to/other/checkout] [--profile DIR]

Theory of operation. One `rmq up --detach` (the default SYNC_MASTER + slave) in a temp data dir
on free ports. Each side sends 1 KiB bodies to its own 4-queue topic after 300 untimed sends:

* 4.x: `rmq bench produce --batch 1 --inflight 1|32` (remoting, our Trio client), then
  `rmq bench consume` (pull, 32 per request, all queues) of what it sent;
* 5.x: the official `rocketmq-python-client` (the interop tests' venv,
  tests/interop/py5_venv.py) through tests/interop/py5_driver.py: `bench-send --inflight 1`
  (`Producer.send`), `--inflight 32` (`send_async`, 32 outstanding), then `bench-receive`
  (`SimpleConsumer.receive` of up to 32, one `ack` per message) of what it sent.

The clients differ (ours is Trio; the 5.x one is grpcio's asyncio loop behind blocking calls),
so beside msg/s each row gives the brokers' CPU per message (/proc/<pid>/stat before and after):
the server's cost of a request on each path, which is what this compares, and the same net of
what each broker burns idle (measured for 3 s before the scenarios: timers, HA heartbeats;
at a few hundred messages a second on a loaded host that is a good part of the raw figure).
Client and servers share the host's cores. Prints one JSON line per measurement and a table
of the rounds' medians.

`--base DIR` compares two trees in one run: each round runs the scenarios twice, first on a
cluster of the other checkout's code (`rmq` started with its root as working directory and
PYTHONPATH), then on this tree's, and the table has a row per tree. `--profile DIR` samples the
master with py-spy (bench/profile_summary.py; the GIL holder only) during each 5.x scenario,
writes the raw stacks to DIR and prints the top frames; profiled runs are slower, their rates
are not for the docs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import profile_summary  # noqa: E402
from bench.cluster import ClusterError, cpu_seconds, free_ports  # noqa: E402
from tests.interop.py5_venv import ensure_py5_python  # noqa: E402

DRIVER = ROOT / "tests" / "interop" / "py5_driver.py"
TOPIC4, TOPIC5, GROUP5 = "GrpcBench4x", "GrpcBench5x", "grpc-bench-5x"


def rmq(*args: str, timeout: float = 600, tree: Path = ROOT) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        capture_output=True, text=True, timeout=timeout, cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
    )  # fmt: skip
    if out.returncode:
        raise ClusterError(f"rmq {' '.join(args)}: {out.stdout}{out.stderr}")
    return out.stdout


@contextlib.contextmanager
def cluster(tree: Path = ROOT) -> Iterator[dict[str, Any]]:
    """`rmq up --detach --json` (SYNC_MASTER + slave) of `tree`'s code; its status document,
    `rmq down` after."""
    namesrv_port, broker_port = free_ports(brokers=2)
    with tempfile.TemporaryDirectory(prefix="rmq-grpc-bench-") as tmp:
        data = str(Path(tmp) / "rmq")
        doc = json.loads(
            rmq("up", "--detach", "--json", "--data-dir", data, "--namesrv-port",
                str(namesrv_port), "--broker-port", str(broker_port), timeout=120, tree=tree)
        )  # fmt: skip
        try:
            doc["namesrv"] = f"127.0.0.1:{namesrv_port}"
            yield doc
        finally:
            with contextlib.suppress(Exception):
                rmq("down", "--data-dir", data, timeout=120, tree=tree)


def py5(python: Path, home: Path, *args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [str(python), str(DRIVER), *args],
        capture_output=True, text=True, timeout=900,
        env={**os.environ, "HOME": str(home)},
    )  # fmt: skip
    if proc.returncode:
        raise ClusterError(f"py5 driver {args[0]}: {proc.stderr[-3000:]}")
    return [json.loads(x) for x in proc.stdout.splitlines() if x.startswith('{"event": "bench"')][0]


IDLE_SECONDS = 3.0


def idle_rates(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds per second each broker spends with no client (timers, HA heartbeats, the
    revive and flush services): at a few hundred messages a second on a loaded host that is a
    good part of the raw CPU per message, so each row also gives the CPU net of it."""
    before = {n: cpu_seconds(p) for n, p in pids.items()}
    t0 = time.monotonic()
    time.sleep(IDLE_SECONDS)
    elapsed = time.monotonic() - t0
    return {n: (cpu_seconds(p) - before[n]) / elapsed for n, p in pids.items()}


def measured(
    pids: dict[str, int],
    count_of: Any,
    run: Any,
    profile: Path | None = None,
    idle: dict[str, float] | None = None,
) -> dict[str, Any]:
    before = {n: cpu_seconds(p) for n, p in pids.items()}
    t0 = time.monotonic()
    if profile is None:
        result = run()
    else:
        master = next(iter(pids.values()))
        with profile_summary.sample(master, profile):
            time.sleep(0.3)  # py-spy attaches before the scenario starts
            result = run()
        summary = profile_summary.summarise(profile, top=30)
        print(profile_summary.format_summary(f"master ({profile})", summary), flush=True)
    elapsed = time.monotonic() - t0
    count = count_of(result)
    used = {n: cpu_seconds(p) - before[n] for n, p in pids.items()}
    result["cpu_us"] = {n: 1e6 * used[n] / count for n in pids}
    if idle is not None:
        result["net_cpu_us"] = {n: 1e6 * (used[n] - idle[n] * elapsed) / count for n in pids}
    return result


def one_round(
    python: Path,
    home: Path,
    one: int,
    many: int,
    *,
    tree: Path = ROOT,
    profile: Path | None = None,
    tag: str = "",
) -> dict[str, dict[str, Any]]:
    def prof(name: str) -> Path | None:
        return profile / f"{tag}{name}.txt" if profile is not None else None

    with cluster(tree) as doc:
        ns = doc["namesrv"]
        brokers = [n for n in doc["nodes"] if n["kind"] == "broker"]
        master = next(n for n in brokers if n["broker_id"] == 0)
        # the master first: --profile samples it
        pids = {n["name"]: n["pid"] for n in sorted(brokers, key=lambda n: n["broker_id"])}
        if not master.get("grpc"):
            raise ClusterError(f"no gRPC endpoint in `rmq up --json` for {master['name']}")
        endpoint = str(master["grpc"])
        for t, mtype in ((TOPIC4, None), (TOPIC5, "NORMAL")):
            extra = ["--message-type", mtype] if mtype else []
            rmq("topic", "create", t, "--queues", "4", "-n", ns, *extra, tree=tree)
        rmq("group", "create", GROUP5, "-n", ns, tree=tree)

        def bench4(inflight: int, count: int) -> dict[str, Any]:
            out = rmq("-n", ns, "bench", "produce", "--topic", TOPIC4, "--batch", "1",
                      "--inflight", str(inflight), "--size", "1024", "--count", str(count),
                      "--json", tree=tree)  # fmt: skip
            run = json.loads(out)["runs"][0]
            return {"msg_per_s": run["msg_per_s"], "p50_ms": run["latency_median_ms"],
                    "count": count}  # fmt: skip

        def bench5(inflight: int, count: int) -> dict[str, Any]:
            r = py5(python, home, "bench-send", "--endpoint", endpoint, "--topic", TOPIC5,
                    "--count", str(count), "--inflight", str(inflight), "--size", "1024",
                    "--timeout", "600")  # fmt: skip
            return {"msg_per_s": r["rate"], "p50_ms": r["p50_ms"], "count": count,
                    "errors": r["errors"]}  # fmt: skip

        out: dict[str, dict[str, Any]] = {}
        bench4(1, 300)  # warm-up: connections, routes, the first mapped file
        bench5(1, 300)
        idle = idle_rates(pids)
        n = lambda r: r["count"]  # noqa: E731
        out["4.x send, 1 in flight"] = measured(pids, n, lambda: bench4(1, one), idle=idle)
        out["5.x send, 1 in flight"] = measured(
            pids, n, lambda: bench5(1, one), prof("send1"), idle
        )
        out["4.x send, 32 in flight"] = measured(pids, n, lambda: bench4(32, many), idle=idle)
        out["5.x send, 32 in flight"] = measured(
            pids, n, lambda: bench5(32, many), prof("send32"), idle
        )
        total4 = 300 + one + many
        total5 = 300 + 1 + one + many  # bench-send's own untimed first send

        def consume4() -> dict[str, Any]:
            text = rmq("-n", ns, "bench", "consume", "--topic", TOPIC4, "--batch", "32", "--json",
                      tree=tree)  # fmt: skip
            run = json.loads(text)["runs"][0]
            return {"msg_per_s": run["msg_per_s"], "count": total4}

        def consume5() -> dict[str, Any]:
            r = py5(python, home, "bench-receive", "--endpoint", endpoint, "--topic", TOPIC5,
                    "--group", GROUP5, "--count", str(total5), "--batch", "32",
                    "--timeout", "600")  # fmt: skip
            return {"msg_per_s": r["rate"], "count": r["count"], "errors": r["errors"]}

        out["4.x pull (32 per request)"] = measured(pids, n, consume4, idle=idle)
        out["5.x receive (32) + ack each"] = measured(pids, n, consume5, prof("receive"), idle)
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--one", type=int, default=2000, help="sends one at a time")
    ap.add_argument("--many", type=int, default=10000, help="sends 32 in flight")
    ap.add_argument("--base", type=Path, default=None, help="another checkout to alternate with")
    ap.add_argument("--profile", type=Path, default=None, help="py-spy the master into this dir")
    args = ap.parse_args()
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    trees = [("", ROOT)] if args.base is None else [("base", args.base.resolve()), ("new", ROOT)]
    python = ensure_py5_python()
    rounds = []
    with tempfile.TemporaryDirectory(prefix="py5-bench-home-") as home:
        for i in range(args.rounds):
            r = {}
            for label, tree in trees:
                tag = f"{label}-{i}-" if label else f"{i}-"
                one = one_round(
                    python, Path(home), args.one, args.many,
                    tree=tree, profile=args.profile, tag=tag,
                )  # fmt: skip
                r.update({f"{name} [{label}]" if label else name: m for name, m in one.items()})
            rounds.append(r)
            for name, m in r.items():
                print(json.dumps({"round": i, "scenario": name, **m}), flush=True)
    print(
        "\n| scenario | msg/s | p50 ms | broker CPU us/msg | net of idle |\n|---|---|---|---|---|"
    )
    for name in rounds[0]:
        ms = [r[name] for r in rounds]
        rate = statistics.median(m["msg_per_s"] for m in ms)
        p50s = [m["p50_ms"] for m in ms if m.get("p50_ms") is not None]
        p50 = f"{statistics.median(p50s):.2f}" if p50s else "-"
        cpu = ", ".join(
            f"{k} {statistics.median(m['cpu_us'][k] for m in ms):.0f}" for k in ms[0]["cpu_us"]
        )
        net = ", ".join(
            f"{k} {statistics.median(m['net_cpu_us'][k] for m in ms):.0f}"
            for k in ms[0]["net_cpu_us"]
        )
        print(f"| {name} | {rate:,.0f} | {p50} | {cpu} | {net} |")


if __name__ == "__main__":
    main()
