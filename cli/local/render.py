"""What the local-cluster commands print (`rmq up`, `status`, `kill`, `restart`, `down`).

Lines that scripts read are plain, one per fact: each node's line
`<name> <host:port> pid <pid> <detail>  log <path>` (bench/cluster.py and the tests parse the
name, address and pid), `ready`, `stopped`. `rmq up` prints the same node lines whether it runs
in the foreground (from the supervisor's events) or with `--detach` (from the supervisor's
status), so a script reads both the same way. No markup, no wrapping.

With `--json` every command prints one JSON document on stdout instead (a foreground
`rmq up`, which runs until stopped, prints one JSON object per line and event); errors stay
one `error:` line on stderr.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cli.local.up import NodeSpec, UpEvent


def _line(text: str = "") -> None:
    print(text, flush=True)


def error(text: str) -> None:
    """One line (the first of `text`) on stderr; the rest, if any, indented below it."""
    first, _, rest = text.partition("\n")
    print(f"error: {first}", file=sys.stderr, flush=True)
    for line in rest.splitlines():
        print(f"  {line}", file=sys.stderr, flush=True)


def _detail(
    kind: str,
    role: str | None,
    broker_name: str | None,
    broker_id: int | None,
    cluster: str,
    port: int,
    dledger_self_id: str | None = None,
    dledger_port: int | None = None,
    metrics_port: int | None = None,
    grpc: str | None = None,
) -> str:
    if kind == "namesrv":
        return f"nameserver, metrics {metrics_port}" if metrics_port else "nameserver"
    if kind == "prometheus":  # `rmq up --metrics` (cli/local/prometheus.py)
        return f"prometheus, web UI and API on port {port}, scraping every node"
    metrics = f", metrics {metrics_port}" if metrics_port else ""
    if grpc:
        metrics += f", grpc {grpc}"
    if dledger_self_id is not None:
        # its brokerId (0 as leader, k+1 as follower n<k>) is decided at run time
        return (
            f"{role} {broker_name} member {dledger_self_id}, cluster {cluster}, "
            f"listen {port}, dledger {dledger_port}, vip {port - 2}{metrics}"
        )
    return (
        f"{role} {broker_name} id {broker_id}, cluster {cluster}, "
        f"listen {port}, ha {port + 1}, vip {port - 2}{metrics}"
    )


def node_line(name: str, addr: str, pid: int | None, detail: str, log: object) -> None:
    _line(f"{name:<14} {addr:<21} pid {pid if pid is not None else '-':<7} {detail}  log {log}")


def spec_detail(node: NodeSpec) -> str:
    return _detail(
        node.kind,
        node.role,
        node.broker_name,
        node.broker_id,
        node.cluster,
        node.port,
        node.dledger_self_id,
        node.dledger_port,
        node.metrics_port,
        node.grpc_addr,
    )


def up_event(event: UpEvent) -> None:
    """One supervisor event of a foreground `rmq up`."""
    node = event.node
    if event.kind == "spawned" and node is not None:
        node_line(node.name, node.addr, event.pid, spec_detail(node), event.log_path)
    elif event.kind == "ready":
        _line("ready")
    elif event.kind == "exited" and node is not None:
        how = "killed" if event.returncode == -9 and event.detail is None else "exited"
        _line(
            f"{node.name:<14} {how} (exit code {event.returncode}); the other nodes keep "
            f"running; `rmq restart {node.name}` starts it again; log {event.log_path}"
        )
        for line in (event.detail or "").splitlines():
            _line(f"{'':<14} | {line}")
    elif event.kind == "restarting" and node is not None:
        _line(f"{node.name:<14} restarting")
    elif event.kind == "restarted" and node is not None:
        _line(f"{node.name:<14} restarted (pid {event.pid}), serving on {node.addr}")
    elif event.kind == "stopping":
        _line("stopping")
    elif event.kind == "stopped" and node is not None:
        _line(f"{node.name:<14} stopped (exit code {event.returncode})")


def up_stopped(*, as_json: bool = False) -> None:
    _line(json.dumps({"event": "stopped", "node": None}) if as_json else "stopped")


def spec_json(node: NodeSpec) -> dict[str, Any]:
    """A planned node in the shape of `rmq status --json`'s nodes (without the run's state)."""
    return {
        "name": node.name,
        "kind": node.kind,
        "role": node.role or "NAMESRV",
        "broker_name": node.broker_name,
        "broker_id": node.broker_id if node.kind == "broker" and not node.is_dledger else None,
        "cluster": node.cluster,
        "addr": node.addr,
        "port": node.port,
        "ha_port": node.ha_port,
        "vip_port": node.vip_port,
        "dledger_self_id": node.dledger_self_id,
        "dledger_port": node.dledger_port,
        "metrics_port": node.metrics_port,
        "metrics": node.metrics_url,
        # RocketMQ 5's gRPC endpoint (broker/grpc), host:port
        "grpc": node.grpc_addr,
    }


def up_event_json(event: UpEvent) -> None:
    """One supervisor event of a foreground `rmq up --json`: one JSON object, one line."""
    doc: dict[str, Any] = {
        "event": event.kind,
        "node": None if event.node is None else spec_json(event.node),
    }
    if event.pid is not None:
        doc["pid"] = event.pid
    if event.kind in ("exited", "stopped"):
        doc["returncode"] = event.returncode
    if event.log_path is not None:
        doc["log"] = str(event.log_path)
    if event.detail is not None:
        doc["log_tail"] = event.detail
    _line(json.dumps(doc))


def tls_note(ca: object) -> None:
    """Where `rmq up --tls`'s CA is, and how each kind of client is told to trust it."""
    _line(f"tls            permissive on every port; CA {ca}")
    _line(f"{'':<14} rmq: RMQ_TLS=1 RMQ_TLS_CA={ca} rmq ...")
    _line(f"{'':<14} 5.x gRPC clients (grpcio): GRPC_DEFAULT_SSL_ROOTS_FILE_PATH={ca}")


def topology(status: dict[str, Any]) -> None:
    """The node lines of a detached cluster, as a foreground `rmq up` prints them."""
    for n in status["nodes"]:
        detail = _detail(
            n["kind"],
            n["role"],
            n["broker_name"],
            n["broker_id"],
            n["cluster"],
            n["port"],
            n.get("dledger_self_id"),
            n.get("dledger_port"),
            n.get("metrics_port"),
            n.get("grpc"),
        )
        node_line(n["name"], n["addr"], n["pid"], detail, n["log"])


def detached(status: dict[str, Any], *, as_json: bool = False) -> None:
    if as_json:
        _line(json.dumps(status, indent=2))
        return
    topology(status)
    _line("ready")
    _line(
        f"supervisor pid {status['supervisor_pid']}; `rmq status --data-dir "
        f"{status['data_dir']}` shows it, `rmq down --data-dir {status['data_dir']}` "
        "stops it"
    )


def state_text(status: dict[str, Any]) -> str:
    """`ready`, or `degraded: broker-a exited (-9), ...` (the supervisor's `problems`)."""
    problems = status.get("problems") or []
    return f"{status['state']}: {', '.join(problems)}" if problems else status["state"]


def status(status: dict[str, Any], *, as_json: bool = False) -> None:
    """`rmq status`: one row per node."""
    if as_json:
        _line(json.dumps(status, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"{status['cluster']} in {status['data_dir']}: {state_text(status)} "
        f"(supervisor pid {status['supervisor_pid']})"
    )
    for col in ("node", "role", "brokerId", "address", "ha", "vip", "pid", "status"):
        table.add_column(col)
    colours = {"alive": "green", "exited": "red", "restarting": "yellow", "starting": "yellow"}
    for n in status["nodes"]:
        state = n["status"]
        if state == "exited":
            state = f"exited ({n['returncode']})"
        if n["restarts"]:
            state += f", restarted {n['restarts']}x"
        colour = colours.get(n["status"], "")
        table.add_row(
            n["name"],
            n["role"],
            "-" if n["broker_id"] is None else str(n["broker_id"]),
            n["addr"],
            str(n["ha_port"] or "-"),
            str(n["vip_port"] or "-"),
            str(n["pid"] or "-"),
            f"[{colour}]{state}[/]" if colour else state,
        )
    console = Console(file=sys.stdout, highlight=False, soft_wrap=True)
    if console.width < 110:
        console.width = 110  # a pipe reports 80 columns: do not fold the rows
    console.print(table)
    if status.get("tls_ca"):
        _line(f"tls: permissive on every port; CA {status['tls_ca']}")
    for n in status["nodes"]:
        if n["status"] == "exited":
            _line(f"{n['name']} exited; last log lines ({n['log']}):")
            for line in (n.get("log_tail") or "").splitlines():
                _line(f"  | {line}")


def killed(node: dict[str, Any], *, as_json: bool = False) -> None:
    if as_json:
        _line(json.dumps(node, indent=2))
        return
    _line(
        f"{node['name']} killed (pid {node['pid']}, exit code {node['returncode']}); "
        f"`rmq restart {node['name']}` starts it again"
    )


def restarted(node: dict[str, Any], *, as_json: bool = False) -> None:
    if as_json:
        _line(json.dumps(node, indent=2))
        return
    _line(f"{node['name']} restarted (pid {node['pid']}), serving on {node['addr']}")


def down_begun(status: dict[str, Any]) -> None:
    _line(
        f"stopping {status['cluster']} in {status['data_dir']} "
        f"(supervisor pid {status['supervisor_pid']})"
    )


def down_done(status: dict[str, Any], *, as_json: bool = False) -> None:
    """Every process of the cluster `status` (the supervisor's last snapshot) is gone."""
    names = [n["name"] for n in status["nodes"]]
    if as_json:
        _line(
            json.dumps(
                {
                    "cluster": status["cluster"],
                    "data_dir": status["data_dir"],
                    "supervisor_pid": status["supervisor_pid"],
                    "stopped": names,
                },
                indent=2,
            )
        )
        return
    _line(f"stopped {', '.join(names)}" if names else "stopped")
