"""Long polling: parked pulls wake on arrival, filter by tags, time out on Trio's clock."""

from __future__ import annotations

import trio

from broker.processor.pull_hold import PullRequestHoldService
from broker.subscription import TagMessageFilter, build_subscription_data
from common.string_hash import java_string_hash


async def test_wakes_on_arrival_beyond_offset(autojump_clock: trio.abc.Clock) -> None:
    hold = PullRequestHoldService()
    results = []

    async def waiter() -> None:
        t0 = trio.current_time()
        ok = await hold.wait_for_arrival("T", 0, 5, 15.0)
        results.append((ok, trio.current_time() - t0))

    async with trio.open_nursery() as n:
        n.start_soon(waiter)
        await trio.sleep(1)
        assert hold.waiting_count("T", 0) == 1
        hold.notify_message_arriving("T", 1, 10)  # other queue
        hold.notify_message_arriving("T", 0, 5)  # not beyond offset 5
        await trio.sleep(1)
        assert results == []
        hold.notify_message_arriving("T", 0, 6)
    assert results == [(True, 2.0)]
    assert hold.waiting_count() == 0


async def test_times_out(autojump_clock: trio.abc.Clock) -> None:
    hold = PullRequestHoldService()
    t0 = trio.current_time()
    assert not await hold.wait_for_arrival("T", 0, 0, 15.0)
    assert trio.current_time() - t0 == 15.0
    assert hold.waiting_count() == 0


async def test_tag_filter_keeps_waiting(autojump_clock: trio.abc.Clock) -> None:
    hold = PullRequestHoldService()
    f = TagMessageFilter.of(build_subscription_data("T", "A"))
    woke = []

    async def waiter() -> None:
        woke.append(await hold.wait_for_arrival("T", 0, 0, 10.0, f))

    async with trio.open_nursery() as n:
        n.start_soon(waiter)
        await trio.sleep(1)
        hold.notify_message_arriving("T", 0, 1, java_string_hash("B"))
        await trio.sleep(1)
        assert woke == []
        hold.notify_message_arriving("T", 0, 2, java_string_hash("A"))
    assert woke == [True]
