"""A local cluster: `rmq up`, `status`, `kill`, `restart`, `down`.

`up` resolves its topology (`topology.py`: flags over a TOML file over defaults) into a plan,
refuses what cannot start (bad file, --slaves with --dledger, a cluster already running in the
data dir, busy ports) with one line, then runs the supervisor (`up.py` + `supervisor.py`) in the
foreground, or with `--detach` as a background process in its own session, returning once the
cluster is ready. The other commands talk to that supervisor through the data dir's control
socket (`state.py`) and never start Trio.

`fast_up_arguments` (`up_arguments.py`) lets `cli/main.py` run `up` without typer's parameter
conversion, which imports pydantic and costs `rmq up` ~0.1 s before the first node is spawned.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from cli.app import _run, examples

_DATA_DIR_HELP = "Data dir of the cluster (as given to `rmq up`)."
_CONFIG_HELP = "Topology file of the cluster; its data_dir is used when --data-dir is not given."


@examples(
    "rmq up                              # namesrv 9876, SYNC_MASTER 10911 + slave 10921",
    "rmq up --slaves 2                   # slaves on 10921 and 10931 (brokerId 1, 2)",
    "rmq up --slaves 0                   # one ASYNC_MASTER alone",
    "rmq up --role ASYNC_MASTER          # the master answers before the slave has it",
    "rmq up --data-dir /tmp/rmq --namesrv-port 19876 --broker-port 20911",
    "rmq up --masters 2 --slaves 1       # broker-a/b on 10911/10921, slaves 10931/10941",
    "rmq up --dledger 3                  # Raft group broker-a-n0..n2 on 10911/10921/10931",
    "rmq up --masters 2 --dledger 3      # two groups: broker-a-n0..n2, broker-b-n0..n2",
    "rmq up --config cluster.toml        # topology from a file (flags override it)",
    "rmq up --detach && rmq status       # in the background; `rmq down` stops it",
    "rmq up --detach --json              # the nodes as one JSON document (as status --json)",
    "rmq up --json                       # foreground: one JSON object per event and line",
    "rmq up --metrics                    # and a Prometheus scraping every node (port printed)",
    "rmq up --tls                        # TLS (permissive) on every port, with a local CA",
)
def up(
    # typer passes it, and knows it only by a bare typer.Context annotation (Optional would
    # make it a CLI option); cli.main's fast path calls up() directly, without one
    ctx: typer.Context = None,  # type: ignore[assignment]
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="Topology TOML file (cluster, masters, slaves, dledger, role, ports, data_dir, "
            "[broker_conf], [nodes.<name>] port/broker_conf); flags override it.",
        ),
    ] = None,
    data_dir: Annotated[
        Path, typer.Option("--data-dir", help="Data and logs of every node.")
    ] = Path(".rmq"),
    namesrv_port: Annotated[int, typer.Option("--namesrv-port", help="Nameserver port.")] = 9876,
    broker_port: Annotated[
        int, typer.Option("--broker-port", help="First broker port; next nodes take +10, +20, ...")
    ] = 10911,
    masters: Annotated[
        int,
        typer.Option(
            "--masters", min=1, help="Broker names (broker-a, -b, ...); with --dledger: groups."
        ),
    ] = 1,
    slaves: Annotated[
        int | None,
        typer.Option(
            "--slaves",
            min=0,
            help="Slaves per master (brokerId 1..N) [default: 1; not with --dledger].",
        ),
    ] = None,
    role: Annotated[
        str,
        typer.Option(
            "--role",
            help="Masters' brokerRole: SYNC_MASTER or ASYNC_MASTER; auto = SYNC_MASTER when "
            "there are slaves, ASYNC_MASTER without (a SYNC_MASTER alone refuses every send).",
        ),
    ] = "auto",
    cluster: Annotated[str, typer.Option("--cluster", help="Cluster name.")] = "DefaultCluster",
    dledger: Annotated[
        int,
        typer.Option(
            "--dledger",
            help="DLedger group size (3 or 5; 0 = master/slave): each master becomes a Raft "
            "group broker-a-n0..n{N-1} whose leader is the master. Each member takes a block "
            "of 10 ports (listen P, VIP P-2, DLedger P+2, metrics P+3). Laptop timing unless "
            "broker_conf overrides it: heartBeatTimeIntervalMs=500, maxHeartBeatLeak=3, "
            "minVoteIntervalMs=150, maxVoteIntervalMs=400 (RocketMQ: 2000, 3, 300, 1000).",
        ),
    ] = 0,
    detach: Annotated[
        bool,
        typer.Option("--detach", "-d", help="Run in the background; return once ready."),
    ] = False,
    sync_master: Annotated[
        bool, typer.Option("--sync-master", hidden=True, help="Same as --role SYNC_MASTER.")
    ] = False,
    ready_timeout: Annotated[
        float, typer.Option("--ready-timeout", help="Seconds to wait for ready.")
    ] = 30.0,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="With --detach: the ready cluster as one JSON document (as `rmq status "
            "--json`). In the foreground: one JSON object per line for each event (spawned, "
            "ready, exited, restarted, stopped...).",
        ),
    ] = False,
    metrics: Annotated[
        bool,
        typer.Option(
            "--metrics",
            help="Also run a Prometheus server (the `prometheus` binary on PATH) scraping every "
            "node every 2 s, with trio-rmq's alert rules loaded; its port is printed with the "
            "nodes' (examples/grafana/README.md).",
        ),
    ] = False,
    prometheus: Annotated[
        Path | None,
        typer.Option("--prometheus", help="The Prometheus binary for --metrics (implies it)."),
    ] = None,
    prometheus_port: Annotated[
        int,
        typer.Option(
            "--prometheus-port", help="Prometheus's web port with --metrics; 0: a free one."
        ),
    ] = 0,
    tls: Annotated[
        bool,
        typer.Option(
            "--tls",
            help="TLS on every node's ports in permissive mode (plain clients keep working): "
            "makes a local CA and a server certificate in <data-dir>/tls once, prints the CA "
            "to trust; `RMQ_TLS=1 rmq ...` then connects with TLS.",
        ),
    ] = False,
) -> None:
    """Run a local cluster: a nameserver, a SYNC_MASTER broker and its slave(s), each its own
    process; or with --dledger N, DLedger groups of N brokers sharing a Raft log.

    Prints every node's role, brokerId and ports, then `ready` once all of them serve, every
    broker is registered and every slave replicates from its master (with --dledger: every
    group has elected a leader, which serves as master); runs until Ctrl-C,
    SIGTERM or `rmq down`, then stops every node. A node that dies is shown with its exit
    code and last log lines; `rmq restart <node>` starts it again. Logs: <data-dir>/logs/.
    Brokers run with enablePropertyFilter=true (SQL92 subscriptions; RocketMQ's default is
    off, and [broker_conf] in the --config file can turn it off).
    """
    from cli.errors import Exit
    from cli.local import render
    from cli.local.state import running_supervisor
    from cli.local.up import PlanError, busy_ports
    from cli.servers.node import make_data_dir

    given: dict[str, Any] = {
        "data_dir": data_dir,
        "namesrv_port": namesrv_port,
        "broker_port": broker_port,
        "masters": masters,
        "slaves": slaves,
        "role": role,
        "cluster": cluster,
        "dledger": dledger,
        "ready_timeout": ready_timeout,
    }
    if config is not None:
        # only the flags typed on the command line override the file
        given = {k: (v if _typed(ctx, k) else None) for k, v in given.items()}
    try:
        from cli.local.topology import resolve

        topo = resolve(config, **given)
        plan = topo.plan(sync_master=sync_master)
        if metrics or prometheus is not None:
            from cli.local.prometheus import find_prometheus, with_prometheus

            binary = find_prometheus(prometheus)
            plan = with_prometheus(plan, binary, port=prometheus_port)
    except PlanError as exc:
        render.error(str(exc))
        raise typer.Exit(1) from None
    data_dir = topo.data_dir
    try:
        make_data_dir(data_dir)  # here, before anything runs, for both ways of running
    except Exit as exc:  # the error line is printed already
        raise typer.Exit(exc.code) from None
    other = running_supervisor(data_dir)
    if other is not None:
        render.error(
            f"a cluster is already running in {data_dir} (supervisor pid "
            f"{other['supervisor_pid']}); see `rmq status --data-dir {data_dir}`, stop it "
            f"with `rmq down --data-dir {data_dir}`"
        )
        raise typer.Exit(1)
    if tls:
        import attrs

        from cli.local.certificates import ensure_local_tls

        local_tls = ensure_local_tls(data_dir, plan.namesrv.host)
        plan = attrs.evolve(plan, tls_config=local_tls.properties)
        if not as_json:
            render.tls_note(local_tls.ca_cert)
    busy = busy_ports(plan)
    if busy:
        node, port = busy[0]
        render.error(f"port {port} ({node.name}) is already in use; is another `rmq up` running?")
        raise typer.Exit(1)
    if detach:
        argv = ["--data-dir", str(data_dir.absolute())]
        if config is not None:
            argv += ["--config", str(config.absolute())]
        for name, value in given.items():
            if value is not None and name != "data_dir":
                argv += [f"--{name.replace('_', '-')}", str(value)]
        if sync_master:
            argv.append("--sync-master")
        if tls:
            argv.append("--tls")
        if plan.prometheus is not None:
            # the port chosen here, so that the one checked free above is the one used
            argv += ["--prometheus", str(plan.prometheus.executable)]
            argv += ["--prometheus-port", str(plan.prometheus.port)]
        _detach(argv, data_dir, topo.ready_timeout, as_json=as_json)
        return
    report = render.up_event_json if as_json else render.up_event

    async def main() -> None:
        import trio

        from cli.local.supervisor import run_up

        extra: dict[str, Any] = {}
        if plan.prometheus is not None:
            from cli.local import prometheus as local_prometheus

            extra = {
                "probe": local_prometheus.probe,
                "command_for": local_prometheus.command_for,
            }
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:

                async def supervise() -> None:
                    await run_up(
                        plan, data_dir, report=report, ready_timeout=topo.ready_timeout, **extra
                    )
                    nursery.cancel_scope.cancel()  # `rmq down`: done

                nursery.start_soon(supervise)
                async for signum in signals:
                    stopped_by.append(signum)
                    nursery.cancel_scope.cancel()
                    break

    import signal

    from cli.errors import INTERRUPTED

    stopped_by: list[int] = []
    _run(main)
    render.up_stopped(as_json=as_json)
    if stopped_by == [signal.SIGINT]:  # every node stopped cleanly; Ctrl-C's status all the same
        raise typer.Exit(INTERRUPTED)


def _typed(ctx: typer.Context | None, param: str) -> bool:
    """Whether option `param` came from the command line (or its environment) rather than
    its default. Without a typer context (a direct call) every value counts as typed."""
    if ctx is None:
        return True
    source = ctx.get_parameter_source(param)
    return source is not None and source.name != "DEFAULT"


def _detach(argv: list[str], data_dir: Path, ready_timeout: float, *, as_json: bool) -> None:
    """Start `rmq up <argv>` as a background process (own session, output to
    <data-dir>/logs/supervisor.log) and return once it reports ready."""
    import os
    import subprocess
    import sys
    import time

    from cli.local import render
    from cli.local.state import Refused, request
    from cli.local.up import run_separator

    log_dir = data_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / "supervisor.log"
    with open(log_path, "ab") as log:
        start = log.seek(0, 2)  # this run's lines start here (the log is appended to)
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "up", *argv],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # no terminal signal (Ctrl-C, hang-up) reaches it
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        log.write(run_separator("supervisor", proc.pid).encode())
    deadline = time.monotonic() + ready_timeout + 15  # its own deadline fires first
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            render.error(
                _first_error(log_path, start) or f"`rmq up` exited with code {code}; see {log_path}"
            )
            raise typer.Exit(1)
        try:
            status = request(data_dir, "status", timeout=2.0)
        except Refused:
            raise
        except Exception:  # not listening yet
            status = None
        if status is not None and status.get("state") == "ready":
            proc.returncode = 0  # detached on purpose: nobody waits for it here
            render.detached(status, as_json=as_json)
            return
        time.sleep(0.05)
    proc.terminate()
    proc.wait(timeout=30)
    render.error(f"cluster not ready after {ready_timeout:g} s; see {log_path}")
    raise typer.Exit(1)


def _first_error(log_path: Path, start: int) -> str | None:
    try:
        with open(log_path, "rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("error: "):
            return line[len("error: ") :]
    return None


def _cluster_dir(data_dir: Path | None, config: Path | None) -> Path:
    if data_dir is not None or config is None:
        return data_dir or Path(".rmq")
    from cli.local.topology import load_topology_file

    return load_topology_file(config).get("data_dir", Path(".rmq"))


def _control(
    data_dir: Path | None, config: Path | None, op: str, *, timeout: float = 10.0, **args: Any
) -> dict[str, Any]:
    # `timeout` bounds the wait for the answer; `args` travel in the request
    """One control request; known failures -> one stderr line, exit 1."""
    from cli.errors import CliError
    from cli.local import render
    from cli.local.state import request

    try:
        return request(_cluster_dir(data_dir, config), op, args, timeout=timeout)
    except CliError as exc:
        render.error(str(exc))
        raise typer.Exit(1) from None


DataDirOption = Annotated[Path | None, typer.Option("--data-dir", help=_DATA_DIR_HELP)]
ConfigOption = Annotated[Path | None, typer.Option("--config", help=_CONFIG_HELP)]


@examples(
    "rmq status                          # the cluster of ./.rmq",
    "rmq status --data-dir /tmp/rmq --json",
)
def status(
    data_dir: DataDirOption = None,
    config: ConfigOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Every node of a local cluster: role, brokerId, ports, pid, alive/exited/restarting."""
    from cli.local import render

    render.status(_control(data_dir, config, "status"), as_json=as_json)


@examples(
    "rmq kill broker-a                   # SIGKILL the master; its slave keeps serving",
    "rmq kill broker-a-s1 --data-dir /tmp/rmq",
    "rmq kill broker-a-n0                # a DLedger member (rmq up --dledger 3)",
    "rmq kill broker-a --json            # the node as `rmq status --json` shows it",
)
def kill(
    node: Annotated[
        str, typer.Argument(help="Node name: namesrv, broker-a, broker-a-s1, broker-a-n0, ...")
    ],
    data_dir: DataDirOption = None,
    config: ConfigOption = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the killed node as one JSON document.")
    ] = False,
) -> None:
    """SIGKILL one node of a local cluster (the supervisor shows it as exited)."""
    from cli.local import render

    reply = _control(data_dir, config, "kill", node=node)
    render.killed(reply["node"], as_json=as_json)


@examples(
    "rmq restart broker-a                # same ports, same store, log appended",
    "rmq restart namesrv --timeout 60",
    "rmq restart broker-a-n0             # rejoins its DLedger group as a follower",
    "rmq restart broker-a --json         # the node, serving again, as one JSON document",
)
def restart(
    node: Annotated[
        str, typer.Argument(help="Node name: namesrv, broker-a, broker-a-s1, broker-a-n0, ...")
    ],
    data_dir: DataDirOption = None,
    config: ConfigOption = None,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds to wait until it serves.")
    ] = 30.0,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the restarted node as one JSON document.")
    ] = False,
) -> None:
    """Start one node of a local cluster again (stopping it first if it runs)."""
    from cli.local import render

    reply = _control(data_dir, config, "restart", timeout=timeout + 15, node=node, wait=timeout)
    render.restarted(reply["node"], as_json=as_json)


@examples(
    "rmq down                            # the cluster of ./.rmq",
    "rmq down --data-dir /tmp/rmq",
    "rmq down --json                     # what was stopped, as one JSON document",
)
def down(
    data_dir: DataDirOption = None,
    config: ConfigOption = None,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds to wait until every node is gone.")
    ] = 60.0,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print what was stopped as one JSON document.")
    ] = False,
) -> None:
    """Stop a local cluster (`rmq up`, foreground or --detach): every node, then its
    supervisor; returns once every process is gone."""
    import os
    import signal
    import time

    from cli.errors import CliError
    from cli.local import render
    from cli.local.state import (
        NoCluster,
        Unreachable,
        pid_running,
        read_state,
        remove_state,
        request,
    )

    try:
        where = _cluster_dir(data_dir, config)
    except CliError as exc:  # a topology file that cannot be read
        render.error(str(exc))
        raise typer.Exit(1) from None
    state = read_state(where)
    if state is None:
        render.error(f"no cluster is running in {where} (nothing to stop)")
        raise typer.Exit(1)
    sup_pid = state["supervisor_pid"]
    try:
        status = request(where, "down")
    except NoCluster:
        remove_state(where, pid=sup_pid)
        render.error(
            f"no cluster is running in {where} (its supervisor, pid {sup_pid}, is gone; "
            "removed its stale state file)"
        )
        raise typer.Exit(1) from None
    except Unreachable:
        os.kill(sup_pid, signal.SIGTERM)  # it stops its nodes on SIGTERM as on Ctrl-C
        status = state
    if not as_json:
        render.down_begun(status)
    node_pids = [n["pid"] for n in status["nodes"] if n.get("pid")]
    deadline = time.monotonic() + timeout
    left = node_pids
    while time.monotonic() < deadline:
        left = [p for p in node_pids if pid_running(p)]
        if not left and not pid_running(sup_pid, state.get("start_time")):
            render.down_done(status, as_json=as_json)
            return
        time.sleep(0.05)
    render.error(f"still running after {timeout:g} s: pids {left + [sup_pid]}")
    raise typer.Exit(1)
