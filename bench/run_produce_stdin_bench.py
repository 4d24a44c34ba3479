"""`seq N | rmq produce --topic Orders` against `rmq up`'s default cluster.

    .venv/bin/python bench/run_produce_stdin_bench.py [--lines 100000] [--runs 3] [--json]

Theory of operation. The README's example, timed as a user runs it. A fresh `rmq up --detach`
(nameserver, SYNC_MASTER broker-a, one slave: every acknowledged send is on the slave) runs in
a temporary directory on free loopback ports. Per run, `seq N` is piped into a new `rmq
produce --topic Orders` process (the topic is created by its first message, as in the README;
`--no-progress` is not given, so the progress bar is drawn on stderr, which is a pipe here).
Wall time runs from spawning `rmq produce` to its exit, so interpreter start and connecting
are included; lines/s = N / wall time. The command's own summary line (`sent N message(s) ...
in S s`) is recorded too, and every run must exit 0 having sent N messages. Afterwards the
topic must hold runs x N messages. The cluster is stopped with `rmq down`, whatever happened.
Prints min / median / max; nothing is written to docs/ by the script.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cli.chaos.port_blocks import free_port_block  # noqa: E402

RMQ = [sys.executable, "-m", "cli.main"]
SUMMARY = re.compile(r"sent (\d+) message\(s\) to \S+ in ([\d.]+)s")


def rmq(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RMQ, *args], cwd=ROOT, text=True, capture_output=True, **kw)


def one_run(namesrv: str, lines: int) -> dict[str, float]:
    seq = subprocess.Popen(["seq", str(lines)], stdout=subprocess.PIPE)
    started = time.perf_counter()
    proc = subprocess.run(
        [*RMQ, "-n", namesrv, "produce", "--topic", "Orders"],
        stdin=seq.stdout,
        cwd=ROOT,
        text=True,
        capture_output=True,
        timeout=600,
    )
    wall = time.perf_counter() - started
    assert seq.stdout is not None
    seq.stdout.close()
    seq.wait(timeout=10)
    if proc.returncode != 0:
        raise SystemExit(f"rmq produce exited {proc.returncode}: {proc.stderr[-2000:]}")
    m = SUMMARY.search(proc.stdout)
    if m is None or int(m.group(1)) != lines:
        raise SystemExit(f"unexpected summary: {proc.stdout[-500:]!r}")
    return {"wall_s": wall, "lines_per_s": lines / wall, "command_s": float(m.group(2))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print the runs as JSON")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="rmq-produce-bench-") as tmp:
        data_dir = Path(tmp) / "cluster"
        base = free_port_block(20)
        namesrv = f"127.0.0.1:{base + 15}"
        up = rmq(
            "up",
            "--detach",
            "--data-dir",
            str(data_dir),
            "--namesrv-port",
            str(base + 15),
            "--broker-port",
            str(base),
            timeout=120,
        )
        try:
            if up.returncode != 0:
                raise SystemExit(f"rmq up failed: {up.stdout}{up.stderr}")
            runs = [one_run(namesrv, args.lines) for _ in range(args.runs)]
            status = rmq("-n", namesrv, "topic", "status", "Orders", "--json", timeout=60)
            total = json.loads(status.stdout)["total"]["messages"]
            if total != args.runs * args.lines:
                raise SystemExit(f"topic holds {total} messages, expected {args.runs * args.lines}")
        finally:
            down = rmq("down", "--data-dir", str(data_dir), timeout=120)
            if down.returncode != 0:
                print(f"rmq down failed: {down.stdout}{down.stderr}", file=sys.stderr)

    rates = sorted(r["lines_per_s"] for r in runs)
    if args.json:
        print(json.dumps({"lines": args.lines, "runs": runs}, indent=2))
    print(
        f"seq {args.lines} | rmq produce --topic Orders, {args.runs} runs, wall time incl. "
        "interpreter start:"
    )
    for r in runs:
        print(
            f"  {r['wall_s']:.2f} s wall ({r['lines_per_s']:,.0f} lines/s), "
            f"command's own summary {r['command_s']:.2f} s"
        )
    print(
        f"lines/s min / median / max: {rates[0]:,.0f} / {statistics.median(rates):,.0f} / "
        f"{rates[-1]:,.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
