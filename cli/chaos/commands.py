"""`rmq chaos`: fault schedules against a cluster of real processes, checked (cli/chaos/run.py)."""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path
from typing import Annotated

import attrs
import typer

from cli.app import examples


@examples(
    "rmq chaos --mode sync --schedules 3",
    "rmq chaos --mode dledger --schedules 100 --seed 1000   # the long form",
    "rmq chaos --mode async --faults 4 --duration 20",
    "rmq chaos --mode dledger --kinds torn,full_disk --json",
)
def chaos_cmd(
    mode: Annotated[str, typer.Option(help="sync, async or dledger.")] = "sync",
    schedules: Annotated[int, typer.Option(min=1, help="How many seeded schedules to run.")] = 3,
    seed: Annotated[int, typer.Option(help="The first schedule's seed (then seed+1, ...).")] = 1,
    faults: Annotated[int, typer.Option(min=0, help="Faults per schedule.")] = 2,
    duration: Annotated[float, typer.Option(min=1.0, help="Seconds of load per schedule.")] = 8.0,
    kinds: Annotated[
        str,
        typer.Option(
            help="Fault kinds to draw from, comma-separated: kill, pause, partition, delay, "
            "drop, slow_disk, full_disk, torn (default: all). slow_disk and full_disk need gcc."
        ),
    ] = "all",
    data_dir: Annotated[
        Path | None, typer.Option(help="Where the clusters live (default: a temporary dir).")
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="One JSON document per schedule instead of text, then one with the totals "
            '({"totals": ...}: per fault kind, count and recovery median and max).',
        ),
    ] = False,
) -> None:
    """Start a nameserver and brokers (SYNC_MASTER + slave, ASYNC_MASTER + slave, or three
    DLedger members) as processes, send messages with unique ids while a seeded schedule
    injects faults: kill -9 and restart, SIGSTOP, a partition of replication links, a delayed
    or lossy link between two brokers, a slow or full disk (an LD_PRELOAD shim, built with
    gcc), a kill with a torn segment tail before the restart. Then check the history: lost
    acknowledged messages, duplicates, order per queue, recovery time per fault. Exit 1 if a
    promise broke (an acknowledged message lost or out of order; for async only the order
    counts, its loss is reported) or a schedule could not be checked because the cluster took
    no write for 60 s (reported as failed, with the tail of each node's log)."""
    import trio

    from cli.chaos.checker import Report, recovery_by_kind
    from cli.chaos.cluster import MODES
    from cli.chaos.run import run_schedule
    from cli.chaos.schedule import parse_kinds

    if mode not in MODES:
        raise typer.BadParameter(f"expected one of {', '.join(MODES)}", param_hint="--mode")
    try:
        chosen = parse_kinds(kinds)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--kinds") from None
    root = data_dir or Path(tempfile.mkdtemp(prefix="rmq-chaos-"))
    broken = failed = 0
    reports: list[Report] = []
    for n in range(schedules):
        report = trio.run(
            functools.partial(
                run_schedule,
                root / f"{mode}-{seed + n}",
                mode,
                seed + n,
                faults=faults,
                duration=duration,
                kinds=chosen,
                shim_cache=root / "disk-shim",
            )
        )
        reports.append(report)
        if as_json:
            typer.echo(json.dumps(attrs.asdict(report)))
        else:
            typer.echo(report.summary())
        if report.failure:
            failed += 1
        else:
            promise_kept = report.ok if mode != "async" else not report.order_violations
            broken += not promise_kept
    recovery = recovery_by_kind(reports)
    totals = {
        "mode": mode,
        "schedules": schedules,
        "broken": broken,
        "failed": failed,
        "acked": sum(r.acked for r in reports),
        "lost": sum(len(r.lost) for r in reports),
        "duplicated": sum(len(r.duplicates) for r in reports),
        "out_of_order": sum(len(r.order_violations) for r in reports),
        "unacked_delivered": sum(r.unacked_delivered for r in reports),
        "recovery": recovery,
    }
    if as_json:
        typer.echo(json.dumps({"totals": totals}))
    else:
        for kind, r in recovery.items():
            med, top = r["median"], r["max"]
            times = "" if med is None else f", recovery median {med:.2f} s, max {top:.2f} s"
            typer.echo(f"  {kind}: {r['faults']} faults, {r['never']} never recovered{times}")
        typer.echo(
            f"{schedules - broken - failed}/{schedules} schedules kept every promise, {failed} "
            f"could not be checked (the cluster took no write) ({root})"
        )
    if broken or failed:
        raise typer.Exit(1)
