"""FIFO pop: one batch in flight per (group, topic, queue) (RocketMQ 5
``broker/offset/ConsumerOrderInfoManager.java``).

Theory of operation
-------------------
For a group that consumes orderly, a queue is *locked* while a popped batch of it has an
unacked message still invisible: pop skips the queue, so the next message of a message group
(one group lives in one queue: the producer hashes ``message_group``) is never handed out
before the previous one is acked or dead-lettered.  The group's consumer offset of the queue
moves only over acked messages, so it is always the first unacked one; when the batch's
invisible time runs out the lock lapses and the next pop reads from that offset again, the
same messages in the same order, each with its attempt count raised.  Nothing is re-put to a
retry topic (RocketMQ's FIFO revive does the same).

Durability: each FIFO batch is also a checkpoint marked ``order`` in the revive log
(``broker/pop/checkpoint.py``), never revived; an ack clears its offset in every such checkpoint
of the queue.  A new master rebuilds the locks and the attempt counts from the undone ones
(:meth:`OrderInfoManager.rebuild`).  A change of a FIFO message's invisible time (RocketMQ 5
``ConsumerOrderInfoManager.updateNextVisibleTime``, persisted with its order info) is the batch's
CK written once more under the same key with the new invisible time (counted from the batch's
pop time); replay takes the last such record of a key, so a restarted master or a new leader
keeps the queue locked until the changed time, not the batch's first one.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

__all__ = ["OrderBatch", "OrderInfoManager"]

# (group, topic, queue id)
OrderKey = tuple[str, str, int]


@attrs.define(eq=False)
class OrderBatch:
    offsets: list[int]
    pop_time: int
    invisible_until: int
    acked: set[int] = attrs.field(factory=set)

    def blocks(self, now_ms: int) -> bool:
        return len(self.acked) < len(self.offsets) and now_ms < self.invisible_until


@attrs.define(eq=False)
class OrderInfoManager:
    _batches: dict[OrderKey, OrderBatch] = attrs.field(factory=dict)
    # how often each offset was handed out (delivery attempt = this count)
    _attempts: dict[OrderKey, dict[int, int]] = attrs.field(factory=dict)

    def clear(self) -> None:
        self._batches.clear()
        self._attempts.clear()

    def is_locked(self, key: OrderKey, now_ms: int) -> bool:
        b = self._batches.get(key)
        return b is not None and b.blocks(now_ms)

    def attempt_of(self, key: OrderKey, offset: int) -> int:
        """The attempt the next delivery of ``offset`` would be (1 for a first one)."""
        return self._attempts.get(key, {}).get(offset, 0) + 1

    def begin(self, key: OrderKey, offsets: list[int], pop_time: int, invisible_ms: int) -> None:
        self._batches[key] = OrderBatch(list(offsets), pop_time, pop_time + invisible_ms)
        att = self._attempts.setdefault(key, {})
        for o in offsets:
            att[o] = att.get(o, 0) + 1

    def forget(self, key: OrderKey, offset: int) -> None:
        """``offset`` was dead-lettered: its count is of no more use."""
        att = self._attempts.get(key)
        if att is not None:
            att.pop(offset, None)
            if not att:
                del self._attempts[key]

    def batch(self, key: OrderKey) -> OrderBatch | None:
        return self._batches.get(key)

    def ack(self, key: OrderKey, offset: int, pop_time: int) -> int | None:
        """Ack one message of the batch popped at ``pop_time``; returns the new consumer
        offset (first unacked, or past the batch), None for a stale handle."""
        b = self._batches.get(key)
        if b is None or b.pop_time != pop_time or offset not in b.offsets or offset in b.acked:
            return None
        b.acked.add(offset)
        att = self._attempts.get(key)
        if att is not None:
            att.pop(offset, None)
        for o in b.offsets:
            if o not in b.acked:
                return o
        del self._batches[key]
        return b.offsets[-1] + 1

    def change(self, key: OrderKey, offset: int, pop_time: int, until_ms: int) -> bool:
        b = self._batches.get(key)
        if b is None or b.pop_time != pop_time or offset not in b.offsets or offset in b.acked:
            return False
        b.invisible_until = until_ms
        return True

    def rebuild(self, batches: Iterable[tuple[OrderKey, list[int], set[int], int, int]]) -> None:
        """After a replay of the revive log: ``(key, offsets, acked, pop_time, invisible_ms)``
        of every undone FIFO checkpoint.  An offset's attempts are the undone batches that hold
        it unacked; the latest batch of a queue is its lock."""
        self.clear()
        for key, offsets, acked, pop_time, invisible_ms in sorted(batches, key=lambda b: b[3]):
            att = self._attempts.setdefault(key, {})
            for o in offsets:
                if o not in acked:
                    att[o] = att.get(o, 0) + 1
            self._batches[key] = OrderBatch(
                list(offsets), pop_time, pop_time + invisible_ms, set(acked) & set(offsets)
            )

    def inflight(self, group: str, topic: str) -> int:
        return sum(
            len(b.offsets) - len(b.acked)
            for (g, t, _), b in self._batches.items()
            if g == group and t == topic
        )
