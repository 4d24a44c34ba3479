"""Brokers in DLedger mode: configuration, and whole groups on the in-memory networks."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from broker.config import BrokerConfig
from broker.dledger.driver.memory_transport import MemoryDLedgerNetwork
from broker.dledger.driver.node import DLedgerNode, run_dledger_node
from broker.dledger.driver.node_config import DLedgerConfig
from broker.dledger.driver.node_storage import MemoryStorage
from broker.dledger.raft.log import MemoryLog
from broker.dledger.raft.messages import Role
from broker.service import BrokerHandle, dledger_broker_config, dledger_node_config, run_broker
from broker.store import MessageStoreConfig, PutMessageResult, PutMessageStatus, run_memory_store
from common.errors import RmqError
from common.message import decode_record
from namesrv.config import NamesrvConfig
from namesrv.service import NamesrvHandle, run_namesrv
from rmq import Admin, Message, Producer, SendStatus
from tests.support.memory_network import MemoryNetwork

PEERS = "n0-127.0.0.1:40911;n1-127.0.0.1:40912;n2-127.0.0.1:40913"


# --- configuration ------------------------------------------------------------------------------


def test_dledger_keys_are_read_by_their_rocketmq_names():
    config = BrokerConfig.from_properties(
        f"""
        brokerName=RaftNode00
        brokerRole=ASYNC_MASTER
        brokerId=7
        enableDLegerCommitLog=true
        dLegerGroup=RaftNode00
        dLegerPeers={PEERS}
        dLegerSelfId=n1
        preferredLeaderId=n2
        storePathRootDir=/tmp/rmq
        storePathDLedgerCommitLog=/tmp/rmq/raft
        isEnableBatchPush=true
        heartBeatTimeIntervalMs=500
        maxHeartBeatLeak=4
        minVoteIntervalMs=100
        maxVoteIntervalMs=200
        maxWaitAckTimeMs=1500
        maxPushTimeOutMs=700
        dLegerSlaveSyncInterval=2000
        """
    )
    s = config.store
    assert config.dledger and s.enable_dleger_commit_log
    assert (s.dleger_group, s.dleger_self_id, s.preferred_leader_id) == ("RaftNode00", "n1", "n2")
    assert s.dledger_peer_map() == {
        "n0": "127.0.0.1:40911",
        "n1": "127.0.0.1:40912",
        "n2": "127.0.0.1:40913",
    }
    # RocketMQ's meaning: the data files' directory; the member's own files stay in the root
    assert s.dledger_data_dir == "/tmp/rmq/raft" and s.enable_batch_push
    assert (s.heart_beat_time_interval_ms, s.max_heart_beat_leak) == (500, 4)
    assert (s.min_vote_interval_ms, s.max_vote_interval_ms) == (100, 200)
    assert (s.max_wait_ack_time_ms, s.max_push_time_out_ms) == (1500, 700)
    assert config.dledger_slave_sync_interval == 2.0
    # the role is the Raft role's, so brokerRole/brokerId rules are not applied
    assert config.broker_id == 7


def test_batch_push_is_on_unless_broker_conf_says_otherwise():
    """DLedger's default is off; a DLedger 0.3.1.2 follower takes batch pushes whatever its own
    setting, so a plain broker.conf gets the fast one (broker/config.py)."""
    plain = f"enableDLegerCommitLog=true\ndLegerPeers={PEERS}\ndLegerSelfId=n0\nbrokerName=b\n"
    assert BrokerConfig.from_properties(plain).store.enable_batch_push
    off = BrokerConfig.from_properties(plain + "isEnableBatchPush=false\n")
    assert not off.store.enable_batch_push
    member = DLedgerConfig.from_store_config(BrokerConfig.from_properties(plain).store, group="b")
    assert member.core_config().enable_batch_push


def test_dledger_defaults_are_dledgers():
    config = BrokerConfig.from_properties(
        f"enableDLegerCommitLog=true\ndLegerPeers={PEERS}\ndLegerSelfId=n0\nbrokerName=b\n"
        "storePathRootDir=/data\nenableBatchPush=false\n"
    )
    s = config.store
    assert (s.dledger_member_dir, s.dledger_data_dir) == (
        "/data/dledger-n0",
        "/data/dledger-n0/data",
    )
    assert (s.heart_beat_time_interval_ms, s.max_heart_beat_leak) == (2000, 3)
    assert (s.min_vote_interval_ms, s.max_vote_interval_ms) == (300, 1000)
    assert (s.max_wait_ack_time_ms, s.max_push_time_out_ms) == (2500, 1000)
    assert not s.enable_batch_push and s.preferred_leader_id is None
    assert config.dledger_slave_sync_interval == 5.0
    # the group defaults to the broker name when run
    assert dledger_broker_config(config).store.dleger_group == "b"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("dLegerPeers=n0-127.0.0.1", "dLegerPeers"),
        ("dLegerPeers=n0-127.0.0.1:99999", "dLegerPeers"),
        ("dLegerPeers=a-127.0.0.1:1", "member id"),
        ("dLegerPeers=n0-h:1;n0-h:2", "listed twice"),
        ("dLegerSelfId=zero", "dLegerSelfId"),
        ("heartBeatTimeIntervalMs=0", "heartBeatTimeIntervalMs"),
        ("maxVoteIntervalMs=-5", "maxVoteIntervalMs"),
        ("maxWaitAckTimeMs=soon", "maxWaitAckTimeMs"),
        ("isEnableBatchPush=yes", "isEnableBatchPush"),
        ("enableDLegerCommitLog=1", "enableDLegerCommitLog"),
        (f"enableDLegerCommitLog=true\ndLegerPeers={PEERS}\ndLegerSelfId=n5", "not one of"),
        (
            f"enableDLegerCommitLog=true\ndLegerPeers={PEERS}\ndLegerSelfId=n0\n"
            "preferredLeaderId=n9",
            "preferredLeaderId",
        ),
        (
            f"enableDLegerCommitLog=true\ndLegerPeers={PEERS}\ndLegerSelfId=n0\n"
            "minVoteIntervalMs=900\nmaxVoteIntervalMs=800",
            "minVoteIntervalMs",
        ),
    ],
)
def test_bad_dledger_values_are_config_errors(text, message):
    with pytest.raises(ValueError, match=message):
        BrokerConfig.from_properties(text)


def test_an_incomplete_group_fails_at_start():
    config = BrokerConfig.from_properties("enableDLegerCommitLog=true\ndLegerSelfId=n0\n")
    with pytest.raises(ValueError, match="dLegerPeers is empty"):
        dledger_broker_config(config)


# --- a whole group in process: 3 brokers, a nameserver, the in-memory networks ----------------


@attrs.define(eq=False)
class Member:
    """One broker of the group with its DLedger node; its Raft log and storage outlive it (a
    restart keeps them, as the files would), its classic store does not (in memory)."""

    config: BrokerConfig
    log: MemoryLog = attrs.Factory(MemoryLog)
    storage: MemoryStorage = attrs.Factory(MemoryStorage)
    scope: trio.CancelScope | None = None
    node: DLedgerNode | None = None
    broker: BrokerHandle | None = None

    @property
    def up(self) -> BrokerHandle:
        """The running broker (the member is started)."""
        assert self.broker is not None, "the member is not running"
        return self.broker

    @property
    def raft(self) -> DLedgerNode:
        """The running DLedger node (the member is started)."""
        assert self.node is not None, "the member is not running"
        return self.node


@attrs.define(eq=False)
class Group:
    nursery: trio.Nursery
    network: MemoryNetwork
    dnet: MemoryDLedgerNetwork
    namesrv: NamesrvHandle
    members: dict[str, Member]

    async def start(self, member_id: str) -> None:
        m = self.members[member_id]
        m.scope = scope = trio.CancelScope()
        config = dledger_broker_config(m.config)

        async def run(
            *,
            task_status: trio.TaskStatus[
                tuple[DLedgerNode, BrokerHandle]
            ] = trio.TASK_STATUS_IGNORED,
        ) -> None:
            with scope:
                async with trio.open_nursery() as n:
                    node = await n.start(
                        functools.partial(
                            run_dledger_node,
                            dledger_node_config(config),
                            self.dnet,
                            log=m.log,
                            storage=m.storage,
                            rng=random.Random(member_id),
                        )
                    )
                    broker = await n.start(
                        functools.partial(
                            run_broker,
                            config,
                            store_factory=run_memory_store,
                            network=self.network,
                            io_threads=False,
                            dledger_node=node,
                        )
                    )
                    task_status.started((node, broker))

        m.node, m.broker = await self.nursery.start(run)

    def kill(self, member_id: str) -> None:
        """Gone at once (a cancelled scope; it still unregisters on the way out, as on SIGTERM)."""
        m = self.members[member_id]
        assert m.scope is not None
        m.scope.cancel()
        m.node = m.broker = None

    def routes(self) -> dict[int, str]:
        table = self.namesrv.routes.get_all_cluster_info().broker_addr_table
        return dict(table["broker-a"].broker_addrs) if "broker-a" in table else {}

    def master(self) -> Member | None:
        """The member that is broker master and leads, once the nameserver names it."""
        addr = self.routes().get(0)
        for m in self.members.values():
            if m.broker is not None and m.up.addr == addr and m.up.controller.broker_id == 0:
                return m
        return None

    async def wait_master(self, timeout: float = 60.0) -> Member:
        await eventually(lambda: self.master() is not None, timeout)
        m = self.master()
        assert m is not None
        return m

    def running(self) -> list[Member]:
        return [m for m in self.members.values() if m.broker is not None]


async def start_group(nursery: trio.Nursery, tmp_path: Path, n: int = 3, **store_kw: Any) -> Group:
    network = MemoryNetwork()
    ns = await nursery.start(
        functools.partial(run_namesrv, network=network),
        NamesrvConfig(listen_port=0, kv_config_path=str(tmp_path / "kv.json")),
    )
    peers = ";".join(f"n{i}-127.0.0.1:{40911 + i}" for i in range(n))
    members = {}
    for i in range(n):
        store = MessageStoreConfig(
            store_path_root_dir=str(tmp_path / f"n{i}"),
            mapped_file_size_commit_log=64 * 1024,
            enable_dleger_commit_log=True,
            dleger_peers=peers,
            dleger_self_id=f"n{i}",
            heart_beat_time_interval_ms=500,
            min_vote_interval_ms=150,
            max_vote_interval_ms=400,
            **store_kw,
        )
        members[f"n{i}"] = Member(BrokerConfig(listen_port=0, namesrv_addr=ns.addr, store=store))
    group = Group(nursery, network, MemoryDLedgerNetwork(seed=11), ns, members)
    for member_id in members:
        await group.start(member_id)
    return group


def stored(member: Member, topic: str, queue_id: int) -> list[bytes]:
    store = member.up.store
    out = []
    for off in range(
        store.get_min_offset_in_queue(topic, queue_id),
        store.get_max_offset_in_queue(topic, queue_id),
    ):
        phys = store.get_commit_log_offset_in_queue(topic, queue_id, off)
        record = store.select_one_message_by_offset(phys)
        assert record is not None
        out.append(decode_record(record).body)
    return out


async def eventually(predicate: Callable[[], bool], timeout: float = 60.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():  # noqa: ASYNC110 - polling Trio's (mock) clock
            await trio.sleep(0.05)


async def test_group_elects_a_master_and_every_member_registers(nursery, tmp_path, autojump_clock):
    group = await start_group(nursery, tmp_path)
    master = await group.wait_master()
    await eventually(lambda: len(group.routes()) == 3)
    routes = group.routes()
    assert routes[0] == master.up.addr
    for member_id, m in group.members.items():
        if m is not master:
            assert routes[int(member_id[1:]) + 1] == m.up.addr
            assert m.up.controller.broker_role == "SLAVE"


async def test_only_committed_entries_are_dispatched(nursery, tmp_path, mk, autojump_clock):
    group = await start_group(nursery, tmp_path)
    master = await group.wait_master()
    leader_id = master.raft.config.self_id
    followers = [i for i in group.members if i != leader_id]
    cut, other = followers
    # one follower cut off: the leader and the other one still make a quorum
    group.dnet.partition([cut], [leader_id, other])
    assert (await master.up.store.put_message(mk(body=b"quorum"))).ok
    await eventually(lambda: stored(group.members[other], "T", 0) == [b"quorum"])
    await trio.sleep(1)
    assert stored(group.members[cut], "T", 0) == []
    assert group.members[cut].up.store.get_max_phy_offset() == 0
    # the leader alone: appended to its log, never committed, never dispatched
    group.dnet.heal()
    await eventually(lambda: stored(group.members[cut], "T", 0) == [b"quorum"])
    group.dnet.partition([leader_id], followers)
    end = master.up.store.get_max_phy_offset()
    pending = master.up.store.append_message(mk(body=b"alone"))
    assert not isinstance(pending, PutMessageResult)  # it waits for the quorum
    result = await pending.wait()
    assert result.status in (
        PutMessageStatus.OS_PAGECACHE_BUSY,
        PutMessageStatus.SERVICE_NOT_AVAILABLE,
    )
    for m in group.running():
        assert m.up.store.get_max_phy_offset() == end
        assert stored(m, "T", 0) == [b"quorum"]


async def test_producer_goes_on_through_a_leader_kill(
    nursery, tmp_path, commit_log_bytes, autojump_clock
):
    group = await start_group(nursery, tmp_path)
    master = await group.wait_master()
    async with Admin(group.namesrv.addr, network=group.network) as admin:
        await admin.create_topic("F", broker_addr=master.up.addr, queues=2)
    acked: list[bytes] = []

    async def send_all(producer, first, count):
        for i in range(first, first + count):
            body = b"m%d" % i
            with trio.fail_after(60):
                while True:
                    try:
                        r = await producer.send(Message("F", body))
                    except RmqError:
                        await trio.sleep(0.2)  # no master yet: the client's own retries ran out
                        continue
                    if r.status is SendStatus.SEND_OK:
                        acked.append(body)
                        break

    async with Producer("pg", group.namesrv.addr, network=group.network) as producer:
        await send_all(producer, 0, 20)
        old = master.raft.config.self_id
        group.kill(old)
        await send_all(producer, 20, 20)
        new = await group.wait_master()
        assert new.raft.config.self_id != old
        await send_all(producer, 40, 5)
    # everything acknowledged is readable on the new master, in send order per queue
    seen = stored(new, "F", 0) + stored(new, "F", 1)
    assert set(acked) <= set(seen) and len(acked) == 45
    for q in (0, 1):
        bodies = [b for b in stored(new, "F", q) if b in acked]
        assert bodies == sorted(set(bodies), key=acked.index)
    # the killed member comes back as a follower and ends with the same CommitLog
    await group.start(old)
    back = group.members[old]
    await eventually(lambda: commit_log_bytes(back.up.store) == commit_log_bytes(new.up.store))
    assert back.up.controller.broker_id == int(old[1:]) + 1
    await eventually(lambda: group.routes().get(int(old[1:]) + 1) == back.up.addr)
    assert group.routes()[0] == new.up.addr


async def test_consumer_offsets_survive_a_leader_change(nursery, tmp_path, mk, autojump_clock):
    group = await start_group(nursery, tmp_path)
    master = await group.wait_master()
    for i in range(5):
        assert (await master.up.store.put_message(mk(body=b"%d" % i))).ok
    master.up.controller.consumer_offset_manager.commit_offset("cg", "T", 0, 3)
    await trio.sleep(6)  # one follower sync round (dLegerSlaveSyncInterval, 5 s)
    group.kill(master.raft.config.self_id)
    new = await group.wait_master()
    assert new.up.controller.consumer_offset_manager.query_offset("cg", "T", 0) == 3


async def test_timers_go_on_through_a_leader_kill(nursery, tmp_path, autojump_clock):
    # RocketMQ 5 timer messages (broker/timer): the timer records replicate as entries; the new
    # leader, with no timer checkpoint of its own, finds what the old one delivered in the log
    # and delivers the rest, each once and none before its time
    group = await start_group(nursery, tmp_path)
    master = await group.wait_master()
    async with Admin(group.namesrv.addr, network=group.network) as admin:
        await admin.create_topic("TM", broker_addr=master.up.addr, queues=1)
    now = master.up.controller.timer_service.clock_ms()
    dues = {b"t%d" % i: now + 3000 + 2000 * i for i in range(8)}
    async with Producer("pg", group.namesrv.addr, network=group.network) as producer:
        for body, due in dues.items():
            r = await producer.send(Message("TM", body, deliver_at=due))
            assert r.status is SendStatus.SEND_OK
    await trio.sleep((now + 8500 - master.up.controller.timer_service.clock_ms()) / 1000)
    before = stored(master, "TM", 0)
    assert 0 < len(before) < len(dues)
    old = master.raft.config.self_id
    group.kill(old)
    new = await group.wait_master()
    assert new.raft.config.self_id != old
    await eventually(lambda: len(stored(new, "TM", 0)) >= len(dues), timeout=60)
    await trio.sleep(5)
    store = new.up.store
    got = []
    for off in range(store.get_max_offset_in_queue("TM", 0)):
        phys = store.get_commit_log_offset_in_queue("TM", 0, off)
        record = store.select_one_message_by_offset(phys)
        assert record is not None
        got.append(decode_record(record))
    assert sorted(m.body for m in got) == sorted(dues)  # each once
    for m in got:
        assert int(m.properties["TIMER_DEQUEUE_MS"]) >= dues[m.body]


# --- reads in DLedger mode (docs/guarantees.md) -------------------------------------------------


async def test_a_cut_off_master_stops_serving_as_master_within_its_lease(
    nursery, tmp_path, mk, autojump_clock
):
    # heartBeatTimeIntervalMs 500, maxHeartBeatLeak 3: a 1.5 s lease from the last heartbeat
    # round a majority answered, which left at most one interval before the cut
    group = await start_group(nursery, tmp_path)
    master = await group.wait_master()
    await trio.sleep(2)  # steady: heartbeat rounds answered
    leader_id = master.raft.config.self_id
    followers = [i for i in group.members if i != leader_id]
    cut_at = trio.current_time()
    group.dnet.partition([leader_id], followers)
    while master.raft.role is Role.LEADER:  # noqa: ASYNC110 - polling Trio's (mock) clock
        await trio.sleep(0.001)
    stepped_down = trio.current_time() - cut_at
    assert 1.5 - 0.5 <= stepped_down <= 1.5 + 0.002
    # from that moment a put is refused with 14 at once (no wait for a quorum that never comes)
    refused = master.up.store.append_message(mk(body=b"late"))
    assert isinstance(refused, PutMessageResult)
    assert refused.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
    # and the nameserver lists it as slave k+1 (its registration is not cut)
    slave_id = int(leader_id[1:]) + 1
    await eventually(lambda: group.routes().get(slave_id) == master.up.addr, timeout=1.0)
    assert master.up.controller.broker_id == slave_id
    # the other side elects a master only after the step-down (the followers' own 1.5 s wait
    # starts at the last heartbeat they heard, no earlier than the lease's start)
    new = await group.wait_master()
    assert new is not master


async def test_a_follower_serves_an_acknowledged_message_one_push_later(
    nursery, tmp_path, mk, autojump_clock
):
    group = await start_group(nursery, tmp_path)
    master = await group.wait_master()
    await trio.sleep(2)  # steady, nothing pushed for a while: the followers are idle
    followers = [m for m in group.members.values() if m is not master]
    assert (await master.up.store.put_message(mk(body=b"one"))).ok
    acked_at = trio.current_time()
    # the entry's push carried the commit index from before it; the COMMIT push 20 ms after
    # it carries the new one (DLedger's idle COMMIT push: every half interval, 250 ms here)
    await eventually(lambda: all(stored(f, "T", 0) == [b"one"] for f in followers), 1.0)
    assert trio.current_time() - acked_at <= 0.1
