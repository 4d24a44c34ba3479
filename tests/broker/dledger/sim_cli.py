"""Command line of the DLedger simulator (run it as ``python -m tests.broker.dledger.sim_cli``).

--seed N [--nodes 3|5] [-v]          one seed; -v prints the trace
--seeds A:B [--nodes 3|5] [--workers W]
                                     seeds A..B-1 (3 members for even seeds, 5 for odd
                                     ones unless --nodes), over W processes; prints a
                                     summary and every failing seed's replay command
--planted NAME                       run a planted bug instead of the correct core
                                     (sim_planted.py: no-current-term-rule,
                                     ack-before-flush, no-lease, reset-at-newest-file); a
                                     long form of the suite's proof that the checks
                                     catch it
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import sys
import time
from collections.abc import Callable

from tests.broker.dledger.sim_planted import PLANTED, factory_of
from tests.broker.dledger.simulator import (
    SimStats,
    SimulationFailure,
    default_factory,
    nodes_for,
    replay_command,
    run_seed,
)


def _run(
    seed: int,
    nodes: int,
    planted: str | None,
    trace: Callable[[str], None] | None = None,
    fast_first_vote: bool = False,
) -> SimStats:
    if planted is None:
        return run_seed(
            seed,
            nodes,
            core_factory=default_factory,
            trace=trace,
            fast_first_vote=fast_first_vote,
        )
    cls, acks_before_flush = PLANTED[planted]
    return run_seed(
        seed,
        nodes,
        core_factory=factory_of(cls),
        trace=trace,
        acks_before_flush=acks_before_flush,
        fast_first_vote=fast_first_vote,
    )


def _one(job: tuple[int, int, str | None, bool]) -> tuple[int, int, SimStats | None, str]:
    seed, nodes, planted, fast = job
    try:
        return seed, nodes, _run(seed, nodes, planted, fast_first_vote=fast), ""
    except SimulationFailure as e:
        return seed, nodes, None, str(e)


def _range(text: str) -> range:
    start, _, stop = text.partition(":")
    return range(int(start), int(stop))


def main(argv: list[str] | None = None) -> int:
    # a simulated leader steps down for want of a quorum thousands of times per run: its
    # warning (broker/dledger/raft/election.py) is for operators, not for this report
    logging.getLogger("broker.dledger.raft.election").setLevel(logging.ERROR)
    # ... and so do the resets of members stranded by the simulated forced cleans
    logging.getLogger("broker.dledger.raft.entry_handler").setLevel(logging.ERROR)
    logging.getLogger("broker.dledger.raft.entry_pusher").setLevel(logging.ERROR)
    parser = argparse.ArgumentParser(prog="python -m tests.broker.dledger.sim_cli")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--seed", type=int)
    which.add_argument("--seeds", type=_range, help="A:B, the seeds A..B-1")
    parser.add_argument("--nodes", type=int, choices=(3, 5))
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--planted", choices=sorted(PLANTED))
    parser.add_argument(
        "--fast-first-vote",
        action="store_true",
        help="started members ask for votes after a vote pause (the driver's default)",
    )
    args = parser.parse_args(argv)
    if args.seed is not None:
        nodes = args.nodes or nodes_for(args.seed)
        trace = print if args.verbose else None
        try:
            print(_run(args.seed, nodes, args.planted, trace, args.fast_first_vote))
        except SimulationFailure as e:
            print(f"FAILED {e}")
            return 1
        return 0
    jobs = [(s, args.nodes or nodes_for(s), args.planted, args.fast_first_vote) for s in args.seeds]
    started = time.perf_counter()
    failures: list[str] = []
    failed_seeds: list[int] = []
    events = acked = leaders = resets = 0
    with multiprocessing.Pool(args.workers) as pool:
        for seed, _nodes, result, error in pool.imap_unordered(_one, jobs, chunksize=64):
            if result is None:
                failures.append(error)
                failed_seeds.append(seed)
                if args.planted is None:
                    print(f"FAILED {error}", flush=True)
            else:
                events += result.events
                acked += result.acked
                leaders += result.leaders
                resets += result.resets
    elapsed = time.perf_counter() - started
    if args.planted is not None:
        # a planted bug is the other way round: every seed that catches it is a success
        failed_seeds.sort()
        print(
            f"{args.planted}: caught by {len(failed_seeds)} of {len(jobs)} seeds, the first "
            f"{failed_seeds[:10]}, {elapsed:.1f} s"
        )
        if failed_seeds:
            first = failed_seeds[0]
            print(
                "replay: "
                f"{replay_command(first, args.nodes or nodes_for(first), fast_first_vote=args.fast_first_vote)} "
                f"--planted {args.planted}"
            )
        return 0 if failed_seeds else 1
    print(
        f"{len(jobs)} seeds, {len(failures)} failed, {elapsed:.1f} s "
        f"({events} events, {leaders} leader terms, {acked} acknowledged entries, "
        f"{resets} stranded members reset)"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
