"""The timer service (RocketMQ 5 ``TimerMessageStore``): reads ``rmq_sys_wheel_timer`` queue 0
into the wheel and delivers (or rolls) what is due; runs on a master / DLedger leader only.

See the package docstring for the theory and the invariants.  Here: ``run`` first recovers
(:meth:`TimerMessageService._recover`: the checkpoint, then a CommitLog scan for the markers of
writes made after it), then runs three tasks over the timer queue:

* *enqueue* follows the queue as records arrive and puts each unresolved *near* one in the
  wheel (``wheel.is_near``);
* *far* trails one roll window behind and, for each unresolved *far* record, once the window
  since its store time has passed, puts it in the wheel to deliver (due within the window) or
  to roll now (``wheel.far_action``); it never passes the enqueue cursor;
* *dequeue* sleeps until the wheel's first slot fires, then re-puts its entries one at a time
  (their order within a slot is timer-queue order) and marks each resolved once the store took
  it.  A failed put leaves the entry to be retried after ``retry_delay``; a put whose answer
  says "stored, replica late" counts as done.

The watermark: ``_pending`` holds entries in the wheel; the commit offset is the least of them
and the far cursor (every far record below it was looked at); ``_done`` the resolved entries
above it.  The checkpoint's CommitLog position is the store's end when no put is in flight,
else the end as it was when the in-flight put started, so every write not in ``_done`` lies at
or after it.
"""

from __future__ import annotations

import heapq
import logging
import struct
import time
from collections.abc import Callable

import attrs
import trio
import trio.lowlevel

from broker.processor.pull_hold import PullRequestHoldService
from broker.schedule import trio_wall_clock_ms
from broker.store.api import MessageStore
from broker.store.results import GetMessageStatus, PutMessageStatus
from broker.timer.checkpoint import TimerCheckpoint
from broker.timer.transform import TIMER_QUEUE_ID, TimerSettings, fire_ms
from broker.timer.wheel import FarAction, TimerEntry, TimerWheel, far_action, is_near
from common.message import (
    MESSAGE_MAGIC_CODE,
    MessageExt,
    MessageExtBrokerInner,
    RecordDecodeError,
    decode_records,
    record_properties,
)
from common.message_properties import MessageConst
from common.topics import TIMER_TOPIC

log = logging.getLogger(__name__)

TIMER_GROUP = "TIMER_CONSUMER"
# ours: on every record the service writes, the timer-queue offset of the entry it resolves
TIMER_QUEUE_OFFSET = "TIMER_QUEUE_OFFSET"
_BATCH = 32
# put answers after which the record is in the CommitLog (only a replica or flush was late)
_STORED = frozenset(
    {
        PutMessageStatus.PUT_OK,
        PutMessageStatus.FLUSH_DISK_TIMEOUT,
        PutMessageStatus.FLUSH_SLAVE_TIMEOUT,
        PutMessageStatus.SLAVE_NOT_AVAILABLE,
    }
)


def scan_markers(
    store: MessageStore, start: int, end: int, file_size: int, at_least: int
) -> set[int]:
    """The ``TIMER_QUEUE_OFFSET`` markers (>= ``at_least``) of the records in [start, end)."""
    found: set[int] = set()
    pos = max(start, store.get_min_phy_offset())
    while pos < end:
        buf = store.get_commit_log_data(pos)
        i = 0
        filler = buf is None
        if buf is not None:
            n = len(buf)
            while i + 8 <= n and pos + i < end:
                size, magic = struct.unpack_from(">ii", buf, i)
                if magic != MESSAGE_MAGIC_CODE or size <= 0 or i + size > n:
                    filler = True  # the BLANK record that ends a file
                    break
                try:
                    mark = record_properties(buf, i).get(TIMER_QUEUE_OFFSET)
                except RecordDecodeError:
                    filler = True
                    break
                if mark is not None and mark.isdigit() and int(mark) >= at_least:
                    found.add(int(mark))
                i += size
        if filler or i == 0:
            pos = (pos // file_size + 1) * file_size  # go on in the next file
        else:
            pos += i
    return found


def _entry_fire_ms(m: MessageExt, precision_ms: int) -> int | None:
    raw = dict(m.properties).get(MessageConst.TIMER_OUT_MS)
    if raw is None:
        return None
    try:
        return fire_ms(int(raw), precision_ms)
    except ValueError:
        return None


@attrs.define(eq=False)
class TimerMessageService:
    store: MessageStore
    hold: PullRequestHoldService
    settings: TimerSettings = attrs.field(factory=TimerSettings)
    window_slots: int = 3600
    commit_log_file_size: int = 1024 * 1024 * 1024
    checkpoint: TimerCheckpoint = attrs.field(factory=TimerCheckpoint)
    now_ms: Callable[[], int] | None = None
    retry_delay: float = 1.0
    idle_recheck: float = 10.0
    wheel: TimerWheel = attrs.field(factory=TimerWheel, init=False)
    # counts for stats and tests
    delivered: int = attrs.field(default=0, init=False)
    rolled: int = attrs.field(default=0, init=False)
    _read_offset: int = attrs.field(default=0, init=False)
    _far_offset: int = attrs.field(default=0, init=False)
    _read_moved: trio.Event = attrs.field(factory=trio.Event, init=False)
    _commit_offset: int = attrs.field(default=0, init=False)
    _pending: set[int] = attrs.field(factory=set, init=False)
    _pending_heap: list[int] = attrs.field(factory=list, init=False)
    _done: set[int] = attrs.field(factory=set, init=False)
    _inflight_phy: int | None = attrs.field(default=None, init=False)
    _wakeup: trio.Event = attrs.field(factory=trio.Event, init=False)
    running: bool = attrs.field(default=False, init=False)

    @property
    def window_ms(self) -> int:
        return self.window_slots * self.settings.precision_ms

    def clock_ms(self) -> int:
        """The service's wall clock in ms (it follows the Trio clock, so autojump tests see
        time pass); the send path computes deliver times from the same clock."""
        if self.now_ms is None:
            try:
                self.now_ms = trio_wall_clock_ms()
            except RuntimeError:  # outside Trio
                return int(time.time() * 1000)
        return self.now_ms()

    # --- the watermark and the checkpoint ---------------------------------------------------
    def _resolve(self, queue_offset: int) -> None:
        self._inflight_phy = None
        self._pending.discard(queue_offset)
        self._done.add(queue_offset)
        self._advance()

    def _advance(self) -> None:
        heap = self._pending_heap
        while heap and heap[0] not in self._pending:
            heapq.heappop(heap)
        new = min(heap[0], self._far_offset) if heap else self._far_offset
        if new > self._commit_offset:
            if new - self._commit_offset < len(self._done):
                for o in range(self._commit_offset, new):
                    self._done.discard(o)
            else:
                self._done = {o for o in self._done if o >= new}
            self._commit_offset = new
        self.checkpoint.mark_dirty()

    def _live_state(self) -> tuple[int, int, set[int]]:
        """What a checkpoint written now says (see the module docstring)."""
        phy = self._inflight_phy
        if phy is None:
            phy = self.store.get_max_phy_offset()
        return self._commit_offset, phy, self._done

    @property
    def commit_offset(self) -> int:
        return self._commit_offset

    def runtime_info(self) -> dict[str, str]:
        """RocketMQ 5's timer keys of GET_BROKER_RUNTIME_INFO, as far as they apply here:
        how far the dequeue is behind its first due slot (ms), the timer records not read yet,
        and the timers held in the wheel."""
        behind = 0
        first = self.wheel.next_fire_ms()
        if self.running and first is not None:
            behind = max(0, self.clock_ms() - first)
        unread = 0
        if self.running:
            hi = self.store.get_max_offset_in_queue(TIMER_TOPIC, TIMER_QUEUE_ID)
            unread = max(0, hi - self._read_offset)
        return {
            "timerReadBehind": str(behind),
            "timerOffsetBehind": str(unread),
            "timerCongestNum": str(self.wheel.size),
            "timerDelivered": str(self.delivered),
            "timerRolled": str(self.rolled),
        }

    # --- run --------------------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.clock_ms()
        self._recover()
        self.checkpoint.master = None  # the live state supersedes any synced copy
        self.checkpoint.live = self._live_state
        self.running = True
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._enqueue_task)
                nursery.start_soon(self._far_task)
                nursery.start_soon(self._dequeue_task)
                task_status.started()
        finally:
            self.running = False
            # a put cancelled in flight may still land: _inflight_phy keeps it in the scan
            self.checkpoint.freeze()
            self._inflight_phy = None

    def _recover(self) -> None:
        """Where to start: the checkpoint's watermark (or the oldest timer record), and the
        entries above it already resolved (the checkpoint's, and the markers the CommitLog holds
        from after it)."""
        store = self.store
        lo = store.get_min_offset_in_queue(TIMER_TOPIC, TIMER_QUEUE_ID)
        hi = store.get_max_offset_in_queue(TIMER_TOPIC, TIMER_QUEUE_ID)
        # its own checkpoint or the master's synced copy, whichever is fresher and usable
        cp_commit, cp_phy, cp_done = self.checkpoint.best(store.get_max_phy_offset())
        if cp_commit is None:
            commit = lo
            if lo < hi:
                scan_from = store.get_commit_log_offset_in_queue(TIMER_TOPIC, TIMER_QUEUE_ID, lo)
            else:
                scan_from = store.get_max_phy_offset()
            done: set[int] = set()
        else:
            commit = min(max(cp_commit, lo), hi)
            scan_from = cp_phy
            # (an offset at or past the queue's end names no record of this log)
            done = {o for o in cp_done if commit <= o < hi}
        end = store.get_max_phy_offset()
        found = scan_markers(store, scan_from, end, self.commit_log_file_size, commit)
        self.wheel.clear()
        self._pending.clear()
        self._pending_heap.clear()
        self._done = done | found
        self._read_offset = commit
        self._far_offset = commit
        self._commit_offset = commit
        self._inflight_phy = None
        log.info(
            "timer: recovered at offset %d (queue %d..%d), %d resolved above, scanned %d bytes",
            commit,
            lo,
            hi,
            len(self._done),
            max(0, end - scan_from),
        )
        self._advance()

    def _to_wheel(self, m: MessageExt, queue_offset: int, fire: int, roll: bool) -> None:
        first = self.wheel.next_fire_ms()
        self.wheel.add(TimerEntry(m.commit_log_offset, m.store_size, queue_offset, fire, roll))
        self._pending.add(queue_offset)
        heapq.heappush(self._pending_heap, queue_offset)
        if first is None or fire < first:
            self._wakeup.set()

    def _add_near(self, m: MessageExt, queue_offset: int) -> None:
        if queue_offset in self._done:
            return
        fire = _entry_fire_ms(m, self.settings.precision_ms)
        if fire is None:
            log.warning("timer: record at %d has no TIMER_OUT_MS; skipped", m.commit_log_offset)
            self._done.add(queue_offset)
            return
        if is_near(fire, m.store_timestamp, self.window_ms):
            self._to_wheel(m, queue_offset, fire, roll=False)

    async def _enqueue_task(self) -> None:
        while True:
            offset = self._read_offset
            res = self.store.get_message(TIMER_GROUP, TIMER_TOPIC, TIMER_QUEUE_ID, offset, _BATCH)
            st = res.status
            if st is GetMessageStatus.FOUND:
                msgs = decode_records(b"".join(bytes(b) for b in res.buffers))
                for m, qo in zip(
                    msgs, res.queue_offsets or [m.queue_offset for m in msgs], strict=True
                ):
                    self._add_near(m, qo)
                self._read_offset = max(offset, res.next_begin_offset)
                self._read_moved.set()
                self._advance()
                await trio.lowlevel.checkpoint()
            elif st is GetMessageStatus.OFFSET_TOO_SMALL:
                self._read_offset = res.min_offset
            elif st in (GetMessageStatus.NO_MATCHED_MESSAGE, GetMessageStatus.MESSAGE_WAS_REMOVING):
                if res.next_begin_offset > offset:
                    self._read_offset = res.next_begin_offset
                    self._read_moved.set()
                    self._advance()
                else:
                    await trio.sleep(self.retry_delay)
            else:
                await self.hold.wait_for_arrival(
                    TIMER_TOPIC, TIMER_QUEUE_ID, offset, self.idle_recheck
                )

    async def _far_task(self) -> None:
        while True:
            offset = self._far_offset
            if offset >= self._read_offset:
                self._read_moved = trio.Event()
                with trio.move_on_after(self.idle_recheck):
                    await self._read_moved.wait()
                continue
            res = self.store.get_message(TIMER_GROUP, TIMER_TOPIC, TIMER_QUEUE_ID, offset, _BATCH)
            if res.status is GetMessageStatus.FOUND:
                msgs = decode_records(b"".join(bytes(b) for b in res.buffers))
                wait_ms = 0
                for m, qo in zip(
                    msgs, res.queue_offsets or [m.queue_offset for m in msgs], strict=True
                ):
                    if qo >= self._read_offset:
                        break
                    wait_ms = self._look_far(m, qo)
                    if wait_ms:
                        break
                    self._far_offset = qo + 1
                else:
                    self._far_offset = max(
                        self._far_offset, min(res.next_begin_offset, self._read_offset)
                    )
                self._advance()
                if wait_ms:
                    await trio.sleep(wait_ms / 1000.0)
                else:
                    await trio.lowlevel.checkpoint()
            elif res.status is GetMessageStatus.OFFSET_TOO_SMALL:
                self._far_offset = res.min_offset
            elif res.next_begin_offset > offset:
                self._far_offset = min(res.next_begin_offset, self._read_offset)
                self._advance()
            else:
                await trio.sleep(self.retry_delay)

    def _look_far(self, m: MessageExt, queue_offset: int) -> int:
        """The far cursor at one record: 0 when done with it, else ms to wait first."""
        if queue_offset in self._done or queue_offset in self._pending:
            return 0
        fire = _entry_fire_ms(m, self.settings.precision_ms)
        if fire is None or is_near(fire, m.store_timestamp, self.window_ms):
            return 0  # the enqueue cursor's
        now = self.clock_ms()
        action = far_action(fire, m.store_timestamp, now, self.window_ms)
        if action is FarAction.WAIT:
            return max(1, m.store_timestamp + self.window_ms - now)
        if action is FarAction.WHEEL:
            self._to_wheel(m, queue_offset, fire, roll=False)
        else:
            self._to_wheel(m, queue_offset, now, roll=True)
        return 0

    async def _dequeue_task(self) -> None:
        while True:
            first = self.wheel.next_fire_ms()
            now = self.clock_ms()
            if first is None or first > now:
                self._wakeup = trio.Event()
                wait = self.idle_recheck if first is None else (first - now) / 1000.0
                with trio.move_on_after(wait):
                    await self._wakeup.wait()
                continue
            for entry in self.wheel.pop_due(now):
                while True:
                    if await self._fire(entry):
                        break
                    await trio.sleep(self.retry_delay)

    async def _fire(self, entry: TimerEntry) -> bool:
        """Deliver or roll one entry; False when the store did not take it (retry)."""
        m = self.store.look_message_by_offset(entry.phys_offset, entry.size)
        if m is None:
            log.warning("timer: record at %d is gone; dropped", entry.phys_offset)
            self._resolve(entry.queue_offset)
            return True
        inner = self._reput(m, entry)
        if inner is None:
            log.warning("timer: record at %d lost REAL_TOPIC; dropped", entry.phys_offset)
            self._resolve(entry.queue_offset)
            return True
        # kept over a failed or cancelled put (the record may land anyway: a DLedger entry
        # the next leader commits) until this entry is resolved, so a checkpoint scans it
        if self._inflight_phy is None:
            self._inflight_phy = self.store.get_max_phy_offset()
        result = await self.store.put_message(inner)
        if result.status not in _STORED:
            log.warning("timer: re-put of %s failed: %s", inner.topic, result.status)
            return False
        self._inflight_phy = None
        if entry.roll:
            self.rolled += 1
        else:
            self.delivered += 1
        self._resolve(entry.queue_offset)
        return True

    def _reput(self, m: MessageExt, entry: TimerEntry) -> MessageExtBrokerInner | None:
        props = dict(m.properties)
        props[TIMER_QUEUE_OFFSET] = str(entry.queue_offset)
        props[MessageConst.TIMER_DEQUEUE_MS] = str(self.clock_ms())
        props.setdefault(MessageConst.TIMER_ENQUEUE_MS, str(m.store_timestamp))
        if entry.roll:
            rolls = props.get(MessageConst.TIMER_ROLL_TIMES, "0")
            props[MessageConst.TIMER_ROLL_TIMES] = str(int(rolls) + 1 if rolls.isdigit() else 1)
            topic, queue_id = TIMER_TOPIC, TIMER_QUEUE_ID
        else:
            topic = props.pop(MessageConst.REAL_TOPIC, "")
            qid = props.pop(MessageConst.REAL_QID, "")
            if not topic or not qid.isdigit():
                return None
            queue_id = int(qid)
        return MessageExtBrokerInner(
            topic=topic,
            queue_id=queue_id,
            flag=m.flag,
            body=m.body,
            properties=props,
            sys_flag=m.sys_flag,
            born_timestamp=m.born_timestamp,
            born_host=m.born_host,
            store_host=m.store_host,
            reconsume_times=m.reconsume_times,
        )
