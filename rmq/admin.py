"""Admin: topics, routes, clusters, offsets, groups, messages (MQAdminExt for the CLI and TUI).

Theory of operation: reads go to the nameserver (route, cluster, topic list) or to the master
of a broker name (offsets). `create_topic` sends UPDATE_AND_CREATE_TOPIC to every master of a
cluster (mqadmin updateTopic -c) or to one broker address (-b); each broker then re-registers
with the nameserver, so the route appears within one round trip of that registration.

Per-broker questions (consume stats, topic stats, group lists, connections, key queries) are
asked of every master concerned, concurrently, and the answers merged: for a topic, the
brokers of its route; for a group without a topic, every master of every cluster (a group has
no route of its own unless a push consumer made its retry topic). `delete_topic` is the two
steps of mqadmin deleteTopic: DELETE_TOPIC_IN_BROKER on each master, then
DELETE_TOPIC_IN_NAMESRV on every nameserver, so no broker re-registers the route afterwards.

Message lookup follows DefaultMQAdminExtImpl: an offset msgId names the broker (store host)
and the CommitLog offset, so VIEW_MESSAGE_BY_ID goes straight there; an id that is not the
offset id of a known broker is taken as a UNIQ_KEY and needs the topic, whose brokers are
asked with QUERY_MESSAGE (`_UNIQUE_KEY_QUERY`). Key queries drop index hash collisions.

Offset reset (`reset_offset`) is DefaultMQAdminExtImpl.resetOffsetByTimestamp: one
INVOKE_BROKER_TO_RESET_OFFSET per broker of the topic; each broker sets the group's offsets
and tells the group's live members itself (broker/broker2client.py). Requests a broker
relays to one client (running info, direct consume) wait `RELAY_TIMEOUT`, longer than the
broker waits for the client, so a silent client comes back as the broker's
CONSUME_MSG_TIMEOUT rather than as our own timeout.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import attrs
import trio

from common.errors import BrokerResponseError, RemotingError, TopicNotExistError
from common.message import MessageExt
from common.message_id import decode_offset_msg_id
from common.mixall import TOOLS_CONSUMER_GROUP
from common.model import ClusterInfo, MessageQueue, PermName, TopicConfig, TopicRouteData
from common.remoting.network import Network
from common.session_credentials import SessionCredentials
from common.topic_message_type import MESSAGE_TYPE_ATTRIBUTE
from common.topics import RETRY_GROUP_TOPIC_PREFIX, RMQ_SYS_TRACE_TOPIC
from rmq.admin_api import (
    AdminAPI,
    BrokerStatsData,
    ConsumeMessageDirectlyResult,
    ConsumerConnection,
    ConsumerRunningInfo,
    ConsumeStats,
    OffsetReset,
    ProducerInfo,
    QueueConsumeStats,
    QueueStats,
)
from rmq.client_api import PULL_SUBSCRIPTION
from rmq.client_instance import ClientBase
from rmq.errors import ClientError
from rmq.remoting import Remoting
from rmq.topic_publish_info import subscribe_queues
from rmq.trace.view import TraceView, trace_views

T = TypeVar("T")

RELAY_TIMEOUT = 12.0

__all__ = [
    "Admin",
    "ConsumeStats",
    "ConsumerConnection",
    "MessageNotFoundError",
    "OffsetReset",
    "ProducerInfo",
    "StatsRow",
    "QueueConsumeStats",
    "QueueOffsets",
    "QueueStats",
]


class MessageNotFoundError(ClientError):
    """No broker has the message asked for (by id, key or queue offset)."""


@attrs.frozen
class QueueOffsets:
    queue: MessageQueue
    min_offset: int
    max_offset: int


@attrs.frozen
class StatsRow:
    """One line of mqadmin statsAll: a topic and one of its consumer groups ("" when none)."""

    topic: str
    group: str
    accumulation: int
    in_tps: float
    out_tps: float
    in_msg_24h: int
    out_msg_24h: int


class Admin(ClientBase):
    """`async with Admin("127.0.0.1:9876") as admin: await admin.topic_list()`."""

    def __init__(
        self,
        namesrv: str | list[str] = "127.0.0.1:9876",
        *,
        remoting: Remoting | None = None,
        network: Network | None = None,
        credentials: SessionCredentials | None = None,
        timeout: float = 3.0,
    ) -> None:
        super().__init__(
            namesrv, remoting=remoting, network=network, timeout=timeout, credentials=credentials
        )
        self.timeout = timeout

    async def __aenter__(self) -> Admin:
        await super().__aenter__()
        return self

    async def cluster_info(self) -> ClusterInfo:
        client = self.client
        return await client.invoke_namesrv(
            lambda addr: client.api.get_cluster_info(addr, timeout=self.timeout)
        )

    async def topic_list(self) -> list[str]:
        client = self.client
        return await client.invoke_namesrv(
            lambda addr: client.api.get_topic_list(addr, timeout=self.timeout)
        )

    async def topic_route(self, topic: str) -> TopicRouteData:
        """The nameserver's route; TopicNotExistError (17) for an unknown topic."""
        return await self.client.fetch_route(topic)

    async def master_addrs(self, cluster: str | None = None) -> list[str]:
        """Master addresses of `cluster`, or of the only cluster there is."""
        info = await self.cluster_info()
        if cluster is None:
            if len(info.clusterAddrTable) != 1:
                names = ", ".join(sorted(info.clusterAddrTable)) or "none"
                raise ClientError(f"pass a cluster name; the nameserver knows: {names}")
            cluster = next(iter(info.clusterAddrTable))
        if cluster not in info.clusterAddrTable:
            raise ClientError(f"cluster {cluster!r} is not registered with the nameserver")
        addrs = []
        for name in sorted(info.clusterAddrTable[cluster]):
            bd = info.brokerAddrTable.get(name)
            if bd is not None and 0 in bd.brokerAddrs:
                addrs.append(bd.brokerAddrs[0])
        if not addrs:
            raise ClientError(f"cluster {cluster!r} has no live master")
        return addrs

    async def create_topic(
        self,
        topic: str,
        *,
        queues: int = 8,
        cluster: str | None = None,
        broker_addr: str | None = None,
        perm: int = PermName.READ | PermName.WRITE,
        order: bool = False,
        message_type: str | None = None,
    ) -> list[str]:
        """Create or update `topic` on one broker or on every master of a cluster;
        ``message_type``: RocketMQ 5's ``message.type`` attribute (NORMAL, FIFO, DELAY,
        TRANSACTION, MIXED), what 5.x clients may send to it."""
        from rmq.message import Message

        Message(topic, b"x").validate()  # same name rules as sending
        if queues < 1:
            raise ClientError("queues must be >= 1")
        config = TopicConfig(
            topic,
            readQueueNums=queues,
            writeQueueNums=queues,
            perm=perm,
            order=order,
            attributes={MESSAGE_TYPE_ATTRIBUTE: message_type} if message_type else None,
        )
        addrs = [broker_addr] if broker_addr else await self.master_addrs(cluster)
        for addr in addrs:
            await self.client.api.create_topic(addr, config, timeout=self.timeout)
        self.client.invalidate(topic)
        return addrs

    async def _broker(self, mq: MessageQueue) -> str:
        return await self.client.any_addr(mq.brokerName, mq.topic)

    async def max_offset(self, mq: MessageQueue) -> int:
        return await self.client.api.get_max_offset(
            await self._broker(mq), mq, timeout=self.timeout
        )

    async def min_offset(self, mq: MessageQueue) -> int:
        return await self.client.api.get_min_offset(
            await self._broker(mq), mq, timeout=self.timeout
        )

    async def consumer_offset(self, group: str, mq: MessageQueue) -> int:
        """The group's committed offset of `mq`, -1 when none."""
        addr = await self.client.master_addr(mq.brokerName, mq.topic)
        found = await self.client.api.query_consumer_offset(addr, group, mq, timeout=self.timeout)
        return -1 if found is None else found

    async def update_consumer_offset(self, group: str, mq: MessageQueue, offset: int) -> None:
        addr = await self.client.master_addr(mq.brokerName, mq.topic)
        await self.client.api.update_consumer_offset(addr, group, mq, offset, timeout=self.timeout)

    async def topic_offsets(self, topic: str) -> list[QueueOffsets]:
        """min/max offset of every readable queue (mqadmin topicStatus)."""
        route = await self.topic_route(topic)
        out = []
        for mq in subscribe_queues(topic, route):
            out.append(QueueOffsets(mq, await self.min_offset(mq), await self.max_offset(mq)))
        return out

    # --- offset reset; what brokers relay to a group's clients (Broker2Client) ---------------

    async def reset_offset(
        self, group: str, topic: str, timestamp: int, *, dry_run: bool = False
    ) -> list[OffsetReset]:
        """Move `group`'s offsets of `topic` to `timestamp` (epoch ms; -1: each queue's end,
        mqadmin skipAccumulatedMessage; 0: its first message), forced as mqadmin
        resetOffsetByTime does by default: INVOKE_BROKER_TO_RESET_OFFSET to every broker of
        the topic, which also tells the group's live members. `dry_run` changes nothing and
        computes the same offsets from SEARCH_OFFSET_BY_TIMESTAMP / GET_MAX_OFFSET.

        ClientError when the group has no offsets on `topic` (the broker refuses those too)."""
        # asked without a topic, brokers list only the topics the group has offsets on
        stats = await self.consume_stats(group)
        old = {q.queue: q.consumer_offset for q in stats.queues if q.queue.topic == topic}
        if not old:
            raise ClientError(f"consumer group {group} has no offsets on topic {topic}")
        # the committed offsets as they are (-1: none), not consume stats' max(offset, 0)
        for mq in list(old):
            old[mq] = await self.consumer_offset(group, mq)
        if dry_run:
            new: dict[MessageQueue, int] = {}
            for mq in old:
                addr = await self._broker(mq)
                api = self.client.api
                if timestamp == -1:
                    target = await api.get_max_offset(addr, mq, timeout=self.timeout)
                else:
                    target = await api.search_offset(addr, mq, timestamp, timeout=self.timeout)
                new[mq] = max(target, 0)
        else:
            admin_api = self._admin_api
            tables = await self._each(
                [addr for _, addr in await self._topic_masters(topic)],
                lambda addr: admin_api.reset_offset(
                    addr, topic, group, timestamp, True, timeout=self._relay_timeout
                ),
            )
            new = {mq: off for t in tables for mq, off in t.items()}
        return [
            OffsetReset(mq, old.get(mq, -1), new[mq])
            for mq in sorted(new, key=lambda q: (q.topic, q.brokerName, q.queueId))
        ]

    async def consumer_status(
        self, group: str, topic: str, client_id: str | None = None
    ) -> dict[str, dict[MessageQueue, int]]:
        """Each online client's in-memory offsets of `topic` (mqadmin getConsumerStatus)."""
        api = self._admin_api
        answers = await self._each(
            [addr for _, addr in await self._topic_masters(topic)],
            lambda addr: api.consumer_status(addr, topic, group, client_id, timeout=self.timeout),
        )
        merged: dict[str, dict[MessageQueue, int]] = {}
        for answer in answers:
            for cid, table in answer.items():
                merged.setdefault(cid, {}).update(table)
        return merged

    async def _group_brokers(self, group: str) -> list[str]:
        """Brokers a member of `group` heartbeats to: those of its retry topic (what
        DefaultMQAdminExtImpl asks), else every master."""
        try:
            return [addr for _, addr in await self._topic_masters(RETRY_GROUP_TOPIC_PREFIX + group)]
        except TopicNotExistError:
            return await self._all_masters()

    async def consumer_running_info(
        self, group: str, client_id: str, *, jstack: bool = False
    ) -> ConsumerRunningInfo:
        """What client `client_id` says about its consumer of `group` (GET_CONSUMER_RUNNING_INFO
        relayed by a broker it is connected to; mqadmin consumerStatus)."""
        api = self._admin_api
        last: Exception = ClientError(f"consumer group {group} has no broker to ask")
        for addr in await self._group_brokers(group):
            try:
                return await api.consumer_running_info(
                    addr, group, client_id, jstack=jstack, timeout=self._relay_timeout
                )
            except (RemotingError, BrokerResponseError) as exc:
                last = exc
        raise last

    async def consume_message_directly(
        self, group: str, client_id: str, msg_id: str
    ) -> ConsumeMessageDirectlyResult:
        """Hand the message with offset msgId `msg_id` to the listener of `client_id`
        (mqadmin consumeMessage); the broker that stored it relays it."""
        try:
            (host, port), _ = decode_offset_msg_id(msg_id.strip().upper())
        except ValueError:
            raise ClientError(f"malformed msgId {msg_id!r}: expected an offset msgId") from None
        return await self._admin_api.consume_message_directly(
            f"{host}:{port}", group, client_id, msg_id.strip().upper(), timeout=self._relay_timeout
        )

    @property
    def _relay_timeout(self) -> float:
        """What a request the broker relays to a client may take: the broker's own wait
        (10 s, Broker2Client.callClient) and a margin, so its CONSUME_MSG_TIMEOUT arrives."""
        return max(self.timeout, RELAY_TIMEOUT)

    # --- runtime, groups, stats, deletion, messages -------------------------------------------

    @property
    def _admin_api(self) -> AdminAPI:
        return AdminAPI(self.client.remoting)

    async def _each(self, addrs: list[str], call: Callable[[str], Awaitable[T]]) -> list[T]:
        """`call(addr)` for every address concurrently; results in the order of `addrs`."""
        from common.errors import unwrap_group

        results: dict[int, T] = {}

        async def one(i: int, addr: str) -> None:
            results[i] = await call(addr)

        try:
            async with trio.open_nursery() as nursery:
                for i, addr in enumerate(addrs):
                    nursery.start_soon(one, i, addr)
        except BaseExceptionGroup as group:
            raise unwrap_group(group) from None
        return [results[i] for i in range(len(addrs))]  # every call answered, or we raised

    async def _all_masters(self, cluster: str | None = None) -> list[str]:
        """Masters of `cluster`, or of every cluster when None."""
        if cluster is not None:
            return await self.master_addrs(cluster)
        info = await self.cluster_info()
        addrs = []
        for name in sorted(info.brokerAddrTable):
            addr = info.brokerAddrTable[name].brokerAddrs.get(0)
            if addr is not None:
                addrs.append(addr)
        return addrs

    async def _each_broker(
        self, cluster: str | None, call: Callable[[str], Awaitable[T]]
    ) -> list[T]:
        """`call(addr)` once per broker name of `cluster` (all clusters when None), all
        concurrently: on its master, else (no master listed, or the master does not answer)
        on its slaves in brokerId order. For reads a slave serves as well (groups, offsets,
        connections), so they go on while a master is down."""
        info = await self.cluster_info()
        if cluster is not None and cluster not in info.clusterAddrTable:
            raise ClientError(f"cluster {cluster!r} is not registered with the nameserver")
        names = info.clusterAddrTable[cluster] if cluster is not None else info.brokerAddrTable
        nodes = []
        for name in sorted(names):
            bd = info.brokerAddrTable.get(name)
            if bd is not None and bd.brokerAddrs:
                nodes.append([bd.brokerAddrs[i] for i in sorted(bd.brokerAddrs)])

        async def first_answer(addrs: list[str]) -> T:
            for addr in addrs[:-1]:
                try:
                    return await call(addr)
                except RemotingError:  # gone or not answering: the next member
                    continue
            return await call(addrs[-1])

        return await self._each(
            [str(i) for i in range(len(nodes))], lambda i: first_answer(nodes[int(i)])
        )

    async def _topic_masters(self, topic: str) -> list[tuple[str, str]]:
        """(broker name, address) of each broker of `topic`'s route: the master, else any node
        (a slave still answers reads when its master is gone)."""
        route = await self.topic_route(topic)
        out = []
        for bd in sorted(route.brokerDatas, key=lambda b: b.brokerName):
            if bd.brokerAddrs:
                out.append(
                    (bd.brokerName, bd.brokerAddrs.get(0) or bd.brokerAddrs[min(bd.brokerAddrs)])
                )
        return out

    async def broker_runtime_info(self, addr: str) -> dict[str, str]:
        """GET_BROKER_RUNTIME_INFO of the broker at `addr` (mqadmin brokerStatus)."""
        return await self._admin_api.broker_runtime_info(addr, timeout=self.timeout)

    async def group_list(self, cluster: str | None = None) -> list[str]:
        """Subscription groups known to the brokers of `cluster` (all clusters when None): a
        master's, or its slave's while it is down."""
        api = self._admin_api
        lists = await self._each_broker(
            cluster, lambda addr: api.subscription_groups(addr, timeout=self.timeout)
        )
        return sorted({g for groups in lists for g in groups})

    async def offset_topics_by_group(
        self, cluster: str | None = None, *, topic: str | None = None
    ) -> dict[str, set[str]]:
        """group -> the topics it has consumer offsets for, over the brokers of `cluster` (all
        clusters when None), or with `topic` over that topic's brokers and for it alone."""
        api = self._admin_api

        def ask(addr: str) -> Awaitable[dict[str, set[str]]]:
            return api.offset_topics_by_group(addr, timeout=self.timeout)

        if topic is not None:
            answers = await self._each([a for _, a in await self._topic_masters(topic)], ask)
        else:
            answers = await self._each_broker(cluster, ask)
        merged: dict[str, set[str]] = {}
        for answer in answers:
            for group, topics in answer.items():
                if topic is None or topic in topics:
                    merged.setdefault(group, set()).update({topic} if topic else topics)
        return merged

    async def consume_stats(self, group: str, topic: str | None = None) -> ConsumeStats:
        """The group's per-queue progress (mqadmin consumerProgress): broker offset, consumer
        offset, last consumed store time and lag; over `topic`'s brokers or every broker (its
        master, or its slave while the master is down)."""
        api = self._admin_api

        def ask(addr: str) -> Awaitable[tuple[float, list[QueueConsumeStats]]]:
            return api.consume_stats(addr, group, topic, timeout=self.timeout)

        if topic is not None:
            answers = await self._each([a for _, a in await self._topic_masters(topic)], ask)
        else:
            answers = await self._each_broker(None, ask)
        queues = sorted(
            (q for _, qs in answers for q in qs),
            key=lambda q: (q.queue.topic, q.queue.brokerName, q.queue.queueId),
        )
        return ConsumeStats(group, tuple(queues), sum(tps for tps, _ in answers))

    async def consumer_connections(self, group: str) -> list[ConsumerConnection]:
        """Online clients of `group` as the brokers see them (a master, or its slave while it
        is down), one entry per client id."""
        api = self._admin_api
        answers = await self._each_broker(
            None, lambda addr: api.consumer_connections(addr, group, timeout=self.timeout)
        )
        seen: dict[str, ConsumerConnection] = {}
        for conns in answers:
            for c in conns:
                seen.setdefault(c.client_id, c)
        return [seen[k] for k in sorted(seen)]

    async def topic_stats(self, topic: str) -> list[QueueStats]:
        """Per queue min/max offset and last update time (mqadmin topicStatus)."""
        api = self._admin_api
        brokers = await self._topic_masters(topic)
        answers = await self._each(
            [addr for _, addr in brokers],
            lambda addr: api.topic_stats(addr, topic, timeout=self.timeout),
        )
        return sorted(
            (q for qs in answers for q in qs),
            key=lambda q: (q.queue.brokerName, q.queue.queueId),
        )

    async def delete_topic(self, topic: str, cluster: str | None = None) -> list[str]:
        """Delete `topic` from every master of `cluster` (else of its route) and from every
        nameserver; returns the broker addresses it was deleted on.

        TopicNotExistError when no cluster is given and the nameserver has no route."""
        api = self._admin_api
        if cluster is not None:
            addrs = await self.master_addrs(cluster)
        else:
            addrs = [addr for _, addr in await self._topic_masters(topic)]
        await self._each(
            addrs, lambda addr: api.delete_topic_in_broker(addr, topic, timeout=self.timeout)
        )
        for ns in self.client.namesrv_addrs:
            await api.delete_topic_in_namesrv(ns, topic, cluster, timeout=self.timeout)
        self.client.invalidate(topic)
        return addrs

    async def query_message_by_key(
        self, topic: str, key: str, max_num: int = 32
    ) -> list[MessageExt]:
        """Messages of `topic` whose KEYS hold `key` (mqadmin queryMsgByKey), oldest first."""
        return await self._query(topic, key, max_num, unique=False)

    async def _query(self, topic: str, key: str, max_num: int, *, unique: bool) -> list[MessageExt]:
        api = self._admin_api
        brokers = await self._topic_masters(topic)
        answers = await self._each(
            [addr for _, addr in brokers],
            lambda addr: api.query_message(
                addr, topic, key, max_num, unique=unique, timeout=self.timeout
            ),
        )
        found: list[MessageExt] = []
        for msgs in answers:
            for m in msgs:
                # the index is a hash table: drop other keys (and other topics) that collide
                if m.topic != topic:
                    continue
                if unique and m.uniq_key != key:
                    continue
                if not unique and key not in (m.keys or "").split(" "):
                    continue
                found.append(m)
        found.sort(key=lambda m: (m.store_timestamp, m.commit_log_offset))
        return found[:max_num] if not unique else found

    async def query_trace(
        self, msg_id: str, trace_topic: str | None = None, max_num: int = 64
    ) -> list[TraceView]:
        """The trace records of message `msg_id` (its UNIQ_KEY) that traced clients wrote to
        `trace_topic` (default RMQ_SYS_TRACE_TOPIC), oldest first; [] when the trace topic
        does not exist. See rmq/trace/."""
        topic = trace_topic or RMQ_SYS_TRACE_TOPIC
        try:
            found = await self._query(topic, msg_id, max_num, unique=False)
        except TopicNotExistError:
            return []
        return trace_views(msg_id, found)

    async def view_message(self, msg_id: str, topic: str | None = None) -> MessageExt:
        """The message with offset msgId or UNIQ_KEY `msg_id` (a UNIQ_KEY needs `topic`).

        ClientError for a malformed id, MessageNotFoundError when no broker has it."""
        given, msg_id = msg_id, msg_id.strip().upper()
        try:
            (host, port), phys = decode_offset_msg_id(msg_id)
        except ValueError:
            raise ClientError(
                f"malformed msgId {given!r}: expected 32 hex characters "
                "(an offset msgId or a UNIQ_KEY)"
            ) from None
        addr = f"{host}:{port}"
        known = await self._known_broker_addrs()
        if addr in known:
            try:
                return await self._admin_api.view_message(addr, phys, timeout=self.timeout)
            except (RemotingError, ClientError, ValueError) as exc:
                if topic is None:
                    raise MessageNotFoundError(f"no message with msgId {msg_id}: {exc}") from None
        elif topic is None:
            raise ClientError(
                f"msgId {msg_id} is not the offset msgId of a broker the nameserver knows; "
                "if it is a message's UNIQ_KEY, give its topic"
            )
        from common.errors import BrokerResponseError

        try:
            found = await self._query(topic, msg_id, 32, unique=True)
        except BrokerResponseError as exc:
            if isinstance(exc, TopicNotExistError):
                raise
            found = []
        if not found:
            raise MessageNotFoundError(f"no message with msgId {msg_id} in topic {topic}")
        return found[0]

    async def _known_broker_addrs(self) -> set[str]:
        info = await self.cluster_info()
        return {a for bd in info.brokerAddrTable.values() for a in bd.brokerAddrs.values()}

    async def message_at(self, mq: MessageQueue, offset: int) -> MessageExt:
        """The message at `offset` of `mq` (mqadmin queryMsgByOffset: pull one, no commit)."""
        if offset < 0:
            raise ClientError(f"offset must be >= 0, not {offset}")
        addr = await self._broker(mq)
        resp = await self.client.api.pull_message(
            addr,
            group=TOOLS_CONSUMER_GROUP,
            mq=mq,
            offset=offset,
            max_nums=1,
            sys_flag=PULL_SUBSCRIPTION,
            commit_offset=0,
            suspend_ms=0,
            subscription="*",
            sub_version=0,
            timeout=self.timeout,
        )
        for m in resp.messages:
            if m.queue_offset == offset:
                return m
        raise MessageNotFoundError(
            f"no message at offset {offset} of {mq.topic} {mq.brokerName}:{mq.queueId} "
            f"(the queue holds offsets {resp.min_offset}..{max(resp.max_offset - 1, resp.min_offset)})"
            if resp.max_offset > resp.min_offset
            else f"no message at offset {offset} of {mq.topic} {mq.brokerName}:{mq.queueId} "
            "(the queue is empty)"
        )

    # --- operations: broker config, producers, groups, write permission, stats ----------------

    async def _cluster_addrs(self, cluster: str | None) -> list[str]:
        """Every broker (masters and slaves) of `cluster` (or of the only cluster there is)."""
        info = await self.cluster_info()
        masters = await self.master_addrs(cluster)
        names = {
            n
            for n, bd in info.brokerAddrTable.items()
            if set(bd.brokerAddrs.values()) & set(masters)
        }
        return [
            addr
            for name in sorted(names)
            for _, addr in sorted(info.brokerAddrTable[name].brokerAddrs.items())
        ]

    async def broker_config(self, addr: str) -> tuple[dict[str, str], str]:
        """GET_BROKER_CONFIG of the broker at `addr`: (properties, DataVersion JSON)."""
        return await self._admin_api.broker_config(addr, timeout=self.timeout)

    async def update_broker_config(
        self,
        props: dict[str, str],
        *,
        broker_addr: str | None = None,
        cluster: str | None = None,
    ) -> list[tuple[str, str | None]]:
        """UPDATE_BROKER_CONFIG on one broker or every broker (masters and slaves) of a cluster,
        as mqadmin updateBrokerConfig -b / -c; (address, the broker's remark) per broker."""
        if not props:
            raise ClientError("nothing to set: pass KEY=VALUE")
        api = self._admin_api
        addrs = [broker_addr] if broker_addr else await self._cluster_addrs(cluster)
        remarks = await self._each(
            addrs, lambda addr: api.update_broker_config(addr, props, timeout=self.timeout)
        )
        return list(zip(addrs, remarks, strict=True))

    async def producers(self, group: str | None = None) -> list[ProducerInfo]:
        """Producer clients the masters see (GET_ALL_PRODUCER_INFO), one per group and client id."""
        api = self._admin_api
        answers = await self._each(
            await self._all_masters(),
            lambda addr: api.all_producer_info(addr, timeout=self.timeout),
        )
        seen: dict[tuple[str, str], ProducerInfo] = {}
        for infos in answers:
            for p in infos:
                if group is None or p.group == group:
                    key = (p.group, p.client_id)
                    if key not in seen or p.last_update_timestamp > seen[key].last_update_timestamp:
                        seen[key] = p
        return [seen[k] for k in sorted(seen)]

    async def create_group(
        self,
        group: str,
        *,
        cluster: str | None = None,
        broker_addr: str | None = None,
        retry_max_times: int = 16,
        retry_queue_nums: int = 1,
        consume_broadcast: bool = True,
        consume_enable: bool = True,
        consume_message_orderly: bool = False,
    ) -> list[str]:
        """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP on one broker or every master of a cluster
        (mqadmin updateSubGroup); the addresses it was created on.  ``consume_message_orderly``
        is RocketMQ 5's consumeMessageOrderly: pop serves the group in FIFO order."""
        if not group or len(group) > 255:
            raise ClientError("a group name is 1 to 255 characters")
        if retry_max_times < 0 or retry_queue_nums < 1:
            raise ClientError("retry-max-times must be >= 0 and retry-queues >= 1")
        config: dict[str, object] = {
            "groupName": group,
            "consumeEnable": consume_enable,
            "consumeFromMinEnable": True,
            "consumeBroadcastEnable": consume_broadcast,
            "retryQueueNums": retry_queue_nums,
            "retryMaxTimes": retry_max_times,
            "brokerId": 0,
            "whichBrokerWhenConsumeSlowly": 1,
            "notifyConsumerIdsChangedEnable": True,
            "consumeMessageOrderly": consume_message_orderly,
        }
        api = self._admin_api
        addrs = [broker_addr] if broker_addr else await self.master_addrs(cluster)
        await self._each(
            addrs, lambda addr: api.create_subscription_group(addr, config, timeout=self.timeout)
        )
        return addrs

    async def delete_group(
        self,
        group: str,
        *,
        cluster: str | None = None,
        broker_addr: str | None = None,
        remove_offset: bool = True,
    ) -> list[str]:
        """DELETE_SUBSCRIPTIONGROUP on one broker or every master of a cluster; with a cluster
        also its %RETRY% and %DLQ% topics, as mqadmin deleteSubGroup -c does."""
        api = self._admin_api
        addrs = [broker_addr] if broker_addr else await self.master_addrs(cluster)
        await self._each(
            addrs,
            lambda addr: api.delete_subscription_group(
                addr, group, remove_offset, timeout=self.timeout
            ),
        )
        if broker_addr is None:
            from common.topics import dlq_topic, retry_topic

            for topic in (retry_topic(group), dlq_topic(group)):
                try:
                    await self.delete_topic(topic, cluster)
                except (TopicNotExistError, RemotingError):
                    pass  # no such topic: nothing to delete
        return addrs

    async def write_perm(self, broker_name: str, *, wipe: bool) -> list[tuple[str, int]]:
        """mqadmin wipeWritePerm / addWritePerm: on every nameserver, (address, topics changed)."""
        api = self._admin_api
        out = []
        for ns in self.client.namesrv_addrs:
            count = await api.write_perm_of_broker(ns, broker_name, wipe=wipe, timeout=self.timeout)
            out.append((ns, count))
        return out

    async def broker_stats(self, addr: str, name: str, key: str) -> BrokerStatsData | None:
        return await self._admin_api.broker_stats(addr, name, key, timeout=self.timeout)

    async def stats_all(
        self, topic: str | None = None, *, include_system: bool = False
    ) -> list[StatsRow]:
        """mqadmin statsAll: per topic and consumer group, the accumulation, in/out TPS over
        the last minute and messages in/out over the last 24 hours, summed over the masters."""
        from common.topics import (
            DLQ_GROUP_TOPIC_PREFIX,
            RETRY_GROUP_TOPIC_PREFIX,
            is_system_topic,
        )

        if topic is not None:
            topics = [topic]
        else:
            info = await self.cluster_info()
            own = set(info.clusterAddrTable) | set(info.brokerAddrTable)
            topics = [
                t
                for t in await self.topic_list()
                if not t.startswith((RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX))
                and (include_system or not is_system_topic(t, own))
            ]
        rows: list[StatsRow] = []
        for t in sorted(topics):
            rows.extend(await self._topic_stats_rows(t))
        return rows

    async def _topic_stats_rows(self, topic: str) -> list[StatsRow]:
        api = self._admin_api
        route = await self.topic_route(topic)
        masters = sorted(bd.brokerAddrs[0] for bd in route.brokerDatas if 0 in bd.brokerAddrs)

        async def stats(name: str, key: str) -> tuple[float, int]:
            answers = await self._each(
                masters, lambda addr: api.broker_stats(addr, name, key, timeout=self.timeout)
            )
            found = [a for a in answers if a is not None]
            return sum(a.minute.tps for a in found), sum(a.sum_24h() for a in found)

        in_tps, in_24h = await stats("TOPIC_PUT_NUMS", topic)
        groups: set[str] = set()
        for addr in masters:
            groups.update(await api.consume_by_who(addr, topic, timeout=self.timeout))
        if not groups:
            return [StatsRow(topic, "", 0, in_tps, 0.0, in_24h, 0)]
        rows = []
        for group in sorted(groups):
            out_tps, out_24h = await stats("GROUP_GET_NUMS", f"{topic}@{group}")
            consume = await self.consume_stats(group, topic)
            rows.append(StatsRow(topic, group, consume.lag, in_tps, out_tps, in_24h, out_24h))
        return rows

    async def group_config(self, group: str) -> dict[str, Any] | None:
        """The group's SubscriptionGroupConfig as the first master that has it holds it."""
        api = self._admin_api
        tables = await self._each(
            await self._all_masters(),
            lambda addr: api.subscription_group_configs(addr, timeout=self.timeout),
        )
        return next((t[group] for t in tables if group in t), None)
