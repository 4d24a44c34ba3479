"""Pop consumption through ``controller.pop`` (broker/pop/service.py), on the Trio clock."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from broker.pop.api import AckStatus, ConsumeInitMode, PopRequest, PopStatus
from broker.pop.receipt import ReceiptHandle
from common.model import TopicConfig
from tests.broker.pop.support import make_pop_broker, put, set_group


def req(**kw: object) -> PopRequest:
    base: dict[str, object] = {
        "group": "G",
        "topic": "T",
        "max_msgs": 32,
        "invisible_time_ms": 10_000,
        "init_mode": ConsumeInitMode.MIN,
    }
    base.update(kw)
    return PopRequest(**base)  # type: ignore[arg-type]


async def test_pop_then_ack_is_done(autojump_clock: trio.abc.Clock, tmp_path: Path) -> None:
    async with trio.open_nursery() as n:
        b, pop = await make_pop_broker(n, tmp_path)
        for i in range(3):
            await put(b, b"m%d" % i, queue_id=i % 2)
        r = await pop.pop(req())
        assert r.status is PopStatus.FOUND
        assert sorted(m.msg.body for m in r.messages) == [b"m0", b"m1", b"m2"]
        assert all(m.delivery_attempt == 1 for m in r.messages)
        h = ReceiptHandle.parse(r.messages[0].receipt_handle)
        assert (h.broker_name, h.retry, h.invisible_time) == (b.config.broker_name, False, 10_000)
        # the proxy's form: the ExtraInfo and the CommitLog offset; both forms ack
        assert len(r.messages[0].receipt_handle.split(" ")) == 9
        assert h.commit_log_offset == r.messages[0].msg.commit_log_offset
        assert len(h.extra_info().split(" ")) == 8
        assert (await pop.ack("G", "T", h.extra_info())).status is AckStatus.OK
        for m in r.messages[1:]:
            assert (await pop.ack("G", "T", m.receipt_handle)).status is AckStatus.OK
        # acked twice: stale
        again = await pop.ack("G", "T", r.messages[0].receipt_handle)
        assert again.status is AckStatus.EXPIRED
        assert (await pop.pop(req())).status is PopStatus.NO_NEW_MSG
        await trio.sleep(30)
        assert (await pop.pop(req())).status is PopStatus.NO_NEW_MSG
        assert pop.inflight("G", "T") == 0
        n.cancel_scope.cancel()


async def test_unacked_comes_back_with_attempt_2(
    autojump_clock: trio.abc.Clock, tmp_path: Path
) -> None:
    async with trio.open_nursery() as n:
        b, pop = await make_pop_broker(n, tmp_path)
        await put(b, b"a")
        await put(b, b"b")
        r = await pop.pop(req())
        assert len(r.messages) == 2
        await pop.ack("G", "T", r.messages[0].receipt_handle)
        await trio.sleep(5)
        assert (await pop.pop(req())).status is PopStatus.NO_NEW_MSG  # still invisible
        await trio.sleep(6.5)
        r2 = await pop.pop(req())
        assert [(m.msg.body, m.delivery_attempt, m.msg.topic) for m in r2.messages] == [
            (b"b", 2, "T")
        ]
        assert ReceiptHandle.parse(r2.messages[0].receipt_handle).retry
        assert (await pop.ack("G", "T", r2.messages[0].receipt_handle)).status is AckStatus.OK
        await trio.sleep(30)
        assert (await pop.pop(req())).status is PopStatus.NO_NEW_MSG
        n.cancel_scope.cancel()


async def test_change_invisible_time_and_old_handle_refused(
    autojump_clock: trio.abc.Clock, tmp_path: Path
) -> None:
    async with trio.open_nursery() as n:
        b, pop = await make_pop_broker(n, tmp_path)
        await put(b, b"x")
        old = (await pop.pop(req())).messages[0].receipt_handle
        ch = await pop.change_invisible_time("G", "T", old, 60_000)
        assert ch.status is AckStatus.OK and ch.receipt_handle != old
        assert ReceiptHandle.parse(ch.receipt_handle).invisible_time == 60_000
        # the old handle is refused for a change and for an ack
        stale = await pop.change_invisible_time("G", "T", old, 1000)
        assert stale.status is AckStatus.EXPIRED
        assert (await pop.ack("G", "T", old)).status is AckStatus.EXPIRED
        await trio.sleep(20)  # past the first invisible time, not the new one
        assert (await pop.pop(req())).status is PopStatus.NO_NEW_MSG
        # shorten it: back soon after
        ch2 = await pop.change_invisible_time("G", "T", ch.receipt_handle, 1000)
        assert ch2.status is AckStatus.OK
        await trio.sleep(3)
        r = await pop.pop(req())
        assert [(m.msg.body, m.delivery_attempt) for m in r.messages] == [(b"x", 2)]
        n.cancel_scope.cancel()


async def test_dead_letter_after_max_attempts(
    autojump_clock: trio.abc.Clock, tmp_path: Path
) -> None:
    async with trio.open_nursery() as n:
        b, pop = await make_pop_broker(n, tmp_path)
        set_group(b, "G", retryMaxTimes=2)
        await put(b, b"poison")
        attempts = []
        for _ in range(5):
            r = await pop.pop(req(poll_time_ms=20_000, invisible_time_ms=1000))
            if r.status is not PopStatus.FOUND:
                break
            attempts.append(r.messages[0].delivery_attempt)
        assert attempts == [1, 2, 3]
        dlq = b.store.get_message("x", "%DLQ%G", 0, 0, 10)
        assert dlq.message_count == 1
        n.cancel_scope.cancel()


async def test_forward_to_dead_letter_queue(autojump_clock: trio.abc.Clock, tmp_path: Path) -> None:
    async with trio.open_nursery() as n:
        b, pop = await make_pop_broker(n, tmp_path)
        await put(b, b"bad")
        h = (await pop.pop(req())).messages[0].receipt_handle
        assert (await pop.forward_to_dead_letter_queue("G", "T", h)).status is AckStatus.OK
        assert b.store.get_message("x", "%DLQ%G", 0, 0, 10).message_count == 1
        await trio.sleep(30)
        assert (await pop.pop(req())).status is PopStatus.NO_NEW_MSG
        n.cancel_scope.cancel()


async def test_fifo_blocks_queue_until_ack(autojump_clock: trio.abc.Clock, tmp_path: Path) -> None:
    async with trio.open_nursery() as n:
        b, pop = await make_pop_broker(n, tmp_path, queues=1)
        set_group(b, "F", consumeMessageOrderly=True)
        for i in range(3):
            await put(b, b"f%d" % i)
        r1 = await pop.pop(req(group="F", max_msgs=1))
        assert [m.msg.body for m in r1.messages] == [b"f0"]
        assert ReceiptHandle.parse(r1.messages[0].receipt_handle).order
        # blocked while f0 is in flight
        assert (await pop.pop(req(group="F", max_msgs=1))).status is PopStatus.NO_NEW_MSG
        # not acked: f0 again, attempt 2, after its invisible time
        await trio.sleep(11)
        r2 = await pop.pop(req(group="F", max_msgs=1))
        assert [(m.msg.body, m.delivery_attempt) for m in r2.messages] == [(b"f0", 2)]
        # a long poll is woken by the ack and gets f1
        got: list[bytes] = []

        async def poller() -> None:
            r = await pop.pop(req(group="F", max_msgs=1, poll_time_ms=5000))
            got.extend(m.msg.body for m in r.messages)

        async with trio.open_nursery() as inner:
            inner.start_soon(poller)
            await trio.sleep(1)
            assert got == []
            assert (await pop.ack("F", "T", r2.messages[0].receipt_handle)).status is AckStatus.OK
        assert got == [b"f1"]
        n.cancel_scope.cancel()


async def test_fifo_dead_letters_after_max(autojump_clock: trio.abc.Clock, tmp_path: Path) -> None:
    async with trio.open_nursery() as n:
        b, pop = await make_pop_broker(n, tmp_path, queues=1)
        set_group(b, "F", consumeMessageOrderly=True, retryMaxTimes=1)
        await put(b, b"p")
        await put(b, b"q")
        seen = []
        for _ in range(3):
            r = await pop.pop(req(group="F", max_msgs=1, invisible_time_ms=1000))
            seen.append([(m.msg.body, m.delivery_attempt) for m in r.messages])
            await trio.sleep(1.5)
        assert seen == [[(b"p", 1)], [(b"p", 2)], [(b"q", 1)]]
        assert b.store.get_message("x", "%DLQ%F", 0, 0, 10).message_count == 1
        n.cancel_scope.cancel()


async def test_long_poll_woken_by_arrival(autojump_clock: trio.abc.Clock, tmp_path: Path) -> None:
    async with trio.open_nursery() as n:
        b, pop = await make_pop_broker(n, tmp_path)
        t0 = trio.current_time()
        r = await pop.pop(req(poll_time_ms=3000))
        assert r.status is PopStatus.NO_NEW_MSG
        assert trio.current_time() - t0 >= 3.0

        async def later() -> None:
            await trio.sleep(1)
            await put(b, b"late", queue_id=1)

        n.start_soon(later)
        t0 = trio.current_time()
        r = await pop.pop(req(poll_time_ms=10_000))
        assert [m.msg.body for m in r.messages] == [b"late"]
        assert 1.0 <= trio.current_time() - t0 < 2.0
        n.cancel_scope.cancel()


async def test_tag_and_sql_filters(autojump_clock: trio.abc.Clock, tmp_path: Path) -> None:
    async with trio.open_nursery() as n:
        b, pop = await make_pop_broker(n, tmp_path, enable_property_filter=True)
        await put(b, b"a", tags="A")
        await put(b, b"b", tags="B")
        r = await pop.pop(req(expression="B"))
        assert [m.msg.body for m in r.messages] == [b"b"]
        await put(b, b"c", tags="C")
        r = await pop.pop(req(group="S", expression_type="SQL92", expression="TAGS = 'C'"))
        assert [m.msg.body for m in r.messages] == [b"c"]
        bad = await pop.pop(req(group="S2", expression_type="SQL92", expression="a = = 1"))
        assert bad.status is PopStatus.FILTER_ERROR
        n.cancel_scope.cancel()


async def test_pop_and_pull_groups_side_by_side(
    autojump_clock: trio.abc.Clock, tmp_path: Path
) -> None:
    async with trio.open_nursery() as n:
        b, pop = await make_pop_broker(n, tmp_path, queues=1)
        for i in range(4):
            await put(b, b"s%d" % i)
        r = await pop.pop(req(max_msgs=4))
        assert len(r.messages) == 4
        com = b.consumer_offset_manager
        assert com.query_offset("G", "T", 0) == 4
        assert com.query_offset("PULLER", "T", 0) == -1
        pulled = b.store.get_message("PULLER", "T", 0, 0, 32)
        assert pulled.message_count == 4
        n.cancel_scope.cancel()


async def test_bad_input(autojump_clock: trio.abc.Clock, tmp_path: Path) -> None:
    async with trio.open_nursery() as n:
        b, pop = await make_pop_broker(n, tmp_path, auto_create_subscription_group=False)
        set_group(b, "G")
        assert (await pop.pop(req(group="nope"))).status is PopStatus.SUBSCRIPTION_GROUP_NOT_EXIST
        assert (await pop.pop(req(topic="NOPE"))).status is PopStatus.TOPIC_NOT_EXIST
        assert (await pop.pop(req(queue_id=7))).status is PopStatus.BAD_REQUEST
        assert (await pop.pop(req(max_msgs=0))).status is PopStatus.BAD_REQUEST
        for h in ["", "garbage", "1 2 3", "a b c d e f g h", "1 2 3 4 9 broker 0 1"]:
            assert (await pop.ack("G", "T", h)).status is AckStatus.BAD_HANDLE, h
        other = "0 1 1000 0 0 someOtherBroker 0 0"
        assert (await pop.ack("G", "T", other)).status is AckStatus.BAD_HANDLE
        mine = f"0 1 1000 0 0 {b.config.broker_name} 0 0"
        assert (await pop.ack("G", "T", mine)).status is AckStatus.EXPIRED
        assert (await pop.ack("nope", "T", mine)).status is AckStatus.SUBSCRIPTION_GROUP_NOT_EXIST
        assert (await pop.ack("G", "NOPE", mine)).status is AckStatus.TOPIC_NOT_EXIST
        n.cancel_scope.cancel()


async def test_in_flight_and_polling_are_bounded(
    autojump_clock: trio.abc.Clock, tmp_path: Path
) -> None:
    async with trio.open_nursery() as n:
        b, pop = await make_pop_broker(
            n, tmp_path, queues=1, pop_inflight_message_threshold=3, max_pop_polling_size=2
        )
        for i in range(6):
            await put(b, b"%d" % i)
        first = await pop.pop(req(max_msgs=3))
        assert len(first.messages) == 3
        # the queue holds 3 unacked: no more until some are acked
        assert (await pop.pop(req(max_msgs=3))).status is PopStatus.NO_NEW_MSG
        await pop.ack("G", "T", first.messages[0].receipt_handle)
        assert len((await pop.pop(req(max_msgs=3))).messages) >= 1

        # two pollers of an empty topic hold the two slots; a third is answered POLLING_FULL
        b.topic_config_manager.update_topic_config(TopicConfig(topicName="E"))
        results: list[PopStatus] = []

        async def poll() -> None:
            results.append((await pop.pop(req(topic="E", poll_time_ms=5000))).status)

        async with trio.open_nursery() as inner:
            for _ in range(2):
                inner.start_soon(poll)
            await trio.sleep(0.5)
            assert (await pop.pop(req(topic="E", poll_time_ms=5000))).status is (
                PopStatus.POLLING_FULL
            )
        assert results == [PopStatus.NO_NEW_MSG] * 2
        n.cancel_scope.cancel()


def test_pop_config_keys() -> None:
    from broker.config import BrokerConfig

    cfg = BrokerConfig.from_properties(
        "reviveInterval=500\nreviveQueueNum=2\nmaxPopPollingSize=7\npopInflightMessageThreshold=9\n"
    )
    assert (cfg.revive_interval, cfg.revive_queue_num) == (0.5, 2)
    assert (cfg.max_pop_polling_size, cfg.pop_inflight_message_threshold) == (7, 9)


async def test_fifo_poll_gets_the_message_whose_lock_lapsed(
    autojump_clock: trio.abc.Clock, tmp_path: Path
) -> None:
    async with trio.open_nursery() as n:
        b, pop = await make_pop_broker(n, tmp_path, queues=1)
        set_group(b, "F", consumeMessageOrderly=True)
        await put(b, b"only")
        await pop.pop(req(group="F", invisible_time_ms=2000))
        # blocked while polling; the lock lapses at 2 s, the last look at 5 s finds it
        r = await pop.pop(req(group="F", poll_time_ms=5000))
        assert [(m.msg.body, m.delivery_attempt) for m in r.messages] == [(b"only", 2)]
        n.cancel_scope.cancel()


async def test_init_mode_last_starts_at_the_last_message(
    autojump_clock: trio.abc.Clock, tmp_path: Path
) -> None:
    async with trio.open_nursery() as n:
        b, pop = await make_pop_broker(n, tmp_path, queues=1)
        for i in range(3):
            await put(b, b"old%d" % i)
        r = await pop.pop(req(group="L", init_mode=ConsumeInitMode.LAST))
        # getInitOffset with initPopOffsetByCheckMsgInMem (RocketMQ 5's default): the queue
        # still holds its first message, so a new group reads it from there (max - 1 only
        # once the queue's head was deleted)
        assert [m.msg.body for m in r.messages] == [b"old0", b"old1", b"old2"]
        await put(b, b"new")
        r = await pop.pop(req(group="L", init_mode=ConsumeInitMode.LAST))
        assert [m.msg.body for m in r.messages] == [b"new"]
        n.cancel_scope.cancel()


async def test_poll_time_is_capped(autojump_clock: trio.abc.Clock, tmp_path: Path) -> None:
    async with trio.open_nursery() as n:
        _, pop = await make_pop_broker(n, tmp_path)
        t0 = trio.current_time()
        r = await pop.pop(req(poll_time_ms=10**12))
        assert r.status is PopStatus.NO_NEW_MSG
        assert trio.current_time() - t0 <= 31
        n.cancel_scope.cancel()


async def test_pops_count_as_gets(autojump_clock: trio.abc.Clock, tmp_path: Path) -> None:
    async with trio.open_nursery() as n:
        b, pop = await make_pop_broker(n, tmp_path)
        await put(b, b"s1")
        await put(b, b"s2", queue_id=1)
        assert len((await pop.pop(req())).messages) == 2
        assert b.stats.get_found == 2
        assert b.stats.manager.tps_group_get_nums("T", "G", trio.current_time()) > 0
        n.cancel_scope.cancel()
