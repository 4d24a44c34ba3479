"""The trace writer keeps tracing off the send path: appends never wait, memory is bounded,
records are batched into trace messages keyed by msgId, and the rest is flushed on close."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import trio

from rmq.trace.dispatcher import AsyncTraceDispatcher, running
from rmq.trace.encoder import MessageType, TraceBean, TraceContext, TraceType, decode

pytestmark = pytest.mark.timeout(10)


def pub(i: int, keys: str = "") -> TraceContext:
    return TraceContext(
        TraceType.Pub,
        time_stamp=1000 + i,
        group_name="pg",
        trace_beans=[
            TraceBean(topic="T", msg_id=f"MSG{i:04d}", keys=keys, msg_type=MessageType.Normal_Msg)
        ],
    )


class Sink:
    """A trace topic that takes messages after `delay` seconds (or never: `block`)."""

    def __init__(self, delay: float = 0.0, block: bool = False, fail: bool = False) -> None:
        self.delay, self.block, self.fail = delay, block, fail
        self.got: list[tuple[str, bytes, list[str]]] = []

    async def __call__(self, topic: str, body: bytes, keys: Sequence[str]) -> None:
        if self.block:
            await trio.sleep_forever()
        await trio.sleep(self.delay)
        if self.fail:
            raise OSError("broker gone")
        self.got.append((topic, body, list(keys)))


async def test_records_are_batched_after_the_wait_threshold(autojump_clock: object) -> None:
    sink = Sink()
    d = AsyncTraceDispatcher(sink)
    async with running(d):
        for i in range(5):
            assert d.append(pub(i, keys="k1 k2"))
        await trio.sleep(0.3)
        assert sink.got == []  # still under the 500 ms threshold
        await trio.sleep(0.5)
        [(topic, body, keys)] = sink.got
    assert topic == "RMQ_SYS_TRACE_TOPIC"
    assert [c.trace_beans[0].msg_id for c in decode(body.decode())] == [
        f"MSG{i:04d}" for i in range(5)
    ]
    # QUERY_MESSAGE by a msgId finds the message: every msgId (and key, once) is a key
    assert keys == ["MSG0000", "k1", "k2", "MSG0001", "MSG0002", "MSG0003", "MSG0004"]


async def test_a_full_segment_leaves_at_once_and_custom_topic(autojump_clock: object) -> None:
    sink = Sink()
    d = AsyncTraceDispatcher(sink, "MyTrace", max_msg_size=10_000 + 300)
    async with running(d):
        for i in range(20):
            d.append(pub(i))
        await trio.sleep(0.15)  # one polling round, far under the wait threshold
        assert len(sink.got) >= 2 and all(t == "MyTrace" for t, _, _ in sink.got)
    sent = [c for _, body, _ in sink.got for c in decode(body.decode())]
    assert len(sent) == 20 and d.discarded == 0


async def test_keys_are_capped_per_message(autojump_clock: object) -> None:
    sink = Sink()
    d = AsyncTraceDispatcher(sink, max_keys_chars=100, max_in_flight=100)
    async with running(d):
        for i in range(30):
            d.append(pub(i, keys="a-long-business-key-" + str(i)))
    assert len(sink.got) > 1
    assert all(sum(len(k) + 1 for k in keys) <= 100 for _, _, keys in sink.got)
    assert sum(len(decode(b.decode())) for _, b, _ in sink.got) == 30


async def test_full_queue_drops_and_counts_never_blocks(autojump_clock: object) -> None:
    # the writer is stuck on a trace topic that never answers: every send slot is taken
    sink = Sink(block=True)
    d = AsyncTraceDispatcher(sink, queue_size=8, max_in_flight=1, flush_timeout=1.0)
    async with running(d):
        t0 = trio.current_time()
        for i in range(10_000):
            d.append(pub(i))  # synchronous: a full queue cannot make it wait
            if i % 100 == 0:
                await trio.sleep(0.6)  # let the writer take some and cut segments
        assert trio.current_time() - t0 == pytest.approx(0.6 * 100)
        # bounded: the queue, one segment, one message in flight; the rest dropped
        assert d.discarded > 9_000
        assert d._in_flight == 1 and len(d._segment) <= 8 * 2
    assert sink.got == []


async def test_failed_sends_are_counted_not_raised(autojump_clock: object) -> None:
    sink = Sink(fail=True)
    d = AsyncTraceDispatcher(sink)
    async with running(d):
        d.append(pub(1))
        await trio.sleep(1)
    assert d.send_failures == 1 and d.sent_messages == 0


async def test_close_flushes_what_is_queued(autojump_clock: object) -> None:
    sink = Sink(delay=0.2)
    d = AsyncTraceDispatcher(sink)
    async with running(d):
        for i in range(3):
            d.append(pub(i))
    # the block ended at once; the exit sent the three records and waited for the send
    assert len(sink.got) == 1 and len(decode(sink.got[0][1].decode())) == 3
    assert not d.append(pub(9)) and d.discarded == 1  # closed: counted, not raised


async def test_close_does_not_wait_forever_for_a_dead_trace_topic(autojump_clock: object) -> None:
    d = AsyncTraceDispatcher(Sink(block=True), flush_timeout=2.0)
    t0 = trio.current_time()
    async with running(d):
        d.append(pub(1))
    assert trio.current_time() - t0 == pytest.approx(2.0)


async def test_a_record_that_does_not_encode_is_dropped_not_fatal(autojump_clock: object) -> None:
    sink = Sink()
    d = AsyncTraceDispatcher(sink)
    async with running(d):
        d.append(TraceContext(TraceType.Pub, trace_beans=[]))  # nothing to write: ignored
        d.append(TraceContext(TraceType.EndTransaction, trace_beans=[None]))  # type: ignore[list-item]
        d.append(pub(1))
    assert d.discarded == 1 and len(sink.got) == 1


async def test_the_writer_keeps_up_with_many_busy_tasks(autojump_clock: object) -> None:
    # 64 tasks each append a record every scheduling round: taking one record per round, the
    # writer would fall behind and the full queue would drop records
    sink = Sink()
    d = AsyncTraceDispatcher(sink)
    async with running(d):

        async def client(k: int) -> None:
            for i in range(50):
                d.append(pub(k * 1000 + i))
                await trio.lowlevel.checkpoint()

        async with trio.open_nursery() as nursery:
            for k in range(64):
                nursery.start_soon(client, k)
    assert d.discarded == 0
    assert sum(len(decode(body.decode())) for _, body, _ in sink.got) == 64 * 50
