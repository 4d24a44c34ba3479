"""`rmq up`: a local cluster, one OS process per node, supervised from a Trio nursery.

Theory of operation:

* The port plan (`plan_cluster`) is pure. The nameserver gets one port (9876). Every broker gets
  a block of 10 ports starting at the first broker port (10911): the listen port P, the VIP
  port P-2 and the HA port P+1 (RocketMQ forces both), and the metrics port P+3 (the
  nameserver's: its port + 1; docs/metrics.md), and the gRPC port P+4 (RocketMQ 5's clients,
  broker/grpc). Masters take the first blocks (10911,
  10921, ...) and slaves the blocks after them, so adding slaves never moves a master.
* `run_up` (in `cli/local/supervisor.py`, which runs the processes) spawns every node at once:
  the interpreters start in parallel, and a broker that comes up before the nameserver
  listens retries its registration within a fraction of a second (`broker/registrar.py`).
  Each child is `python -m cli.servers.node namesrv|broker ... --watch-stdin` (argparse, no
  typer/pydantic: see `cli/servers/node.py`), with stdout+stderr going to
  `<data-dir>/logs/<node>.log`. Each child watches its stdin, a pipe only the supervisor
  holds: if the supervisor dies, even by SIGKILL, the pipe closes and every child stops by
  itself, so no orphan outlives `rmq up`. Children run in their own session,
  so a terminal Ctrl-C reaches only the supervisor, which then stops them in order.
* The default cluster is one SYNC_MASTER (`broker-a`, brokerId 0) with one slave (brokerId 1);
  `slaves=N` gives N slaves (brokerId 1..N, each its own port block and store directory
  `<data-dir>/<broker>-s<i>`), `master_role` ASYNC_MASTER makes the master answer sends
  without waiting for a slave. Slaves find their master through the nameserver (the address
  comes back in each registration answer), as they would in a real deployment.
* `rmq up --dledger N` plans DLedger groups instead of masters and slaves
  (`cli/local/dledger_plan.py`): members `broker-a-n0..` whose brokerId and role Raft decides, so
  their command lines carry neither; each also serves the Raft RPCs on its listen port + 2.
* Readiness is probed over the wire, not guessed from logs: the nameserver must answer
  GET_BROKER_CLUSTER_INFO with every planned broker registered at its planned address, every
  broker must answer GET_BROKER_RUNTIME_INFO on its listen port, and every master must count
  at least as many HA connections (`haConnectionCount`) as it has planned slaves, so a
  SYNC_MASTER can acknowledge sends the moment `ready` is printed. DLedger members must be
  elected (LEADER or FOLLOWER) and registered, and each group's leader its master. Only then
  `ready` fires.
* The processes themselves are run by `cli/local/supervisor.py` (a child that exits before ready
  fails the start; after ready it is shown and can be restarted; ordered, bounded shutdown),
  and `cli/local/state.py` serves `rmq status/kill/restart/down` while the cluster runs.
  `plan_cluster` takes per-node ports and broker.conf properties; `cli/local/topology.py` builds
  them from flags and a TOML file.
* Every broker of a local cluster gets `LOCAL_BROKER_DEFAULTS` under its own properties: SQL92
  subscriptions on (`enablePropertyFilter`, off in RocketMQ and in a bare `rmq broker`), so the
  README's SQL92 example runs against `rmq up`; `[broker_conf]` can turn it off again.
"""

from __future__ import annotations

import socket
import string
import sys
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

import attrs

from cli.errors import CliError

NAMESRV_PORT = 9876
BROKER_PORT = 10911
PORT_BLOCK = 10  # ports reserved per broker node: P-2 (VIP), P (listen), P+1 (HA)


class PlanError(CliError, ValueError):
    """A cluster plan that cannot work (ports out of range or overlapping)."""


class NodeFailed(CliError):
    """A node exited on its own, could not start, or never became ready."""


@attrs.frozen
class NodeSpec:
    name: str  # unique node name, also its log and data directory name
    kind: str  # "namesrv" | "broker"
    host: str
    port: int
    cluster: str = "DefaultCluster"
    broker_name: str | None = None
    broker_id: int = 0
    role: str | None = None  # ASYNC_MASTER | SYNC_MASTER | SLAVE for brokers
    # extra broker.conf properties (sorted pairs, so the spec stays hashable); written to
    # `<data-dir>/conf/<name>.conf` and passed with --config; the flags the plan sets win
    properties: tuple[tuple[str, str], ...] = ()
    # a DLedger member (`rmq up --dledger N`, dledger_plan.py): its dLegerSelfId, n0, n1...
    dledger_self_id: str | None = None
    # kind "prometheus" (`rmq up --metrics`, cli/local/prometheus.py): the server's binary
    executable: str | None = None

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def is_dledger(self) -> bool:
        return self.dledger_self_id is not None

    @property
    def ha_port(self) -> int | None:
        # a DLedger member has no HA connection (its port stays reserved in the block)
        return self.port + 1 if self.kind == "broker" and not self.is_dledger else None

    @property
    def vip_port(self) -> int | None:
        return self.port - 2 if self.kind == "broker" else None

    @property
    def dledger_port(self) -> int | None:
        """Where a DLedger member serves the Raft RPCs: its listen port + 2."""
        return self.port + 2 if self.is_dledger else None

    @property
    def metrics_port(self) -> int:
        """Where the node serves Prometheus metrics (docs/metrics.md): a broker's listen
        port + 3 (in its block), the nameserver's port + 1."""
        if self.kind == "prometheus":  # `rmq up --metrics`: its own, on its web port
            return self.port
        return self.port + 3 if self.kind == "broker" else self.port + 1

    @property
    def grpc_port(self) -> int | None:
        """Where a broker serves RocketMQ 5's gRPC MessagingService (broker/grpc): its listen
        port + 4, in its block."""
        return self.port + 4 if self.kind == "broker" else None

    @property
    def grpc_addr(self) -> str | None:
        return f"{self.host}:{self.grpc_port}" if self.grpc_port is not None else None

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    def ports(self) -> list[int]:
        if self.is_dledger:
            return [
                self.port - 2,
                self.port,
                self.port + 1,
                self.port + 2,
                self.metrics_port,
                self.port + 4,
            ]
        if self.kind == "broker":
            return [self.port - 2, self.port, self.port + 1, self.metrics_port, self.port + 4]
        return sorted({self.port, self.metrics_port})


@attrs.frozen
class ClusterPlan:
    namesrv: NodeSpec
    brokers: tuple[NodeSpec, ...]
    # `rmq up --metrics`: a Prometheus server scraping every node (cli/local/prometheus.py)
    prometheus: NodeSpec | None = None
    # `rmq up --tls`: the tls.properties every node starts with (cli/local/certificates.py)
    tls_config: Path | None = None

    @property
    def nodes(self) -> tuple[NodeSpec, ...]:
        extra = () if self.prometheus is None else (self.prometheus,)
        return (self.namesrv, *self.brokers, *extra)

    @property
    def namesrv_addr(self) -> str:
        return self.namesrv.addr


def broker_name_for(index: int) -> str:
    """broker-a, broker-b, ..., broker-z, then broker-26, broker-27, ..."""
    if index < 26:
        return f"broker-{string.ascii_lowercase[index]}"
    return f"broker-{index}"


def master_role(role: str, *, slaves: int, sync_master: bool = False) -> str:
    """The masters' brokerRole for `rmq up --role ROLE [--sync-master]` with `slaves` slaves."""
    role = role.upper()
    if role == "AUTO":
        role = "SYNC_MASTER" if sync_master or slaves > 0 else "ASYNC_MASTER"
    if sync_master and role != "SYNC_MASTER":
        raise PlanError(f"--sync-master contradicts --role {role}")
    return role


def plan_cluster(
    *,
    host: str = "127.0.0.1",
    namesrv_port: int = NAMESRV_PORT,
    broker_port: int = BROKER_PORT,
    masters: int = 1,
    slaves: int = 1,
    cluster: str = "DefaultCluster",
    master_role: str = "SYNC_MASTER",
    ports: Mapping[str, int] | None = None,
    properties: Mapping[str, Mapping[str, str]] | None = None,
) -> ClusterPlan:
    """The nodes of a local cluster: `masters` broker names, each with `slaves` slaves.

    `ports` moves single nodes (by node name) off their block; `properties` gives a node
    (by name) extra broker.conf properties. Names that are not in the plan are an error.
    """
    if masters < 1:
        raise PlanError("a cluster needs at least one master")
    if slaves < 0:
        raise PlanError("slaves must be >= 0")
    if master_role not in ("ASYNC_MASTER", "SYNC_MASTER"):
        raise PlanError(f"master role must be ASYNC_MASTER or SYNC_MASTER, not {master_role}")
    namesrv = NodeSpec("namesrv", "namesrv", host, namesrv_port, cluster=cluster)
    brokers: list[NodeSpec] = []
    block = 0
    for m in range(masters):
        name = broker_name_for(m)
        brokers.append(
            NodeSpec(
                name,
                "broker",
                host,
                broker_port + PORT_BLOCK * block,
                cluster,
                name,
                0,
                master_role,
            )
        )
        block += 1
    for s in range(1, slaves + 1):
        for m in range(masters):
            name = broker_name_for(m)
            port = broker_port + PORT_BLOCK * block
            brokers.append(
                NodeSpec(f"{name}-s{s}", "broker", host, port, cluster, name, s, "SLAVE")
            )
            block += 1
    plan = ClusterPlan(namesrv, tuple(brokers))
    plan = customised(plan, ports or {}, properties or {})
    check_ports(plan)
    return plan


# broker.conf properties every broker of `rmq up` starts with unless its own say otherwise
LOCAL_BROKER_DEFAULTS: dict[str, str] = {"enablePropertyFilter": "true"}


def customised(
    plan: ClusterPlan, ports: Mapping[str, int], properties: Mapping[str, Mapping[str, str]]
) -> ClusterPlan:
    names = [n.name for n in plan.nodes]
    for what, table in (("port", ports), ("broker.conf properties", properties)):
        for name in table:
            if name not in names:
                raise PlanError(
                    f"{what} for {name!r}, which is not a node of this cluster "
                    f"(nodes: {', '.join(names)})"
                )
    if properties.get(plan.namesrv.name):
        raise PlanError("broker.conf properties are for brokers, not the nameserver")

    def custom(node: NodeSpec) -> NodeSpec:
        given = {k: str(v) for k, v in properties.get(node.name, {}).items()}
        if node.kind == "broker":
            given = {**LOCAL_BROKER_DEFAULTS, **given}
        props = tuple(sorted(given.items()))
        return attrs.evolve(node, port=ports.get(node.name, node.port), properties=props)

    return ClusterPlan(custom(plan.namesrv), tuple(custom(b) for b in plan.brokers))


def check_ports(plan: ClusterPlan) -> None:
    seen: dict[int, str] = {}
    for node in plan.nodes:
        for port in node.ports():
            if not 1 <= port <= 65535:
                raise PlanError(f"{node.name}: port {port} is outside 1..65535")
            if port in seen:
                raise PlanError(f"{node.name} and {seen[port]} both need port {port}")
            seen[port] = node.name


def busy_ports(plan: ClusterPlan) -> list[tuple[NodeSpec, int]]:
    """Planned ports another process already listens on (checked before spawning anything)."""
    busy = []
    for node in plan.nodes:
        for port in node.ports():
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind((node.host, port))
                except OSError:
                    busy.append((node, port))
    return busy


def node_config_path(node: NodeSpec, data_dir: Path) -> Path:
    """Where a broker's extra broker.conf properties are written (see `write_node_config`)."""
    return data_dir / "conf" / f"{node.name}.conf"


def write_node_config(node: NodeSpec, data_dir: Path) -> None:
    """Write `node`'s extra broker.conf properties (nothing for a node without any)."""
    if not node.properties:
        return
    from cli.servers.node import properties_text

    path = node_config_path(node, data_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(properties_text(dict(node.properties)))


def node_command(node: NodeSpec, plan: ClusterPlan, data_dir: Path) -> list[str]:
    """The child command line; `python -m cli.servers.node` keeps the child's imports lean."""
    base = [sys.executable, "-m", "cli.servers.node"]
    node_dir = str(data_dir / node.name)
    tls = [] if plan.tls_config is None else ["--tls-config", str(plan.tls_config)]
    if node.kind == "namesrv":
        return [
            *base,
            "namesrv",
            "--host",
            node.host,
            "--port",
            str(node.port),
            "--metrics-port",
            str(node.metrics_port),
            "--data-dir",
            node_dir,
            "--watch-stdin",
            *tls,
        ]
    # a DLedger member's brokerId and role follow its Raft role: the plan fixes neither
    identity = (
        []
        if node.is_dledger
        else ["--id", str(node.broker_id), "--role", node.role or "ASYNC_MASTER"]
    )
    return [
        *base,
        "broker",
        "--name",
        node.broker_name or node.name,
        "--cluster",
        node.cluster,
        *identity,
        "--host",
        node.host,
        "--port",
        str(node.port),
        "--namesrv",
        plan.namesrv_addr,
        "--metrics-port",
        str(node.metrics_port),
        "--grpc-port",
        str(node.grpc_port),
        "--data-dir",
        node_dir,
        "--watch-stdin",
        # extra properties from a file; the flags above win over it (see cli.servers.node)
        *(["--config", str(node_config_path(node, data_dir))] if node.properties else []),
        *tls,
    ]


@attrs.frozen
class UpEvent:
    # "spawned" | "ready" | "exited" (ended after ready: crash or `rmq kill`) | "restarting" |
    # "restarted" (serves again) | "stopping" | "stopped"
    kind: str
    node: NodeSpec | None = None
    pid: int | None = None
    returncode: int | None = None
    log_path: Path | None = None
    detail: str | None = None  # "exited" on its own: the last lines of its log


# probe(plan, nodes) -> True once every node of `nodes` serves
Probe = Callable[[ClusterPlan, tuple[NodeSpec, ...]], Awaitable[bool]]
CommandFor = Callable[[NodeSpec, ClusterPlan, Path], list[str]]


def log_tail(path: Path, lines: int = 15, *, start: int = 0) -> str:
    """The last `lines` lines of `path` written at or after byte `start` (where the node's
    current run began: the log is appended to across runs, and an old run's last words are
    not why this one ended)."""
    try:
        with open(path, "rb") as f:
            end = f.seek(0, 2)
            # a long run's log can be large: the last lines are in its last bytes
            f.seek(max(start, end - 256 * lines - 65536))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def run_separator(name: str, pid: int, restarts: int = 0) -> str:
    """The line written into a node's (or the supervisor's) log at each start of it."""
    head, tail = _separator_parts(name, restarts)
    return f"{head}{pid}{tail}\n"


def _separator_parts(name: str, restarts: int) -> tuple[str, str]:
    from datetime import datetime

    now = datetime.now().astimezone().isoformat(timespec="milliseconds")
    again = f" (restart {restarts})" if restarts else ""
    return f"==== {now} rmq up: starting {name} pid ", f"{again} ===="


def with_separator(command: list[str], name: str, restarts: int = 0) -> list[str]:
    """``command`` started through ``/bin/sh``, which writes the run's separator line to
    standard output (the node's log) and then execs it: the separator names the pid the node
    keeps (exec does not change it) and comes before anything the node writes.  Written by the
    parent after the spawn instead, a node quick to print could get its first line in first."""
    head, tail = _separator_parts(name, restarts)
    script = 'printf "%s%s%s\\n" "$1" "$$" "$2"; shift 2; exec "$@"'
    return ["/bin/sh", "-c", script, "sh", head, tail, *command]


def registered_at(cluster_info: object, node: NodeSpec) -> bool:
    """Whether GET_BROKER_CLUSTER_INFO's JSON lists `node` at its planned address."""

    def field(obj: object, key: str) -> object:
        return obj.get(key) if isinstance(obj, dict) else None

    addrs = field(
        field(field(cluster_info, "brokerAddrTable"), node.broker_name or ""), "brokerAddrs"
    )
    if not isinstance(addrs, dict):
        return False
    # fastjson writes the Long keys bare; the tolerant parser gives them back as str
    return any(str(k) == str(node.broker_id) and v == node.addr for k, v in addrs.items())


def slaves_of(plan: ClusterPlan, master: NodeSpec) -> int:
    """How many slaves the plan gives `master`'s broker name."""
    return sum(1 for b in plan.brokers if b.broker_name == master.broker_name and b.broker_id != 0)


def ha_connected(runtime_table: dict[str, str], want: int) -> bool:
    """Whether a master's GET_BROKER_RUNTIME_INFO table counts `want` or more slave connections."""
    try:
        return int(runtime_table.get("haConnectionCount", "0")) >= want
    except ValueError:
        return False


async def probe_cluster(
    plan: ClusterPlan, nodes: tuple[NodeSpec, ...], *, timeout: float = 1.0
) -> bool:
    """True once the nameserver answers, lists every broker of `nodes` at its planned
    address, each of those brokers answers GET_BROKER_RUNTIME_INFO itself, and each master
    among them has an HA connection from every planned slave. DLedger members are ready by
    `cli.local.dledger_plan.dledger_ready` (elected, registered, a group's leader is its master).

    Reads the answers as plain JSON instead of through `rmq` (whose import pulls in the
    whole client and the model classes): the probe runs while the nodes start, on the same
    CPUs, so the supervisor's own imports delay them.
    """
    from cli.runtime_info.status import fetch_runtime_table
    from common.remoting.client import open_remoting_client
    from common.remoting.codes import RequestCode, ResponseCode
    from common.remoting.command import RemotingCommand
    from common.serde import loads

    brokers = [n for n in nodes if n.kind == "broker" and not n.is_dledger]
    members = tuple(n for n in nodes if n.is_dledger)
    async with open_remoting_client(connect_timeout=timeout) as remoting:
        resp = await remoting.invoke(
            plan.namesrv_addr, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO), timeout
        )
        if resp.code != ResponseCode.SUCCESS:
            return False
        info = loads(resp.body_bytes())
        if not all(registered_at(info, node) for node in brokers):
            return False
        for node in brokers:
            table = await fetch_runtime_table(remoting, node.addr, timeout)
            if node.broker_id == 0 and not ha_connected(table, slaves_of(plan, node)):
                return False
        if members:
            tables = {n.name: await fetch_runtime_table(remoting, n.addr, timeout) for n in members}
            return dledger_ready(plan, members, info, tables)
    return True


RAFT_SERVING_ROLES = ("LEADER", "FOLLOWER")


# --- readiness --------------------------------------------------------------------------------


def listed_addrs(cluster_info: object, broker_name: str) -> dict[int, str]:
    """brokerId -> address of `broker_name` in GET_BROKER_CLUSTER_INFO's parsed JSON."""
    table = cluster_info.get("brokerAddrTable") if isinstance(cluster_info, dict) else None
    data = table.get(broker_name) if isinstance(table, dict) else None
    addrs = data.get("brokerAddrs") if isinstance(data, dict) else None
    if not isinstance(addrs, dict):
        return {}
    out: dict[int, str] = {}
    for k, v in addrs.items():
        try:
            out[int(k)] = str(v)  # fastjson writes the Long keys bare: str or int here
        except (TypeError, ValueError):
            continue
    return out


def dledger_ready(
    plan: ClusterPlan,
    nodes: tuple[NodeSpec, ...],
    cluster_info: object,
    tables: Mapping[str, Mapping[str, str]],
) -> bool:
    """Whether the DLedger members among `nodes` serve (module doc, "Readiness"); `tables`
    holds each member's runtime-info table by node name (a member that did not answer has
    none)."""
    members = [n for n in nodes if n.is_dledger]
    for node in members:
        table = tables.get(node.name)
        if table is None or table.get("dledgerRole") not in RAFT_SERVING_ROLES:
            return False
        if node.addr not in listed_addrs(cluster_info, node.broker_name or "").values():
            return False
    waited = {n.name for n in members}
    for group in sorted({n.broker_name or "" for n in members}):
        everyone = [b for b in plan.brokers if b.broker_name == group and b.is_dledger]
        if not all(b.name in waited for b in everyone):
            continue  # a member restarted alone: its group has its leader already
        master = listed_addrs(cluster_info, group).get(0)
        leaders = [b for b in everyone if tables[b.name].get("dledgerRole") == "LEADER"]
        if not any(b.addr == master for b in leaders):
            return False
    return True
