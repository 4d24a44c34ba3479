"""Pops waiting for a message (RocketMQ 5 ``PopLongPollingService``).

A pop that found nothing registers a waiter under its topic *before* its last look, then waits
on it up to its poll time: no arrival can slip in between.  The store's arrival listener wakes
the waiters of the topic, and of the topic a pop retry topic ``%RETRY%<group>_<topic>`` belongs
to; an ack of a FIFO message wakes the topic too (its queue may be unlocked).  Woken pops look
again.  At most ``limit`` waiters exist at once; past it a pop is answered POLLING_FULL.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import attrs
import trio

from common.topics import RETRY_GROUP_TOPIC_PREFIX

__all__ = ["PollingFull", "PopLongPolling"]


class PollingFull(Exception):
    """``limit`` pops wait already."""


@attrs.define(eq=False)
class PopLongPolling:
    limit: int
    _waiters: dict[str, set[trio.Event]] = attrs.field(factory=dict, init=False)
    _count: int = attrs.field(default=0, init=False)

    @property
    def waiting(self) -> int:
        return self._count

    @contextmanager
    def waiter(self, topic: str) -> Iterator[trio.Event]:
        """An Event set on the next arrival for ``topic``; raises PollingFull past the limit."""
        if self._count >= self.limit:
            raise PollingFull
        ev = trio.Event()
        self._waiters.setdefault(topic, set()).add(ev)
        self._count += 1
        try:
            yield ev
        finally:
            waiting = self._waiters.get(topic)
            if waiting is not None:
                waiting.discard(ev)
                if not waiting:
                    del self._waiters[topic]
            self._count -= 1

    def wake(self, topic: str) -> None:
        for ev in self._waiters.get(topic, ()):
            ev.set()

    def wake_all(self) -> None:
        for waiting in self._waiters.values():
            for ev in waiting:
                ev.set()

    def on_message_arriving(self, topic: str, queue_id: int, offset: int, tags: int) -> None:
        """Store arrival listener."""
        if not self._waiters:
            return
        self.wake(topic)
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            for t in list(self._waiters):
                if topic.endswith("_" + t):
                    self.wake(t)
