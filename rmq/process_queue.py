"""ProcessQueue: the messages of one queue pulled but not yet consumed (Java ProcessQueue).

Theory of operation
-------------------
The pull loop of a queue `put`s each pulled batch here; the consume service takes them out
again when the listener is done with them. What is left is exactly "pulled but not finished",
so:

* The offset a consumer may commit is the smallest offset still held (`remove` returns it),
  or one past the largest offset ever put once nothing is held. Java keeps a TreeMap for
  this; pulls of one queue arrive in offset order, so an insertion-ordered dict is already
  sorted and its first key is the smallest (the orderly rollback below re-sorts explicitly).
  Committing that offset means a crash re-delivers what was in flight, never skips it.
* `msg_count` / `msg_size` feed flow control: the pull loop pauses while either is above its
  threshold (Java: pullThresholdForQueue / pullThresholdSizeForQueue).
* `dropped` is set when rebalancing takes the queue away (or the offset moved): the pull loop
  stops, and results of listener calls still running are not committed, because the queue's
  new owner starts from the offset this consumer persisted.
* Orderly consumption (`take_messages` / `commit` / `make_messages_to_consume_again`) moves
  messages to a `consuming` table while the listener runs, as Java's
  consumingMsgOrderlyTreeMap, and keeps the broker lock state (`locked`, `last_lock_time`).
  `consume_lock` is held by the one listener call at a time of an orderly queue, so a
  rebalance waits for it before it unlocks the queue on the broker.
"""

from __future__ import annotations

import attrs
import trio

from common.message import MessageExt

# A broker lock lives 60 s without renewal (RebalanceLockManager); the client treats its own
# lock as expired after 30 s (Java REBALANCE_LOCK_MAX_LIVE_TIME) and renews every 20 s.
REBALANCE_LOCK_MAX_LIVE_TIME = 30.0


@attrs.define(eq=False)
class ProcessQueue:
    # queue offset -> message pulled and not yet consumed; keys ascending (insertion order)
    msgs: dict[int, MessageExt] = attrs.field(factory=dict)
    # orderly only: queue offset -> message handed to the listener and not yet committed
    consuming: dict[int, MessageExt] = attrs.field(factory=dict)
    # largest queue offset ever put (-1: none yet)
    queue_offset_max: int = -1
    # total body bytes of `msgs` + `consuming`
    msg_size: int = 0
    dropped: bool = False
    # orderly: the broker granted this client the queue's lock at `last_lock_time` (Trio time)
    locked: bool = False
    last_lock_time: float = -1e9
    # orderly: a task is draining this queue (Java's `consuming` flag in ProcessQueue)
    consuming_task: bool = False
    consume_lock: trio.Lock = attrs.field(factory=trio.Lock)

    @property
    def msg_count(self) -> int:
        return len(self.msgs) + len(self.consuming)

    def put(self, msgs: list[MessageExt]) -> None:
        for m in msgs:
            if m.queue_offset not in self.msgs:
                self.msgs[m.queue_offset] = m
                self.msg_size += len(m.body)
            if m.queue_offset > self.queue_offset_max:
                self.queue_offset_max = m.queue_offset

    def remove(self, msgs: list[MessageExt]) -> int:
        """Forget consumed messages; the offset now safe to commit (-1: nothing ever put)."""
        for m in msgs:
            if self.msgs.pop(m.queue_offset, None) is not None:
                self.msg_size -= len(m.body)
        return self.commit_offset()

    def commit_offset(self) -> int:
        if self.msgs:
            return next(iter(self.msgs))
        if self.queue_offset_max < 0:
            return -1
        return self.queue_offset_max + 1

    # --- orderly ------------------------------------------------------------------------------

    def take_messages(self, n: int) -> list[MessageExt]:
        """The next `n` messages in offset order, moved to the consuming table."""
        out: list[MessageExt] = []
        while self.msgs and len(out) < n:
            off = next(iter(self.msgs))
            m = self.msgs.pop(off)
            self.consuming[off] = m
            out.append(m)
        return out

    def commit(self) -> int:
        """The taken messages are done; the offset to commit (-1 when none were taken)."""
        if not self.consuming:
            return -1
        top = max(self.consuming)
        for m in self.consuming.values():
            self.msg_size -= len(m.body)
        self.consuming.clear()
        return top + 1

    def make_messages_to_consume_again(self, msgs: list[MessageExt]) -> None:
        """Put taken messages back in front so the next take returns them again, in order."""
        for m in msgs:
            self.consuming.pop(m.queue_offset, None)
            self.msgs[m.queue_offset] = m
        self.msgs = dict(sorted(self.msgs.items()))

    def lock_expired(self, now: float) -> bool:
        return now - self.last_lock_time > REBALANCE_LOCK_MAX_LIVE_TIME
