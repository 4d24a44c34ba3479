"""What `rmq top` shows, as plain values: one `TopSnapshot` per refresh (no rich here).

Theory of operation: `TopCollector.collect()` asks a `TopSource` (the nameserver and brokers,
through `rmq.Admin`; a fake in tests) for one picture of the cluster:

1. the nameserver's cluster table (clusters, broker names, brokerId -> address);
2. every node's runtime info (CommitLog max offset, the put/get counters behind send/pull TPS,
   the HA state) and its role, all nodes at once, each under its own `timeout`;
3. the queue max offsets of each user topic and the lag of each consumer group, also
   concurrently and each bounded.

A frame therefore takes at most about two timeouts however many nodes are dead or hung.
The collector remembers every node the nameserver ever listed (by address): a broker that dies
drops out of the nameserver's table as soon as its connection closes, and `top` must show it
red rather than silently forget it. A remembered node that answers again turns normal; if the
nameserver lists a different identity for that address (a DLedger role change) the newest wins.
Every error of a node, topic or group is kept as text in its row: nothing a node does can end
the collector. If the nameserver itself is unreachable the snapshot says so and still shows
the remembered nodes.

A DLedger member's row also carries its Raft state (`cli/runtime_info/raft.py`); the snapshot
names each group's leader (`raft_leaders`), from which the drawing computes every member's lag.

The clients are the online producers (GET_ALL_PRODUCER_INFO of every master) and the members
of each consumer group shown (GET_CONSUMER_CONNECTION_LIST), RocketMQ 5 gRPC clients among
them: the broker registers those like 4.x connections (broker/grpc/client_manager.py), a 5.x
producer under a producer group named after each topic it publishes to, as RocketMQ 5's proxy
does, and says `GRPC_V2` for their protocol.

Rates are not in the snapshot: `rates(snap, prev)` diffs the brokers' msgPutTotalTodayNow /
msgGetTotalTodayNow counters between two snapshots over Trio-clock seconds (a counter that went
down means the broker restarted: no rate for that frame). Replication lag per slave is
`slave_lag(master, slave)`: the master's own view of that slave connection when it can be
matched (bytes and ms behind), else the difference of the two CommitLog max offsets.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

import attrs
import trio

from cli.runtime_info.raft import RaftStatus, group_leaders
from cli.runtime_info.status import SlaveLag, broker_role, parse_runtime_info, runtime_table
from common.mixall import is_system_group
from common.model import ClusterInfo
from common.topics import (  # noqa: F401 - SYSTEM_TOPICS, is_system_topic re-exported
    RETRY_GROUP_TOPIC_PREFIX,
    SYSTEM_TOPICS,
    is_system_topic,
)

if TYPE_CHECKING:
    from rmq.admin import Admin

T = TypeVar("T")


@attrs.frozen
class NodeView:
    """One broker process as the nameserver lists it and as it last answered."""

    cluster: str
    broker_name: str
    broker_id: int
    addr: str
    role: str = ""  # brokerRole from the broker's config ("" unknown)
    max_offset: int | None = None  # commitLogMaxOffset
    put_total: int | None = None  # msgPutTotalTodayNow
    get_total: int | None = None  # msgGetTotalTodayNow
    slaves: tuple[SlaveLag, ...] = ()  # on a master: each slave connection
    ha_reported_offset: int | None = None  # on a slave: what it last reported to its master
    listed: bool = True  # the nameserver lists it right now
    error: str | None = None  # why it did not answer this time (then it is shown red)
    raft: RaftStatus | None = None  # a DLedger member's Raft state (lag not filled in)
    disk_ratio: float | None = None  # commitLogDiskRatio: used / total of its store's disk
    put_refused: str = ""  # putRefusedReason: why it refuses sends now ("" it takes them)

    @property
    def alive(self) -> bool:
        return self.error is None

    @property
    def is_master(self) -> bool:
        return self.broker_id == 0


@attrs.frozen
class QueueView:
    broker_name: str
    queue_id: int
    max_offset: int


@attrs.frozen
class TopicView:
    topic: str
    queues: tuple[QueueView, ...] = ()
    error: str | None = None

    @property
    def total(self) -> int:
        return sum(q.max_offset for q in self.queues)


@attrs.frozen
class GroupView:
    group: str
    topics: tuple[str, ...] = ()
    # ready + inflight: what the group has not consumed yet
    lag: int | None = None
    queues: int = 0
    error: str | None = None
    # pop groups (RocketMQ 5): ready = sum of broker offset - consumer offset (not handed out
    # yet), inflight = popped and not acked yet; a 4.x group's inflight is 0 and lag == ready
    ready: int | None = None
    inflight: int = 0


@attrs.frozen
class ClientView:
    """One online client of a producer or consumer group, as the brokers see it."""

    kind: str  # "producer", "push consumer", "simple consumer" (5.x), "pull consumer" (4.x)
    group: str  # a 5.x producer's group is the topic it publishes to
    client_id: str
    language: str  # JAVA, CPP, PYTHON, ...
    protocol: str  # REMOTING (4.x) or GRPC_V2 (RocketMQ 5)
    addr: str
    topics: tuple[str, ...] = ()  # a consumer's subscriptions

    @property
    def is_5x(self) -> bool:
        return self.protocol == "GRPC_V2"


def consumer_kind(consume_type: str, protocol: str) -> str:
    """A consumer's kind from its group's consume type: a 5.x client that consumes actively is
    a SimpleConsumer (it receives by pop), a 4.x one a pull consumer."""
    if consume_type == "CONSUME_PASSIVELY":
        return "push consumer"
    return "simple consumer" if protocol == "GRPC_V2" else "pull consumer"


@attrs.frozen
class TopSnapshot:
    namesrv: str
    taken_at: float  # trio.current_time() when collected: rates divide by its differences
    wall_time: float  # time.time(), only for display
    nodes: tuple[NodeView, ...] = ()
    topics: tuple[TopicView, ...] = ()
    groups: tuple[GroupView, ...] = ()
    namesrv_error: str | None = None
    hidden_topics: int = 0  # user topics beyond the display limit
    hidden_groups: int = 0
    topics_error: str | None = None  # the topic list could not be read
    groups_error: str | None = None  # the group list could not be read
    clients: tuple[ClientView, ...] = ()  # producers, then consumers, each sorted by group
    clients_error: str | None = None  # the producers could not be read

    def node(self, addr: str) -> NodeView | None:
        return next((n for n in self.nodes if n.addr == addr), None)

    def raft_leaders(self) -> dict[str, RaftStatus]:
        """DLedger group -> its current leader, among the members that answered."""
        return group_leaders(n.raft for n in self.nodes if n.alive and n.raft is not None)

    def raft_groups(self) -> list[str]:
        """Every DLedger group a member of which answered at some point in this snapshot."""
        return sorted({n.raft.group for n in self.nodes if n.raft is not None})

    def master_of(self, node: NodeView) -> NodeView | None:
        return next(
            (
                n
                for n in self.nodes
                if n.broker_name == node.broker_name
                and n.cluster == node.cluster
                and n.broker_id == 0
            ),
            None,
        )


@attrs.frozen
class Rates:
    send_tps: float | None
    pull_tps: float | None


def rates(snap: TopSnapshot, prev: TopSnapshot | None) -> dict[str, Rates]:
    """Send/pull messages per second of each node (by address) between two snapshots."""
    out: dict[str, Rates] = {}
    dt = None if prev is None else snap.taken_at - prev.taken_at
    for node in snap.nodes:
        old = prev.node(node.addr) if prev is not None else None
        if old is None or not dt or dt <= 0:
            out[node.addr] = Rates(None, None)
            continue
        out[node.addr] = Rates(
            _rate(node.put_total, old.put_total, dt), _rate(node.get_total, old.get_total, dt)
        )
    return out


def _rate(now: int | None, before: int | None, dt: float) -> float | None:
    if now is None or before is None or now < before:  # unknown, or the broker restarted
        return None
    return (now - before) / dt


@attrs.frozen
class Lag:
    bytes: int | None
    ms: int | None


def slave_lag(master: NodeView | None, slave: NodeView) -> Lag:
    """How far `slave` is behind its master: the master's view of that connection if it can
    be told apart (the only connection, or the one whose acked offset is what the slave says
    it reported), else the difference of the CommitLog max offsets and no time."""
    if master is None or not master.alive or not slave.alive:
        return Lag(None, None)
    conns = list(master.slaves)
    host = slave.addr.rpartition(":")[0]
    same_host = [c for c in conns if c.addr.rpartition(":")[0] == host]
    if len(same_host) > 1 and slave.ha_reported_offset is not None:
        same_host = [c for c in same_host if c.ack_offset == slave.ha_reported_offset]
    if len(same_host) == 1:
        return Lag(same_host[0].lag_bytes, same_host[0].lag_ms)
    if master.max_offset is not None and slave.max_offset is not None:
        return Lag(max(0, master.max_offset - slave.max_offset), None)
    return Lag(None, None)


# --- the source ------------------------------------------------------------------------------


@attrs.frozen
class NodeInfo:
    """What one broker answered: its runtime-info table and its role."""

    table: dict[str, str]
    role: str = ""


@attrs.frozen
class GroupLag:
    topics: tuple[str, ...]
    lag: int  # ready: broker offset - consumer offset over the group's queues
    queues: int
    inflight: int = 0


class TopSource(Protocol):
    """Where the collector gets its numbers (`AdminSource` in real life, fakes in tests)."""

    async def cluster_info(self) -> ClusterInfo: ...
    async def node_info(self, addr: str) -> NodeInfo: ...
    async def topic_list(self) -> list[str]: ...
    async def topic_queues(self, topic: str) -> list[QueueView]: ...
    async def group_list(self) -> list[str]: ...
    async def group_lag(self, group: str) -> GroupLag: ...
    async def producers(self) -> list[ClientView]: ...
    async def consumers(self, group: str) -> list[ClientView]: ...


def describe_error(exc: BaseException) -> str:
    """One short line for a node/topic/group that failed."""
    from common.errors import RemotingConnectError, RemotingTimeoutError

    if isinstance(exc, trio.TooSlowError | RemotingTimeoutError):
        return "timeout"
    if isinstance(exc, RemotingConnectError | ConnectionError):
        return "down (connection refused)"
    text = str(exc).splitlines()[0] if str(exc) else ""
    return text or type(exc).__name__


async def _bounded(timeout: float, fn: Callable[[], Awaitable[T]]) -> T | BaseException:
    """fn() under `timeout`; any Exception is returned, not raised (one node never ends top)."""
    try:
        with trio.fail_after(timeout):
            return await fn()
    except Exception as exc:  # every failure of a node is shown, none is fatal
        return exc


@attrs.define(eq=False)
class TopCollector:
    source: TopSource
    namesrv: str
    timeout: float = 2.0
    max_topics: int = 50
    max_groups: int = 50
    show_system: bool = False
    # addr -> (cluster, brokerName, brokerId) of every node the nameserver ever listed;
    # the newest listing of an address wins
    _known: dict[str, tuple[str, str, int]] = attrs.field(factory=dict, init=False)
    # addr -> the role it last reported, so a node that stops answering keeps showing it
    _roles: dict[str, str] = attrs.field(factory=dict, init=False)
    # addr -> the Raft state a DLedger member last reported, so a dead member keeps its id
    _rafts: dict[str, RaftStatus] = attrs.field(factory=dict, init=False)

    async def collect(self) -> TopSnapshot:
        import time

        started = trio.current_time()
        wall = time.time()
        info = await _bounded(self.timeout, self.source.cluster_info)
        namesrv_error = None
        listed: dict[str, tuple[str, str, int]] = {}
        if isinstance(info, BaseException):
            namesrv_error = describe_error(info)
        else:
            listed = listed_nodes(info)
            self._known.update(listed)
        keys = sorted(self._known.items(), key=lambda kv: (kv[1], kv[0]))
        nodes: list[NodeView | None] = [None] * len(keys)
        topics: list[TopicView] = []
        groups: list[GroupView] = []
        hidden = [0, 0]
        list_errors: dict[str, str] = {}

        async def one_node(i: int, addr: str, key: tuple[str, str, int]) -> None:
            got = await _bounded(self.timeout, lambda: self.source.node_info(addr))
            if isinstance(got, NodeInfo) and got.role:
                self._roles[addr] = got.role
            view = node_view(addr, key, got, listed=addr in listed)
            if view.raft is not None:
                self._rafts[addr] = view.raft
            if not view.alive:
                view = attrs.evolve(
                    view, role=self._roles.get(addr, ""), raft=self._rafts.get(addr)
                )
            nodes[i] = view

        async def all_topics() -> None:
            names = await _bounded(self.timeout, self.source.topic_list)
            if isinstance(names, BaseException):
                list_errors["topics"] = describe_error(names)
                return
            brokers = {k[1] for k in self._known.values()}
            clusters = {k[0] for k in self._known.values()}
            user = sorted(
                t
                for t in set(names)
                if self.show_system or not is_system_topic(t, brokers | clusters)
            )
            hidden[0] = max(0, len(user) - self.max_topics)
            found: dict[str, TopicView] = {}

            async def one(topic: str) -> None:
                got = await _bounded(self.timeout, lambda: self.source.topic_queues(topic))
                if isinstance(got, BaseException):
                    found[topic] = TopicView(topic, error=describe_error(got))
                else:
                    qs = sorted(got, key=lambda q: (q.broker_name, q.queue_id))
                    found[topic] = TopicView(topic, tuple(qs))

            async with trio.open_nursery() as nursery:
                for topic in user[: self.max_topics]:
                    nursery.start_soon(one, topic)
            topics.extend(found[t] for t in user[: self.max_topics])

        producers: list[ClientView] = []
        consumers: dict[str, list[ClientView]] = {}

        async def all_producers() -> None:
            got = await _bounded(self.timeout, self.source.producers)
            if isinstance(got, BaseException):
                list_errors["clients"] = describe_error(got)
                return
            producers.extend(
                sorted(
                    (p for p in got if self.show_system or not is_system_group(p.group)),
                    key=lambda c: (c.group, c.client_id),
                )
            )

        async def group_members(group: str) -> None:
            got = await _bounded(self.timeout, lambda: self.source.consumers(group))
            if not isinstance(got, BaseException):  # its row in the groups table says why
                consumers[group] = sorted(got, key=lambda c: c.client_id)

        async def all_groups() -> None:
            names = await _bounded(self.timeout, self.source.group_list)
            if isinstance(names, BaseException):
                list_errors["groups"] = describe_error(names)
                return
            user = sorted(g for g in set(names) if self.show_system or not is_system_group(g))
            hidden[1] = max(0, len(user) - self.max_groups)
            found: dict[str, GroupView] = {}

            async def one(group: str) -> None:
                got = await _bounded(self.timeout, lambda: self.source.group_lag(group))
                if isinstance(got, BaseException):
                    found[group] = GroupView(group, error=describe_error(got))
                else:
                    found[group] = GroupView(
                        group,
                        got.topics,
                        got.lag + got.inflight,
                        got.queues,
                        ready=got.lag,
                        inflight=got.inflight,
                    )

            async with trio.open_nursery() as nursery:
                for group in user[: self.max_groups]:
                    nursery.start_soon(one, group)
                    nursery.start_soon(group_members, group)
            groups.extend(found[g] for g in user[: self.max_groups])

        async with trio.open_nursery() as nursery:
            for i, (addr, key) in enumerate(keys):
                nursery.start_soon(one_node, i, addr, key)
            if namesrv_error is None:
                nursery.start_soon(all_topics)
                nursery.start_soon(all_groups)
                nursery.start_soon(all_producers)
        return TopSnapshot(
            namesrv=self.namesrv,
            taken_at=started,
            wall_time=wall,
            nodes=tuple(n for n in nodes if n is not None),
            topics=tuple(topics),
            groups=tuple(groups),
            namesrv_error=namesrv_error,
            hidden_topics=hidden[0],
            hidden_groups=hidden[1],
            topics_error=list_errors.get("topics"),
            groups_error=list_errors.get("groups"),
            clients=(*producers, *(c for g in sorted(consumers) for c in consumers[g])),
            clients_error=list_errors.get("clients"),
        )


def listed_nodes(info: ClusterInfo) -> dict[str, tuple[str, str, int]]:
    """addr -> (cluster, brokerName, brokerId) of every node in the nameserver's table."""
    out: dict[str, tuple[str, str, int]] = {}
    for cluster, names in info.clusterAddrTable.items():
        for name in names or ():
            bd = info.brokerAddrTable.get(name)
            if bd is None:
                continue
            for bid, addr in bd.brokerAddrs.items():
                out[addr] = (cluster, name, int(bid))
    return out


def node_view(
    addr: str, key: tuple[str, str, int], got: NodeInfo | BaseException, *, listed: bool
) -> NodeView:
    """A NodeView from what the node answered (or the error it raised)."""
    cluster, name, bid = key
    if isinstance(got, BaseException):
        return NodeView(cluster, name, bid, addr, listed=listed, error=describe_error(got))
    try:
        status = parse_runtime_info(
            got.table, broker_name=name, broker_id=bid, addr=addr, cluster=cluster, role=got.role
        )
        put = _int_or_none(got.table.get("msgPutTotalTodayNow"))
        get = _int_or_none(got.table.get("msgGetTotalTodayNow"))
        disk = _float_or_none(got.table.get("commitLogDiskRatio"))
    except Exception as exc:  # a malformed table is this node's problem only
        return NodeView(cluster, name, bid, addr, listed=listed, error=describe_error(exc))
    return NodeView(
        cluster,
        name,
        bid,
        addr,
        role=got.role,
        max_offset=status.max_offset,
        put_total=put,
        get_total=get,
        slaves=status.slaves,
        ha_reported_offset=status.ha_reported_offset,
        listed=listed,
        raft=status.raft,
        disk_ratio=disk,
        put_refused=got.table.get("putRefusedReason", ""),
    )


def _float_or_none(value: str | None) -> float | None:
    try:
        return None if value in (None, "") else float(value)
    except ValueError:
        return None


def _int_or_none(value: str | None) -> int | None:
    try:
        return None if value in (None, "") else int(value)
    except ValueError:
        return None


# --- the real source -------------------------------------------------------------------------


@attrs.define(eq=False)
class AdminSource:
    """`TopSource` over an open `rmq.Admin` (its remoting client for the per-node calls)."""

    admin: Admin
    timeout: float = 2.0

    async def cluster_info(self) -> ClusterInfo:
        return await self.admin.cluster_info()

    async def node_info(self, addr: str) -> NodeInfo:
        from common.remoting.codes import RequestCode, ResponseCode
        from common.remoting.command import RemotingCommand

        table = await self.admin.broker_runtime_info(addr)
        remoting = self.admin.client.remoting
        resp = await remoting.invoke(
            addr, RemotingCommand.request(RequestCode.GET_BROKER_CONFIG), self.timeout
        )
        role = ""
        if resp.code == ResponseCode.SUCCESS and resp.body:
            role = broker_role(resp.body_bytes().decode("utf-8", "replace"))
        return NodeInfo(runtime_table({"table": table}), role)

    async def topic_list(self) -> list[str]:
        return await self.admin.topic_list()

    async def topic_queues(self, topic: str) -> list[QueueView]:
        stats = await self.admin.topic_stats(topic)
        return [QueueView(s.queue.brokerName, s.queue.queueId, s.max_offset) for s in stats]

    async def group_list(self) -> list[str]:
        return await self.admin.group_list()

    async def group_lag(self, group: str) -> GroupLag:
        stats = await self.admin.consume_stats(group)
        return GroupLag(tuple(stats.topics()), stats.lag, len(stats.queues), stats.inflight)

    async def producers(self) -> list[ClientView]:
        return [
            ClientView("producer", p.group, p.client_id, p.language, p.protocol, p.client_addr)
            for p in await self.admin.producers()
        ]

    async def consumers(self, group: str) -> list[ClientView]:
        return [
            ClientView(
                consumer_kind(c.consume_type, c.protocol),
                group,
                c.client_id,
                c.language,
                c.protocol,
                c.client_addr,
                # a 4.x consumer also subscribes to its group's retry topic: not news
                tuple(
                    sorted(t for t in c.subscriptions if not t.startswith(RETRY_GROUP_TOPIC_PREFIX))
                ),
            )
            for c in await self.admin.consumer_connections(group)
        ]
