"""DLedger benchmark: a 3-member group against SYNC_MASTER + slave, in the same run.

    .venv/bin/python bench/run_dledger_bench.py [--runs 3] [--duration 8]

Theory of operation. Per run, for each setup (the order alternates between runs so neither
always gets the warmer machine): `rmq up --detach` in a fresh data dir (`--dledger 3` with its
laptop defaults, batch push included; then `--slaves 1 --role SYNC_MASTER`), then
`rmq bench produce --batch 64 --inflight 4 --size 1024 --duration D --json` as a child process
(the batched, pipelined headline load: 64 x 1 KiB per request, 4 requests in flight; every
send must be SEND_OK or the bench fails). CPU seconds of every node (from /proc/<pid>/stat)
and of the producer (its rusage) are read around it and divided by the messages sent: CPU
microseconds per message per process. `rmq down` stops the cluster. Min / median / max of
msg/s over the runs are printed and written to docs/benchmarks.md between this script's
markers, with the per-process CPU of the median run.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
BEGIN, END = "<!-- dledger-bench:begin -->", "<!-- dledger-bench:end -->"
SETUPS = {
    "DLedger 3 members": ["--dledger", "3"],
    "SYNC_MASTER + slave": ["--slaves", "1", "--role", "SYNC_MASTER"],
}
sys.path.insert(0, str(ROOT))

from bench.cluster import cpu_seconds, detached_cluster  # noqa: E402


def one(setup: str, duration: float) -> dict:
    with detached_cluster(*SETUPS[setup], brokers=3, prefix="rmq-dledger-bench-") as (ns, nodes):
        before = {name: cpu_seconds(pid) for name, pid in nodes.items()}
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "cli.main",
                "--namesrv",
                ns,
                "bench",
                "produce",
                "--batch",
                "64",
                "--inflight",
                "4",
                "--size",
                "1024",
                "--duration",
                str(duration),
                "--json",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        out, err = proc.communicate(timeout=duration + 120)
        kids_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode:
            raise SystemExit(f"rmq bench failed: {err[-2000:]}")
        after = {name: cpu_seconds(pid) for name, pid in nodes.items()}
        result = json.loads(out)["runs"][0]
        msgs = result["msgs"]
        cpu = {
            name: (after[name] - before[name]) / msgs * 1e6
            for name in nodes
            if not name.startswith("namesrv")
        }
        producer = (kids_after.ru_utime + kids_after.ru_stime) - (kids.ru_utime + kids.ru_stime)
        cpu["producer"] = producer / msgs * 1e6
        return {"msg_per_s": result["msg_per_s"], "cpu_us_per_msg": cpu}


def markdown(results: dict[str, list[dict]], command: str, runs: int) -> str:
    lines = [
        BEGIN,
        "## DLedger: a 3-member group against SYNC_MASTER + slave",
        "",
        f"Command: `{command}` ({runs} runs, each setup once per run, order alternating).",
        "Load: `rmq bench produce --batch 64 --inflight 4 --size 1024` (64 x 1 KiB per request,",
        "4 requests in flight), all SEND_OK. Same machine, same run, every process on its 2 cores.",
        "",
        "| setup | min msg/s | median msg/s | max msg/s | target |",
        "|---|---|---|---|---|",
    ]
    for setup, rs in results.items():
        rates = sorted(r["msg_per_s"] for r in rs)
        target = ">= 15,000" if setup.startswith("DLedger") else "(comparison)"
        lines.append(
            f"| {setup} | {rates[0]:,.0f} | {statistics.median(rates):,.0f} | "
            f"{rates[-1]:,.0f} | {target} |"
        )
    lines += ["", "CPU microseconds per message per process (the median run):", ""]
    for setup, rs in results.items():
        med = sorted(rs, key=lambda r: r["msg_per_s"])[len(rs) // 2]
        parts = ", ".join(f"{k} {v:.0f}" for k, v in med["cpu_us_per_msg"].items())
        lines.append(f"* {setup}: {parts}")
    lines += ["", END]
    return "\n".join(lines)


def write_doc(section: str) -> None:
    text = DOC.read_text()
    if BEGIN in text:
        text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), section, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    DOC.write_text(text)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    results: dict[str, list[dict]] = {s: [] for s in SETUPS}
    for i in range(args.runs):
        order = list(SETUPS) if i % 2 == 0 else list(reversed(SETUPS))
        for setup in order:
            r = one(setup, args.duration)
            results[setup].append(r)
            print(setup, f"{r['msg_per_s']:,.0f} msg/s", r["cpu_us_per_msg"], flush=True)
    command = "python bench/run_dledger_bench.py " + " ".join(sys.argv[1:])
    section = markdown(results, command.strip(), args.runs)
    print(section)
    if not args.no_write:
        write_doc(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
