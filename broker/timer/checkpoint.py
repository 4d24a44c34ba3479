"""What the timer service has resolved (RocketMQ 5 ``TimerCheckpoint``), as
``config/timerCheckpoint.json``.

``commitOffset``: every timer-queue entry below it is resolved (delivered or rolled).
``done``: entries at or above it resolved too (timers fire out of queue order), as
``[first, last]`` ranges.  ``scanFromPhy``: a CommitLog offset at or below every resolving write
not in ``done`` when the file was written.  Any older checkpoint is still correct, only slower to
recover from (package doc, invariant 3).

A slave's copy (RocketMQ 5 ``SlaveSynchronize.syncTimerCheckPoint``, GET_TIMER_CHECK_POINT 60)
---------------------------------------------------------------------------------------------
A slave, or a DLedger follower, fetches the master's checkpoint in its metadata sync
(:meth:`TimerCheckpoint.take_master`), so when it becomes the serving node it starts near where
the master was instead of at the oldest timer record.  The master's numbers name offsets of the
master's CommitLog and timer queue, which a replica shares (HA copies the bytes; every DLedger
member applies the same committed entries at the same offsets); but the replica may lag.  Every
write that resolved an entry the checkpoint counts as resolved lies below its ``scanFromPhy``
(it had completed when the checkpoint was taken), so the copy is *usable* by a node whose
CommitLog reaches ``scanFromPhy``: a node short of it could lack a delivery the copy says was
made, and would lose that message.  Hence:

* a copy is kept beside the node's own checkpoint (``master``), and persisted with it;
* at start (:meth:`TimerCheckpoint.best`) the node takes, of its own and the copy, the one with
  the higher ``scanFromPhy`` among the usable ones (its own always is: it names its own log);
  a copy its log does not reach is ignored, so the start is as slow as without it, never wrong;
* a copy is taken only while this node's timer service is stopped (RocketMQ: only when the
  timer store is not dequeuing), and only when it is fresher than what the node holds.
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


# the most resolved entries above the watermark a copy may carry (the service's own are bounded
# by one roll window of timers; this only stops a bad answer from taking the memory)
MAX_DONE = 1 << 22


def _span(r: object) -> int:
    if isinstance(r, list) and len(r) == 2:
        return max(0, int(r[1]) - int(r[0]) + 1)
    return 0


# the running service's (commit offset, scan-from CommitLog offset, resolved entries above)
LiveState = Callable[[], tuple[int, int, set[int]]]


@attrs.frozen
class CheckpointCopy:
    """A checkpoint as another node (the master) had it."""

    commit_offset: int
    scan_from_phy: int
    done: frozenset[int]

    def to_obj(self) -> dict[str, object]:
        return {
            "commitOffset": self.commit_offset,
            "scanFromPhy": self.scan_from_phy,
            "done": to_ranges(set(self.done)),
        }

    @classmethod
    def from_obj(cls, obj: object) -> CheckpointCopy | None:
        """None for a master that has no checkpoint (``commitOffset`` null)."""
        if not isinstance(obj, dict):
            raise ValueError('timer checkpoint: expected {"commitOffset": ...}')
        c = obj.get("commitOffset")
        if c is None:
            return None
        phy = int(obj.get("scanFromPhy") or 0)
        if int(c) < 0 or phy < 0:
            raise ValueError("timer checkpoint: negative offset")
        ranges = obj.get("done") or []
        # (another node's answer: its size is checked before it is expanded)
        if isinstance(ranges, list) and sum(_span(r) for r in ranges) > MAX_DONE:
            raise ValueError(f"timer checkpoint: more than {MAX_DONE} resolved entries")
        return cls(int(c), phy, frozenset(from_ranges(ranges)))


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
    # the master's checkpoint as last synced, while this node's log may not reach it yet
    # (module doc); None when there is none or it was taken as this node's own
    master: CheckpointCopy | None = None
    _dirty: bool = attrs.field(default=False, init=False)

    def freeze(self) -> None:
        """The service stops: keep its state as it is now."""
        if self.live is not None:
            self.commit_offset, self.scan_from_phy, done = self.live()
            self.done = set(done)
            self.live = None
            self._dirty = True

    def own(self) -> dict[str, object]:
        """This node's checkpoint (the live one while the service runs): what a master answers
        GET_TIMER_CHECK_POINT with."""
        commit: int | None = self.commit_offset
        phy, done = self.scan_from_phy, self.done
        if self.live is not None:
            commit, phy, done = self.live()
        return {"commitOffset": commit, "scanFromPhy": phy, "done": to_ranges(done)}

    def encode(self) -> bytes:
        obj = self.own()
        if self.master is not None and self.live is None:
            obj["master"] = self.master.to_obj()
        return serde.dumps(obj)

    def _load_obj(self, obj: object) -> None:
        if not isinstance(obj, dict):
            raise ValueError('timer checkpoint: expected {"commitOffset": ...}')
        c = obj.get("commitOffset")
        self.commit_offset = None if c is None else int(c)
        self.scan_from_phy = int(obj.get("scanFromPhy") or 0)
        self.done = from_ranges(obj.get("done") or [])
        m = obj.get("master")
        self.master = None if m is None else CheckpointCopy.from_obj(m)

    def take_master(self, copy: CheckpointCopy, max_phy: int) -> bool:
        """A slave sync fetched the master's checkpoint; ``max_phy`` is this node's CommitLog
        end.  True when it was kept (as this node's own when the log reaches it, else as the
        copy to weigh at start); False while the service runs or when it is not fresher."""
        if self.live is not None:
            return False
        held = self.scan_from_phy if self.commit_offset is not None else -1
        if copy.scan_from_phy < held:
            return False
        if copy.scan_from_phy <= max_phy:
            own = (copy.commit_offset, copy.scan_from_phy, set(copy.done))
            if own == (self.commit_offset, self.scan_from_phy, self.done):
                return False
            self.commit_offset, self.scan_from_phy, self.done = own
            self.master = None
        elif copy == self.master:
            return False
        else:
            self.master = copy
        self._dirty = True
        return True

    def best(self, max_phy: int) -> tuple[int | None, int, set[int]]:
        """Where a starting service begins: the freshest checkpoint this node's log (ending at
        ``max_phy``) makes usable; ``(None, 0, set())`` when there is none."""
        m = self.master
        if m is not None and m.scan_from_phy <= max_phy:
            if self.commit_offset is None or m.scan_from_phy >= self.scan_from_phy:
                return m.commit_offset, m.scan_from_phy, set(m.done)
        return self.commit_offset, self.scan_from_phy, set(self.done)
