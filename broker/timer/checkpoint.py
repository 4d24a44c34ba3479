"""What the timer service has resolved (RocketMQ 5 ``TimerCheckpoint``), as
``config/timerCheckpoint.json``.

``commitOffset``: every timer-queue entry below it is resolved (delivered or rolled).
``done``: entries at or above it resolved too (timers fire out of queue order), as
``[first, last]`` ranges.  ``scanFromPhy``: a CommitLog offset at or below every resolving write
not in ``done`` when the file was written.  Any older checkpoint is still correct, only slower to
recover from (package doc, invariant 3).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from broker.config_manager import DirtyConfigManager
from common import serde


def to_ranges(offsets: set[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for o in sorted(offsets):
        if out and out[-1][1] == o - 1:
            out[-1][1] = o
        else:
            out.append([o, o])
    return out


def from_ranges(ranges: object) -> set[int]:
    if not isinstance(ranges, list):
        raise ValueError("done: expected a list of [first, last]")
    out: set[int] = set()
    for r in ranges:
        if not isinstance(r, list) or len(r) != 2:
            raise ValueError("done: expected [first, last]")
        out.update(range(int(r[0]), int(r[1]) + 1))
    return out


# the running service's (commit offset, scan-from CommitLog offset, resolved entries above)
LiveState = Callable[[], tuple[int, int, set[int]]]


@attrs.define(eq=False)
class TimerCheckpoint(DirtyConfigManager):
    """While the service runs, ``live`` gives its state at the moment a snapshot is encoded
    (on the event loop), so a resolve costs only ``mark_dirty``; stopped, the fields hold the
    last state."""

    # None: no checkpoint stored (recovery starts at the oldest timer record)
    commit_offset: int | None = None
    scan_from_phy: int = 0
    done: set[int] = attrs.field(factory=set)
    live: LiveState | None = None
    _dirty: bool = attrs.field(default=False, init=False)

    def freeze(self) -> None:
        """The service stops: keep its state as it is now."""
        if self.live is not None:
            self.commit_offset, self.scan_from_phy, done = self.live()
            self.done = set(done)
            self.live = None
            self._dirty = True

    def encode(self) -> bytes:
        commit: int | None = self.commit_offset
        phy, done = self.scan_from_phy, self.done
        if self.live is not None:
            commit, phy, done = self.live()
        return serde.dumps({"commitOffset": commit, "scanFromPhy": phy, "done": to_ranges(done)})

    def _load_obj(self, obj: object) -> None:
        if not isinstance(obj, dict):
            raise ValueError('timer checkpoint: expected {"commitOffset": ...}')
        c = obj.get("commitOffset")
        self.commit_offset = None if c is None else int(c)
        self.scan_from_phy = int(obj.get("scanFromPhy") or 0)
        self.done = from_ranges(obj.get("done") or [])
