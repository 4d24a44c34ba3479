"""Single sends against `rmq up`'s default cluster (SYNC_MASTER + slave): one at a time and 32
in flight, with the brokers' CPU per message: run before and after a change to the request path
to compare the two.

    .venv/bin/python bench/run_send_ab.py [--rounds 2]

Theory of operation: per round, a fresh `rmq up --detach` (own data dir, free ports), 500
untimed sends, then `rmq bench produce --batch 1 --inflight 1 --count 4000` and `--inflight 32
--count 20000`, each bracketed by /proc/<pid>/stat reads of every broker (CPU microseconds per
message per process); `rmq down`.  Comparing two trees means running it in each (a checkout
per side), alternating, on a quiet machine: the 2 cores are shared by client and servers.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.cluster import cpu_seconds, detached_cluster  # noqa: E402


def produce(ns: str, inflight: int, count: int) -> dict:
    """`rmq bench produce` of single 1 KiB sends; its first run's JSON."""
    out = subprocess.run(
        [sys.executable, "-m", "cli.main", "--namesrv", ns, "bench", "produce", "--batch", "1",
         "--inflight", str(inflight), "--size", "1024", "--count", str(count), "--json"],
        capture_output=True, text=True, timeout=300, cwd=ROOT, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)["runs"][0]


def bench(ns: str, inflight: int, count: int, pids: dict[str, int]) -> dict:
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    run = produce(ns, inflight, count)
    cpu = {name: (cpu_seconds(pid) - before[name]) / count * 1e6 for name, pid in pids.items()}
    return {"msg_per_s": run["msg_per_s"], "p50_us": run["latency_median_ms"] * 1000, "cpu": cpu}


def one_round() -> dict:
    with detached_cluster(prefix="rmq-send-ab-") as (ns, nodes):
        pids = {name: pid for name, pid in nodes.items() if name != "namesrv"}
        produce(ns, 1, 500)  # warm-up: connections, routes, the first mapped file
        return {"one": bench(ns, 1, 4000, pids), "inflight32": bench(ns, 32, 20000, pids)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    for i in range(args.rounds):
        r = one_round()
        for scenario, m in r.items():
            cpu = ", ".join(f"{k} {v:.0f}" for k, v in m["cpu"].items())
            print(
                f"round {i + 1} {scenario}: {m['msg_per_s']:,.0f} msg/s, "
                f"p50 {m['p50_us']:.0f} us, CPU us/msg: {cpu}"
            )


if __name__ == "__main__":
    main()
