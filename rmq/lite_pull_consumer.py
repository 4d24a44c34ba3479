"""LitePullConsumer: assign queues, seek, poll (DefaultLitePullConsumer in assign mode).

    async with LitePullConsumer("cg", "127.0.0.1:9876") as c:
        c.assign(await c.fetch_queues("TopicTest"))
        while True:
            for msg in await c.poll(timeout=1.0):
                ...

Theory of operation:

* One prefetch task per assigned queue, in the consumer's nursery, pulls ahead of the user
  with long polling (the broker holds a pull up to `long_poll` seconds until a message
  arrives) into that queue's buffer. It stops pulling while the buffer holds
  `pull_threshold_for_queue` messages and resumes when `poll` drains it (flow control).
  Pull errors are logged and retried after `pull_delay_on_error` (Java's 1 s), so a broker
  restart or a missing topic never kills the consumer. An empty answer that comes back
  before the long poll is over (a broker that does not hold pulls) is followed by a pause
  of up to 1 s, so such a broker is not asked in a tight loop.
* `set_selector(topic, selector)` narrows what is pulled of a topic (tags, or SQL92 that the
  broker evaluates; a SQL92 selector is checked with a broker when the consumer starts).
* A queue's start offset is the group's committed offset; with none, `consume_from`
  decides (LAST_OFFSET -> the queue's max offset, FIRST_OFFSET -> its min offset,
  TIMESTAMP -> the offset of `consume_timestamp_ms`), as computePullFromWhere does.
* Two offsets per queue: `pull_offset` (next offset to prefetch) and `consume_offset` (one
  past the last message `poll` handed out). Only the latter is ever committed, so a message
  is committed only after the user got it (at-least-once).
* `poll(timeout)` returns one buffered batch of one queue, visiting the queues round-robin so
  a busy queue cannot starve the others; with nothing buffered it waits up to `timeout`
  (Trio clock) and returns [].
* `seek(mq, offset)` (checked against the broker's min..max, as Java) empties the buffer,
  moves both offsets and cancels the queue's in-flight long poll; a result that comes back
  for the old position is dropped (each queue state has a `generation`, bumped per seek).
* Offsets are committed by `commit()`, every `auto_commit_interval` seconds when
  `auto_commit` (Java's 5 s persist), and once on exit (shielded, bounded by the timeout).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterable
from types import TracebackType

import attrs
import trio

from common.errors import RmqError, unwrapping_groups
from common.message import MessageExt
from common.model import MessageQueue
from common.remoting.network import Network
from rmq.errors import ClientError
from rmq.message_selector import MessageSelector
from rmq.pull_consumer import PullConsumer, PullStatus
from rmq.remoting import Remoting

log = logging.getLogger(__name__)

PULL_DELAY_ON_ERROR = 1.0  # Java PULL_TIME_DELAY_MILLS_WHEN_EXCEPTION
_EARLY_EMPTY_PAUSE = 1.0  # the broker's shortPollingTimeMills
_CONSUME_FROM = ("LAST_OFFSET", "FIRST_OFFSET", "TIMESTAMP")


@attrs.define(eq=False)
class _QueueState:
    mq: MessageQueue
    # next offset to pull; None until the start offset is known
    pull_offset: int | None = None
    # one past the last message handed to the user; None until known; what commit() stores
    consume_offset: int | None = None
    # messages pulled but not yet polled, in queue order, all >= consume_offset
    buffer: collections.deque[MessageExt] = attrs.Factory(collections.deque)
    # bumped by seek/unassign: a pull result carrying an older generation is dropped
    generation: int = 0
    # consume_offset changed since the last successful commit
    dirty: bool = False
    # cancels the queue's prefetch task (unassign) / its in-flight pull (seek)
    task_scope: trio.CancelScope | None = None
    pull_scope: trio.CancelScope | None = None
    # set when poll() takes messages out of a full buffer
    space: trio.Event = attrs.Factory(trio.Event)


class LitePullConsumer:
    def __init__(
        self,
        group: str = "DEFAULT_CONSUMER",
        namesrv: str | list[str] = "127.0.0.1:9876",
        *,
        auto_commit: bool = True,
        auto_commit_interval: float = 5.0,
        pull_batch_size: int = 32,
        poll_timeout: float = 5.0,
        pull_threshold_for_queue: int = 1000,
        long_poll: float = 20.0,
        consume_from: object = "LAST_OFFSET",
        consume_timestamp_ms: int | None = None,
        pull_delay_on_error: float = PULL_DELAY_ON_ERROR,
        timeout: float = 3.0,
        remoting: Remoting | None = None,
        network: Network | None = None,
    ) -> None:
        # by name; a ConsumeFromWhere member or RocketMQ's spelling ("CONSUME_FROM_...") too
        name = str(getattr(consume_from, "name", consume_from)).removeprefix("CONSUME_FROM_")
        if name not in _CONSUME_FROM:
            raise ClientError(f"consume_from must be one of {_CONSUME_FROM}, got {consume_from!r}")
        if name == "TIMESTAMP" and consume_timestamp_ms is None:
            raise ClientError("consume_from TIMESTAMP needs consume_timestamp_ms")
        if not 1 <= pull_batch_size <= 1024:
            raise ClientError("pull_batch_size must be within 1..1024")
        self.group = group
        self.auto_commit = auto_commit
        self.auto_commit_interval = auto_commit_interval
        self.pull_batch_size = pull_batch_size
        self.poll_timeout = poll_timeout
        self.pull_threshold_for_queue = pull_threshold_for_queue
        self.long_poll = long_poll
        self.consume_from = name
        self.consume_timestamp_ms = consume_timestamp_ms
        self.pull_delay_on_error = pull_delay_on_error
        self.timeout = timeout
        self._pull = PullConsumer(
            group, namesrv, remoting=remoting, network=network, timeout=timeout
        )
        # assigned queues in assignment order; the keys are exactly the assignment
        self._queues: dict[MessageQueue, _QueueState] = {}
        # queues taken out of the assignment with offsets not committed yet
        self._unassigned: dict[MessageQueue, _QueueState] = {}
        # set (and replaced) whenever a buffer gains messages; poll() waits on it
        self._data = trio.Event()
        # round-robin position of poll() over the assigned queues
        self._rr = 0
        self._nursery: trio.Nursery | None = None
        self._closing = False
        # topic -> what to pull of it (absent: every message)
        self._selectors: dict[str, MessageSelector] = {}

    # --- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> LitePullConsumer:
        await self._pull.__aenter__()
        try:
            await self._check_selectors()
        except BaseException:
            await self._pull.__aexit__(None, None, None)
            raise
        try:
            self._nursery_cm = trio.open_nursery()
            self._nursery = await self._nursery_cm.__aenter__()
        except BaseException:
            await self._pull.__aexit__(None, None, None)
            raise
        self._closing = False
        for state in self._queues.values():
            self._nursery.start_soon(self._prefetch, state)
        if self.auto_commit:
            self._nursery.start_soon(self._auto_commit)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        nursery, self._nursery = self._nursery, None
        if nursery is None:
            return
        self._closing = True
        nursery.cancel_scope.cancel()
        try:
            with unwrapping_groups():
                await self._nursery_cm.__aexit__(None, None, None)
        finally:
            try:
                with trio.CancelScope(shield=True), trio.move_on_after(self.timeout):
                    await self._commit_all(log_errors=True)
            finally:
                await self._pull.__aexit__(exc_type, exc, tb)

    # --- assignment --------------------------------------------------------------------------

    async def fetch_queues(self, topic: str) -> list[MessageQueue]:
        """Every readable queue of `topic` (to pass to `assign`)."""
        return await self._pull.fetch_queues(topic)

    def assign(self, mqs: Iterable[MessageQueue]) -> None:
        """Consume exactly `mqs` from now on (replaces the previous assignment)."""
        wanted = list(dict.fromkeys(mqs))
        for mq in wanted:
            if not isinstance(mq, MessageQueue):
                raise ClientError(f"assign wants MessageQueue objects, got {mq!r}")
        for mq in list(self._queues):
            if mq not in wanted:
                state = self._queues.pop(mq)
                state.generation += 1
                if state.task_scope is not None:
                    state.task_scope.cancel()
                if state.dirty and state.consume_offset is not None:
                    # what poll handed out is committed by the next commit, as Java persists a
                    # queue's offset before it leaves the assignment
                    self._unassigned[mq] = state
        for mq in wanted:
            if mq not in self._queues:
                state = self._queues[mq] = _QueueState(mq)
                if self._nursery is not None:
                    self._nursery.start_soon(self._prefetch, state)

    def assignment(self) -> frozenset[MessageQueue]:
        return frozenset(self._queues)

    def set_selector(self, topic: str, selector: str | MessageSelector) -> None:
        """Pull only what `selector` selects of `topic`'s assigned queues: a tag expression
        ('A || B') or `MessageSelector.by_sql(...)` (Java's setSubExpression4Assign). Before
        `async with`, which asks a broker whether it takes a SQL92 selector."""
        if self._nursery is not None:
            raise ClientError("set selectors before entering `async with LitePullConsumer(...)`")
        if not topic:
            raise ClientError("topic is empty")
        self._selectors[topic] = MessageSelector.of(selector)

    async def _check_selectors(self) -> None:
        for topic, selector in self._selectors.items():
            if selector.is_sql:
                await self._pull.check_selector(topic, selector)

    def _state(self, mq: MessageQueue) -> _QueueState:
        state = self._queues.get(mq)
        if state is None:
            raise ClientError(f"{mq} is not assigned to this consumer")
        return state

    # --- seek --------------------------------------------------------------------------------

    async def seek(self, mq: MessageQueue, offset: int) -> None:
        """Consume `mq` from `offset` on (within the queue's min..max offset)."""
        state = self._state(mq)
        lo, hi = await self._pull.min_offset(mq), await self._pull.max_offset(mq)
        if not lo <= offset <= hi:
            raise ClientError(f"seek offset {offset} illegal: {mq} holds {lo}..{hi}")
        self._move(state, offset)

    async def seek_to_begin(self, mq: MessageQueue) -> None:
        self._state(mq)
        self._move(self._state(mq), await self._pull.min_offset(mq))

    async def seek_to_end(self, mq: MessageQueue) -> None:
        self._state(mq)
        self._move(self._state(mq), await self._pull.max_offset(mq))

    def _move(self, state: _QueueState, offset: int) -> None:
        state.generation += 1
        state.buffer.clear()
        state.pull_offset = state.consume_offset = offset
        state.dirty = True
        state.space.set()
        if state.pull_scope is not None:
            state.pull_scope.cancel()  # a long poll at the old position would delay the new one

    # --- poll --------------------------------------------------------------------------------

    async def poll(self, timeout: float | None = None) -> list[MessageExt]:
        """The next batch of messages of one queue, or [] after `timeout` seconds."""
        if self._nursery is None:
            raise ClientError("LitePullConsumer is not open: use `async with`")
        timeout = self.poll_timeout if timeout is None else timeout
        with trio.move_on_after(timeout):
            while True:
                batch = self._take()
                if batch:
                    return batch
                await self._data.wait()
        return self._take()

    def _take(self) -> list[MessageExt]:
        states = list(self._queues.values())
        for k in range(len(states)):
            state = states[(self._rr + k) % len(states)]
            if state.buffer:
                self._rr = (self._rr + k + 1) % len(states)
                n = min(self.pull_batch_size, len(state.buffer))
                batch = [state.buffer.popleft() for _ in range(n)]
                state.consume_offset = batch[-1].queue_offset + 1
                state.dirty = True
                state.space.set()
                return batch
        if self._data.is_set():
            self._data = trio.Event()
        return []

    # --- offsets -----------------------------------------------------------------------------

    async def commit(self) -> None:
        """Store the consumed offset of every assigned queue on its broker now."""
        await self._commit_all(log_errors=False)

    async def committed(self, mq: MessageQueue) -> int:
        """The group's offset of `mq` stored on the broker (-1 if none)."""
        return await self._pull.query_offset(mq)

    async def _commit_all(self, *, log_errors: bool) -> None:
        # queues unassigned since the last commit first: a queue assigned again commits its
        # newer offset after them
        for state in [*self._unassigned.values(), *self._queues.values()]:
            if not state.dirty or state.consume_offset is None:
                continue
            offset = state.consume_offset
            try:
                await self._pull.commit_offset(state.mq, offset)
            except RmqError as exc:
                if not log_errors:
                    raise
                log.warning("commit of %s offset %d failed: %s", state.mq, offset, exc)
                continue
            if state.consume_offset == offset:
                state.dirty = False
        self._unassigned = {mq: st for mq, st in self._unassigned.items() if st.dirty}

    async def _auto_commit(self) -> None:
        while True:
            await trio.sleep(self.auto_commit_interval)
            await self._commit_all(log_errors=True)

    # --- prefetch ----------------------------------------------------------------------------

    async def _start_offset(self, mq: MessageQueue) -> int:
        found = await self._pull.query_offset(mq)
        if found >= 0:
            return found
        if self.consume_from == "FIRST_OFFSET":
            return await self._pull.min_offset(mq)
        if self.consume_from == "TIMESTAMP":
            if self.consume_timestamp_ms is None:
                raise ClientError("consume_from TIMESTAMP needs consume_timestamp_ms")
            return await self._pull.search_offset(mq, self.consume_timestamp_ms)
        return await self._pull.max_offset(mq)

    async def _prefetch(self, state: _QueueState) -> None:
        with trio.CancelScope() as state.task_scope:
            while self._queues.get(state.mq) is state:
                try:
                    await self._prefetch_once(state)
                except RmqError as exc:
                    log.warning("pull of %s failed, retrying: %s", state.mq, exc)
                    await trio.sleep(self.pull_delay_on_error)

    async def _prefetch_once(self, state: _QueueState) -> None:
        generation = state.generation
        if state.pull_offset is None:
            offset = await self._start_offset(state.mq)
            if state.generation == generation and state.pull_offset is None:
                state.pull_offset = state.consume_offset = offset
            return
        if len(state.buffer) >= self.pull_threshold_for_queue:
            state.space = trio.Event()
            await state.space.wait()
            return
        result = None
        with trio.CancelScope() as state.pull_scope:
            started = trio.current_time()
            result = await self._pull.pull(
                state.mq,
                state.pull_offset,
                self.pull_batch_size,
                suspend=self.long_poll,
                selector=self._selectors.get(state.mq.topic),
            )
            if result.status is PullStatus.NO_NEW_MSG:
                # A broker that does not hold pulls answers at once; pause like its short
                # polling would (<= 1 s) instead of asking again in a tight loop.
                held = trio.current_time() - started
                await trio.sleep(max(0.0, min(self.long_poll - held, _EARLY_EMPTY_PAUSE)))
        state.pull_scope = None
        if result is None or state.generation != generation:
            return  # cancelled by seek, or the answer is for the old position
        if result.status is PullStatus.FOUND:
            fresh = [m for m in result.messages if m.queue_offset >= state.pull_offset]
            state.buffer.extend(fresh)
            if fresh:
                self._data.set()
        elif result.status is PullStatus.OFFSET_ILLEGAL:
            log.warning(
                "%s offset %d illegal, moving to %d",
                state.mq,
                state.pull_offset,
                result.next_begin_offset,
            )
            if not state.buffer:
                state.consume_offset = result.next_begin_offset
                state.dirty = True
        state.pull_offset = result.next_begin_offset


__all__ = ["LitePullConsumer"]
