"""Single sends against `rmq up`'s default cluster (SYNC_MASTER + slave): one at a time and 32
in flight, with the brokers' CPU per message; the before/after measure of issue 12's request
path changes.

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
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.cluster import cpu_seconds, free_ports  # noqa: E402


def rmq(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        check=True,
    )
    return out.stdout


def bench(ns: str, inflight: int, count: int, pids: dict[str, int]) -> dict:
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    run = json.loads(
        rmq(
            "--namesrv",
            ns,
            "bench",
            "produce",
            "--batch",
            "1",
            "--inflight",
            str(inflight),
            "--size",
            "1024",
            "--count",
            str(count),
            "--json",
        )
    )["runs"][0]
    cpu = {name: (cpu_seconds(pid) - before[name]) / count * 1e6 for name, pid in pids.items()}
    return {"msg_per_s": run["msg_per_s"], "p50_us": run["latency_median_ms"] * 1000, "cpu": cpu}


def one_round() -> dict:
    namesrv_port, broker_port = free_ports(brokers=2)
    ns = f"127.0.0.1:{namesrv_port}"
    with tempfile.TemporaryDirectory(prefix="rmq-send-ab-") as tmp:
        data = str(Path(tmp) / "rmq")
        up = json.loads(
            rmq(
                "up",
                "--detach",
                "--json",
                "--data-dir",
                data,
                "--namesrv-port",
                str(namesrv_port),
                "--broker-port",
                str(broker_port),
            )
        )
        try:
            pids = {n["name"]: n["pid"] for n in up["nodes"] if n["name"] != "namesrv"}
            rmq(
                "--namesrv",
                ns,
                "bench",
                "produce",
                "--batch",
                "1",
                "--inflight",
                "1",
                "--size",
                "1024",
                "--count",
                "500",
                "--json",
            )
            return {"one": bench(ns, 1, 4000, pids), "inflight32": bench(ns, 32, 20000, pids)}
        finally:
            subprocess.run(
                [sys.executable, "-m", "cli.main", "down", "--data-dir", data],
                capture_output=True,
                timeout=120,
                cwd=ROOT,
            )


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
