"""Slave metadata sync against a real master controller through the remoting codec (fake clock)."""

from __future__ import annotations

import json

import trio

from broker.config import BrokerConfig
from broker.controller import BrokerController
from broker.processor.dispatcher import build_dispatcher
from broker.slave_sync import SlaveSynchronize, SyncReport, run_slave_sync
from broker.store import MessageStoreConfig, run_memory_store
from common.errors import RemotingConnectError
from common.model import SubscriptionGroupConfig, TopicConfig
from common.remoting import codec
from common.remoting.codes import RequestCode
from common.remoting.command import RemotingCommand

MASTER = "127.0.0.1:10911"


class FakeChannel:
    remote_addr = "127.0.0.1:40000"
    closed = False
    attrs: dict = {}


class LoopbackClient:
    """A RemotingClient stand-in: every frame goes through the real codec to a dispatcher."""

    def __init__(self, routes):
        self.routes = routes  # addr -> dispatcher
        self.calls: list[tuple[str, int]] = []
        self.down = False

    async def invoke(self, addr, cmd, timeout=3.0):
        self.calls.append((addr, cmd.code))
        if self.down or addr not in self.routes:
            raise RemotingConnectError(f"connect to {addr} failed")
        (req,) = codec.FrameDecoder().feed(codec.encode(cmd))
        resp = await self.routes[addr].dispatch(req, FakeChannel())
        (out,) = codec.FrameDecoder().feed(codec.encode(resp))
        return out


def controller(tmp_path, name, store, **kw):
    cfg = BrokerConfig(
        broker_name="broker-a",
        store=MessageStoreConfig(
            store_path_root_dir=str(tmp_path / name),
            broker_role="SLAVE" if kw.get("broker_id") else "ASYNC_MASTER",
        ),
        **kw,
    )
    c = BrokerController(cfg, store)
    c.load()
    return c


async def start_pair(nursery, tmp_path, *, slave_port=0):
    mstore = await nursery.start(run_memory_store, MessageStoreConfig(str(tmp_path / "ms")))
    sstore = await nursery.start(
        run_memory_store, MessageStoreConfig(str(tmp_path / "ss"), broker_role="SLAVE")
    )
    master = controller(tmp_path, "m", mstore, listen_port=10911)
    slave = controller(tmp_path, "s", sstore, listen_port=slave_port, broker_id=1)
    return master, slave


async def synced(sync: SlaveSynchronize) -> SyncReport:
    """One sync_all, which runs: the slave knows its master."""
    report = await sync.sync_all()
    assert report is not None
    return report


async def test_changes_on_master_reach_slave_within_one_period(tmp_path, autojump_clock):
    async with trio.open_nursery() as n:
        master, slave = await start_pair(n, tmp_path)
        d = build_dispatcher(master)
        client = LoopbackClient({MASTER: d})
        m = master
        m.topic_config_manager.update_topic_config(TopicConfig("OrderTopic", 4, 4))
        m.consumer_offset_manager.commit_offset("cg", "OrderTopic", 1, 42)
        m.subscription_group_manager.update_subscription_group_config(
            SubscriptionGroupConfig(groupName="cg", retryMaxTimes=3)
        )
        m.schedule_service.offset_table[3] = 17
        m.schedule_service._dirty = True
        sync = await n.start(
            lambda task_status: run_slave_sync(
                slave, client, master_addr=MASTER, task_status=task_status
            )
        )
        assert isinstance(sync, SlaveSynchronize)
        await trio.sleep(2.9)
        assert client.calls == []  # the first round comes ~3 s after start
        await trio.sleep(0.2)
        s = slave
        assert s.topic_config_manager.select_topic_config("OrderTopic").readQueueNums == 4
        assert s.topic_config_manager.data_version == m.topic_config_manager.data_version
        assert s.consumer_offset_manager.query_offset("cg", "OrderTopic", 1) == 42
        assert s.subscription_group_manager.find_subscription_group_config("cg").retryMaxTimes == 3
        assert s.schedule_service.offset_table == {3: 17}
        # persisted on the slave
        cfg_dir = tmp_path / "s" / "config"
        assert "OrderTopic" in json.loads((cfg_dir / "topics.json").read_text())["topicConfigTable"]
        offsets = json.loads((cfg_dir / "consumerOffset.json").read_text())["offsetTable"]
        assert offsets["OrderTopic@cg"] == {"1": 42}
        assert json.loads((cfg_dir / "delayOffset.json").read_text()) == {"offsetTable": {"3": 17}}
        groups = json.loads((cfg_dir / "subscriptionGroup.json").read_text())
        assert "cg" in groups["subscriptionGroupTable"]
        # one request of each kind, in Java's order, all to the normal port (ephemeral ports)
        assert [c for _, c in client.calls] == [
            RequestCode.GET_ALL_TOPIC_CONFIG,
            RequestCode.GET_ALL_CONSUMER_OFFSET,
            RequestCode.GET_ALL_DELAY_OFFSET,
            RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
            RequestCode.GET_TIMER_CHECK_POINT,
        ]
        # a later change shows up within one period, not before
        m.topic_config_manager.update_topic_config(TopicConfig("Later", 2, 2))
        m.consumer_offset_manager.commit_offset("cg", "OrderTopic", 1, 99)
        await trio.sleep(59.0)
        assert s.topic_config_manager.select_topic_config("Later") is None
        await trio.sleep(1.0)
        assert s.topic_config_manager.select_topic_config("Later") is not None
        assert s.consumer_offset_manager.query_offset("cg", "OrderTopic", 1) == 99
        assert sync.rounds == 2
        n.cancel_scope.cancel()


async def test_tables_replaced_only_when_data_version_differs(tmp_path, autojump_clock):
    async with trio.open_nursery() as n:
        master, slave = await start_pair(n, tmp_path)
        client = LoopbackClient({MASTER: build_dispatcher(master)})
        master.topic_config_manager.update_topic_config(TopicConfig("A", 1, 1))
        sync = SlaveSynchronize(slave, client, vip_channel=False, master_addr=MASTER)
        first = await synced(sync)
        assert first.topics
        # a local edit on the slave with the same version is not overwritten (same version)
        slave.topic_config_manager.table["LocalOnly"] = TopicConfig("LocalOnly")
        again = await synced(sync)
        assert not again.topics and not again.groups
        assert "LocalOnly" in slave.topic_config_manager.table
        master.topic_config_manager.update_topic_config(TopicConfig("B", 1, 1))
        third = await synced(sync)
        assert third.topics
        assert "LocalOnly" not in slave.topic_config_manager.table
        assert "B" in slave.topic_config_manager.table
        n.cancel_scope.cancel()


async def test_vip_port_on_fixed_ports_and_master_from_registration(tmp_path, autojump_clock):
    async with trio.open_nursery() as n:
        master, slave = await start_pair(n, tmp_path, slave_port=10921)
        client = LoopbackClient({"127.0.0.1:10909": build_dispatcher(master)})
        client.routes[MASTER] = client.routes["127.0.0.1:10909"]
        sync = await n.start(
            lambda task_status: run_slave_sync(slave, client, task_status=task_status)
        )
        await trio.sleep(10)
        assert client.calls == []  # no master known yet: nothing is asked

        class Registrar:
            master_addr = MASTER

        slave.registrar = Registrar()
        await trio.sleep(60)
        assert sync.rounds == 1
        assert client.calls[0] == ("127.0.0.1:10909", RequestCode.GET_ALL_TOPIC_CONFIG)
        assert {a for a, _ in client.calls[1:]} == {MASTER}
        n.cancel_scope.cancel()


async def test_master_down_leaves_tables_and_next_round_recovers(tmp_path, autojump_clock):
    async with trio.open_nursery() as n:
        master, slave = await start_pair(n, tmp_path)
        client = LoopbackClient({MASTER: build_dispatcher(master)})
        master.topic_config_manager.update_topic_config(TopicConfig("A", 1, 1))
        sync = SlaveSynchronize(slave, client, vip_channel=False, master_addr=MASTER)
        client.down = True
        before = dict(slave.topic_config_manager.table)
        report = await synced(sync)
        assert len(report.errors) == 5  # every step tried on its own
        assert slave.topic_config_manager.table == before
        client.down = False
        assert (await synced(sync)).topics
        assert "A" in slave.topic_config_manager.table
        n.cancel_scope.cancel()


async def test_no_sync_against_itself(tmp_path, autojump_clock):
    async with trio.open_nursery() as n:
        master, slave = await start_pair(n, tmp_path)
        client = LoopbackClient({})
        sync = SlaveSynchronize(slave, client, master_addr=slave.broker_addr)
        assert await sync.sync_all() is None
        assert client.calls == []
        n.cancel_scope.cancel()


# --- offsets committed to the slave are handed to the master (broker/slave_sync.py doc) ------


async def commit_via(dispatcher, group, topic, queue_id, offset):
    """UPDATE_CONSUMER_OFFSET through the real codec, as a client sends it."""
    cmd = RemotingCommand.request(
        RequestCode.UPDATE_CONSUMER_OFFSET,
        {"consumerGroup": group, "topic": topic, "queueId": queue_id, "commitOffset": offset},
    )
    (req,) = codec.FrameDecoder().feed(codec.encode(cmd))
    resp = await dispatcher.dispatch(req, FakeChannel())
    assert resp.code == 0


async def start_sync(n, slave, client, online):
    sync = await n.start(
        lambda task_status: run_slave_sync(
            slave, client, master_addr=MASTER, task_status=task_status
        )
    )
    sync.master_online = lambda: online[0]
    return sync


async def test_progress_committed_to_slave_during_outage_reaches_returning_master(
    tmp_path, autojump_clock
):
    async with trio.open_nursery() as n:
        master, slave = await start_pair(n, tmp_path)
        client = LoopbackClient({MASTER: build_dispatcher(master)})
        client.down = True  # the master is gone
        online = [False]
        sync = await start_sync(n, slave, client, online)
        on_slave = build_dispatcher(slave)
        for q in range(4):
            await commit_via(on_slave, "cg", "T", q, 50 + q)
        # two periodic rounds fail against the dead master; the slave keeps the progress
        await trio.sleep(130)
        assert [slave.consumer_offset_manager.query_offset("cg", "T", q) for q in range(4)] == [
            50,
            51,
            52,
            53,
        ]
        # the master returns with no offsets for the group (4.x would now overwrite the slave)
        client.down = False
        online[0] = True
        sync.master_connected()  # what the HA client's connect listener calls
        await trio.sleep(0.5)  # far less than the 60 s period
        assert master.consumer_offset_manager.offsets_of("cg", "T") == {0: 50, 1: 51, 2: 52, 3: 53}
        assert slave.consumer_offset_manager.offsets_of("cg", "T") == {0: 50, 1: 51, 2: 52, 3: 53}
        assert sync.forwarded == 4 and sync.pending == {}
        n.cancel_scope.cancel()


async def test_commit_to_slave_with_master_up_is_forwarded_within_a_second(
    tmp_path, autojump_clock
):
    async with trio.open_nursery() as n:
        master, slave = await start_pair(n, tmp_path)
        client = LoopbackClient({MASTER: build_dispatcher(master)})
        online = [True]
        sync = await start_sync(n, slave, client, online)
        await trio.sleep(5)  # the first whole round is done
        calls = len(client.calls)
        on_slave = build_dispatcher(slave)
        await commit_via(on_slave, "cg", "T", 0, 7)
        await commit_via(on_slave, "cg", "T", 0, 9)
        await trio.sleep(1.0)
        assert master.consumer_offset_manager.query_offset("cg", "T", 0) == 9
        # only the offsets step ran: one table fetch and one hand-over, not a whole round
        assert [c for _, c in client.calls[calls:]] == [
            RequestCode.GET_ALL_CONSUMER_OFFSET,
            RequestCode.UPDATE_CONSUMER_OFFSET,
        ]
        # a burst of commits costs the master at most one forward per forward_gap
        for off in range(10, 30):
            await commit_via(on_slave, "cg", "T", 0, off)
            await trio.sleep(0.05)
        await trio.sleep(1.0)
        assert master.consumer_offset_manager.query_offset("cg", "T", 0) == 29
        fetches = [c for _, c in client.calls[calls:] if c == RequestCode.GET_ALL_CONSUMER_OFFSET]
        assert len(fetches) <= 4
        assert sync.pending == {}
        n.cancel_scope.cancel()


async def test_slave_never_moves_the_masters_offset_back(tmp_path, autojump_clock):
    async with trio.open_nursery() as n:
        master, slave = await start_pair(n, tmp_path)
        client = LoopbackClient({MASTER: build_dispatcher(master)})
        sync = SlaveSynchronize(slave, client, vip_channel=False, master_addr=MASTER)
        slave.slave_sync = sync
        await commit_via(build_dispatcher(slave), "cg", "T", 0, 30)
        master.consumer_offset_manager.commit_offset("cg", "T", 0, 50)
        await sync.sync_all()
        assert master.consumer_offset_manager.query_offset("cg", "T", 0) == 50
        assert slave.consumer_offset_manager.query_offset("cg", "T", 0) == 50
        assert sync.forwarded == 0 and sync.pending == {}
        n.cancel_scope.cancel()


async def test_refused_hand_over_keeps_the_slaves_progress_and_retries(tmp_path, autojump_clock):
    async with trio.open_nursery() as n:
        master, slave = await start_pair(n, tmp_path)
        inner = LoopbackClient({MASTER: build_dispatcher(master)})

        class RefusingUpdates:
            refuse = True

            async def invoke(self, addr, cmd, timeout=3.0):
                if self.refuse and cmd.code == RequestCode.UPDATE_CONSUMER_OFFSET:
                    raise RemotingConnectError("connection reset")
                return await inner.invoke(addr, cmd, timeout)

        client = RefusingUpdates()
        sync = SlaveSynchronize(slave, client, vip_channel=False, master_addr=MASTER)
        slave.slave_sync = sync
        master.consumer_offset_manager.commit_offset("cg", "T", 0, 5)
        await commit_via(build_dispatcher(slave), "cg", "T", 0, 40)
        await sync.sync_all()
        assert master.consumer_offset_manager.query_offset("cg", "T", 0) == 5
        # not overwritten by the master's lower value, still marked for the master
        assert slave.consumer_offset_manager.query_offset("cg", "T", 0) == 40
        assert sync.pending == {("cg", "T", 0): 40}
        client.refuse = False
        await sync.sync_all()
        assert master.consumer_offset_manager.query_offset("cg", "T", 0) == 40
        assert sync.pending == {} and sync.forwarded == 1
        n.cancel_scope.cancel()
