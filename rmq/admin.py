"""Admin: topics, routes, clusters, offsets (the parts of MQAdminExt the CLI needs).

Theory of operation: reads go to the nameserver (route, cluster, topic list) or to the master
of a broker name (offsets). `create_topic` sends UPDATE_AND_CREATE_TOPIC to every master of a
cluster (mqadmin updateTopic -c) or to one broker address (-b); each broker then re-registers
with the nameserver, so the route appears within one round trip of that registration.
"""

from __future__ import annotations

import attrs

from common.model import ClusterInfo, MessageQueue, PermName, TopicConfig, TopicRouteData
from rmq.client_instance import ClientBase
from rmq.errors import ClientError
from rmq.topic_publish_info import subscribe_queues


@attrs.frozen
class QueueOffsets:
    queue: MessageQueue
    min_offset: int
    max_offset: int


class Admin(ClientBase):
    """`async with Admin("127.0.0.1:9876") as admin: await admin.topic_list()`."""

    def __init__(self, namesrv: str | list[str] = "127.0.0.1:9876", *, remoting=None,
                 timeout: float = 3.0) -> None:  # fmt: skip
        super().__init__(namesrv, remoting=remoting, timeout=timeout)
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
        config = TopicConfig(topic, readQueueNums=queues, writeQueueNums=queues, perm=perm,
                             order=order)  # fmt: skip
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
