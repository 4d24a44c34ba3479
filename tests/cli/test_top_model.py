"""The `rmq top` collector against a fake source, on Trio's autojump clock.

The fake answers like a nameserver and brokers would; a node can be made to refuse
connections, hang (sleep past any timeout) or send a broken table. Checked: a dead or hung
node becomes an error row without stalling the frame, a node the nameserver dropped is still
shown (red), a node that comes back turns normal, rates and slave lag are computed.
"""

from __future__ import annotations

import attrs
import pytest
import trio

from cli.runtime_info.status import SlaveLag
from cli.top.model import (
    ClientView,
    GroupLag,
    NodeInfo,
    NodeView,
    QueueView,
    TopCollector,
    TopSnapshot,
    is_system_topic,
    rates,
    slave_lag,
)
from common.errors import RemotingConnectError
from common.model import BrokerData, ClusterInfo

MASTER = "127.0.0.1:10911"
SLAVE = "127.0.0.1:10921"


@attrs.define
class FakeSource:
    listed: dict[str, int] = attrs.Factory(lambda: {MASTER: 0, SLAVE: 1})
    down: set[str] = attrs.Factory(set)
    hung: set[str] = attrs.Factory(set)
    broken: set[str] = attrs.Factory(set)
    namesrv_down: bool = False
    lists_fail: bool = False
    put: int = 0
    topics: list[str] = attrs.Factory(lambda: ["Orders", "TBW102", "broker-a", "%RETRY%g1"])
    groups: list[str] = attrs.Factory(lambda: ["g1", "TOOLS_CONSUMER"])
    calls: list[str] = attrs.Factory(list)

    async def cluster_info(self) -> ClusterInfo:
        if self.namesrv_down:
            raise RemotingConnectError("127.0.0.1:9876 refused")
        return ClusterInfo(
            {
                "broker-a": BrokerData(
                    "DefaultCluster", "broker-a", {bid: addr for addr, bid in self.listed.items()}
                )
            },
            {"DefaultCluster": ["broker-a"]},
        )

    async def node_info(self, addr: str) -> NodeInfo:
        self.calls.append(addr)
        if addr in self.down:
            raise RemotingConnectError(f"{addr} refused")
        if addr in self.hung:
            await trio.sleep(3600)
        if addr in self.broken:
            return NodeInfo({"commitLogMaxOffset": "lots"}, "SLAVE")
        if addr == MASTER:
            return NodeInfo(
                {
                    "commitLogMaxOffset": "500",
                    "msgPutTotalTodayNow": str(self.put),
                    "msgGetTotalTodayNow": "4",
                    "haSlave0Addr": "127.0.0.1:50000",
                    "haSlave0AckOffset": "450",
                    "haSlave0LagBytes": "50",
                    "haSlave0LagMillis": "20",
                },
                "SYNC_MASTER",
            )
        return NodeInfo({"commitLogMaxOffset": "450", "haClientReportedOffset": "450"}, "SLAVE")

    async def topic_list(self) -> list[str]:
        if self.lists_fail:
            raise RuntimeError("kaboom")
        return self.topics

    async def topic_queues(self, topic: str) -> list[QueueView]:
        return [QueueView("broker-a", 1, 7), QueueView("broker-a", 0, 5)]

    async def group_list(self) -> list[str]:
        if self.lists_fail:
            raise RuntimeError("kaboom")
        return self.groups

    async def group_lag(self, group: str) -> GroupLag:
        if group == "g2":
            raise RemotingConnectError("gone")
        return GroupLag(("Orders",), 3, 2, inflight=4)  # a pop group: 4 popped, not acked

    async def producers(self) -> list[ClientView]:
        if self.lists_fail:
            raise RuntimeError("kaboom")
        return [
            # a 5.x producer is registered under a group named after its topic
            ClientView("producer", "Orders", "h@2@0@x", "PYTHON", "GRPC_V2", "127.0.0.1:4002"),
            ClientView("producer", "pg", "h@1", "CPP", "REMOTING", "127.0.0.1:4001"),
            ClientView("producer", "CID_RMQ_SYS_TRANS", "h@1", "CPP", "REMOTING", "x:1"),
        ]

    async def consumers(self, group: str) -> list[ClientView]:
        if group == "g2":
            raise RemotingConnectError("gone")
        return [
            ClientView("simple consumer", group, "h@3@0@y", "PYTHON", "GRPC_V2", "x:3", ("Orders",))
        ]


async def test_collects_nodes_topics_groups_without_system_ones(autojump_clock):
    collector = TopCollector(FakeSource(), "127.0.0.1:9876")
    snap = await collector.collect()
    assert [(n.broker_id, n.addr, n.role, n.max_offset) for n in snap.nodes] == [
        (0, MASTER, "SYNC_MASTER", 500),
        (1, SLAVE, "SLAVE", 450),
    ]
    assert all(n.alive and n.listed for n in snap.nodes)
    assert [t.topic for t in snap.topics] == ["Orders"]
    assert [q.queue_id for q in snap.topics[0].queues] == [0, 1]  # sorted
    assert snap.topics[0].total == 12
    # lag = ready + inflight
    assert [(g.group, g.lag, g.ready, g.inflight, g.queues) for g in snap.groups] == [
        ("g1", 7, 3, 4, 2)
    ]
    lag = slave_lag(snap.master_of(snap.nodes[1]), snap.nodes[1])
    assert (lag.bytes, lag.ms) == (50, 20)


async def test_show_system_keeps_them():
    snap = await TopCollector(FakeSource(), "ns", show_system=True).collect()
    assert {t.topic for t in snap.topics} == {"Orders", "TBW102", "broker-a", "%RETRY%g1"}
    assert {g.group for g in snap.groups} == {"g1", "TOOLS_CONSUMER"}


async def test_hung_node_costs_one_timeout_and_others_still_show(autojump_clock):
    source = FakeSource(hung={SLAVE})
    collector = TopCollector(source, "ns", timeout=2.0)
    start = trio.current_time()
    snap = await collector.collect()
    assert trio.current_time() - start == pytest.approx(2.0)
    master, slave = snap.nodes
    assert master.alive and master.max_offset == 500
    assert not slave.alive and slave.error == "timeout" and slave.listed


async def test_node_dropped_by_nameserver_stays_red_then_comes_back(autojump_clock):
    source = FakeSource()
    collector = TopCollector(source, "ns")
    assert all(n.alive for n in (await collector.collect()).nodes)
    # the slave dies: its connection closes and the nameserver forgets it at once
    source.down.add(SLAVE)
    del source.listed[SLAVE]
    snap = await collector.collect()
    slave = snap.node(SLAVE)
    assert slave is not None and not slave.alive and not slave.listed
    assert slave.error == "down (connection refused)"
    assert (slave.broker_name, slave.broker_id) == ("broker-a", 1)  # remembered identity
    assert slave.role == "SLAVE"  # and role
    # it restarts and registers again
    source.down.clear()
    source.listed[SLAVE] = 1
    slave = (await collector.collect()).node(SLAVE)
    assert slave is not None and slave.alive and slave.listed


async def test_nameserver_down_keeps_known_nodes_and_says_so(autojump_clock):
    source = FakeSource()
    collector = TopCollector(source, "ns")
    await collector.collect()
    source.namesrv_down = True
    snap = await collector.collect()
    assert snap.namesrv_error == "down (connection refused)"
    assert [n.addr for n in snap.nodes] == [MASTER, SLAVE]
    assert all(n.alive for n in snap.nodes)
    assert snap.topics == () and snap.groups == ()
    # never seen any node: an empty snapshot with the error, no exception
    empty = await TopCollector(source, "ns").collect()
    assert empty.nodes == () and empty.namesrv_error


async def test_broken_table_and_failing_group_are_errors_of_their_row(autojump_clock):
    source = FakeSource(broken={SLAVE}, groups=["g1", "g2"])
    snap = await TopCollector(source, "ns").collect()
    master, slave = snap.node(MASTER), snap.node(SLAVE)
    assert master is not None and master.alive
    assert slave is not None and slave.error is not None and "not an integer" in slave.error
    assert [(g.group, g.error) for g in snap.groups] == [
        ("g1", None),
        ("g2", "down (connection refused)"),
    ]


async def test_list_errors_are_reported(autojump_clock):
    source = FakeSource(lists_fail=True)
    snap = await TopCollector(source, "ns").collect()
    assert (snap.topics_error, snap.groups_error) == ("kaboom", "kaboom")


async def test_limits_hide_the_rest(autojump_clock):
    source = FakeSource(topics=[f"T{i}" for i in range(5)], groups=[f"g{i}" for i in (1, 3, 4)])
    snap = await TopCollector(source, "ns", max_topics=2, max_groups=1).collect()
    assert [t.topic for t in snap.topics] == ["T0", "T1"] and snap.hidden_topics == 3
    assert [g.group for g in snap.groups] == ["g1"] and snap.hidden_groups == 2


async def test_rates_from_counters(autojump_clock):
    source = FakeSource(put=100)
    collector = TopCollector(source, "ns")
    first = await collector.collect()
    await trio.sleep(2)
    source.put = 300
    second = await collector.collect()
    r = rates(second, first)[MASTER]
    assert r.send_tps == pytest.approx(100.0) and r.pull_tps == 0
    assert rates(second, None)[MASTER].send_tps is None
    source.put = 5  # restarted broker: counter went down
    await trio.sleep(1)
    assert rates(await collector.collect(), second)[MASTER].send_tps is None


def test_slave_lag_fallbacks():
    master = NodeView(
        "c",
        "b",
        0,
        "10.0.0.1:10911",
        max_offset=1000,
        slaves=(SlaveLag("10.0.0.2:5000", 900, 100, 7), SlaveLag("10.0.0.2:5001", 950, 50, 3)),
    )
    # two connections from the slave's host: the one whose ack is what the slave reported
    slave = NodeView("c", "b", 2, "10.0.0.2:10921", max_offset=960, ha_reported_offset=950)
    assert slave_lag(master, slave) == slave_lag(master, slave)
    assert (slave_lag(master, slave).bytes, slave_lag(master, slave).ms) == (50, 3)
    # no matching connection: the difference of max offsets, time unknown
    other = NodeView("c", "b", 1, "10.0.0.3:10921", max_offset=990)
    assert (slave_lag(master, other).bytes, slave_lag(master, other).ms) == (10, None)
    assert slave_lag(None, other).bytes is None
    dead = attrs.evolve(master, error="timeout")
    assert slave_lag(dead, other).bytes is None


def test_system_topic_names():
    assert is_system_topic("TBW102") and is_system_topic("%DLQ%g") and is_system_topic("x", {"x"})
    assert not is_system_topic("Orders", {"broker-a", "DefaultCluster"})


def test_snapshot_lookup():
    snap = TopSnapshot("ns", 0.0, 0.0, (NodeView("c", "b", 1, "a:1"),))
    assert snap.node("a:1") is not None and snap.node("a:2") is None
    assert snap.master_of(snap.nodes[0]) is None


async def test_clients_are_producers_then_consumers_5x_among_them(autojump_clock):
    snap = await TopCollector(FakeSource(), "ns").collect()
    assert [(c.kind, c.group, c.language, c.protocol, c.is_5x) for c in snap.clients] == [
        ("producer", "Orders", "PYTHON", "GRPC_V2", True),
        ("producer", "pg", "CPP", "REMOTING", False),  # the system producer group is left out
        ("simple consumer", "g1", "PYTHON", "GRPC_V2", True),
    ]
    assert snap.clients_error is None
    failing = await TopCollector(FakeSource(lists_fail=True), "ns").collect()
    assert failing.clients == () and failing.clients_error == "kaboom"


def test_consumer_kind_from_consume_type_and_protocol():
    from cli.top.model import consumer_kind

    assert consumer_kind("CONSUME_PASSIVELY", "GRPC_V2") == "push consumer"
    assert consumer_kind("CONSUME_ACTIVELY", "GRPC_V2") == "simple consumer"
    assert consumer_kind("CONSUME_ACTIVELY", "REMOTING") == "pull consumer"
