"""The Trio driver: 3 members on the in-memory network under the autojump clock (MemoryLog,
MemoryStorage), then once on TCP loopback with file logs, restarted from disk."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from typing import Any

import attrs
import pytest
import trio

from broker.dledger.driver.memory_transport import MemoryDLedgerNetwork
from broker.dledger.driver.node import DLedgerConfig, DLedgerNode, run_dledger_node
from broker.dledger.driver.node_storage import MemoryStorage
from broker.dledger.driver.proposal import PendingProposals, Proposal
from broker.dledger.driver.transport import RESPONSE_TYPES, DLedgerNetwork, RemotingDLedgerNetwork
from broker.dledger.raft.log import MemoryLog, RaftLog
from broker.dledger.raft.member_state import HardState
from broker.dledger.raft.messages import (
    Entry,
    LeadershipTransferRequest,
    MetadataRequest,
    MetadataResponse,
    Role,
    VoteRequest,
    VoteResponse,
    VoteResult,
)
from cli.chaos.port_blocks import free_port_block
from common.remoting.codes import DLedgerResponseCode as RC

OK = RC.SUCCESS


def peers_string(n: int, base: int = 40911) -> str:
    return ";".join(f"n{i}-127.0.0.1:{base + i}" for i in range(n))


async def eventually(
    predicate: Callable[[], bool], timeout: float = 60.0, step: float = 0.01
) -> None:
    with trio.fail_after(timeout):
        while not predicate():  # noqa: ASYNC110 - polling Trio's (mock) clock
            await trio.sleep(step)


@attrs.define(eq=False)
class Member:
    config: DLedgerConfig
    log: MemoryLog
    storage: MemoryStorage
    scope: trio.CancelScope | None = None
    node: DLedgerNode | None = None


@attrs.define(eq=False)
class Group:
    """Members that can be stopped and started again with their log and storage kept."""

    nursery: trio.Nursery
    net: DLedgerNetwork
    members: dict[str, Member]

    async def start(self, member_id: str) -> DLedgerNode:
        member = self.members[member_id]
        member.scope = trio.CancelScope()

        async def run(
            *, task_status: trio.TaskStatus[DLedgerNode] = trio.TASK_STATUS_IGNORED
        ) -> None:
            assert member.scope is not None
            with member.scope:
                await run_dledger_node(
                    member.config,
                    self.net,
                    log=member.log,
                    storage=member.storage,
                    rng=random.Random(member_id),
                    task_status=task_status,
                )

        member.node = await self.nursery.start(run)
        return member.node

    def stop(self, member_id: str) -> None:
        member = self.members[member_id]
        assert member.scope is not None
        member.scope.cancel()
        member.node = None

    @property
    def nodes(self) -> list[DLedgerNode]:
        return [m.node for m in self.members.values() if m.node is not None]

    def leaders(self, among: list[str] | None = None) -> list[DLedgerNode]:
        nodes = self.nodes if among is None else [self.members[m].node for m in among]
        return [n for n in nodes if n is not None and n.role is Role.LEADER]

    async def leader(self, among: list[str] | None = None, timeout: float = 60.0) -> DLedgerNode:
        """The one leader of ``among`` (default: every running member), once all of them follow it."""

        def settled() -> bool:
            leaders = self.leaders(among)
            if len(leaders) != 1:
                return False
            ids = among or [n.config.self_id for n in self.nodes]
            lead = leaders[0]
            return all(
                (node := self.members[m].node) is not None
                and node.leader_id == lead.config.self_id
                and node.term == lead.term
                for m in ids
            )

        await eventually(settled, timeout)
        return self.leaders(among)[0]


def make_group(nursery: trio.Nursery, net: DLedgerNetwork, n: int = 3, **config: Any) -> Group:
    peers = peers_string(n)
    members = {}
    for i in range(n):
        cfg = DLedgerConfig(
            group="g", self_id=f"n{i}", peers=peers, store_base_dir="/nonexistent", **config
        )
        members[cfg.self_id] = Member(cfg, MemoryLog(), MemoryStorage())
    return Group(nursery, net, members)


async def started_group(
    nursery: trio.Nursery, net: DLedgerNetwork, n: int = 3, **config: Any
) -> Group:
    group = make_group(nursery, net, n, **config)
    for member_id in group.members:
        await group.start(member_id)
    return group


def bodies(log: RaftLog, upto: int) -> list[bytes]:
    out = []
    for i in range(upto + 1):
        entry = log.get(i)
        assert entry is not None, i
        out.append(entry.body)
    return out


async def test_a_leader_is_elected_and_all_follow_it(autojump_clock):
    net = MemoryDLedgerNetwork(seed=1)
    async with trio.open_nursery() as nursery:
        started = trio.current_time()
        group = await started_group(nursery, net)
        leader = await group.leader()
        # members started together: the first to ask after its vote pause wins, before any of
        # them would have given up on a leader it never heard (2 heartbeat intervals here)
        cfg = leader.config
        assert trio.current_time() - started < cfg.heart_beat_time_interval_ms * 2 / 1000
        assert all(n.role is Role.FOLLOWER for n in group.nodes if n is not leader)
        # it stays leader while nothing fails (heartbeats keep the followers)
        term = leader.term
        await trio.sleep(30)
        assert leader.role is Role.LEADER and leader.term == term
        nursery.cancel_scope.cancel()


async def test_proposals_commit_on_every_member(autojump_clock):
    net = MemoryDLedgerNetwork(seed=2, min_delay=0.001, max_delay=0.005)
    async with trio.open_nursery() as nursery:
        group = await started_group(nursery, net)
        leader = await group.leader()
        proposals = [leader.propose([b"m%d" % i, b"n%d" % i]) for i in range(50)]
        assert all(p.code is OK for p in proposals)
        indexes = [e.index for p in proposals for e in p.entries]
        assert indexes == list(range(indexes[0], indexes[0] + 100))  # call order = log order
        assert [await p.wait() for p in proposals] == [OK] * 50
        last = indexes[-1]
        assert leader.committed_index >= last
        await eventually(lambda: all(n.committed_index >= last for n in group.nodes))
        expected = bodies(leader.log, last)
        for node in group.nodes:
            assert bodies(node.log, last) == expected
            await node.wait_committed(last)
        follower = next(n for n in group.nodes if n is not leader)
        refused = follower.propose([b"x"])
        assert refused.code is RC.NOT_LEADER and refused.entries == []
        assert await refused.wait() is RC.NOT_LEADER
        status = leader.status()
        assert status.role is Role.LEADER and status.committed_index >= last
        assert status.watermarks[leader.config.self_id] == leader.log.end_index
        nursery.cancel_scope.cancel()


async def test_killed_leader_is_replaced_and_proposals_go_on(autojump_clock):
    net = MemoryDLedgerNetwork(seed=3)
    async with trio.open_nursery() as nursery:
        group = await started_group(nursery, net)
        old = await group.leader()
        assert await old.propose([b"before"]).wait() is OK
        old_id = old.config.self_id
        net.kill(old_id)
        lost = old.propose([b"lost"])
        assert lost.code is OK
        others = [m for m in group.members if m != old_id]
        new = await group.leader(among=others)
        assert new.config.self_id != old_id and new.term > old.term
        assert await lost.wait() in (RC.WAIT_QUORUM_ACK_TIMEOUT, RC.TERM_CHANGED)
        assert await new.propose([b"after"]).wait() is OK
        # the old leader comes back, follows, and drops its unacknowledged entry
        net.revive(old_id)
        await group.leader()
        assert old.role is Role.FOLLOWER and old.leader_id == new.config.self_id
        end = new.log.end_index
        await eventually(lambda: old.committed_index >= end)
        assert bodies(old.log, end) == bodies(new.log, end)
        assert b"lost" not in bodies(old.log, old.log.end_index)
        nursery.cancel_scope.cancel()


async def test_partitioned_leader_times_out_and_its_tail_is_truncated(autojump_clock):
    net = MemoryDLedgerNetwork(seed=4)
    async with trio.open_nursery() as nursery:
        group = await started_group(nursery, net)
        old = await group.leader()
        assert await old.propose([b"committed"]).wait() is OK
        old_id = old.config.self_id
        others = [m for m in group.members if m != old_id]
        net.partition([old_id], others)
        stranded = [old.propose([b"stranded%d" % i]) for i in range(5)]
        assert all(p.code is OK for p in stranded)
        tail = [e.index for p in stranded for e in p.entries]
        assert [await p.wait() for p in stranded] == [RC.WAIT_QUORUM_ACK_TIMEOUT] * 5
        assert old.committed_index < tail[0]
        new = await group.leader(among=others)
        for i in range(8):
            assert await new.propose([b"majority%d" % i]).wait() is OK
        net.heal()
        leader = await group.leader()
        assert leader is new and old.role is Role.FOLLOWER
        end = new.log.end_index
        await eventually(lambda: old.log.end_index == end and old.committed_index >= end)
        assert bodies(old.log, end) == bodies(new.log, end)
        for index in tail:
            entry = old.log.get(index)
            assert entry is not None and not entry.body.startswith(b"stranded")
        nursery.cancel_scope.cancel()


async def test_a_vote_is_answered_only_once_it_is_durable(autojump_clock):
    """n1 alone (its peers never start): a candidate's vote is answered after the save."""
    net = MemoryDLedgerNetwork(seed=5)
    async with trio.open_nursery() as nursery:
        group = make_group(nursery, net, heart_beat_time_interval_ms=60_000)
        storage = group.members["n1"].storage
        storage.save_delay = 0.25
        node = await group.start("n1")
        async with net.open_client("n0") as candidate:
            addr = node.bound_addr
            term = node.term + 1
            vote = VoteRequest(group="g", remote_id="n1", local_id="n0", leader_id="n0", term=term)
            first = await candidate.call(addr, vote)
            # a larger term: n1 moves to it (persisted) and answers "not ready" first
            assert isinstance(first, VoteResponse)
            assert first.vote_result is VoteResult.REJECT_TERM_NOT_READY
            assert storage.saves[-1].term == term
            sent = trio.current_time()
            second = await candidate.call(addr, vote)
            received = trio.current_time()
        assert isinstance(second, VoteResponse) and second.vote_result is VoteResult.ACCEPT
        saved_at, state = storage.saved_at[-1], storage.saves[-1]
        assert state == HardState(term=term, voted_for="n0")
        assert sent < saved_at <= received
        assert received - sent >= storage.save_delay
        nursery.cancel_scope.cancel()


async def test_leadership_transfer_moves_the_leader(autojump_clock):
    net = MemoryDLedgerNetwork(seed=6)
    async with trio.open_nursery() as nursery:
        group = await started_group(nursery, net)
        old = await group.leader()
        assert await old.propose([b"one"]).wait() is OK
        target = next(m for m in group.members if m != old.config.self_id)
        assert await old.transfer_leadership(target) is OK
        new = await group.leader()
        assert new.config.self_id == target
        assert await new.propose([b"two"]).wait() is OK
        # an admin's LEADERSHIP_TRANSFER over the network, answered once done
        back = old.config.self_id
        async with net.open_client("admin") as admin:
            request = LeadershipTransferRequest(
                group="g",
                remote_id=target,
                local_id="admin",
                transfer_id=target,
                transferee_id=back,
            )
            answer = await admin.call(new.bound_addr, request, timeout=30)
        assert answer.code is OK
        assert (await group.leader()).config.self_id == back
        nursery.cancel_scope.cancel()


async def test_metadata_names_the_leader_and_peers(autojump_clock):
    net = MemoryDLedgerNetwork(seed=7)
    async with trio.open_nursery() as nursery:
        group = await started_group(nursery, net)
        leader = await group.leader()
        follower = next(n for n in group.nodes if n is not leader)
        async with net.open_client("cli") as cli:
            request = MetadataRequest(group="g", remote_id="n0", local_id="cli")
            answer = await cli.call(follower.bound_addr, request)
        assert isinstance(answer, MetadataResponse)
        assert answer.leader_id == leader.config.self_id
        assert answer.peers == leader.config.peer_addresses()
        nursery.cancel_scope.cancel()


async def test_disk_full_refuses_proposals(autojump_clock):
    net = MemoryDLedgerNetwork(seed=8)
    async with trio.open_nursery() as nursery:
        group = await started_group(nursery, net, disk_check_interval_ms=1000)
        leader = await group.leader()
        group.members[leader.config.self_id].storage.disk_ratio = 0.95
        await trio.sleep(1.5)
        assert leader.propose([b"x"]).code is RC.DISK_FULL
        group.members[leader.config.self_id].storage.disk_ratio = 0.5
        await trio.sleep(1.5)
        assert await leader.propose([b"y"]).wait() is OK
        nursery.cancel_scope.cancel()


async def test_restart_keeps_hard_state_and_log(autojump_clock):
    net = MemoryDLedgerNetwork(seed=9)
    async with trio.open_nursery() as nursery:
        group = await started_group(nursery, net)
        leader = await group.leader()
        for i in range(10):
            assert await leader.propose([b"r%d" % i]).wait() is OK
        term = leader.term
        for member_id in group.members:
            group.stop(member_id)
        await trio.sleep(1)
        for member in group.members.values():
            assert member.storage.hard_state.term >= term
            assert member.storage.checkpoints >= 1  # the final checkpoint on the way out
        for member_id in group.members:
            await group.start(member_id)
        leader = await group.leader()
        # DLedger's candidates first ask at their current term: the same leader may win it again
        assert leader.term >= term
        assert await leader.propose([b"after"]).wait() is OK
        assert [b"r%d" % i for i in range(10)] == [
            b for b in bodies(leader.log, leader.log.end_index) if b.startswith(b"r")
        ]
        nursery.cancel_scope.cancel()


# --- the real path: file logs, TCP on loopback ---------------------------------------------------


async def test_file_logs_over_tcp_and_restart_from_disk(tmp_path):
    base = free_port_block(4)
    peers = peers_string(3, base)
    fast: dict[str, Any] = dict(
        heart_beat_time_interval_ms=200,
        max_heart_beat_leak=3,
        min_vote_interval_ms=50,
        max_vote_interval_ms=150,
        data_file_size=16 * 1024,
        index_file_size=32 * 1024,
    )
    configs = [
        DLedgerConfig(group="g", self_id=f"n{i}", peers=peers, store_base_dir=str(tmp_path), **fast)
        for i in range(3)
    ]
    net = RemotingDLedgerNetwork()
    payload = [b"%04d" % i * 64 for i in range(200)]  # 256-byte bodies: 16 KiB files roll over

    async def run_group(work):
        async with trio.open_nursery() as nursery:
            nodes = [
                await nursery.start(functools.partial(run_dledger_node, cfg, net))
                for cfg in configs
            ]
            await work(nodes)
            nursery.cancel_scope.cancel()

    async def lead(nodes):
        def one():
            leaders = [n for n in nodes if n.role is Role.LEADER]
            return len(leaders) == 1 and all(
                n.leader_id == leaders[0].config.self_id for n in nodes
            )

        await eventually(one, timeout=30)
        return next(n for n in nodes if n.role is Role.LEADER)

    first_end = []

    async def write(nodes):
        leader = await lead(nodes)
        proposals = [leader.propose([body]) for body in payload]
        with trio.fail_after(30):
            assert {await p.wait() for p in proposals} == {OK}
        end = leader.log.end_index
        await eventually(lambda: all(n.committed_index >= end for n in nodes), timeout=30)
        for n in nodes:
            assert [n.log.get(i).body for i in range(end + 1)][-200:] == payload
        first_end.append((end, leader.term))

    await run_group(write)
    for cfg in configs:
        assert (tmp_path / f"dledger-{cfg.self_id}" / "currterm").exists()
        assert len(list((tmp_path / f"dledger-{cfg.self_id}" / "data").iterdir())) >= 3

    async def reread(nodes):
        end, term = first_end[0]
        for n in nodes:
            assert n.log.end_index >= end
            assert [n.log.get(i).body for i in range(end + 1)][-200:] == payload
        leader = await lead(nodes)
        assert leader.term >= term
        # the commit index is learned again from the new leader (node.py), not the checkpoint
        await eventually(lambda: all(n.committed_index >= end for n in nodes), timeout=30)
        with trio.fail_after(30):
            assert await leader.propose([b"after restart"]).wait() is OK

    await run_group(reread)


@pytest.mark.parametrize("bad", ["", "n0", "n0-host", "n0-h:1;n0-h:2"])
def test_bad_peers_are_refused(bad):
    with pytest.raises(ValueError):
        DLedgerConfig(group="g", self_id="n0", peers=bad, store_base_dir="/x")


def test_config_reads_peers_and_paths():
    cfg = DLedgerConfig(group="g", self_id="n1", peers=peers_string(3), store_base_dir="/data")
    assert cfg.peer_addresses() == {
        "n0": "127.0.0.1:40911",
        "n1": "127.0.0.1:40912",
        "n2": "127.0.0.1:40913",
    }
    assert cfg.store_dir == "/data/dledger-n1"
    core = cfg.core_config()
    assert core.peers == ("n0", "n1", "n2") and core.self_id == "n1"
    assert core.heart_beat_time_interval_ms == 2000 and core.max_wait_ack_time_ms == 2500


def test_response_types_cover_every_answer():
    assert len(RESPONSE_TYPES) == 5


# --- proposals, by themselves ----------------------------------------------------------------


def proposal(first: int, count: int) -> Proposal:
    entries = [Entry(index=first + i, term=1, pos=0, body=b"") for i in range(count)]
    return Proposal(OK, entries)


async def outcome(p: Proposal) -> RC | None:
    """The proposal's outcome if it has one, else None."""
    return await p.wait() if p.finished else None


async def test_pending_proposals_settle_by_ranges():
    pending = PendingProposals()
    a, b, c = proposal(0, 2), proposal(2, 3), proposal(5, 1)
    for p in (a, b, c):
        pending.add(p)
    pending.settle(0, 3, OK)  # all of a, part of b
    assert await outcome(a) is OK and await outcome(b) is None and len(pending) == 2
    pending.settle(4, 4, RC.WAIT_QUORUM_ACK_TIMEOUT)
    assert await outcome(b) is RC.WAIT_QUORUM_ACK_TIMEOUT
    pending.settle(5, 5, OK)
    assert await outcome(c) is OK and len(pending) == 0


async def test_pending_proposals_out_of_order_and_close():
    pending = PendingProposals()
    a, b, c = proposal(0, 1), proposal(1, 1), proposal(2, 1)
    for p in (a, b, c):
        pending.add(p)
    pending.settle(1, 1, RC.TERM_CHANGED)
    assert await outcome(a) is None and await outcome(b) is RC.TERM_CHANGED
    assert len(pending) == 2
    pending.close(RC.WAIT_QUORUM_ACK_TIMEOUT)
    assert await outcome(a) is RC.WAIT_QUORUM_ACK_TIMEOUT
    assert await outcome(c) is RC.WAIT_QUORUM_ACK_TIMEOUT
    refused = Proposal(RC.NOT_LEADER, [])
    pending.add(refused)
    assert len(pending) == 0 and await outcome(refused) is RC.NOT_LEADER


def test_config_from_the_brokers_store_config():
    from broker.store.config import MessageStoreConfig

    store = MessageStoreConfig(
        store_path_root_dir="/root-dir",
        enable_dleger_commit_log=True,
        dleger_peers=peers_string(3),
        dleger_self_id="n2",
        preferred_leader_id="n0",
        heart_beat_time_interval_ms=500,
        enable_batch_push=True,
    )
    cfg = DLedgerConfig.from_store_config(store, group="broker-a")
    assert (cfg.group, cfg.self_id, cfg.peers) == ("broker-a", "n2", peers_string(3))
    # RocketMQ's layout: <storePathRootDir>/dledger-<selfId>/{data,index,currterm,checkpoint}
    assert cfg.store_dir == "/root-dir/dledger-n2"
    assert cfg.data_store_path == "/root-dir/dledger-n2/data"
    raft = attrs.evolve(store, store_path_dledger_commit_log="/raft")
    assert DLedgerConfig.from_store_config(raft, group="b").data_store_path == "/raft"
    assert cfg.preferred_leader_id == "n0" and cfg.enable_batch_push
    assert cfg.heart_beat_time_interval_ms == 500 and cfg.max_wait_ack_time_ms == 2500
