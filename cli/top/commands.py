"""`rmq top`: the live view of a cluster (collector in `model.py`, drawing in `screen.py`)."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.app import _namesrv, _run, examples


@examples(
    "rmq top                          # refresh every second until ctrl-C",
    "rmq top --interval 5",
    "rmq top --once                   # print one frame (rates over --interval) and exit",
    "rmq -n 10.0.0.1:9876 top --system   # include TBW102, %RETRY% topics, system groups",
)
def top(
    ctx: typer.Context,
    interval: Annotated[
        float, typer.Option("--interval", "-i", min=0.1, help="Seconds between refreshes.")
    ] = 1.0,
    once: Annotated[bool, typer.Option("--once", help="Print one frame and exit.")] = False,
    timeout: Annotated[
        float, typer.Option("--timeout", min=0.1, help="Seconds to wait for each node.")
    ] = 2.0,
    system: Annotated[
        bool, typer.Option("--system", help="Also show system topics and groups.")
    ] = False,
) -> None:
    """Live view of the cluster: brokers, roles, offsets, replication lag, TPS, topics, groups.

    A node that stops answering turns red and top keeps running; it turns normal again when
    it is back. Ctrl-C quits.

    No --json: top is a live picture for people. Scripts ask for the same facts as JSON
    with `rmq cluster --json` (nodes, roles, replication), `rmq topic status T --json`
    (queue offsets), `rmq group progress G --json` (lag) and `rmq status --json` (the
    processes of a local cluster).
    """
    namesrv = _namesrv(ctx)

    async def main() -> None:
        from cli.top.screen import run_top

        await run_top(namesrv, interval=interval, once=once, timeout=timeout, show_system=system)

    _run(main)  # ctrl-C: 130, as every command stopped by it
