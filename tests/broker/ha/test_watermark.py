"""SYNC_MASTER waiters: one ack releases many, timeout, slave not available, no task per send."""

from __future__ import annotations

import trio

from broker.ha.watermark import ReplicaWatermark
from broker.store import PutMessageStatus

OK = PutMessageStatus.PUT_OK
TIMEOUT = PutMessageStatus.FLUSH_SLAVE_TIMEOUT
NA = PutMessageStatus.SLAVE_NOT_AVAILABLE


async def _collect(w, offsets, timeout, results):
    async def one(off):
        results[off] = (await w.wait_for(off, timeout), trio.current_time())

    async with trio.open_nursery() as n:
        for off in offsets:
            n.start_soon(one, off)


async def test_one_ack_releases_every_waiter_at_or_below(autojump_clock):
    w = ReplicaWatermark(connections=1)
    results: dict[int, tuple] = {}
    async with trio.open_nursery() as n:
        n.start_soon(_collect, w, [100, 200, 300, 400], 3.0, results)
        await trio.sleep(0.5)
        assert w.waiting == 4
        assert w.advance(300) == 3
        await trio.sleep(0.1)
        assert sorted(results) == [100, 200, 300]
        assert all(st is OK and t == 0.5 for st, t in results.values())
        assert w.waiting == 1
        await trio.sleep(1.0)
        w.advance(450)
    assert results[400] == (OK, 1.6)
    assert w.waiting == 0


async def test_timeout_answers_flush_slave_timeout(autojump_clock):
    w = ReplicaWatermark(connections=1)
    results: dict[int, tuple] = {}
    await _collect(w, [10], 3.0, results)
    assert results[10] == (TIMEOUT, 3.0)
    assert w.waiting == 0
    # a late ack after the timeout is harmless and the watermark still moves
    assert w.advance(10) == 0
    assert w.value == 10


async def test_already_acked_is_ok_without_waiting(autojump_clock):
    w = ReplicaWatermark(connections=0, value=500)
    assert await w.wait_for(500, 3.0) is OK
    assert trio.current_time() == 0


async def test_no_slave_is_not_available_at_once(autojump_clock):
    w = ReplicaWatermark(connections=0)
    assert await w.wait_for(1, 3.0) is NA
    assert trio.current_time() == 0


async def test_slave_too_far_behind_is_not_available(autojump_clock):
    w = ReplicaWatermark(fallbehind_max=1000, connections=1, value=5000)
    assert await w.wait_for(5999, 0.1) is TIMEOUT  # 999 behind: still OK to wait
    assert await w.wait_for(6000, 3.0, master_max_offset=6000) is NA
    assert trio.current_time() == 0.1


def test_watermark_only_grows():
    w = ReplicaWatermark()
    w.advance(10)
    w.advance(5)
    assert w.value == 10


async def test_dead_waiters_are_pruned(autojump_clock):
    w = ReplicaWatermark(connections=1)
    async with trio.open_nursery() as n:
        for i in range(200):
            n.start_soon(w.wait_for, 1000 + i, 1.0)
    # every waiter timed out; the heap does not keep all of them
    assert w.waiting == 0
    assert len(w._heap) <= 64
    w.advance(10_000)
    assert len(w._heap) == 0


async def test_cancelled_waiter_is_dropped(autojump_clock):
    w = ReplicaWatermark(connections=1)
    results: dict[int, tuple] = {}

    async def cancelled():
        with trio.move_on_after(0.5):
            await w.wait_for(50, 3.0)

    async with trio.open_nursery() as n:
        n.start_soon(cancelled)
        n.start_soon(_collect, w, [60], 3.0, results)
        await trio.sleep(1.0)
        assert w.waiting == 1
        w.advance(60)
    assert results[60] == (OK, 1.0)
    assert w.waiting == 0 and not w._heap


# --- watch(): the same outcomes through callbacks, with no task per send -----------------------


async def test_watch_answers_decided_cases_at_once_and_the_rest_by_callback(autojump_clock):
    w = ReplicaWatermark(connections=1, value=100)
    told: list[tuple[int, PutMessageStatus, float]] = []

    def tell(off):
        return lambda status: told.append((off, status, trio.current_time()))

    async with trio.open_nursery() as n:
        await n.start(w.run_expiry)
        assert w.watch(100, 3.0, tell(100)) is OK  # acked already: no callback
        assert w.watch(200, 3.0, tell(200)) is None
        assert w.watch(300, 3.0, tell(300)) is None
        await trio.sleep(1.0)
        assert w.watch(400, 3.0, tell(400)) is None
        assert w.waiting == 3 and told == []
        assert w.advance(300) == 2  # released synchronously, inside advance
        assert told == [(200, OK, 1.0), (300, OK, 1.0)]
        await trio.sleep(5)  # 400's deadline is 4.0: the expiry task answers it then
        assert told[2:] == [(400, TIMEOUT, 4.0)]
        w.advance(500)  # a timed-out watch is not told again
        assert len(told) == 3 and w.waiting == 0
        n.cancel_scope.cancel()
    gone = ReplicaWatermark(connections=0)
    assert gone.watch(10, 3.0, tell(10)) is NA


async def test_an_earlier_deadline_wakes_the_expiry_task(autojump_clock):
    w = ReplicaWatermark(connections=1)
    told: list[tuple[int, float]] = []
    async with trio.open_nursery() as n:
        await n.start(w.run_expiry)
        w.watch(10, 30.0, lambda st: told.append((10, trio.current_time())))
        await trio.sleep(1)
        w.watch(20, 2.0, lambda st: told.append((20, trio.current_time())))
        await trio.sleep(5)
        assert told == [(20, 3.0)]
        n.cancel_scope.cancel()


async def test_many_released_watches_leave_bounded_state(autojump_clock):
    w = ReplicaWatermark(connections=1)
    released = 0

    def done(status):
        nonlocal released
        released += status is OK

    async with trio.open_nursery() as n:
        await n.start(w.run_expiry)
        for i in range(1, 20_001):
            assert w.watch(i, 3.0, done) is None
            if i % 32 == 0:
                w.advance(i)
            if i % 1000 == 0:
                await trio.sleep(0.1)  # the expiry task runs now and then
        w.advance(20_000)
        assert released == 20_000 and w.waiting == 0
        await trio.sleep(10)
        assert len(w._deadlines) == 0 and len(w._heap) == 0
        n.cancel_scope.cancel()


async def test_released_watches_leave_no_deadline_behind(autojump_clock):
    # a send leaves nothing behind it once a slave acked it: the deadline entries of the
    # waiters an ack releases go with the ack, not when the expiry task next wakes
    w = ReplicaWatermark(connections=1)
    told: list[object] = []
    async with trio.open_nursery() as n:
        await n.start(w.run_expiry)
        for i in range(1, 33):
            assert w.watch(i * 100, 3.0, told.append) is None
        assert len(w._deadlines) == 32
        w.advance(1600)
        assert told == [OK] * 16 and len(w._deadlines) == 16
        w.advance(3200)
        assert told == [OK] * 32 and len(w._deadlines) == 0 and w.waiting == 0
        # the expiry task still times out the next watch, on time
        assert w.watch(3300, 3.0, told.append) is None
        await trio.sleep(2.9)
        assert len(told) == 32
        await trio.sleep(0.2)
        assert told[32:] == [PutMessageStatus.FLUSH_SLAVE_TIMEOUT]
        n.cancel_scope.cancel()
