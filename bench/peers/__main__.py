"""trio-rmq against Redis (primary + replica) and NATS JetStream (R1, R3), one command:

    .venv/bin/python -m bench.peers [--runs 3] [--count 20000] [--quick] [--no-write]

Theory of operation: install what is missing (redis-server and nats-server from Debian, their
Python clients and matplotlib from PyPI), then for each run (the outer loop) start every
system in turn on loopback (free ports, a temp data dir), run every scenario it supports at
every body size with its own client in this process as the load generator, read each server
process's VmRSS, and stop it (SIGTERM, then SIGKILL; in a finally). The medians over the runs
are printed as markdown and, unless --no-write or --quick, written into docs/benchmarks.md
between the peers-bench markers, with the chart docs/peers.png.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from bench.peers import report
from bench.peers.procs import ensure_installed, rss_kib

# seconds between the run's last scenario and the second RSS reading
SETTLE_S = 2.0

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "benchmarks.md"
CHART = ROOT / "docs" / "peers.png"
REDIS, NATS_R1, NATS_R3 = "Redis primary+replica", "NATS JetStream R1", "NATS JetStream R3"
PEERS = {"Redis": REDIS, "NATS R3": NATS_R3}


def systems(
    base: Path | None = None,
) -> list[tuple[str, Callable[[Path], AbstractContextManager[Any]]]]:
    """Every system; with `base`, each trio-rmq setup is followed by the same setup run from
    that checkout (`<name> (base)`), so base and this tree alternate within every run."""
    from bench.peers import floor_peer, nats_peer, redis_peer, rmq_peer

    out: list[tuple[str, Callable[[Path], AbstractContextManager[Any]]]] = [
        (REDIS, redis_peer.start),
        (NATS_R1, functools.partial(nats_peer.start, replicas=1)),
        (NATS_R3, functools.partial(nats_peer.start, replicas=3)),
        (floor_peer.NAME, floor_peer.start),  # the ceiling of this design (issue 28)
    ]
    for name in rmq_peer.SETUPS:
        out.append((name, functools.partial(rmq_peer.start, name=name)))
        if base is not None:
            out.append(
                (
                    name + rmq_peer.BASE_SUFFIX,
                    functools.partial(rmq_peer.start, name=name, base=base),
                )
            )
    return out


def body(size: int) -> bytes:
    return (bytes(range(256)) * (size // 256 + 1))[:size]


def _version(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout
    except OSError:
        return "?"
    return out.strip().splitlines()[0] if out.strip() else "?"


def _py_version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"


def _loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def intro(command: str, args: argparse.Namespace, loads: list[float]) -> list[str]:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "?",
    )
    commit = _version(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"])
    dirty = _version(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"])
    if dirty != "?":  # the numbers are not only the commit's (other work in the tree)
        commit += " + uncommitted changes"
    return [
        f"Generated {datetime.date.today().isoformat()} by `{command}`: {args.runs} runs "
        "(the outer loop: run 1 of every system, then run 2, ...), each system started fresh "
        "on loopback per run; median (min-max) over the runs. "
        f"{args.count:,} messages per send scenario and body size, {args.concurrency} in flight "
        "where the scenario says so, the same for every system; untimed warm-up sends first.",
        "",
        f"Machine: {os.cpu_count()} CPUs ({cpu}), Linux {platform.release()}, Python "
        f"{platform.python_version()}; 1-minute load average {min(loads):.2f}..{max(loads):.2f} "
        "during the runs (the host is shared). Versions: "
        f"{_version(['redis-server', '--version'])}; nats-server "
        f"{_version(['nats-server', '--version'])}; redis-py {_py_version('redis')}, "
        f"nats-py {_py_version('nats-py')}; trio-rmq commit {commit}.",
    ]


NOTES = [
    "How each system is driven (its own Python client, in the benchmark process):",
    "",
    "* Redis: `XADD` + `WAIT 1 5000` sent as one pipeline per message (sync-replicated), "
    "`XADD` alone (async); 32 in flight = 32 asyncio tasks over a 32+ connection pool; "
    "consume = `XRANGE` pages of 1,000. No persistence (`--save '' --appendonly no`), "
    "`--repl-diskless-sync-delay 0` so the replica's first sync does not wait 5 s.",
    "* NATS: `js.publish` (awaits the PubAck) on a file-storage stream with num_replicas 1 or "
    "3; 32 in flight = 32 asyncio tasks; consume = a pull consumer (no acks) fetching 1,000 at "
    "a time. JetStream has no asynchronously replicated mode, so that row is absent.",
    "* trio-rmq: `rmq up` with `--slaves 1 --role SYNC_MASTER`, `--dledger 3`, and "
    "`--slaves 0 --role ASYNC_MASTER` (a master alone stands for asynchronous replication: "
    "no slave runs at all, an upper bound); `Producer.send` / `send_batch` (32 a batch, one "
    "batch in flight) in Trio tasks; consume = `PullConsumer.pull` over the 8 queues from "
    "offset 0, one task per queue, 32 a pull (the broker's per-pull limit, as in RocketMQ).",
    "* Trio floor chain: `bench/run_floor_chain.py`'s bare chain (client, master, slave; "
    "length + body forwarded, an 8-byte ack, a 100-byte answer; no store, no codec), the "
    "ceiling of trio-rmq's design; one at a time = one task writing and reading its socket, "
    "32 in flight = one writer task with 32 frames outstanding and one reader task.",
    "* Consuming reads everything the system stored for that body size (every send scenario "
    "and its warm-up), so the message counts differ between systems; rates are per message.",
    "* No system fsyncs per message here (Redis: no persistence; JetStream: its default "
    "periodic sync; trio-rmq: ASYNC_FLUSH).",
    "* CPU: each server process's utime+stime (/proc/<pid>/stat) and the load generator's "
    "process time during the timed part, per message; host = every CPU's busy time "
    "(/proc/stat), which includes whatever else runs on the shared host. `rmq up` is the "
    "supervisor process (it is counted in trio-rmq's RSS).",
    "* Start-up: spawn of the first process until every port accepts and the system is usable "
    "(Redis: the replica reports `master_link_status:up`; NATS: every node answers a "
    "JetStream account request; trio-rmq: `rmq up` prints `ready`). RSS: VmRSS of every "
    'server process right after both body sizes ran, and again 2 s later ("settled": '
    "trio-rmq's brokers drop mapped store pages and trim freed heap once their store has "
    "had no writes for one flush interval).",
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--count", type=int, default=20_000, help="messages per send scenario")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--sizes", default="1024,100", help="body sizes in bytes (first = headline)")
    ap.add_argument("--quick", action="store_true", help="1 run of 1,000 messages, no docs")
    ap.add_argument("--no-write", action="store_true", help="do not touch docs/")
    ap.add_argument("--only", action="append", help="run only systems whose name contains this")
    ap.add_argument("--json", type=Path, help="also write the raw samples here")
    ap.add_argument(
        "--base",
        type=Path,
        help="a checkout to compare with: each trio-rmq setup also runs from it, alternating",
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.runs, args.count = 1, 1_000
    if args.runs < 1 or args.count < 32:
        ap.error("--runs must be >= 1 and --count >= 32")
    sizes = [int(s) for s in args.sizes.split(",")]
    ensure_installed()
    chosen = [s for s in systems(args.base) if not args.only or any(o in s[0] for o in args.only)]
    samples: list[dict[str, Any]] = []
    setups: list[dict[str, Any]] = []
    loads = [_loadavg()]
    for run in range(1, args.runs + 1):
        for name, start in chosen:
            with tempfile.TemporaryDirectory(prefix="peers-bench-") as tmp, start(Path(tmp)) as sut:
                print(f"run {run}: {name} ready in {sut.ready_seconds:.3f} s", flush=True)
                for size in sizes:
                    for scenario in sut.scenarios:
                        r = sut.run(scenario, body(size), args.count, args.concurrency)
                        samples.append(r | dict(run=run, system=name, size=size, scenario=scenario))
                        lat = (
                            f", p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms"
                            if "p50_ms" in r
                            else ""
                        )
                        print(
                            f"run {run}: {name} {report.size_label(size)} {scenario}: "
                            f"{r['msgs']:,} msgs, {r['rate']:,.0f} msg/s{lat}",
                            flush=True,
                        )
                rss = {p: rss_kib(pid) for p, pid in sut.pids().items()}
                # and once more when the servers have gone quiet: what an idle system holds
                time.sleep(SETTLE_S)
                settled = {p: rss_kib(pid) for p, pid in sut.pids().items()}
                setups.append(
                    dict(
                        run=run,
                        system=name,
                        ready_s=sut.ready_seconds,
                        rss_kib=rss,
                        rss_settled_kib=settled,
                    )
                )
            loads.append(_loadavg())
    if args.json:
        args.json.write_text(json.dumps({"samples": samples, "setups": setups}, indent=1))
    command = " ".join([".venv/bin/python -m bench.peers", *(argv or sys.argv[1:])])
    names = [name for name, _ in chosen]
    section = report.markdown(
        samples, setups, names, PEERS, sizes, intro(command, args, loads), NOTES
    )
    print(section)
    if not (args.no_write or args.quick):
        from bench.peers import chart

        DOC.write_text(report.replace_section(DOC.read_text(), section))
        chart.draw(report.medians(samples), sizes, names, CHART)
        print(f"wrote {DOC} and {CHART}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
