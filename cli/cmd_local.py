"""A local cluster: `rmq up` (and, with issue 4, down/status/kill/restart).

`fast_up_arguments` lets `cli/main.py` run `up` without typer's parameter conversion, which
imports pydantic and costs `rmq up` ~0.1 s before the first node is spawned.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from cli.app import _examples, _run, app


@app.command(
    epilog=_examples(
        "rmq up                              # namesrv 9876, SYNC_MASTER 10911 + slave 10921",
        "rmq up --slaves 2                   # slaves on 10921 and 10931 (brokerId 1, 2)",
        "rmq up --slaves 0                   # one ASYNC_MASTER alone",
        "rmq up --role ASYNC_MASTER          # the master answers before the slave has it",
        "rmq up --data-dir /tmp/rmq --namesrv-port 19876 --broker-port 20911",
        "rmq up --masters 2 --slaves 1       # broker-a/b on 10911/10921, slaves 10931/10941",
    ),
)
def up(
    data_dir: Annotated[
        Path, typer.Option("--data-dir", help="Data and logs of every node.")
    ] = Path(".rmq"),
    namesrv_port: Annotated[int, typer.Option("--namesrv-port", help="Nameserver port.")] = 9876,
    broker_port: Annotated[
        int, typer.Option("--broker-port", help="First broker port; next nodes take +10, +20, ...")
    ] = 10911,
    masters: Annotated[
        int, typer.Option("--masters", min=1, help="Broker names (broker-a, -b, ...).")
    ] = 1,
    slaves: Annotated[
        int, typer.Option("--slaves", min=0, help="Slaves per master (brokerId 1..N).")
    ] = 1,
    role: Annotated[
        str,
        typer.Option(
            "--role",
            help="Masters' brokerRole: SYNC_MASTER or ASYNC_MASTER; auto = SYNC_MASTER when "
            "there are slaves, ASYNC_MASTER without (a SYNC_MASTER alone refuses every send).",
        ),
    ] = "auto",
    cluster: Annotated[str, typer.Option("--cluster", help="Cluster name.")] = "DefaultCluster",
    sync_master: Annotated[
        bool, typer.Option("--sync-master", hidden=True, help="Same as --role SYNC_MASTER.")
    ] = False,
    ready_timeout: Annotated[
        float, typer.Option("--ready-timeout", help="Seconds to wait for ready.")
    ] = 30.0,
) -> None:
    """Run a local cluster: a nameserver, a SYNC_MASTER broker and its slave(s), each its own
    process.

    Prints every node's role, brokerId and ports, then `ready` once all of them serve, every
    broker is registered and every slave replicates from its master; runs until Ctrl-C or
    SIGTERM, then stops every node.
    """
    from cli import render
    from cli.up import PlanError, busy_ports, plan_cluster

    try:
        plan = plan_cluster(
            namesrv_port=namesrv_port,
            broker_port=broker_port,
            masters=masters,
            slaves=slaves,
            cluster=cluster,
            master_role=master_role(role, slaves=slaves, sync_master=sync_master),
        )
    except PlanError as exc:
        render.error(str(exc))
        raise typer.Exit(1) from None
    busy = busy_ports(plan)
    if busy:
        node, port = busy[0]
        render.error(f"port {port} ({node.name}) is already in use; is another `rmq up` running?")
        raise typer.Exit(1)

    async def main() -> None:
        import signal

        import trio

        from cli.up import run_up

        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    lambda: run_up(
                        plan, data_dir, report=render.up_event, ready_timeout=ready_timeout
                    )
                )
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    break

    try:
        _run(main)
    except typer.Exit:
        raise
    render.up_stopped()


def master_role(role: str, *, slaves: int, sync_master: bool = False) -> str:
    """The masters' brokerRole for `rmq up --role ROLE [--sync-master]` with `slaves` slaves."""
    from cli.up import PlanError

    role = role.upper()
    if role == "AUTO":
        role = "SYNC_MASTER" if sync_master or slaves > 0 else "ASYNC_MASTER"
    if sync_master and role != "SYNC_MASTER":
        raise PlanError(f"--sync-master contradicts --role {role}")
    return role


def fast_up_arguments(argv: list[str]) -> dict[str, Any] | None:
    """The arguments of `up` for a plain `up [--option value | --flag] ...` command line,
    read off `up`'s own typer options; None for anything else (help, other commands, global
    options, unknown or odd options, values typer would refuse), which typer then parses.

    typer converts every parameter through pydantic, whose import costs `rmq up` ~0.1 s
    before it can spawn the first node; this path never gets there. It accepts only what it
    parses exactly as typer does, so errors and help are always typer's own.
    """
    if not argv or argv[0] != "up":
        return None
    import inspect
    import typing

    hints = typing.get_type_hints(up, include_extras=True)
    kwargs: dict[str, Any] = {}
    options: dict[str, tuple[str, Any, Any]] = {}
    for name, param in inspect.signature(up).parameters.items():
        base, info = typing.get_args(hints[name])[:2]
        if base not in (int, float, str, bool, Path):
            return None
        kwargs[name] = param.default
        for decl in (info.default, *info.param_decls):
            if isinstance(decl, str) and decl.startswith("--"):
                options[decl] = (name, base, info)
    args = argv[1:]
    i = 0
    while i < len(args):
        found = options.get(args[i])
        if found is None:
            return None
        name, base, info = found
        if base is bool:
            kwargs[name] = True
            i += 1
            continue
        if i + 1 == len(args) or args[i + 1].startswith("-"):
            return None
        try:
            value = base(args[i + 1])
        except ValueError:
            return None
        if info.min is not None and value < info.min or info.max is not None and value > info.max:
            return None
        kwargs[name] = value
        i += 2
    return kwargs
