"""The `rmq` command: run a local cluster, servers, and talk to them.

Commands are thin: parse options, `trio.run(...)` one coroutine, hand the result to
`cli/render.py`. Imports of trio, the servers and the client happen inside the commands.
`rmq namesrv` / `rmq broker` share their flag handling, serving and error policy with
`cli/node.py`, whose argparse entry point (`python -m cli.node`) is what `rmq up` spawns:
typer's parameter conversion imports pydantic, too slow for a node's start-up.

Errors a user can cause (connection refused, unknown topic, bad config, port in use) print ONE
line on stderr and exit with status 1; no traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.node import (
    BROKER_FLAG_PROPERTIES,  # noqa: F401 - part of this module's API (tests, docs)
    BROKER_ROLES,
    DEFAULT_NAMESRV,
    FLUSH_TYPES,
    Exit,
    broker_properties,
    properties_text,  # noqa: F401 - part of this module's API (tests, docs)
    run_main,
    serve_broker,
    serve_namesrv,
)


def _examples(*lines: str) -> str:
    # "\b" stops click from re-wrapping the block, so each example stays on its own line
    return "Examples:\n\n\b\n" + "\n".join(f"  {line}" for line in lines)


app = typer.Typer(
    name="rmq",
    help="trio-rmq: a RocketMQ 4.x compatible nameserver, broker and client.",
    epilog=_examples(
        "rmq up                                  # local cluster on 9876 / 10911",
        "rmq topic create TopicTest --queues 4",
        "echo hello | rmq produce --topic TopicTest",
        "rmq consume --topic TopicTest --from-beginning --count 1",
    ),
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
topic_app = typer.Typer(
    help="Create, list and inspect topics.",
    no_args_is_help=True,
    rich_markup_mode=None,
    epilog=_examples("rmq topic create T --queues 8", "rmq topic list", "rmq topic route T"),
)
app.add_typer(topic_app, name="topic")


def _namesrv(ctx: typer.Context) -> str:
    obj = ctx.find_root().obj or {}
    return obj.get("namesrv", DEFAULT_NAMESRV)


def _run(async_fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> Any:
    """trio.run with the CLI's error policy: known errors -> one stderr line, exit 1."""
    try:
        return run_main(async_fn, *args)
    except Exit as exc:
        raise typer.Exit(exc.code) from None


@app.callback()
def _global(
    ctx: typer.Context,
    namesrv: Annotated[
        str,
        typer.Option(
            "--namesrv",
            "-n",
            envvar="RMQ_NAMESRV",
            help="Nameserver address(es), 'host:port[;host:port]'.",
        ),
    ] = DEFAULT_NAMESRV,
) -> None:
    ctx.obj = {"namesrv": namesrv}


# --- servers ---------------------------------------------------------------------------------


@app.command(
    epilog=_examples("rmq namesrv", "rmq namesrv --port 9877 --data-dir /tmp/ns"),
)
def namesrv(
    port: Annotated[int, typer.Option("--port", "-p", help="Listen port.")] = 9876,
    host: Annotated[str, typer.Option("--host", help="Listen address.")] = "127.0.0.1",
    data_dir: Annotated[
        Path | None,
        typer.Option("--data-dir", help="Directory for kvConfig.json (default ~/namesrv)."),
    ] = None,
    watch_stdin: Annotated[bool, typer.Option("--watch-stdin", hidden=True)] = False,
) -> None:
    """Run a nameserver until Ctrl-C or SIGTERM."""
    serve_namesrv(port=port, host=host, data_dir=data_dir, watch_stdin=watch_stdin)


@app.command(
    epilog=_examples(
        "rmq broker",
        "rmq broker -c conf/broker.conf",
        "rmq broker --name broker-b --port 10921 --namesrv 127.0.0.1:9876 --data-dir /tmp/b",
        "rmq broker --name broker-a --id 1 --role SLAVE --port 10931",
    ),
)
def broker(
    ctx: typer.Context,
    config_file: Annotated[
        Path | None,
        typer.Option("--config", "-c", exists=True, dir_okay=False, help="RocketMQ broker.conf."),
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="brokerName (default broker-a).")
    ] = None,
    cluster: Annotated[str | None, typer.Option("--cluster", help="brokerClusterName.")] = None,
    broker_id: Annotated[
        int | None, typer.Option("--id", help="brokerId: 0 master, >0 slave.")
    ] = None,
    host: Annotated[
        str | None, typer.Option("--host", help="brokerIP1 (default 127.0.0.1).")
    ] = None,
    port: Annotated[
        int | None, typer.Option("--port", "-p", help="listenPort (default 10911).")
    ] = None,
    namesrv: Annotated[
        str | None, typer.Option("--namesrv", help="namesrvAddr (default: the global --namesrv).")
    ] = None,
    data_dir: Annotated[Path | None, typer.Option("--data-dir", help="storePathRootDir.")] = None,
    flush: Annotated[str | None, typer.Option("--flush", help="SYNC_FLUSH or ASYNC_FLUSH.")] = None,
    role: Annotated[
        str | None, typer.Option("--role", help="ASYNC_MASTER, SYNC_MASTER or SLAVE.")
    ] = None,
    watch_stdin: Annotated[bool, typer.Option("--watch-stdin", hidden=True)] = False,
) -> None:
    """Run a broker until Ctrl-C or SIGTERM. Flags override the config file."""

    if flush is not None and flush.upper() not in FLUSH_TYPES:
        raise typer.BadParameter("must be SYNC_FLUSH or ASYNC_FLUSH", param_hint="--flush")
    if role is not None and role.upper() not in BROKER_ROLES:
        raise typer.BadParameter("must be ASYNC_MASTER, SYNC_MASTER or SLAVE", param_hint="--role")
    conf_text = config_file.read_text() if config_file else None
    overrides = {
        "name": name,
        "cluster": cluster,
        "broker_id": broker_id,
        "host": host,
        "port": port,
        "namesrv": namesrv,
        "data_dir": data_dir,
        "flush": flush.upper() if flush else None,
        "role": role.upper() if role else None,
    }
    props = broker_properties(conf_text, overrides)
    props.setdefault("namesrvAddr", _namesrv(ctx))
    serve_broker(props, data_dir=data_dir, watch_stdin=watch_stdin)


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


# --- topics ----------------------------------------------------------------------------------


@topic_app.command(
    "create",
    epilog=_examples(
        "rmq topic create TopicTest",
        "rmq topic create Orders --queues 4 --cluster DefaultCluster",
        "rmq topic create Orders --broker 127.0.0.1:10911",
    ),
)
def topic_create(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    queues: Annotated[
        int, typer.Option("--queues", "-q", min=1, help="Read and write queue count.")
    ] = 8,
    cluster: Annotated[
        str | None, typer.Option("--cluster", help="Create on every master of it.")
    ] = None,
    broker_addr: Annotated[
        str | None, typer.Option("--broker", help="Create on this broker only.")
    ] = None,
    perm: Annotated[
        int, typer.Option("--perm", help="Permission: 6 read+write, 4 read, 2 write.")
    ] = 6,
) -> None:
    """Create (or update) a topic on the masters of a cluster or on one broker."""
    from cli import render

    async def main() -> list[str]:
        from rmq import Admin

        async with Admin(_namesrv(ctx)) as admin:
            return await admin.create_topic(
                topic, queues=queues, cluster=cluster, broker_addr=broker_addr, perm=perm
            )

    render.topic_created(topic, _run(main))


@topic_app.command("list", epilog=_examples("rmq topic list", "rmq -n 10.0.0.1:9876 topic list"))
def topic_list(ctx: typer.Context) -> None:
    """List every topic the nameserver knows."""
    from cli import render

    async def main() -> list[str]:
        from rmq import Admin

        async with Admin(_namesrv(ctx)) as admin:
            return await admin.topic_list()

    render.topic_list(_run(main))


@topic_app.command("route", epilog=_examples("rmq topic route TopicTest"))
def topic_route(ctx: typer.Context, topic: str = typer.Argument(..., help="Topic name.")) -> None:
    """Show the brokers and queues of a topic."""
    from cli import render

    async def main():
        from rmq import Admin

        async with Admin(_namesrv(ctx)) as admin:
            return await admin.topic_route(topic)

    render.topic_route(topic, _run(main))


@app.command(
    "cluster",
    epilog=_examples(
        "rmq cluster",
        "rmq cluster --json",
        "rmq cluster --broker 127.0.0.1:10911   # one broker, no nameserver needed",
    ),
)
def cluster_list(
    ctx: typer.Context,
    broker_addr: Annotated[
        str | None, typer.Option("--broker", help="Ask only this broker (host:port).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
) -> None:
    """List brokers with their role and replication state.

    Per master: push2SlaveMaxOffset and, per connected slave, its HA address, acknowledged
    offset and lag in bytes and milliseconds. Per slave: its master's HA address, whether it
    is connected and the offset it last reported.
    """
    from cli import render

    async def main():
        from cli.status import broker_status, cluster_status

        if broker_addr is not None:
            return await broker_status(broker_addr)
        return await cluster_status(_namesrv(ctx))

    render.cluster_status(_run(main), as_json=as_json)


# --- messages --------------------------------------------------------------------------------


@app.command(
    epilog=_examples(
        "rmq produce --topic TopicTest hello world       # two messages",
        "printf 'a\\nb\\n' | rmq produce --topic TopicTest  # one message per line",
        "rmq produce --topic TopicTest --tags TagA --keys order-1 'payload'",
    ),
)
def produce(
    ctx: typer.Context,
    topic: Annotated[str, typer.Option("--topic", "-t", help="Topic.")],
    tags: Annotated[str | None, typer.Option("--tags", help="Message tag.")] = None,
    keys: Annotated[
        str | None, typer.Option("--keys", help="Message keys (space separated).")
    ] = None,
    group: Annotated[
        str, typer.Option("--group", "-g", help="Producer group.")
    ] = "rmq-cli-producer",
    delay_level: Annotated[
        int, typer.Option("--delay-level", min=0, max=18, help="1..18, 0 = none.")
    ] = 0,
    prop: Annotated[
        list[str] | None,
        typer.Option("--property", "-P", metavar="K=V", help="User property K=V (repeatable)."),
    ] = None,
    bodies: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="BODY...", help="Message bodies; without any, one message per stdin line."
        ),
    ] = None,
) -> None:
    """Send messages (arguments, or stdin lines) and print each SendResult."""
    from cli import render

    properties: dict[str, str] = {}
    for item in prop or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"expected K=V, got {item!r}", param_hint="--property")
        properties[key] = value
    if bodies:
        payloads = list(bodies)
    else:
        payloads = [line.rstrip("\r\n") for line in sys.stdin]
        payloads = [p for p in payloads if p]
    if not payloads:
        render.error("nothing to send: give BODY arguments or lines on stdin")
        raise typer.Exit(1)

    async def main() -> None:
        from rmq import Message, Producer

        async with Producer(group, _namesrv(ctx)) as producer:
            for body in payloads:
                msg = Message(
                    topic,
                    body,
                    tags=tags,
                    keys=keys,
                    properties=properties,
                    delay_level=delay_level,
                )
                render.send_result(await producer.send(msg))

    _run(main)


@app.command(
    epilog=_examples(
        "rmq consume --topic TopicTest                      # new messages, until Ctrl-C",
        "rmq consume --topic TopicTest --from-beginning --count 10",
        "rmq consume --topic TopicTest --group cg1 --tags 'TagA||TagB' -v",
    ),
)
def consume(
    ctx: typer.Context,
    topic: Annotated[str, typer.Option("--topic", "-t", help="Topic.")],
    group: Annotated[
        str, typer.Option("--group", "-g", help="Consumer group.")
    ] = "rmq-cli-consumer",
    from_beginning: Annotated[
        bool,
        typer.Option(
            "--from-beginning", help="Start at the oldest message, not the group's offset."
        ),
    ] = False,
    count: Annotated[
        int | None, typer.Option("--count", "-c", min=1, help="Stop after N messages.")
    ] = None,
    tags: Annotated[str, typer.Option("--tags", help="Tag expression: '*' or 'A||B'.")] = "*",
    idle_timeout: Annotated[
        float | None,
        typer.Option("--idle-timeout", help="Stop after this many seconds without a message."),
    ] = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show queue, offset, ids, tags.")
    ] = False,
) -> None:
    """Pull messages from every queue of a topic and print them (one line each)."""
    from cli import render

    async def main() -> None:
        from cli.consume import consume_topic

        await consume_topic(
            _namesrv(ctx),
            topic,
            group=group,
            from_beginning=from_beginning,
            count=count,
            tags=tags,
            idle_timeout=idle_timeout,
            on_message=lambda m: render.message(m, verbose=verbose),
        )

    _run(main)


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


def main() -> None:
    """Console-script entry point (`rmq`)."""
    fast = fast_up_arguments(sys.argv[1:])
    if fast is not None:
        try:
            up(**fast)
        except typer.Exit as exc:
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:  # before trio.run took over the signal: what click says
            print("Aborted!", file=sys.stderr)
            sys.exit(1)
        return
    # Tests and `rmq up` children run with the repo as cwd; nothing to set up here beyond typer.
    app(prog_name=os.path.basename(sys.argv[0]) if sys.argv[0].endswith("rmq") else "rmq")


if __name__ == "__main__":
    main()
