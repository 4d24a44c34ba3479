"""Pop state across a failover: it lives in the replicated revive log, so whoever holds a copy
of the CommitLog (a SYNC_MASTER's slave, a DLedger follower) holds it, and the broker that
becomes master rebuilds it; a slave does not serve pop."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from broker.pop.api import AckStatus, ConsumeInitMode, PopRequest, PopStatus
from broker.store.api import MessageStore
from common.message import MessageExtBrokerInner
from common.model import TopicConfig
from tests.broker.dledger.test_broker_dledger import eventually, start_group
from tests.broker.pop.support import make_pop_broker, put, set_group


def req(**kw: object) -> PopRequest:
    base: dict[str, object] = {
        "group": "G",
        "topic": "T",
        "invisible_time_ms": 10_000,
        "init_mode": ConsumeInitMode.MIN,
    }
    base.update(kw)
    return PopRequest(**base)  # type: ignore[arg-type]


def copy_commit_log(src: MessageStore, dst: MessageStore) -> None:
    """What HA does: the master's CommitLog bytes, appended at the same offsets."""
    off = src.get_min_phy_offset()
    while off < src.get_max_phy_offset():
        data = src.get_commit_log_data(off)
        assert data is not None and len(data) > 0
        assert dst.append_to_commit_log(off, data)
        off += len(data)


async def test_slave_copy_rebuilds_the_pop_state(
    autojump_clock: trio.abc.Clock, tmp_path: Path
) -> None:
    async with trio.open_nursery() as n:
        m, mpop = await make_pop_broker(n, tmp_path / "m", queues=1)
        for i in range(4):
            await put(m, b"r%d" % i)
        got = (await mpop.pop(req(max_msgs=4))).messages
        handles = {p.msg.body: p.receipt_handle for p in got}
        assert (await mpop.ack("G", "T", handles[b"r0"])).status is AckStatus.OK
        ch = await mpop.change_invisible_time("G", "T", handles[b"r1"], 120_000)
        assert ch.status is AckStatus.OK

        # the slave: the same bytes; it answers no pop while it is a slave
        s, spop = await make_pop_broker(
            n, tmp_path / "s", queues=1, revive=False, store_cfg={"broker_role": "SLAVE"}
        )
        copy_commit_log(m.store, s.store)
        await s.store.wait_dispatched()
        assert (await spop.pop(req())).status is PopStatus.NOT_MASTER
        assert (await spop.ack("G", "T", handles[b"r2"])).status is AckStatus.NOT_MASTER

        # it takes over with no consumer offsets at all (its offsets file never synced): the
        # revive log alone says what is in flight and how far the group popped
        s.set_role(0, "SYNC_MASTER")
        await n.start(spop.run_revive)
        assert len(spop.table) == 2  # r1 (changed) and the batch holding r2, r3
        assert s.consumer_offset_manager.query_offset("G", "T", 0) == 4
        assert (await spop.pop(req())).status is PopStatus.NO_NEW_MSG
        # a handle the old master gave out acks on the new one
        assert (await spop.ack("G", "T", handles[b"r2"])).status is AckStatus.OK
        # the old handle of r1 stays refused, its new one is good
        assert (await spop.ack("G", "T", handles[b"r1"])).status is AckStatus.EXPIRED
        await trio.sleep(11)
        back = (await spop.pop(req())).messages
        assert [(p.msg.body, p.delivery_attempt) for p in back] == [(b"r3", 2)]
        assert (await spop.ack("G", "T", back[0].receipt_handle)).status is AckStatus.OK
        assert (await spop.ack("G", "T", ch.receipt_handle)).status is AckStatus.OK
        await trio.sleep(200)
        assert (await spop.pop(req())).status is PopStatus.NO_NEW_MSG
        n.cancel_scope.cancel()


async def test_dledger_leader_change_keeps_pop_state(
    nursery: trio.Nursery, tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    group = await start_group(nursery, tmp_path)
    master = await group.wait_master()
    c = master.up.controller
    c.topic_config_manager.update_topic_config(
        TopicConfig(topicName="T", readQueueNums=1, writeQueueNums=1)
    )
    for i in range(3):
        msg = MessageExtBrokerInner(
            topic="T", queue_id=0, body=b"d%d" % i, properties={"UNIQ_KEY": f"D{i}"}
        )
        assert (await master.up.store.put_message(msg)).ok
    pop = c.pop
    assert pop is not None
    await eventually(lambda: getattr(pop, "serving", False))
    got = (await pop.pop(req(max_msgs=3, invisible_time_ms=20_000))).messages
    assert len(got) == 3
    assert (await pop.ack("G", "T", got[0].receipt_handle)).status is AckStatus.OK
    await trio.sleep(6)  # a follower sync round: the topic config reaches the followers

    group.kill(master.raft.config.self_id)
    new = await group.wait_master()
    npop = new.up.controller.pop
    assert npop is not None and new is not master
    await eventually(lambda: getattr(npop, "serving", False))
    assert (await npop.ack("G", "T", got[1].receipt_handle)).status is AckStatus.OK
    # d2 comes back once, as its second attempt; d0 and d1 (acked) never
    seen: list[tuple[bytes, int]] = []
    with trio.move_on_after(60):
        while True:
            r = await npop.pop(req(poll_time_ms=5000))
            for p in r.messages:
                seen.append((p.msg.body, p.delivery_attempt))
                assert (await npop.ack("G", "T", p.receipt_handle)).status is AckStatus.OK
    assert seen == [(b"d2", 2)]


async def test_fifo_lock_and_attempts_survive_a_takeover(
    autojump_clock: trio.abc.Clock, tmp_path: Path
) -> None:
    async with trio.open_nursery() as n:
        m, mpop = await make_pop_broker(n, tmp_path / "m", queues=1)
        set_group(m, "F", consumeMessageOrderly=True)
        for i in range(2):
            await put(m, b"f%d" % i)
        fifo = req(group="F", max_msgs=1)
        assert [p.delivery_attempt for p in (await mpop.pop(fifo)).messages] == [1]
        await trio.sleep(11)
        second = (await mpop.pop(fifo)).messages
        assert [(p.msg.body, p.delivery_attempt) for p in second] == [(b"f0", 2)]

        s, spop = await make_pop_broker(
            n,
            tmp_path / "s",
            queues=1,
            revive=False,
            store_cfg={"broker_role": "SLAVE"},
            clock=mpop.now_ms,  # one wall clock for both
        )
        set_group(s, "F", consumeMessageOrderly=True)
        copy_commit_log(m.store, s.store)
        await s.store.wait_dispatched()
        s.set_role(0, "SYNC_MASTER")
        await n.start(spop.run_revive)
        # the lock of the batch in flight holds on the new master
        assert (await spop.pop(fifo)).status is PopStatus.NO_NEW_MSG
        await trio.sleep(11)
        third = (await spop.pop(fifo)).messages
        assert [(p.msg.body, p.delivery_attempt) for p in third] == [(b"f0", 3)]
        assert (await spop.ack("F", "T", third[0].receipt_handle)).status is AckStatus.OK
        nxt = (await spop.pop(fifo)).messages
        assert [(p.msg.body, p.delivery_attempt) for p in nxt] == [(b"f1", 1)]
        n.cancel_scope.cancel()


async def test_fifo_changed_invisible_time_survives_restart_and_takeover(
    autojump_clock: trio.abc.Clock, tmp_path: Path
) -> None:
    """RocketMQ 5 persists a FIFO message's new invisible time with its order info
    (ConsumerOrderInfoManager.updateNextVisibleTime): neither a restarted master nor the slave
    that takes over hands the message out again before the changed time."""
    async with trio.open_nursery() as n:
        m, mpop = await make_pop_broker(n, tmp_path / "m", queues=1)
        set_group(m, "F", consumeMessageOrderly=True)
        for i in range(2):
            await put(m, b"f%d" % i)
        fifo = req(group="F", max_msgs=1)
        first = (await mpop.pop(fifo)).messages
        assert [(p.msg.body, p.delivery_attempt) for p in first] == [(b"f0", 1)]
        ch = await mpop.change_invisible_time("F", "T", first[0].receipt_handle, 120_000)
        assert ch.status is AckStatus.OK
        popped_at = mpop.now_ms()

        # a restart of the master's pop service: the state comes back from the revive log only
        restarted = await make_pop_broker(
            n, tmp_path / "r", store=m.store, queues=1, clock=mpop.now_ms
        )
        rb, rpop = restarted
        set_group(rb, "F", consumeMessageOrderly=True)
        # the slave: the same bytes, then it takes over
        s, spop = await make_pop_broker(
            n,
            tmp_path / "s",
            queues=1,
            revive=False,
            store_cfg={"broker_role": "SLAVE"},
            clock=mpop.now_ms,
        )
        set_group(s, "F", consumeMessageOrderly=True)
        copy_commit_log(m.store, s.store)
        await s.store.wait_dispatched()
        s.set_role(0, "SYNC_MASTER")
        await n.start(spop.run_revive)

        # past the batch's own 10 s, short of the changed 120 s: still locked on both
        await trio.sleep(30)
        for pop in (rpop, spop):
            assert (await pop.pop(fifo)).status is PopStatus.NO_NEW_MSG
        # the changed handle acks on the broker that took over, and the next one follows
        assert (await spop.ack("F", "T", ch.receipt_handle)).status is AckStatus.OK
        nxt = (await spop.pop(fifo)).messages
        assert [(p.msg.body, p.delivery_attempt) for p in nxt] == [(b"f1", 1)]
        # on the restarted one (no ack there) f0 comes back once the changed time is past
        await trio.sleep(max(0, popped_at + 120_000 - mpop.now_ms()) / 1000 + 1)
        again = (await rpop.pop(fifo)).messages
        assert [(p.msg.body, p.delivery_attempt) for p in again] == [(b"f0", 2)]
        n.cancel_scope.cancel()


async def test_dledger_leader_change_keeps_a_fifo_changed_invisible_time(
    nursery: trio.Nursery, tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    """The changed invisible time is a revive-log record, replicated by Raft: the new leader
    keeps the FIFO queue locked until the changed time, then the next message follows the ack."""
    group = await start_group(nursery, tmp_path)
    master = await group.wait_master()
    c = master.up.controller
    c.topic_config_manager.update_topic_config(
        TopicConfig(topicName="T", readQueueNums=1, writeQueueNums=1)
    )
    set_group(c, "F", consumeMessageOrderly=True)
    for i in range(2):
        msg = MessageExtBrokerInner(
            topic="T", queue_id=0, body=b"f%d" % i, properties={"UNIQ_KEY": f"F{i}"}
        )
        assert (await master.up.store.put_message(msg)).ok
    pop = c.pop
    assert pop is not None
    await eventually(lambda: getattr(pop, "serving", False))
    fifo = req(group="F", max_msgs=1, invisible_time_ms=10_000)
    first = (await pop.pop(fifo)).messages
    assert [p.msg.body for p in first] == [b"f0"]
    ch = await pop.change_invisible_time("F", "T", first[0].receipt_handle, 120_000)
    assert ch.status is AckStatus.OK
    await trio.sleep(6)  # a follower sync round: the topic and the group reach the followers

    group.kill(master.raft.config.self_id)
    new = await group.wait_master()
    npop = new.up.controller.pop
    assert npop is not None and new is not master
    await eventually(lambda: getattr(npop, "serving", False))
    await trio.sleep(20)  # well past the batch's own 10 s
    assert (await npop.pop(fifo)).status is PopStatus.NO_NEW_MSG
    assert (await npop.ack("F", "T", ch.receipt_handle)).status is AckStatus.OK
    nxt = (await npop.pop(fifo)).messages
    assert [(p.msg.body, p.delivery_attempt) for p in nxt] == [(b"f1", 1)]
