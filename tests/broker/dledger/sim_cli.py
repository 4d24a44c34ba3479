"""Command line of the DLedger simulator (run it as ``python -m tests.broker.dledger.sim_cli``).

--seed N [--nodes 3|5] [-v]          one seed; -v prints the trace
--seeds A:B [--nodes 3|5] [--workers W]
                                     seeds A..B-1 (3 members for even seeds, 5 for odd
                                     ones unless --nodes), over W processes; prints a
                                     summary and every failing seed's replay command
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time

from tests.broker.dledger.simulator import SimStats, SimulationFailure, nodes_for, run_seed


def _one(job: tuple[int, int]) -> tuple[int, int, SimStats | None, str]:
    seed, nodes = job
    try:
        return seed, nodes, run_seed(seed, nodes), ""
    except SimulationFailure as e:
        return seed, nodes, None, str(e)


def _range(text: str) -> range:
    start, _, stop = text.partition(":")
    return range(int(start), int(stop))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.broker.dledger.sim_cli")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--seed", type=int)
    which.add_argument("--seeds", type=_range, help="A:B, the seeds A..B-1")
    parser.add_argument("--nodes", type=int, choices=(3, 5))
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    if args.seed is not None:
        nodes = args.nodes or nodes_for(args.seed)
        trace = print if args.verbose else None
        try:
            print(run_seed(args.seed, nodes, trace=trace))
        except SimulationFailure as e:
            print(f"FAILED {e}")
            return 1
        return 0
    jobs = [(s, args.nodes or nodes_for(s)) for s in args.seeds]
    started = time.perf_counter()
    failures: list[str] = []
    events = acked = leaders = 0
    with multiprocessing.Pool(args.workers) as pool:
        for _seed, _nodes, result, error in pool.imap_unordered(_one, jobs, chunksize=64):
            if result is None:
                failures.append(error)
                print(f"FAILED {error}", flush=True)
            else:
                events += result.events
                acked += result.acked
                leaders += result.leaders
    elapsed = time.perf_counter() - started
    print(
        f"{len(jobs)} seeds, {len(failures)} failed, {elapsed:.1f} s "
        f"({events} events, {leaders} leader terms, {acked} acknowledged entries)"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
