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
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import attrs
import trio

from common.errors import RemotingError, TopicNotExistError
from common.message import MessageExt
from common.message_id import decode_offset_msg_id
from common.mixall import TOOLS_CONSUMER_GROUP
from common.model import ClusterInfo, MessageQueue, PermName, TopicConfig, TopicRouteData
from common.remoting.network import Network
from common.session_credentials import SessionCredentials
from rmq.admin_api import (
    AdminAPI,
    ConsumerConnection,
    ConsumeStats,
    QueueConsumeStats,
    QueueStats,
)
from rmq.client_api import PULL_SUBSCRIPTION
from rmq.client_instance import ClientBase
from rmq.errors import ClientError
from rmq.remoting import Remoting
from rmq.topic_publish_info import subscribe_queues

T = TypeVar("T")

__all__ = [
    "Admin",
    "ConsumeStats",
    "ConsumerConnection",
    "MessageNotFoundError",
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
    ) -> list[str]:
        """Create or update `topic` on one broker or on every master of a cluster."""
        from rmq.message import Message

        Message(topic, b"x").validate()  # same name rules as sending
        if queues < 1:
            raise ClientError("queues must be >= 1")
        config = TopicConfig(
            topic, readQueueNums=queues, writeQueueNums=queues, perm=perm, order=order
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
