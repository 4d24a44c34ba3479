"""Delayed messages (RocketMQ ``ScheduleMessageService``).

Theory of operation
-------------------
A message with property DELAY=n (1..18) is not stored under its topic: the store puts it in
``SCHEDULE_TOPIC_XXXX`` queue ``n-1`` with REAL_TOPIC / REAL_QID remembering where it belongs
(``CommitLog.asyncPutMessage`` in ``store/CommitLog.java``; here
``broker/store/put_message.apply_delay``).  Every level has one fixed delay (``messageDelayLevel``,
"1s 5s 10s ... 2h"), so within one queue the deliver times are in store order and one cursor per
level suffices: the *delay offset*, the next logical offset of that queue still to deliver,
persisted as ``config/delayOffset.json`` (``{"offsetTable":{1:0}}``).

One task per level walks its queue: for the message at the cursor it computes the deliver time
(store timestamp + the level's delay, clamped like Java's ``correctDeliverTimestamp`` so a clock
step backwards cannot postpone delivery forever); if it is due, the message is re-put under its
real topic/queue without the DELAY/ WAIT properties and the cursor moves on; if not, the task
sleeps exactly until it is due.  An empty queue waits for the store's arrival notification for
that queue (through the same :class:`PullRequestHoldService` long polling uses), with a coarse
fallback timeout.  All waiting is on the Trio clock; ``now_ms`` maps it to wall-clock
milliseconds anchored when the service started, so autojump tests see time pass.

A failed re-put keeps the cursor where it is and retries after ``retry_delay`` (Java: 10 s).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import attrs
import trio
import trio.lowlevel

from broker.config_manager import DirtyConfigManager
from broker.processor.pull_hold import PullRequestHoldService
from broker.store.api import MessageStore
from broker.store.config import parse_delay_levels as _parse_levels
from broker.store.results import GetMessageStatus, PutMessageStatus
from common import serde
from common.message import MessageExt, MessageExtBrokerInner, decode_records, rewritten
from common.message_properties import MessageConst, real_destination
from common.topics import SCHEDULE_TOPIC

log = logging.getLogger(__name__)

SCHEDULE_GROUP = "SCHEDULE_CONSUMER"
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_BATCH = 32


def parse_delay_levels(text: str) -> dict[int, int]:
    """``"1s 5s 1m"`` -> ``{1: 1000, 2: 5000, 3: 60000}``; ValueError on a bad token."""
    return {i: ms for i, ms in enumerate(_parse_levels(text), start=1)}


def delay_level_to_queue_id(level: int) -> int:
    return level - 1


def queue_id_to_delay_level(queue_id: int) -> int:
    return queue_id + 1


def message_time_up(m: MessageExt) -> MessageExtBrokerInner | None:
    """The message to re-put under its real topic; None if it lost its REAL_TOPIC/REAL_QID."""
    props = dict(m.properties)
    destination = real_destination(props)
    if destination is None:
        return None
    topic, queue_id = destination
    props.pop(MessageConst.DELAY, None)
    props.pop(MessageConst.WAIT, None)
    return rewritten(m, topic, queue_id, props)


def trio_wall_clock_ms() -> Callable[[], int]:
    """Wall-clock ms that advance with the Trio clock (so autojump tests see time pass)."""
    base = time.time() * 1000.0 - trio.current_time() * 1000.0
    return lambda: int(base + trio.current_time() * 1000.0)


@attrs.define(eq=False)
class ScheduleMessageService(DirtyConfigManager):
    store: MessageStore
    hold: PullRequestHoldService
    levels: dict[int, int] = attrs.field(factory=lambda: parse_delay_levels(DEFAULT_DELAY_LEVELS))
    # ms clock used to decide whether a message is due; set by run() when None
    now_ms: Callable[[], int] | None = None
    retry_delay: float = 10.0
    idle_recheck: float = 10.0
    # level -> next logical offset of SCHEDULE_TOPIC_XXXX queue level-1 still to deliver
    offset_table: dict[int, int] = attrs.field(factory=dict)
    # the table changed since it was last persisted
    _dirty: bool = attrs.field(default=False, init=False)
    # count of messages re-put under their real topic (for stats and tests)
    delivered: int = attrs.field(default=0, init=False)

    @property
    def max_level(self) -> int:
        return max(self.levels)

    def compute_deliver_timestamp(self, level: int, store_timestamp: int) -> int:
        return store_timestamp + self.levels.get(level, 1000)

    # --- persistence ------------------------------------------------------------------------
    def to_wire(self) -> dict[str, dict[str, int]]:
        return {"offsetTable": {str(k): v for k, v in sorted(self.offset_table.items())}}

    def encode(self) -> bytes:
        return serde.dumps(self.to_wire())

    def decode(self, data: bytes | str) -> None:
        """Slave sync: adopt the master's delay offsets (marked dirty so they get persisted)."""
        self._load_obj(serde.loads(data))
        self._dirty = True

    def _load_obj(self, obj: object) -> None:
        if not isinstance(obj, dict) or not isinstance(obj.get("offsetTable", {}), dict):
            raise ValueError('delay offsets: expected {"offsetTable": {...}}')
        self.offset_table = {int(k): int(v) for k, v in (obj.get("offsetTable") or {}).items()}

    # --- delivery ---------------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if self.now_ms is None:
            self.now_ms = trio_wall_clock_ms()
        async with trio.open_nursery() as nursery:
            for level in sorted(self.levels):
                nursery.start_soon(self._deliver_level, level)
            task_status.started()

    def _set_offset(self, level: int, offset: int) -> None:
        if self.offset_table.get(level) != offset:
            self.offset_table[level] = offset
            self._dirty = True

    async def _deliver_level(self, level: int) -> None:
        qid = delay_level_to_queue_id(level)
        delay_ms = self.levels[level]
        assert self.now_ms is not None
        while True:
            offset = self.offset_table.get(level, 0)
            res = self.store.get_message(SCHEDULE_GROUP, SCHEDULE_TOPIC, qid, offset, _BATCH, None)
            st = res.status
            if st is GetMessageStatus.FOUND:
                msgs = decode_records(b"".join(bytes(b) for b in res.buffers))
                waited = False
                for m in msgs:
                    now = self.now_ms()
                    deliver = self.compute_deliver_timestamp(level, m.store_timestamp)
                    if deliver > now + delay_ms:  # clock went backwards: deliver now
                        deliver = now
                    if deliver > now:
                        await trio.sleep((deliver - now) / 1000.0)
                        waited = True
                        break
                    inner = message_time_up(m)
                    if inner is None:
                        log.warning(
                            "schedule: message at %d lost REAL_TOPIC; skipped", m.commit_log_offset
                        )
                    else:
                        result = await self.store.put_message(inner)
                        if result.status is not PutMessageStatus.PUT_OK:
                            log.warning(
                                "schedule: re-put of %s failed: %s", inner.topic, result.status
                            )
                            await trio.sleep(self.retry_delay)
                            waited = True
                            break
                        self.delivered += 1
                    self._set_offset(level, m.queue_offset + 1)
                if not waited:
                    # units scanned but not returned (holes, filtered) are skipped as well
                    cur = self.offset_table.get(level, 0)
                    self._set_offset(level, max(cur, res.next_begin_offset))
                    await trio.lowlevel.checkpoint()
            elif st is GetMessageStatus.OFFSET_TOO_SMALL:
                self._set_offset(level, res.min_offset)
            elif st is GetMessageStatus.OFFSET_OVERFLOW_BADLY:
                self._set_offset(level, res.max_offset)
            elif st in (GetMessageStatus.NO_MATCHED_MESSAGE, GetMessageStatus.MESSAGE_WAS_REMOVING):
                if res.next_begin_offset > offset:
                    self._set_offset(level, res.next_begin_offset)
                else:
                    await trio.sleep(self.retry_delay)
            else:
                # nothing (yet) beyond the cursor: wait for the reput task to add some
                await self.hold.wait_for_arrival(SCHEDULE_TOPIC, qid, offset, self.idle_recheck)
