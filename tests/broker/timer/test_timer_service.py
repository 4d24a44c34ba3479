"""Timer messages through the broker's send path and the timer service, on the Trio clock:
delivered at their time and not before, in time order, once over a restart and a crash."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import trio
import trio.testing

from broker.config import BrokerConfig
from broker.controller import BrokerController
from broker.processor.send import SendMessageProcessor
from broker.schedule import trio_wall_clock_ms
from broker.store import MessageStoreConfig, run_memory_store
from broker.store.memory_store import MemoryMessageStore
from broker.store.results import PutMessageResult, PutMessageStatus
from broker.timer.service import TIMER_QUEUE_OFFSET
from common.message import MessageExt, MessageExtBrokerInner, decode_records
from common.message_properties import MessageConst, encode_properties
from common.remoting.channel import Channel
from common.remoting.codes import RequestCode, ResponseCode
from common.remoting.command import RemotingCommand
from common.topics import TIMER_TOPIC


class FakeChannel:
    remote_addr = "127.0.0.1:40000"
    closed = False
    attrs: dict = {}


@asynccontextmanager
async def broker(
    root: Path, store: MemoryMessageStore | None = None, **store_fields: Any
) -> AsyncIterator[tuple[BrokerController, trio.Nursery]]:
    """A master's controller with its timer service running, config files in ``root``.

    A restart is a new controller (new timer service, checkpoint read from ``root``) over the
    same ``store``: the CommitLog survives, the service's memory does not.  (The memory store,
    because a file store's shutdown flushes in a thread, which autojump_clock cannot wait for.)
    """
    cfg = BrokerConfig(
        listen_port=10911,
        store=MessageStoreConfig(store_path_root_dir=root, **store_fields),
    )
    async with trio.open_nursery() as n:
        st = store if store is not None else await n.start(run_memory_store, cfg.store)
        clock = trio_wall_clock_ms()
        st.clock = clock
        b = BrokerController(cfg, st, io_threads=False)
        b.load()
        b.timer_service.now_ms = clock
        st.add_arrival_listener(b.pull_hold.notify_message_arriving)
        await n.start(b.timer_service.run)
        try:
            yield b, n
        finally:
            b.persist_all()
            n.cancel_scope.cancel()


@asynccontextmanager
async def memory_store(root: Path) -> AsyncIterator[MemoryMessageStore]:
    async with trio.open_nursery() as n:
        yield await n.start(run_memory_store, MessageStoreConfig(store_path_root_dir=root))
        n.cancel_scope.cancel()


def send_v2(topic: str, body: bytes, **props: str) -> RemotingCommand:
    """SEND_MESSAGE_V2 with the Java client's one-letter header fields."""
    req = RemotingCommand.request(
        RequestCode.SEND_MESSAGE_V2,
        {
            "a": "pg",
            "b": topic,
            "c": "TBW102",
            "d": "4",
            "e": "0",
            "f": "0",
            "g": "1700000000000",
            "h": "0",
            "i": encode_properties({"UNIQ_KEY": body.hex(), **props}),
            "j": "0",
            "k": "false",
            "m": "false",
        },
    )
    req.body = body
    return req


async def send(b: BrokerController, topic: str, body: bytes, **props: str) -> RemotingCommand:
    return await SendMessageProcessor(b).process_send(
        send_v2(topic, body, **props), cast(Channel, FakeChannel())
    )


def stored(b: BrokerController, topic: str, queue_id: int = 0) -> list[MessageExt]:
    out: list[MessageExt] = []
    offset = 0
    while True:
        res = b.store.get_message("t", topic, queue_id, offset, 32)
        if not res.buffers:
            return out
        out += decode_records(b"".join(bytes(x) for x in res.buffers))
        offset = res.next_begin_offset


async def test_delivered_at_its_time_not_before(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with broker(tmp_path) as (b, _):
        now = b.timer_service.clock_ms()
        at = now + 10_000
        r = await send(b, "T", b"later", TIMER_DELIVER_MS=str(at))
        assert r.code == ResponseCode.SUCCESS and r.ext_fields["queueId"] == "0"
        assert stored(b, "T") == []
        (rec,) = stored(b, TIMER_TOPIC)
        assert rec.properties["REAL_TOPIC"] == "T"
        await trio.sleep((at - b.timer_service.clock_ms()) / 1000 - 0.01)
        assert stored(b, "T") == []  # not one ms early
        await trio.sleep(1.1)  # within one precision after
        (m,) = stored(b, "T")
        assert m.body == b"later" and m.properties[MessageConst.UNIQ_KEY] == b"later".hex()
        assert int(m.properties["TIMER_DEQUEUE_MS"]) >= at
        assert "REAL_TOPIC" not in m.properties


async def test_delay_sec_and_past_time(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with broker(tmp_path) as (b, _):
        t0 = b.timer_service.clock_ms()
        assert (await send(b, "T", b"d", TIMER_DELAY_SEC="3")).code == 0
        assert (await send(b, "T", b"past", TIMER_DELIVER_MS=str(t0 - 1000))).code == 0
        assert [m.body for m in stored(b, "T")] == [b"past"]  # due already: stored at once
        await trio.sleep(2.9)
        assert [m.body for m in stored(b, "T")] == [b"past"]
        await trio.sleep(1.2)  # within one precision after the asked time
        assert [m.body for m in stored(b, "T")] == [b"past", b"d"]


async def test_too_long_delay_is_refused_as_rocketmq_5_does(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with broker(tmp_path, timer_max_delay_sec=60) as (b, _):
        r = await send(b, "T", b"x", TIMER_DELAY_SEC="61")
        assert r.code == ResponseCode.MESSAGE_ILLEGAL
        assert r.remark is not None and "max delay 60000ms" in r.remark
        r = await send(b, "T", b"x", TIMER_DELIVER_MS="soon")
        assert r.code == ResponseCode.MESSAGE_ILLEGAL
        assert stored(b, TIMER_TOPIC) == []


async def test_many_random_timers_arrive_in_time_order(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    # a 20-slot window: most of these roll at least once
    async with broker(tmp_path, timer_roll_window_slot=20) as (b, _):
        now = b.timer_service.clock_ms()
        rng = random.Random(26)
        dues = [now + 1000 * rng.randrange(1, 90) for _ in range(120)]
        for i, due in enumerate(dues):
            assert (await send(b, "T", b"%d" % i, TIMER_DELIVER_MS=str(due))).code == 0
        # bounded memory: the wheel holds the timers due within the window, no far one
        await trio.sleep(0.5)
        # (within a second of the 20 s edge: the due times are rounded up to the second)
        held = b.timer_service.wheel.size
        assert sum(d <= now + 19_000 for d in dues) <= held <= sum(d <= now + 21_000 for d in dues)
        assert held < len(dues) // 3
        await trio.sleep(92)
        got = stored(b, "T")
        assert len(got) == len(dues)
        order = [dues[int(m.body)] for m in got]
        assert order == sorted(order)
        for m in got:
            assert int(m.properties["TIMER_DEQUEUE_MS"]) >= dues[int(m.body)]
        assert b.timer_service.rolled > 0
        assert b.timer_service.wheel.size == 0
        assert b.timer_service.commit_offset == b.store.get_max_offset_in_queue(TIMER_TOPIC, 0)


async def test_restart_before_due_delivers_once_after_the_time(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with memory_store(tmp_path) as st:
        async with broker(tmp_path, st) as (b, _):
            due = b.timer_service.clock_ms() + 30_000
            assert (await send(b, "T", b"r", TIMER_DELIVER_MS=str(due))).code == 0
            await trio.sleep(5)
        await trio.sleep(10)  # down for a while
        async with broker(tmp_path, st) as (b, _):
            assert stored(b, "T") == []
            await trio.sleep((due - b.timer_service.clock_ms()) / 1000 - 0.01)
            assert stored(b, "T") == []
            await trio.sleep(5)
            assert [m.body for m in stored(b, "T")] == [b"r"]
        async with broker(tmp_path, st) as (b, _):
            await trio.sleep(5)
            assert [m.body for m in stored(b, "T")] == [b"r"]  # not again


async def test_crash_after_partial_delivery_does_not_double(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with memory_store(tmp_path) as st:
        async with broker(tmp_path, st) as (b, _):
            now = b.timer_service.clock_ms()
            for i in range(10):
                due = now + 2000 + 1000 * i
                assert (await send(b, "T", b"%d" % i, TIMER_DELIVER_MS=str(due))).code == 0
            b.persist_all()
            stale = b.timer_service.checkpoint.encode()  # written before any delivery
            await trio.sleep(6.5)
            first = [m.body for m in stored(b, "T")]
            assert 0 < len(first) < 10
        # a crash: the checkpoint on disk is the one from before those deliveries
        (tmp_path / "config" / "timerCheckpoint.json").write_bytes(stale)
        async with broker(tmp_path, st) as (b, _):
            await trio.sleep(15)
            got = [m.body for m in stored(b, "T")]
            assert got == [b"%d" % i for i in range(10)]
            marks = [m.properties[TIMER_QUEUE_OFFSET] for m in stored(b, "T")]
            assert len(set(marks)) == 10


async def test_lost_checkpoint_recovers_from_the_commit_log(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with memory_store(tmp_path) as st:
        async with broker(tmp_path, st) as (b, _):
            now = b.timer_service.clock_ms()
            for i in range(4):
                await send(b, "T", b"%d" % i, TIMER_DELIVER_MS=str(now + 2000 + 3000 * i))
            await trio.sleep(6)
        # e.g. a slave that became master
        (tmp_path / "config" / "timerCheckpoint.json").unlink()
        async with broker(tmp_path, st) as (b, _):
            await trio.sleep(15)
            assert [m.body for m in stored(b, "T")] == [b"0", b"1", b"2", b"3"]


async def test_batch_and_transaction_with_a_timer_are_refused(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with broker(tmp_path) as (b, _):
        r = await send(b, "T", b"x", TRAN_MSG="true", PGROUP="pg", TIMER_DELAY_SEC="5")
        assert r.code == ResponseCode.MESSAGE_ILLEGAL
        assert stored(b, TIMER_TOPIC) == []


async def test_delay_levels_keep_working_beside_timers(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with broker(tmp_path) as (b, n):
        await n.start(b.schedule_service.run)
        b.schedule_service.now_ms = b.timer_service.now_ms
        assert (await send(b, "T", b"level", DELAY="2")).code == 0  # 5 s
        assert (await send(b, "T", b"timer", TIMER_DELAY_SEC="3")).code == 0
        await trio.sleep(6)
        assert [m.body for m in stored(b, "T")] == [b"timer", b"level"]


async def test_far_timers_rolled_then_a_crash_are_delivered_once(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    # a 10 s window: timers 35-39 s away are rolled three times; the crash comes after the
    # first rolls, with the checkpoint from before them
    async with memory_store(tmp_path) as st:
        async with broker(tmp_path, st, timer_roll_window_slot=10) as (b, _):
            now = b.timer_service.clock_ms()
            dues = [now + 35_000 + 1000 * i for i in range(5)]
            for i, due in enumerate(dues):
                assert (await send(b, "T", b"%d" % i, TIMER_DELIVER_MS=str(due))).code == 0
            await trio.sleep(0.5)
            assert b.timer_service.wheel.size == 0  # all far: none in memory
            stale = b.timer_service.checkpoint.encode()
            await trio.sleep(12)
            assert b.timer_service.rolled == 5
        (tmp_path / "config" / "timerCheckpoint.json").write_bytes(stale)
        async with broker(tmp_path, st, timer_roll_window_slot=10) as (b, _):
            await trio.sleep((dues[0] - b.timer_service.clock_ms()) / 1000 - 0.01)
            assert stored(b, "T") == []
            await trio.sleep(6)
            got = stored(b, "T")
            assert [m.body for m in got] == [b"0", b"1", b"2", b"3", b"4"]
            for m in got:
                assert int(m.properties["TIMER_DEQUEUE_MS"]) >= dues[int(m.body)]
                assert int(m.properties["TIMER_ROLL_TIMES"]) >= 2


async def test_a_refused_re_put_is_retried_and_delivered_once(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with memory_store(tmp_path) as st:
        real_put = st.put_message
        refused = 0

        async def flaky_put(msg: MessageExtBrokerInner) -> PutMessageResult:
            nonlocal refused
            if msg.topic == "T" and refused < 2:  # e.g. a DLedger leader without its quorum
                refused += 1
                return PutMessageResult(PutMessageStatus.OS_PAGECACHE_BUSY)
            return await real_put(msg)

        st.put_message = flaky_put  # type: ignore[method-assign]
        async with broker(tmp_path, st) as (b, _):
            due = b.timer_service.clock_ms() + 3000
            assert (await send(b, "T", b"x", TIMER_DELIVER_MS=str(due))).code == 0
            (rec,) = stored(b, TIMER_TOPIC)
            fire = int(rec.properties["TIMER_OUT_MS"]) + 1000
            await trio.sleep((fire - b.timer_service.clock_ms()) / 1000 + 0.1)
            assert refused == 1 and stored(b, "T") == []
            await trio.sleep(2)  # retry_delay is 1 s
            assert refused == 2 and [m.body for m in stored(b, "T")] == [b"x"]
            await trio.sleep(5)
            assert [m.body for m in stored(b, "T")] == [b"x"]
