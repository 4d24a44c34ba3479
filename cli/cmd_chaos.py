"""`rmq chaos`: fault schedules against a cluster of real processes, checked (cli/chaos_run.py)."""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path
from typing import Annotated

import attrs
import typer

from cli.app import _examples, app


@app.command(
    "chaos",
    epilog=_examples(
        "rmq chaos --mode sync --schedules 3",
        "rmq chaos --mode dledger --schedules 100 --seed 1000   # the long form",
        "rmq chaos --mode async --faults 4 --duration 20",
    ),
)
def chaos_cmd(
    mode: Annotated[str, typer.Option(help="sync, async or dledger.")] = "sync",
    schedules: Annotated[int, typer.Option(min=1, help="How many seeded schedules to run.")] = 3,
    seed: Annotated[int, typer.Option(help="The first schedule's seed (then seed+1, ...).")] = 1,
    faults: Annotated[int, typer.Option(min=0, help="Faults per schedule.")] = 2,
    duration: Annotated[float, typer.Option(min=1.0, help="Seconds of load per schedule.")] = 8.0,
    data_dir: Annotated[
        Path | None, typer.Option(help="Where the clusters live (default: a temporary dir).")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON document per schedule instead of text.")
    ] = False,
) -> None:
    """Start a nameserver and brokers (SYNC_MASTER + slave, ASYNC_MASTER + slave, or three
    DLedger members) as processes, send messages with unique ids while killing, pausing and
    partitioning nodes on a seeded schedule, then check the history: lost acknowledged
    messages, duplicates, order per queue, recovery time. Exit 1 if a promise broke (an
    acknowledged message lost or out of order; for async only the order counts, its loss is
    reported)."""
    import trio

    from cli.chaos_cluster import MODES
    from cli.chaos_run import run_schedule

    if mode not in MODES:
        raise typer.BadParameter(f"expected one of {', '.join(MODES)}", param_hint="--mode")
    root = data_dir or Path(tempfile.mkdtemp(prefix="rmq-chaos-"))
    broken = 0
    for n in range(schedules):
        report = trio.run(
            functools.partial(
                run_schedule,
                root / f"{mode}-{seed + n}",
                mode,
                seed + n,
                faults=faults,
                duration=duration,
            )
        )
        if as_json:
            typer.echo(json.dumps(attrs.asdict(report)))
        else:
            typer.echo(report.summary())
        promise_kept = report.ok if mode != "async" else not report.order_violations
        broken += not promise_kept
    if not as_json:
        typer.echo(f"{schedules - broken}/{schedules} schedules kept every promise ({root})")
    if broken:
        raise typer.Exit(1)
