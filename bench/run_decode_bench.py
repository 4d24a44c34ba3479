"""Micro-benchmark of the vectorized CommitLog decoder (pipeline.record_batch).

Builds ``--records`` records of ``--body`` byte bodies with producer-like properties (TAGS, KEYS,
UNIQ_KEY, WAIT) with ``common.message_encoder.encode_record`` and times, over ``--runs`` runs:

* ``walk``: finding record starts (``walk_records``),
* ``scan``: the same through ``broker.store.commitlog_scan.scan_segment`` (segment semantics),
* ``decode(starts)``: ``decode_records`` given the starts,
* ``walk+decode``: ``decode_records`` finding its own starts (what a PULL body costs),
* ``numpy decode``: decode(starts) with the numba kernels switched off (the fallback path).

Prints min/median/max in M msg/s (min time = best rate).  Single-threaded; note the machine load
(``uptime``) next to the numbers.  ``--profile`` adds a cProfile of decode(starts).

    .venv/bin/python bench/run_decode_bench.py --records 65536 --runs 7
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import time
from unittest import mock

import numpy.typing as npt

from broker.store.commitlog_scan import scan_segment
from common.message import MessageExtBrokerInner
from common.message_encoder import encode_record
from pipeline import record_batch
from pipeline.record_batch import decode_records, walk_records


def build(records: int, body: int) -> bytes:
    buf = bytearray()
    for i in range(records):
        m = MessageExtBrokerInner(
            topic="BenchTopic",
            queue_id=i % 4,
            body=b"x" * body,
            properties={
                "TAGS": "a",
                "KEYS": f"k{i}",
                "UNIQ_KEY": f"AC11000100002A9F0000000000{i:06d}",
                "WAIT": "true",
            },
            born_timestamp=1700000000000 + i,
        )
        buf += encode_record(m, i // 4, len(buf), 1700000000001 + i)
    return bytes(buf)


def without_numba(buf: bytes, starts: npt.ArrayLike) -> None:
    """decode(starts) through the numpy path (what runs when numba is not installed)."""
    with mock.patch.object(record_batch, "_kernels", None):
        decode_records(buf, broker_name="b", starts=starts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=65536)
    ap.add_argument("--body", type=int, default=100)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    buf = build(args.records, args.body)
    n = args.records
    starts = walk_records(buf)
    cases = [
        ("walk", lambda: walk_records(buf)),
        ("scan", lambda: scan_segment(buf, 0)),
        ("decode(starts)", lambda: decode_records(buf, broker_name="b", starts=starts)),
        ("walk+decode", lambda: decode_records(buf, broker_name="b")),
        ("numpy decode", lambda: without_numba(buf, starts)),
    ]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{n} records, {len(buf) / n:.0f} bytes each, {args.runs} runs, load {load:.2f}")
    for label, f in cases:
        times = []
        for _ in range(args.runs):
            t = time.perf_counter()
            f()
            times.append(time.perf_counter() - t)
        rates = sorted(n / t / 1e6 for t in times)
        print(
            f"{label:15s} M msg/s  min {rates[0]:6.2f}  median {statistics.median(rates):6.2f}"
            f"  max {rates[-1]:6.2f}"
        )
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(5):
            decode_records(buf, broker_name="b", starts=starts)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
