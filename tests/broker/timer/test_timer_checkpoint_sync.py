"""The master's timer checkpoint reaches its slave through the slave sync (GET_TIMER_CHECK_POINT
60, RocketMQ 5 ``SlaveSynchronize.syncTimerCheckPoint``), and a slave that takes over with it
starts near the master's position: nothing delivered early, nothing lost, nothing delivered
twice; a copy the slave's CommitLog does not reach is not used (it could name deliveries the
slave never received)."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing

from broker.config import BrokerConfig
from broker.controller import BrokerController
from broker.processor.dispatcher import build_dispatcher
from broker.slave_sync import SlaveSynchronize
from broker.store import MessageStoreConfig, run_memory_store
from broker.store.api import MessageStore
from broker.store.memory_store import MemoryMessageStore
from broker.timer.checkpoint import CheckpointCopy, TimerCheckpoint
from broker.timer.service import TIMER_QUEUE_OFFSET
from common.message import MessageExt, decode_record
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from common.topics import TIMER_TOPIC
from tests.broker.dledger.test_broker_dledger import Member, start_group
from tests.broker.test_slave_sync import MASTER, LoopbackClient
from tests.broker.timer.test_timer_service import broker, send, stored

pytestmark = pytest.mark.timeout(60)


def copy_log(src: MessageStore, dst: MessageStore, upto: int | None = None) -> None:
    """What HA does, up to the record boundary ``upto`` (default: all of it)."""
    end = src.get_max_phy_offset() if upto is None else upto
    off = dst.get_max_phy_offset()
    while off < end:
        data = src.get_commit_log_data(off)
        assert data is not None and len(data) > 0
        chunk = bytes(data)[: end - off]
        assert dst.append_to_commit_log(off, chunk)
        off += len(chunk)


@asynccontextmanager
async def slave(
    root: Path, master: BrokerController, **store_fields: object
) -> AsyncIterator[tuple[BrokerController, SlaveSynchronize, MemoryMessageStore]]:
    cfg = BrokerConfig(
        listen_port=0,
        broker_id=1,
        store=MessageStoreConfig(store_path_root_dir=root, broker_role="SLAVE", **store_fields),  # type: ignore[arg-type]
    )
    async with trio.open_nursery() as n:
        st = await n.start(run_memory_store, cfg.store)
        st.clock = master.timer_service.clock_ms
        s = BrokerController(cfg, st, io_threads=False)
        s.load()
        s.timer_service.now_ms = master.timer_service.clock_ms
        st.add_arrival_listener(s.pull_hold.notify_message_arriving)
        client = LoopbackClient({MASTER: build_dispatcher(master)})
        yield s, SlaveSynchronize(s, client, vip_channel=False, master_addr=MASTER), st
        n.cancel_scope.cancel()


def held(cp: TimerCheckpoint) -> tuple[int | None, CheckpointCopy | None]:
    return cp.commit_offset, cp.master


async def take_over(s: BrokerController, n: trio.Nursery) -> None:
    """The slave becomes the serving node (a new master, or a DLedger leader)."""
    await s.store.wait_dispatched()
    s.set_role(0, "SYNC_MASTER")
    await n.start(s.timer_service.run)


async def test_sync_keeps_the_masters_checkpoint_as_the_slaves_log_allows(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with broker(tmp_path / "m") as (m, _):
        now = m.timer_service.clock_ms()
        for i in range(4):
            due = str(now + 2000 * (i + 1))
            assert (await send(m, "T", b"%d" % i, TIMER_DELIVER_MS=due)).code == 0
        await trio.sleep(5)  # two delivered
        async with slave(tmp_path / "s", m) as (s, sync, st):
            cp = s.timer_checkpoint
            # the slave's log is short of the master's checkpoint: kept aside, not used
            copy_log(m.store, st, upto=m.store.get_max_phy_offset() // 2)
            report = await sync.sync_all()
            assert report is not None and report.timer_checkpoint and not report.errors
            assert cp.commit_offset is None and cp.master is not None
            assert cp.master.commit_offset == m.timer_service.commit_offset == 2
            assert cp.best(st.get_max_phy_offset()) == (None, 0, set())
            # persisted with it, and read back
            saved = json.loads((tmp_path / "s" / "config" / "timerCheckpoint.json").read_bytes())
            assert saved["commitOffset"] is None and saved["master"]["commitOffset"] == 2
            s.timer_checkpoint.load(tmp_path / "s" / "config" / "timerCheckpoint.json")
            assert cp.master is not None and cp.master.commit_offset == 2
            # the whole log: usable at start; the next round takes it as the slave's own
            copy_log(m.store, st)
            assert cp.best(st.get_max_phy_offset())[0] == 2
            assert await sync.sync_timer_checkpoint(MASTER)
            assert held(cp) == (2, None)
            assert not await sync.sync_timer_checkpoint(MASTER)  # nothing newer
            # an older copy never replaces a fresher one
            older = CheckpointCopy(1, 0, frozenset())
            assert not cp.take_master(older, st.get_max_phy_offset())
            assert cp.commit_offset == 2
            # a copy that would expand beyond any real one is refused before it is
            with pytest.raises(ValueError, match="resolved entries"):
                CheckpointCopy.from_obj({"commitOffset": 0, "done": [[0, 10**12]]})
            assert CheckpointCopy.from_obj({"commitOffset": None}) is None
            # the sync asks for it last, after the 4.x tables
            assert sync.client.calls[-1] == (MASTER, RequestCode.GET_TIMER_CHECK_POINT)  # type: ignore[attr-defined]


async def test_a_running_timer_service_takes_no_copy_and_a_master_without_timers_says_so(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with broker(tmp_path / "m") as (m, n):
        async with slave(tmp_path / "s", m) as (s, sync, st):
            await take_over(s, n)
            assert not s.timer_checkpoint.take_master(CheckpointCopy(5, 0, frozenset()), 10**9)
            assert s.timer_checkpoint.master is None
    async with broker(tmp_path / "m2", timer_wheel_enable=False) as (m, _):
        d = build_dispatcher(m)
        req = RemotingCommand.request(RequestCode.GET_TIMER_CHECK_POINT)
        resp = await d.dispatch(req, object())  # type: ignore[arg-type]
        assert resp is not None
        assert (resp.code, resp.remark) == (ResponseCode.SYSTEM_ERROR, "The checkpoint is null")


@pytest.mark.parametrize("slave_behind", [False, True])
async def test_takeover_with_a_synced_checkpoint_is_never_early_never_loses(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, slave_behind: bool
) -> None:
    """Ten timers 1 s apart; the master delivers some, the slave syncs, the master dies.  With
    the whole log the slave starts at the master's checkpoint; with a log short of the deliveries
    it cannot use the copy and delivers those again (at least once), never loses one."""
    async with broker(tmp_path / "m") as (m, _):
        now = m.timer_service.clock_ms()
        dues = {b"%d" % i: now + 2000 + 1000 * i for i in range(10)}
        for body, due in dues.items():
            assert (await send(m, "T", body, TIMER_DELIVER_MS=str(due))).code == 0
        before_deliveries = m.store.get_max_phy_offset()
        await trio.sleep(5.5)
        early = [x.body for x in stored(m, "T")]
        assert 0 < len(early) < 10
        async with slave(tmp_path / "s", m) as (s, sync, st):
            copy_log(m.store, st, upto=before_deliveries if slave_behind else None)
            assert await sync.sync_timer_checkpoint(MASTER)
            synced_commit = m.timer_service.commit_offset
            assert synced_commit >= len(early)
            # the master dies here: the slave gets nothing more from it
            async with trio.open_nursery() as sn:
                await take_over(s, sn)
                started_at = s.timer_service.commit_offset
                if slave_behind:
                    assert started_at == 0  # the copy names deliveries this log lacks
                else:
                    assert started_at >= synced_commit
                await trio.sleep(12)
                got = stored(s, "T")
                sn.cancel_scope.cancel()
    bodies = [x.body for x in got]
    assert sorted(bodies, key=int) == sorted(dues, key=int)  # none lost
    assert len(set(bodies)) == len(bodies)  # none twice (the slave had the master's marks)
    for x in got:
        assert int(x.properties["TIMER_DEQUEUE_MS"]) >= dues[x.body]  # none early
        assert TIMER_QUEUE_OFFSET in x.properties
    assert s.store.get_max_offset_in_queue(TIMER_TOPIC, 0) == 10


async def test_dledger_follower_takes_over_from_the_synced_checkpoint(
    nursery: trio.Nursery,
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A DLedger group: the followers' sync (every 5 s) copies the leader's timer checkpoint;
    the leader is killed; the new leader starts from the copy and delivers the rest, each
    timer once and none before its time."""
    group = await start_group(nursery, tmp_path)
    leader = await group.wait_master()
    c = leader.up.controller
    now = c.timer_service.clock_ms()
    dues = {b"e%d" % i: now + 2000 + 1000 * i for i in range(5)}
    dues |= {b"l%d" % i: now + 40_000 + 1000 * i for i in range(3)}
    for body, due in dues.items():
        assert (await send(c, "T", body, TIMER_DELIVER_MS=str(due))).code == 0
    await trio.sleep(15)  # the early ones delivered; two sync rounds of the followers
    assert sorted(delivered(leader)) == sorted(b for b in dues if b.startswith(b"e"))
    resolved = c.timer_service.commit_offset
    assert resolved >= 5
    followers = [m for m in group.running() if m is not leader]
    for f in followers:
        cp = f.up.controller.timer_checkpoint
        assert cp.best(f.up.store.get_max_phy_offset())[0] == resolved, f.config.broker_id

    caplog.set_level(logging.INFO, logger="broker.timer.service")
    caplog.clear()
    group.kill(leader.raft.config.self_id)
    new = await group.wait_master()
    assert new is not leader
    # its timer service began at the copy, not at the oldest timer record
    (start,) = [r for r in caplog.records if r.msg.startswith("timer: recovered at offset")]
    assert isinstance(start.args, tuple) and start.args[0] == resolved
    await trio.sleep(45)
    got = delivered(new)
    assert sorted(got) == sorted(dues)  # none lost, none twice
    for m in all_records(new):
        assert int(m.properties["TIMER_DEQUEUE_MS"]) >= dues[m.body]  # none early


def all_records(member: Member) -> list[MessageExt]:
    store = member.up.store
    out: list[MessageExt] = []
    for off in range(store.get_max_offset_in_queue("T", 0)):
        phys = store.get_commit_log_offset_in_queue("T", 0, off)
        record = store.select_one_message_by_offset(phys)
        assert record is not None
        out.append(decode_record(record))
    return out


def delivered(member: Member) -> list[bytes]:
    return [m.body for m in all_records(member)]
