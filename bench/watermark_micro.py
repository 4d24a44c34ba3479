"""CPU per send of the SYNC_MASTER replica watermark at 32 in flight, in one process.

Each batch is what one read of 32 pipelined sends and one slave ack make: 32 ``watch`` calls
(``slaveTimeout`` 3 s) and one ``advance`` that releases them all.  A mock clock moves 32/4,000
s per batch (4,000 sends/s), and the expiry task runs whenever it is due, as in a broker.
``--cold`` writes 36 KiB of a 48 MiB ring between batches (the batch's bodies), so entries
left behind leave the cache as they would in a broker.  Results: docs/benchmarks.md, "Send
path against its floor".

    .venv/bin/python bench/watermark_micro.py [--cold] [--batches 2000] [--runs 3]
"""

from __future__ import annotations

import argparse
import time

import trio
import trio.lowlevel
import trio.testing

from broker.ha.watermark import ReplicaWatermark
from broker.store import PutMessageStatus

RING = 48 << 20
BATCH_BYTES = 32 * 1152


async def _run(batches: int, clock: trio.testing.MockClock, cold: bool) -> float:
    w = ReplicaWatermark(connections=1)

    def done(status: PutMessageStatus) -> None:
        pass

    ring = bytearray(RING if cold else 0)
    blob = bytes(BATCH_BYTES)
    pos = 0
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run_expiry)
        off = 0
        start = time.process_time()
        for _ in range(batches):
            for _ in range(32):
                off += 1100
                w.watch(off, 3.0, done)
            w.advance(off)
            if cold:
                ring[pos : pos + BATCH_BYTES] = blob
                pos = (pos + BATCH_BYTES) % (RING - BATCH_BYTES)
            clock.jump(32 / 4000)
            await trio.lowlevel.checkpoint()  # the expiry task runs if its deadline passed
        elapsed = time.process_time() - start
        nursery.cancel_scope.cancel()
    return elapsed / (batches * 32) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cold", action="store_true", help="write a 48 MiB ring between batches")
    args = ap.parse_args()
    results = []
    for _ in range(args.runs):
        clock = trio.testing.MockClock()
        results.append(trio.run(_run, args.batches, clock, args.cold, clock=clock))
    print(
        f"us CPU per send, {args.runs} runs of {args.batches * 32:,}"
        f"{' (cold)' if args.cold else ''}: " + " ".join(f"{x:.2f}" for x in results)
    )


if __name__ == "__main__":
    main()
