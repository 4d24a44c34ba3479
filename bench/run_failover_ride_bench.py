"""A steady producer across 10 DLedger leader kills: errors surfaced, kill -> next ack.

    .venv/bin/python bench/run_failover_ride_bench.py [--kills 10]

Theory of operation: the measurement is tests/integration/test_dledger_ride_through.py (a
3-member group of real processes with rmq up's laptop timing, our producer with its defaults,
one send at a time about 100 a second, the leader SIGKILLed at a random moment and restarted
0.2-1 s later); this runs it with RMQ_RIDE_KILLS set and prints its figures line: the send
errors the application saw (the test fails unless 0), kill -> first acknowledgement of a send
begun after the kill (p50, max), and the longest single send.  docs/benchmarks.md gives the
figures under "Failover".
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=10)
    args = ap.parse_args()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-s",
            "-p",
            "no:xdist",
            "tests/integration/test_dledger_ride_through.py",
        ],
        cwd=ROOT,
        env={**os.environ, "RMQ_RIDE_KILLS": str(args.kills)},
        capture_output=True,
        text=True,
        check=False,
    )
    figures = [line for line in proc.stdout.splitlines() if line.startswith("ride-through:")]
    print(figures[-1] if figures else proc.stdout[-2000:] + proc.stderr[-2000:])
    return proc.returncode


if __name__ == "__main__":
    raise SystemExit(main())
