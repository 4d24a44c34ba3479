"""The trace writer (RocketMQ ``AsyncTraceDispatcher``) on Trio.

Theory of operation
-------------------
A traced client hands each finished record to :meth:`AsyncTraceDispatcher.append`, which
never waits: the record goes into a bounded memory channel (1024 records, Java's
``traceContextQueue``), and when the channel is full it is dropped and counted in
``discarded``, so a slow or absent trace topic never slows a send or a listener call.

One task (:meth:`run`) takes records off the channel, encodes them (``encoder.encode``) and
gathers them into one segment, as Java's ``TraceDataSegment`` does.  The segment becomes one
trace message when it holds ``max_msg_size - 10000`` characters of records (Java: the trace
producer's 128000-byte limit less 10 KB), or when its first record waited ``wait_threshold``
(500 ms; the task looks every ``polling`` = 100 ms).  A trace message's body is the records one
after the other; its KEYS are every record's msgId and keys, so QUERY_MESSAGE on the trace
topic by a msgId finds it.  We also cut a segment before its keys pass ``max_keys_chars``:
the broker refuses a message whose properties pass 32 KB, which Java's segment can reach under
load.

Messages are sent by tasks of the dispatcher's own nursery, at most ``max_in_flight`` at once
(Java's send thread pool and its bounded queue); a segment ready while that many are in
flight is dropped and its records counted in ``discarded``.  So memory stays bounded: the
channel, one segment and ``max_in_flight`` messages.  A failed send is logged and counted
(``send_failures``), never raised into the client: traces are best effort, as in Java.

:meth:`stop` ends the loop; :meth:`run` then sends what is left (the channel's records and the
segment) and waits up to ``flush_timeout`` for the sends in flight before it returns, as Java's
``flush`` on shutdown.  The owner (a traced Producer or PushConsumer) runs it with
:func:`running`, entered after the producer that carries the trace messages, so that producer
is still open while the last traces leave.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager

import trio

from common.topics import RMQ_SYS_TRACE_TOPIC
from rmq.trace.encoder import TraceContext, TraceTransferBean, encode

log = logging.getLogger(__name__)

# (trace topic, body, keys): send one trace message
TraceSender = Callable[[str, bytes, Sequence[str]], Awaitable[object]]

QUEUE_SIZE = 1024  # traceContextQueue
MAX_MSG_SIZE = 128_000  # the trace producer's maxMessageSize
POLLING = 0.1  # pollingTimeMil
WAIT_THRESHOLD = 0.5  # waitTimeThresholdMil
MAX_KEYS_CHARS = 16_000  # well under the broker's 32 KB properties limit
MAX_IN_FLIGHT = 8
SEND_TIMEOUT = 5.0  # the trace producer's sendMsgTimeout
FLUSH_TIMEOUT = 3.0


class AsyncTraceDispatcher:
    def __init__(
        self,
        send: TraceSender,
        topic: str | None = None,
        *,
        queue_size: int = QUEUE_SIZE,
        max_msg_size: int = MAX_MSG_SIZE,
        polling: float = POLLING,
        wait_threshold: float = WAIT_THRESHOLD,
        max_keys_chars: int = MAX_KEYS_CHARS,
        max_in_flight: int = MAX_IN_FLIGHT,
        send_timeout: float = SEND_TIMEOUT,
        flush_timeout: float = FLUSH_TIMEOUT,
    ) -> None:
        self.topic = topic or RMQ_SYS_TRACE_TOPIC
        self._send = send
        self._in, self._out = trio.open_memory_channel[TraceContext](queue_size)
        self.max_msg_size = max_msg_size
        self.polling = polling
        self.wait_threshold = wait_threshold
        self.max_keys_chars = max_keys_chars
        self.max_in_flight = max_in_flight
        self.send_timeout = send_timeout
        self.flush_timeout = flush_timeout
        # the segment being gathered
        self._segment: list[TraceTransferBean] = []
        self._segment_chars = 0
        self._segment_keys = 0
        self._first_added = 0.0
        self._in_flight = 0
        self._all_sent = trio.Event()  # replaced at the flush; set when nothing is in flight
        self._nursery: trio.Nursery | None = None
        self._loop_scope = trio.CancelScope()
        # counters: records dropped (channel full, or no send slot), messages sent / failed
        self.discarded = 0
        self.sent_messages = 0
        self.send_failures = 0

    # --- the client's side: never waits -------------------------------------------------------
    def append(self, ctx: TraceContext) -> bool:
        """Queue a record; False (and counted) when the queue is full or closed."""
        try:
            self._in.send_nowait(ctx)
        except (trio.WouldBlock, trio.ClosedResourceError):
            self.discarded += 1
            return False
        return True

    def stop(self) -> None:
        """End the loop; `run` sends what is left and returns."""
        self._loop_scope.cancel()

    # --- the writer task -----------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            with self._loop_scope:
                await self._loop()
            # flush: the records still queued, the segment, then the sends in flight
            self._in.close()
            self._drain()
            self._submit()
            self._all_sent = trio.Event()
            if self._in_flight:
                with trio.move_on_after(self.flush_timeout):
                    await self._all_sent.wait()
            nursery.cancel_scope.cancel()

    async def _loop(self) -> None:
        while True:
            with trio.move_on_after(self.polling):
                while True:
                    self._add(await self._out.receive())
                    # take what else is queued in this turn: one record per scheduling round
                    # falls behind many clients' tasks, each finishing a send per round
                    self._drain()
            if self._segment and trio.current_time() - self._first_added >= self.wait_threshold:
                self._submit()

    def _drain(self) -> None:
        while True:
            try:
                ctx = self._out.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                return
            self._add(ctx)

    def _add(self, ctx: TraceContext) -> None:
        if not ctx.trace_beans:
            return
        try:
            bean = encode(ctx)
        except Exception as exc:  # a record we cannot write is dropped, never the writer
            self.discarded += 1
            log.warning("trace: record dropped, it does not encode: %s", exc)
            return
        keys = sum(len(k) + 1 for k in bean.trans_keys)
        if self._segment and self._segment_keys + keys > self.max_keys_chars:
            self._submit()
        if not self._segment:
            self._first_added = trio.current_time()
        self._segment.append(bean)
        self._segment_chars += len(bean.trans_data)
        self._segment_keys += keys
        if self._segment_chars >= self.max_msg_size - 10_000:
            self._submit()

    def _submit(self) -> None:
        batch, self._segment = self._segment, []
        self._segment_chars = self._segment_keys = 0
        if not batch:
            return
        if self._in_flight >= self.max_in_flight or self._nursery is None:
            self.discarded += len(batch)
            log.warning(
                "trace: %d record(s) dropped, %d sends in flight", len(batch), self._in_flight
            )
            return
        self._in_flight += 1
        self._nursery.start_soon(self._send_batch, batch)

    async def _send_batch(self, batch: list[TraceTransferBean]) -> None:
        try:
            keys: dict[str, None] = {}
            for bean in batch:
                keys.update(dict.fromkeys(bean.trans_keys))
            body = "".join(b.trans_data for b in batch).encode()
            try:
                with trio.fail_after(self.send_timeout):
                    await self._send(self.topic, body, list(keys))
            except Exception as exc:  # best effort: a lost trace never fails the client
                self.send_failures += 1
                log.warning(
                    "trace: sending %d record(s) to %s failed: %s", len(batch), self.topic, exc
                )
            else:
                self.sent_messages += 1
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._all_sent.set()


@asynccontextmanager
async def running(dispatcher: AsyncTraceDispatcher) -> AsyncIterator[AsyncTraceDispatcher]:
    """Run `dispatcher` for the block; on exit it flushes (bounded) before this returns."""
    async with trio.open_nursery() as nursery:
        await nursery.start(dispatcher.run)
        try:
            yield dispatcher
        finally:
            dispatcher.stop()


__all__ = ["AsyncTraceDispatcher", "TraceSender", "running"]
