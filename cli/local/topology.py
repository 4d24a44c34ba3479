"""The topology of `rmq up`: flags and a TOML file resolved into one `ClusterPlan`.

Theory of operation: a TOML file (`rmq up --config cluster.toml`) and the command's flags
describe the same settings; a flag the user typed wins over the file, the file over the
defaults. `load_topology_file` checks the file's keys and value types (unknown key, wrong type
-> one `TopologyError` line naming the key); `resolve` merges flags over it and builds the plan
with `cli.local.up.plan_cluster`. Everything here is pure apart from reading the file.

The file (every key optional):

    cluster = "DefaultCluster"
    masters = 2            # broker-a, broker-b
    slaves = 1             # per master: broker-a-s1, broker-b-s1
    role = "auto"          # SYNC_MASTER | ASYNC_MASTER | auto
    namesrv_port = 9876
    broker_port = 10911    # first broker block; each broker takes 10 ports
    data_dir = ".rmq"      # relative to the current directory, as --data-dir
    ready_timeout = 30.0
    dledger = 0            # N > 0: each master is a DLedger group of N (broker-a-n0..n{N-1});
                           # no slaves then (docs/dledger-up.md)

    [broker_conf]          # broker.conf properties for every broker
    flushDiskType = "SYNC_FLUSH"

    [nodes.broker-b]       # one node: its own listen port and broker.conf properties
    port = 20911
    broker_conf = { maxMessageSize = 1048576 }
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from cli.local.dledger_plan import (
    PLANNED_DLEDGER_PROPERTIES,
    check_group_size,
    plan_dledger_cluster,
    planned_dledger_names,
)
from cli.local.up import ClusterPlan, PlanError, broker_name_for, master_role, plan_cluster

# broker.conf properties the plan sets itself (a node's role, identity, ports and store)
PLANNED_PROPERTIES = frozenset(
    {
        "brokerClusterName",
        "brokerName",
        "brokerId",
        "brokerRole",
        "brokerIP1",
        "listenPort",
        "haListenPort",
        "metricsPromExporterPort",
        "grpcServerPort",
        "namesrvAddr",
        "storePathRootDir",
        *PLANNED_DLEDGER_PROPERTIES,
    }
)


class TopologyError(PlanError):
    """A topology file or flags that cannot describe a cluster (names the offending key)."""


@attrs.frozen
class Topology:
    cluster: str = "DefaultCluster"
    masters: int = 1  # with dledger: the number of DLedger groups
    slaves: int | None = None  # None: not given (1 slave per master; none with dledger)
    role: str = "auto"
    namesrv_port: int = 9876
    broker_port: int = 10911
    data_dir: Path = Path(".rmq")
    ready_timeout: float = 30.0
    dledger: int = 0
    # broker.conf properties for every broker
    broker_conf: dict[str, str] = attrs.Factory(dict)
    # per node name: its listen port
    ports: dict[str, int] = attrs.Factory(dict)
    # per node name: its own broker.conf properties (over `broker_conf`)
    node_conf: dict[str, dict[str, str]] = attrs.Factory(dict)

    def plan(self, *, sync_master: bool = False) -> ClusterPlan:
        if self.dledger:
            self._check_dledger(sync_master=sync_master)
        slaves = 1 if self.slaves is None else self.slaves
        names = (
            ["namesrv", *planned_dledger_names(self.masters, self.dledger)]
            if self.dledger
            else _planned_names(self.masters, slaves)
        )
        properties: dict[str, dict[str, str]] = {}
        for name in names:
            if name == "namesrv":
                continue
            props = {**self.broker_conf, **self.node_conf.get(name, {})}
            if props:
                properties[name] = props
        for name in self.node_conf:
            if name not in names:
                properties[name] = self.node_conf[name]  # plan_cluster names the bad node
        try:
            if self.dledger:
                return plan_dledger_cluster(
                    namesrv_port=self.namesrv_port,
                    broker_port=self.broker_port,
                    groups=self.masters,
                    size=self.dledger,
                    cluster=self.cluster,
                    ports=self.ports,
                    properties=properties,
                )
            role = master_role(self.role, slaves=slaves, sync_master=sync_master)
            return plan_cluster(
                namesrv_port=self.namesrv_port,
                broker_port=self.broker_port,
                masters=self.masters,
                slaves=slaves,
                cluster=self.cluster,
                master_role=role,
                ports=self.ports,
                properties=properties,
            )
        except TopologyError:
            raise
        except PlanError as exc:  # one class for everything wrong with a topology
            raise TopologyError(str(exc)) from None

    def _check_dledger(self, *, sync_master: bool) -> None:
        """What a DLedger topology cannot have: slaves and a fixed master role (Raft decides
        which member is master; its followers are the slaves)."""
        try:
            check_group_size(self.dledger)
        except PlanError as exc:
            raise TopologyError(str(exc)) from None
        if self.slaves:
            raise TopologyError(
                f"--slaves {self.slaves} cannot be combined with --dledger {self.dledger}: a "
                "DLedger group's followers are its slaves (drop --slaves / slaves)"
            )
        if self.role.upper() != "AUTO" or sync_master:
            raise TopologyError(
                f"--role {self.role if self.role.upper() != 'AUTO' else 'SYNC_MASTER'} cannot "
                f"be combined with --dledger {self.dledger}: the Raft leader is the master"
            )


def _planned_names(masters: int, slaves: int) -> list[str]:
    names = ["namesrv"] + [broker_name_for(m) for m in range(masters)]
    names += [f"{broker_name_for(m)}-s{s}" for s in range(1, slaves + 1) for m in range(masters)]
    return names


# key -> (type check, what the user is told it must be)
_SCALARS: dict[str, tuple[type | tuple[type, ...], str]] = {
    "cluster": (str, "a string"),
    "masters": (int, "an integer >= 1"),
    "slaves": (int, "an integer >= 0"),
    "role": (str, "SYNC_MASTER, ASYNC_MASTER or auto"),
    "namesrv_port": (int, "a port number"),
    "broker_port": (int, "a port number"),
    "data_dir": (str, "a path"),
    "ready_timeout": ((int, float), "a number of seconds"),
    "dledger": (int, "a DLedger group size (0 = off)"),
}
_TABLES = ("broker_conf", "nodes")
_NODE_KEYS = ("port", "broker_conf")


def load_topology_file(path: Path) -> dict[str, Any]:
    """The settings of a topology file as `Topology` field values (only those it sets)."""
    import tomllib

    try:
        raw = tomllib.loads(path.read_text())
    except OSError as exc:
        raise TopologyError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise TopologyError(f"{path}: not a text file") from None
    except tomllib.TOMLDecodeError as exc:
        raise TopologyError(f"{path}: not valid TOML: {exc}") from None
    return topology_settings(raw, source=str(path))


def topology_settings(raw: dict[str, Any], *, source: str = "topology") -> dict[str, Any]:
    """Checked `Topology` field values from parsed TOML."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key in _SCALARS:
            kind, want = _SCALARS[key]
            if isinstance(value, bool) or not isinstance(value, kind):
                raise TopologyError(f"{source}: {key} must be {want}, not {value!r}")
            out[key] = Path(value) if key == "data_dir" and isinstance(value, str) else value
        elif key == "broker_conf":
            out[key] = _properties(value, f"{source}: broker_conf")
        elif key == "nodes":
            if not isinstance(value, dict):
                raise TopologyError(f"{source}: nodes must be a table of node names")
            for name, node in value.items():
                where = f"{source}: nodes.{name}"
                if not isinstance(node, dict):
                    raise TopologyError(f"{where} must be a table (port, broker_conf)")
                for nkey, nvalue in node.items():
                    if nkey == "port":
                        if isinstance(nvalue, bool) or not isinstance(nvalue, int):
                            raise TopologyError(f"{where}.port must be a port number")
                        out.setdefault("ports", {})[name] = nvalue
                    elif nkey == "broker_conf":
                        conf = _properties(nvalue, f"{where}.broker_conf")
                        out.setdefault("node_conf", {})[name] = conf
                    else:
                        raise TopologyError(
                            f"{where}: unknown key {nkey!r} (known: {', '.join(_NODE_KEYS)})"
                        )
        else:
            known = ", ".join([*_SCALARS, *_TABLES])
            raise TopologyError(f"{source}: unknown key {key!r} (known: {known})")
    return out


def _properties(value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise TopologyError(f"{where} must be a table of broker.conf properties")
    props: dict[str, str] = {}
    for key, v in value.items():
        if key in PLANNED_PROPERTIES:
            raise TopologyError(
                f"{where}.{key} is set by rmq up itself (use the topology's ports, "
                "masters/slaves and data_dir)"
            )
        if isinstance(v, bool):
            props[key] = "true" if v else "false"
        elif isinstance(v, int | float | str):
            props[key] = str(v)
        else:
            raise TopologyError(f"{where}.{key} must be a string, number or boolean")
    _check_properties(props, where)
    return props


def _check_properties(props: dict[str, str], where: str) -> None:
    """Names and values the broker would refuse or ignore, caught before anything starts."""
    from broker import config as broker_config

    known = getattr(broker_config, "_PROPERTIES", None)
    for key, value in props.items():
        if known is not None and key not in known:
            raise TopologyError(f"{where}.{key}: not a broker.conf property trio-rmq knows")
        try:
            broker_config.BrokerConfig.from_properties(f"{key}={value}\n")
        except ValueError as exc:
            raise TopologyError(f"{where}.{key}: {exc}") from None


def resolve(config: Path | None, **flags: Any) -> Topology:
    """The topology of `rmq up`: defaults, then the file, then every flag that is not None."""
    settings = load_topology_file(config) if config is not None else {}
    settings.update({k: v for k, v in flags.items() if v is not None})
    if settings.get("masters", 1) < 1:
        raise TopologyError("masters must be at least 1")
    if (settings.get("slaves") or 0) < 0:
        raise TopologyError("slaves must be 0 or more")
    # the nameserver's port may be set as nodes.namesrv.port too; --namesrv-port wins
    ports = dict(settings.get("ports", {}))
    if "namesrv" in ports:
        settings.setdefault("namesrv_port", ports["namesrv"])
        if flags.get("namesrv_port") is not None:
            ports["namesrv"] = flags["namesrv_port"]
        settings["ports"] = ports
    return Topology(**settings)
