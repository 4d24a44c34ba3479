"""Replication status of brokers, for `rmq cluster` and the `rmq up` readiness probe.

Theory of operation: a broker reports its replication state in GET_BROKER_RUNTIME_INFO (a
KVTable of strings): on a master `push2SlaveMaxOffset`, `haConnectionCount` and, per connected
slave i, `haSlave{i}Addr/AckOffset/LagBytes/LagMillis`; on a slave `haMasterAddress`,
`haClientConnected`, `haClientReportedOffset`; on both `commitLogMaxOffset`; on a DLedger
member its Raft state (`cli/runtime_info/raft.py`, lags computed across the group). The role
(ASYNC_MASTER / SYNC_MASTER / SLAVE) is a configuration value, so it comes from
GET_BROKER_CONFIG's properties text (`brokerRole=...`).

`parse_runtime_info` and `broker_role` are pure (tested on plain dicts and text);
`fetch_broker_status` asks one broker over one remoting client; `cluster_status` asks the
nameserver for the cluster table and then every broker concurrently. A broker that does not
answer is reported with its error instead of failing the whole listing: a cluster with a
dead slave is exactly when one wants to see the others.

The JSON is read with `common.serde.loads` directly, not through the `rmq` client, so the
`rmq up` probe stays lean.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from cli.errors import CliError
from cli.runtime_info.raft import RaftStatus, parse_raft, with_lags

if TYPE_CHECKING:
    from rmq.remoting import Invoker


class StatusError(CliError, ValueError):
    """A broker answered, but not with a usable runtime-info table."""


@attrs.frozen
class SlaveLag:
    """One slave connection as its master sees it."""

    addr: str  # the slave's HA socket address (host:ephemeral port)
    ack_offset: int  # highest CommitLog offset the slave acknowledged
    lag_bytes: int  # master max offset - ack offset
    lag_ms: int  # how long the slave's ack has been behind the master's max offset


@attrs.frozen
class BrokerStatus:
    broker_name: str
    broker_id: int
    addr: str
    cluster: str = ""
    role: str = ""  # brokerRole from the broker's config; "" when unknown
    max_offset: int | None = None  # commitLogMaxOffset
    # master side
    push2slave_max_offset: int | None = None
    ha_connections: int | None = None
    slaves: tuple[SlaveLag, ...] = ()
    # slave side
    ha_master_addr: str | None = None
    ha_client_connected: bool | None = None
    ha_reported_offset: int | None = None
    error: str | None = None  # why the broker could not be asked
    # DLedger mode: the member's Raft state (cli/runtime_info/raft.py); None for other brokers
    raft: RaftStatus | None = None

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self, recurse=True, value_serializer=_json_value)


def _json_value(inst: Any, field: Any, value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _int(table: dict[str, str], key: str) -> int | None:
    value = table.get(key)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise StatusError(f"runtime info {key}={value!r} is not an integer") from None


def runtime_table(parsed: object) -> dict[str, str]:
    """The `table` of a KVTable JSON document (already parsed), as str -> str."""
    table = parsed.get("table") if isinstance(parsed, dict) else None
    if not isinstance(table, dict):
        raise StatusError("runtime info has no table")
    return {str(k): str(v) for k, v in table.items()}


def parse_runtime_info(
    table: dict[str, str],
    *,
    broker_name: str,
    broker_id: int,
    addr: str,
    cluster: str = "",
    role: str = "",
) -> BrokerStatus:
    """A BrokerStatus from GET_BROKER_RUNTIME_INFO's table (missing keys stay None)."""
    slaves = []
    count = _int(table, "haConnectionCount")
    i = 0
    while f"haSlave{i}Addr" in table:
        slaves.append(
            SlaveLag(
                table[f"haSlave{i}Addr"],
                _int(table, f"haSlave{i}AckOffset") or 0,
                _int(table, f"haSlave{i}LagBytes") or 0,
                _int(table, f"haSlave{i}LagMillis") or 0,
            )
        )
        i += 1
    connected = table.get("haClientConnected")
    return BrokerStatus(
        broker_name,
        broker_id,
        addr,
        cluster,
        role,
        max_offset=_int(table, "commitLogMaxOffset"),
        push2slave_max_offset=_int(table, "push2SlaveMaxOffset"),
        ha_connections=count,
        slaves=tuple(slaves),
        ha_master_addr=table.get("haMasterAddress") or None,
        ha_client_connected=None if connected is None else connected == "true",
        ha_reported_offset=_int(table, "haClientReportedOffset"),
        raft=parse_raft(table),
    )


def broker_role(config_text: str) -> str:
    """brokerRole from GET_BROKER_CONFIG's properties text ("" when absent)."""
    for line in config_text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "brokerRole":
            return value.strip()
    return ""


async def fetch_runtime_table(remoting: Invoker, addr: str, timeout: float = 3.0) -> dict[str, str]:
    """GET_BROKER_RUNTIME_INFO of the broker at `addr` as a plain dict."""
    from common.remoting.codes import RequestCode, ResponseCode
    from common.remoting.command import RemotingCommand
    from common.serde import loads

    resp = await remoting.invoke(
        addr, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO), timeout
    )
    if resp.code != ResponseCode.SUCCESS:
        raise StatusError(f"{addr} answered runtime info with code {resp.code}: {resp.remark}")
    try:
        parsed = loads(resp.body_bytes())
    except ValueError as exc:
        raise StatusError(f"{addr} sent runtime info that is not JSON: {exc}") from None
    return runtime_table(parsed)


async def fetch_broker_status(
    remoting: Invoker,
    addr: str,
    *,
    broker_name: str = "",
    broker_id: int | None = None,
    cluster: str = "",
    timeout: float = 3.0,
) -> BrokerStatus:
    """Runtime info + role of one broker; errors of this broker end up in `.error`."""
    from common.errors import RmqError
    from common.remoting.codes import RequestCode, ResponseCode
    from common.remoting.command import RemotingCommand

    try:
        table = await fetch_runtime_table(remoting, addr, timeout)
        resp = await remoting.invoke(
            addr, RemotingCommand.request(RequestCode.GET_BROKER_CONFIG), timeout
        )
        text = resp.body_bytes().decode("utf-8", "replace") if resp.body else ""
        role = broker_role(text) if resp.code == ResponseCode.SUCCESS else ""
        if broker_id is None:  # asked by address alone: the config says who it is
            props = dict(line.partition("=")[::2] for line in text.splitlines() if "=" in line)
            broker_name = broker_name or props.get("brokerName", "")
            cluster = cluster or props.get("brokerClusterName", "")
            try:
                broker_id = int(props.get("brokerId", "0"))
            except ValueError:
                broker_id = 0
        return parse_runtime_info(
            table,
            broker_name=broker_name,
            broker_id=broker_id,
            addr=addr,
            cluster=cluster,
            role=role,
        )
    except (RmqError, CliError, OSError) as exc:
        return BrokerStatus(
            broker_name, broker_id or 0, addr, cluster, error=str(exc) or type(exc).__name__
        )


async def broker_status(addr: str, *, timeout: float = 3.0) -> list[BrokerStatus]:
    """The status of the one broker at `addr` (no nameserver needed); errors raise."""
    from cli.client_network import network_from_env
    from common.remoting.client import open_remoting_client

    async with open_remoting_client(
        connect_timeout=timeout, network=network_from_env()
    ) as remoting:
        # the first call raises a connection error to the caller (one line, exit 1)
        await fetch_runtime_table(remoting, addr, timeout)
        status = await fetch_broker_status(remoting, addr, timeout=timeout)
    if status.error:
        raise StatusError(status.error)
    return [status]


async def cluster_status(namesrv: str, *, timeout: float = 3.0) -> list[BrokerStatus]:
    """Every broker the nameserver lists, each asked for its replication state."""
    import trio

    from common.remoting.client import open_remoting_client
    from common.remoting.codes import RequestCode, ResponseCode
    from common.remoting.command import RemotingCommand
    from common.serde import loads

    addrs = [a.strip() for a in namesrv.split(";") if a.strip()]
    if not addrs:
        raise StatusError("no nameserver address given")
    from cli.client_network import network_from_env

    async with open_remoting_client(
        connect_timeout=timeout, network=network_from_env()
    ) as remoting:
        resp = await remoting.invoke(
            addrs[0], RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO), timeout
        )
        if resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
            from rmq.errors import NotANameserverError

            raise NotANameserverError(addrs[0], resp.remark)
        if resp.code != ResponseCode.SUCCESS:
            raise StatusError(f"nameserver answered cluster info with {resp.code}: {resp.remark}")
        info = loads(resp.body_bytes())
        brokers: list[tuple[str, str, int, str]] = []  # (cluster, name, id, addr)
        clusters = info.get("clusterAddrTable") or {} if isinstance(info, dict) else {}
        table = info.get("brokerAddrTable") or {} if isinstance(info, dict) else {}
        for cluster, names in sorted(clusters.items()):
            for name in sorted(names or []):
                data = table.get(name) or {}
                for bid, addr in sorted(
                    (data.get("brokerAddrs") or {}).items(), key=lambda kv: int(kv[0])
                ):
                    brokers.append((cluster, name, int(bid), addr))
        results: list[BrokerStatus | None] = [None] * len(brokers)

        async def ask(i: int, cluster: str, name: str, bid: int, addr: str) -> None:
            results[i] = await fetch_broker_status(
                remoting,
                addr,
                broker_name=name,
                broker_id=bid,
                cluster=cluster,
                timeout=timeout,
            )

        async with trio.open_nursery() as nursery:
            for i, b in enumerate(brokers):
                nursery.start_soon(ask, i, *b)
    return with_raft_lags([r for r in results if r is not None])


def with_raft_lags(statuses: list[BrokerStatus]) -> list[BrokerStatus]:
    """The statuses with each DLedger member's lag behind its group's leader filled in."""
    lagged = iter(with_lags(s.raft for s in statuses if s.raft is not None))
    return [s if s.raft is None else attrs.evolve(s, raft=next(lagged)) for s in statuses]
