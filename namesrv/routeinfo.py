"""RouteInfoManager: the nameserver's route tables, pure and synchronous.

Theory of operation
-------------------
Five tables, as in RocketMQ's `RouteInfoManager`:

* topicQueueTable   topic -> brokerName -> QueueData (queue counts and perm one master announced)
* brokerAddrTable   brokerName -> BrokerData (cluster, brokerId -> addr; 0 is the master)
* clusterAddrTable  cluster -> set of brokerNames
* brokerLiveTable   brokerAddr -> BrokerLiveInfo (last heard, DataVersion, channel, HA address)
* filterServerTable brokerAddr -> filter server addresses

Brokers re-register every 30 s. Only a master (brokerId 0) defines topic queues, and only when
its DataVersion moved or it registers for the first time, so the periodic heartbeat costs no
table rebuild. A slave learns its master's address and HA address from the registration result,
but only when that master is live: a slave that comes up first gets nulls and asks again on its
next registration.

A broker leaves the tables three ways: UNREGISTER_BROKER (one brokerId), expiry (not heard from
for `broker_channel_expired_time`, found by `scan_not_active_broker`), and its connection closing
(`on_channel_destroy`; BrokerLiveInfo remembers which channel registered each address). Removing
the last address of a brokerName removes that name from its cluster and its QueueData from every
topic; a topic left without QueueData disappears.

Nothing here does I/O or reads a clock itself: `now()` is injected (trio.current_time in the
service, a fake in tests) and channels are opaque objects compared by identity.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping

import attrs

from common.mixall import MASTER_ID
from common.model import DataVersion, PermName, TopicSysFlag


@attrs.frozen
class TopicQueueConfig:
    """What a master announces for one topic (the route-relevant part of TopicConfig)."""

    topic_name: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = PermName.READ | PermName.WRITE
    topic_sys_flag: int = 0


@attrs.frozen
class QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0


@attrs.frozen
class BrokerData:
    """A snapshot of one brokerName's addresses (the live table keeps its own mutable copy)."""

    cluster: str
    broker_name: str
    broker_addrs: dict[int, str]


@attrs.frozen
class TopicRoute:
    queue_datas: list[QueueData]
    broker_datas: list[BrokerData]
    filter_server_table: dict[str, list[str]]


@attrs.frozen
class RegisterBrokerResult:
    # Both set only for a slave whose master is registered and live; None otherwise.
    ha_server_addr: str | None = None
    master_addr: str | None = None


@attrs.frozen
class ClusterSnapshot:
    broker_addr_table: dict[str, BrokerData]
    cluster_addr_table: dict[str, list[str]]


@attrs.define(eq=False)
class BrokerLiveInfo:
    broker_addr: str
    last_update_timestamp: float  # seconds on the injected clock
    data_version: DataVersion  # only ever compared with ==
    channel: Hashable | None  # the connection that registered it; its closing drops the broker
    ha_server_addr: str | None


@attrs.define(eq=False)
class _BrokerEntry:
    cluster: str
    broker_name: str
    # invariant: never empty while the entry is in _broker_addr_table; one brokerId per addr
    addrs: dict[int, str] = attrs.Factory(dict)

    def snapshot(self) -> BrokerData:
        return BrokerData(self.cluster, self.broker_name, dict(sorted(self.addrs.items())))


@attrs.define(eq=False)
class RouteInfoManager:
    now: Callable[[], float]
    broker_channel_expired_time: float = 120.0
    # topic -> brokerName -> QueueData; invariant: no empty inner dict
    _topic_queue_table: dict[str, dict[str, QueueData]] = attrs.Factory(dict)
    # brokerName -> entry; invariant: every entry has at least one address
    _broker_addr_table: dict[str, _BrokerEntry] = attrs.Factory(dict)
    # cluster -> brokerNames; invariant: no empty set
    _cluster_addr_table: dict[str, set[str]] = attrs.Factory(dict)
    # brokerAddr -> liveness; an address here is (or was just) in some _BrokerEntry.addrs
    _broker_live_table: dict[str, BrokerLiveInfo] = attrs.Factory(dict)
    # brokerAddr -> filter server addresses; invariant: no empty list
    _filter_server_table: dict[str, list[str]] = attrs.Factory(dict)

    # ---------------------------------------------------------------- registration

    def register_broker(
        self,
        cluster_name: str,
        broker_addr: str,
        broker_name: str,
        broker_id: int,
        ha_server_addr: str | None,
        data_version: DataVersion,
        topic_configs: Mapping[str, TopicQueueConfig] | None,
        filter_server_list: list[str] | None,
        channel: Hashable | None,
    ) -> RegisterBrokerResult:
        self._cluster_addr_table.setdefault(cluster_name, set()).add(broker_name)

        first = False
        entry = self._broker_addr_table.get(broker_name)
        if entry is None:
            first = True
            entry = _BrokerEntry(cluster_name, broker_name)
            self._broker_addr_table[broker_name] = entry
        # One address has one role: a slave promoted to master (or the reverse) comes back
        # with the same addr and a new brokerId, and its old entry must go.
        for bid in [b for b, a in entry.addrs.items() if a == broker_addr and b != broker_id]:
            del entry.addrs[bid]
        old_addr = entry.addrs.get(broker_id)
        entry.addrs[broker_id] = broker_addr
        first = first or old_addr is None

        if topic_configs is not None and broker_id == MASTER_ID:
            if first or self.is_broker_topic_config_changed(broker_addr, data_version):
                for tc in topic_configs.values():
                    self._create_and_update_queue_data(broker_name, tc)

        self._broker_live_table[broker_addr] = BrokerLiveInfo(
            broker_addr=broker_addr,
            last_update_timestamp=self.now(),
            data_version=data_version,
            channel=channel,
            ha_server_addr=ha_server_addr,
        )
        if filter_server_list is not None:
            if filter_server_list:
                self._filter_server_table[broker_addr] = list(filter_server_list)
            else:
                self._filter_server_table.pop(broker_addr, None)

        if broker_id != MASTER_ID:
            master_addr = entry.addrs.get(MASTER_ID)
            if master_addr is not None:
                master_live = self._broker_live_table.get(master_addr)
                if master_live is not None:
                    return RegisterBrokerResult(master_live.ha_server_addr, master_addr)
        return RegisterBrokerResult()

    def _create_and_update_queue_data(self, broker_name: str, tc: TopicQueueConfig) -> None:
        qd = QueueData(
            broker_name=broker_name,
            read_queue_nums=tc.read_queue_nums,
            write_queue_nums=tc.write_queue_nums,
            perm=tc.perm,
            topic_sys_flag=tc.topic_sys_flag,
        )
        self._topic_queue_table.setdefault(tc.topic_name, {})[broker_name] = qd

    def is_broker_topic_config_changed(self, broker_addr: str, data_version: DataVersion) -> bool:
        live = self._broker_live_table.get(broker_addr)
        return live is None or live.data_version != data_version

    def query_broker_topic_config(self, broker_addr: str) -> DataVersion | None:
        """The DataVersion stored for a broker, or None when it is not registered."""
        live = self._broker_live_table.get(broker_addr)
        return None if live is None else live.data_version

    def update_broker_info_update_timestamp(self, broker_addr: str) -> None:
        """A heartbeat without re-registration (QUERY_DATA_VERSION with an unchanged version)."""
        live = self._broker_live_table.get(broker_addr)
        if live is not None:
            live.last_update_timestamp = self.now()

    def unregister_broker(
        self, cluster_name: str, broker_addr: str, broker_name: str, broker_id: int
    ) -> None:
        self._broker_live_table.pop(broker_addr, None)
        self._filter_server_table.pop(broker_addr, None)
        entry = self._broker_addr_table.get(broker_name)
        if entry is None:
            return
        # Only remove the id if it still points at this address: a late unregister from an old
        # incarnation must not evict whoever holds that brokerId now.
        if entry.addrs.get(broker_id) == broker_addr:
            del entry.addrs[broker_id]
        if not entry.addrs:
            self._remove_broker_name(broker_name, entry.cluster or cluster_name)

    # ---------------------------------------------------------------- liveness

    def scan_not_active_broker(self) -> list[BrokerLiveInfo]:
        """Drop brokers not heard from for `broker_channel_expired_time`; return what was dropped
        (the caller closes their channels)."""
        deadline = self.now() - self.broker_channel_expired_time
        expired = [
            live
            for live in self._broker_live_table.values()
            if live.last_update_timestamp < deadline
        ]
        for live in expired:
            self._broker_live_table.pop(live.broker_addr, None)
            self._destroy_addr(live.broker_addr)
        return expired

    def channel_in_use(self, channel: Hashable) -> bool:
        """Whether some live broker was registered over `channel`."""
        return any(live.channel is channel for live in self._broker_live_table.values())

    def on_channel_destroy(self, channel: Hashable) -> list[str]:
        """The connection `channel` closed: drop every broker address it registered.
        Returns the dropped addresses. A broker that re-registered over a newer connection
        carries that channel instead and is left alone."""
        addrs = [a for a, live in self._broker_live_table.items() if live.channel is channel]
        for addr in addrs:
            del self._broker_live_table[addr]
            self._destroy_addr(addr)
        return addrs

    def _destroy_addr(self, broker_addr: str) -> None:
        self._filter_server_table.pop(broker_addr, None)
        for name, entry in list(self._broker_addr_table.items()):
            for bid in [b for b, a in entry.addrs.items() if a == broker_addr]:
                del entry.addrs[bid]
            if not entry.addrs:
                self._remove_broker_name(name, entry.cluster)

    def _remove_broker_name(self, broker_name: str, cluster_name: str) -> None:
        self._broker_addr_table.pop(broker_name, None)
        names = self._cluster_addr_table.get(cluster_name)
        if names is not None:
            names.discard(broker_name)
            if not names:
                del self._cluster_addr_table[cluster_name]
        for topic in list(self._topic_queue_table):
            queues = self._topic_queue_table[topic]
            queues.pop(broker_name, None)
            if not queues:
                del self._topic_queue_table[topic]

    # ---------------------------------------------------------------- queries

    def pickup_topic_route_data(self, topic: str) -> TopicRoute | None:
        """The route of `topic`, or None when no live brokerName serves it."""
        queues = self._topic_queue_table.get(topic)
        if not queues:
            return None
        broker_datas: list[BrokerData] = []
        filter_servers: dict[str, list[str]] = {}
        for name in sorted(queues):
            entry = self._broker_addr_table.get(name)
            if entry is None:
                continue
            broker_datas.append(entry.snapshot())
            for addr in entry.addrs.values():
                servers = self._filter_server_table.get(addr)
                if servers:
                    filter_servers[addr] = list(servers)
        if not broker_datas:
            return None
        return TopicRoute(
            queue_datas=[queues[n] for n in sorted(queues)],
            broker_datas=broker_datas,
            filter_server_table=filter_servers,
        )

    def get_all_cluster_info(self) -> ClusterSnapshot:
        return ClusterSnapshot(
            broker_addr_table={n: e.snapshot() for n, e in sorted(self._broker_addr_table.items())},
            cluster_addr_table={
                c: sorted(ns) for c, ns in sorted(self._cluster_addr_table.items())
            },
        )

    def get_all_topic_list(self) -> list[str]:
        return sorted(self._topic_queue_table)

    def get_topics_by_cluster(self, cluster: str) -> list[str]:
        names = self._cluster_addr_table.get(cluster, set())
        return sorted(t for t, qs in self._topic_queue_table.items() if names.intersection(qs))

    def get_system_topic_list(self) -> tuple[list[str], str | None]:
        """Cluster names and brokerNames (each is also a system topic in RocketMQ) plus the
        address of some broker, which admin tools use to reach a broker."""
        topics: list[str] = []
        for cluster, names in sorted(self._cluster_addr_table.items()):
            topics.append(cluster)
            topics.extend(sorted(names))
        some_addr = None
        for _name, entry in sorted(self._broker_addr_table.items()):
            if entry.addrs:
                some_addr = entry.addrs[min(entry.addrs)]
                break
        return topics, some_addr

    def _topics_where(self, pred: Callable[[int], bool]) -> list[str]:
        # RocketMQ looks at the first QueueData of each topic only; we look at all of them, so
        # a topic counts when any broker marks it.
        return sorted(
            t
            for t, qs in self._topic_queue_table.items()
            if any(pred(q.topic_sys_flag) for q in qs.values())
        )

    def get_unit_topics(self) -> list[str]:
        return self._topics_where(lambda f: bool(f & TopicSysFlag.UNIT))

    def get_has_unit_sub_topic_list(self) -> list[str]:
        return self._topics_where(lambda f: bool(f & TopicSysFlag.UNIT_SUB))

    def get_has_unit_sub_ununit_topic_list(self) -> list[str]:
        return self._topics_where(
            lambda f: not f & TopicSysFlag.UNIT and bool(f & TopicSysFlag.UNIT_SUB)
        )

    def broker_live_info(self, broker_addr: str) -> BrokerLiveInfo | None:
        return self._broker_live_table.get(broker_addr)

    def live_broker_addrs(self) -> list[str]:
        return sorted(self._broker_live_table)

    # ---------------------------------------------------------------- admin

    def delete_topic(self, topic: str, cluster_name: str | None = None) -> None:
        """Forget `topic`; with `cluster_name`, only that cluster's brokers' queues."""
        if not cluster_name:
            self._topic_queue_table.pop(topic, None)
            return
        queues = self._topic_queue_table.get(topic)
        if queues is None:
            return
        for name in self._cluster_addr_table.get(cluster_name, set()):
            queues.pop(name, None)
        if not queues:
            del self._topic_queue_table[topic]

    def wipe_write_perm_of_broker(self, broker_name: str) -> int:
        """Clear the WRITE bit on every topic of `broker_name` (producers stop sending there,
        consumers keep reading). Returns the number of topics touched."""
        return self._operate_write_perm(broker_name, lambda perm: perm & ~PermName.WRITE)

    def add_write_perm_of_broker(self, broker_name: str) -> int:
        """Give `broker_name` read+write on every topic again. Returns the topic count."""
        return self._operate_write_perm(broker_name, lambda _perm: PermName.READ | PermName.WRITE)

    def _operate_write_perm(self, broker_name: str, op: Callable[[int], int]) -> int:
        count = 0
        for queues in self._topic_queue_table.values():
            qd = queues.get(broker_name)
            if qd is not None:
                queues[broker_name] = attrs.evolve(qd, perm=op(qd.perm))
                count += 1
        return count


def topic_queue_configs(items: Iterable[TopicQueueConfig]) -> dict[str, TopicQueueConfig]:
    """Index topic configs by name (test and processor convenience)."""
    return {tc.topic_name: tc for tc in items}
