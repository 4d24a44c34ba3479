"""`rmq bench produce|consume`: the load generator (the loops and statistics are in `load.py`)."""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.app import _namesrv, _run, examples

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from cli.bench.load import BenchResult

# One benchmark run, told its progress (messages done so far).
BenchRun = Callable[[Callable[[int], None]], Awaitable["BenchResult"]]


Topic = Annotated[str, typer.Option("--topic", "-t", help="Topic to use.")]
Count = Annotated[
    int | None, typer.Option("--count", "-c", min=1, help="Messages per run (default 10000).")
]
Duration = Annotated[
    float | None,
    typer.Option("--duration", "-d", min=0.1, help="Seconds per run (instead of --count)."),
]
Runs = Annotated[int, typer.Option("--runs", min=1, help="Repeat; prints min/median/max.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print one JSON document instead.")]


def _bench(kind: str, settings: dict[str, Any], runs: int, as_json: bool, fn: BenchRun) -> None:
    """Run `fn(progress)` `runs` times with a progress bar on stderr; print the results."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from cli.bench.load import render_run, render_summary, to_json

    results = []
    total = settings.get("count")
    err = Console(file=sys.stderr)
    for i in range(1, runs + 1):
        with Progress(
            TextColumn(f"{kind} run {i}/{runs}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err,
            transient=True,
            disable=not err.is_terminal,
        ) as progress:
            result = _run(_one_run, fn, progress, progress.add_task(kind, total=total))
        results.append(result)
        if not as_json:
            print(render_run(i, result), flush=True)
    if as_json:
        print(json.dumps(to_json(results, settings), indent=2))
    else:
        for line in render_summary(results):
            print(line)


async def _one_run(fn: BenchRun, progress: Progress, task: TaskID) -> BenchResult:
    return await fn(lambda done: progress.update(task, completed=done))


@examples(
    "rmq bench produce                                # 10000 x 1 KiB, 16 in flight",
    "rmq bench produce --size 4096 --batch 16 --inflight 8 --count 200000",
    "rmq bench produce --duration 10 --runs 3 --json",
)
def produce(
    ctx: typer.Context,
    topic: Topic = "BenchTopic",
    size: Annotated[int, typer.Option("--size", "-s", min=1, help="Body bytes.")] = 1024,
    batch: Annotated[
        int, typer.Option("--batch", "-b", min=1, max=1024, help="Messages per request.")
    ] = 1,
    inflight: Annotated[
        int, typer.Option("--inflight", "-p", min=1, help="Requests in flight.")
    ] = 16,
    count: Count = None,
    duration: Duration = None,
    runs: Runs = 1,
    as_json: AsJson = False,
) -> None:
    """Send messages and report msg/s, MB/s and request latency percentiles."""
    from cli.bench.load import bench_produce

    namesrv = _namesrv(ctx)
    if count is None and duration is None:
        count = 10_000
    settings = {
        "kind": "produce",
        "namesrv": namesrv,
        "topic": topic,
        "size": size,
        "batch": batch,
        "inflight": inflight,
        "count": count,
        "duration": duration,
        "runs": runs,
    }
    _bench(
        "produce",
        settings,
        runs,
        as_json,
        lambda progress: bench_produce(
            namesrv,
            topic,
            size=size,
            batch=batch,
            inflight=inflight,
            count=count,
            duration=duration,
            progress=progress,
        ),
    )


@examples(
    "rmq bench consume                       # pull all of BenchTopic from the start",
    "rmq bench consume --count 50000 --batch 32 --runs 3",
)
def consume(
    ctx: typer.Context,
    topic: Topic = "BenchTopic",
    batch: Annotated[
        int, typer.Option("--batch", "-b", min=1, max=1024, help="Messages per pull.")
    ] = 32,
    count: Annotated[
        int | None, typer.Option("--count", "-c", min=1, help="Messages per run (default all).")
    ] = None,
    duration: Duration = None,
    runs: Runs = 1,
    as_json: AsJson = False,
) -> None:
    """Pull a topic from the start of every queue and report msg/s and MB/s."""
    from cli.bench.load import bench_consume

    namesrv = _namesrv(ctx)
    settings = {
        "kind": "consume",
        "namesrv": namesrv,
        "topic": topic,
        "batch": batch,
        "count": count,
        "duration": duration,
        "runs": runs,
    }
    # "everything there is" when neither is given: a duration too long to matter
    dur = duration if duration is not None or count is not None else 10 * 365 * 86400.0
    _bench(
        "consume",
        settings,
        runs,
        as_json,
        lambda progress: bench_consume(
            namesrv, topic, batch=batch, count=count, duration=dur, progress=progress
        ),
    )
