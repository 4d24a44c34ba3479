"""FakeHA: what a SYNC_MASTER send asks of the HA service (``watch_replica``), decided by the test."""

from __future__ import annotations

from collections.abc import Callable

import trio

from broker.store import PutMessageStatus


class FakeHA:
    """Decides every watch 3 s later (``later``), or at once (``now``), with ``status``;
    records the offsets it was asked for."""

    def __init__(
        self, status: PutMessageStatus, nursery: trio.Nursery | None = None, *, now: bool = False
    ) -> None:
        self.status = status
        self.nursery = nursery
        self.now = now
        self.asked: list[int] = []

    def watch_replica(
        self, end_offset: int, on_done: Callable[[PutMessageStatus], None]
    ) -> PutMessageStatus | None:
        self.asked.append(end_offset)
        if self.now:
            return self.status

        async def later() -> None:
            await trio.sleep(3)
            on_done(self.status)

        assert self.nursery is not None
        self.nursery.start_soon(later)
        return None
