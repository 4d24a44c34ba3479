"""RunningFlags: why the store refuses writes right now (RocketMQ ``store/RunningFlags``).

Each flag has one writer and clears itself when its cause goes away; a put is refused with
SERVICE_NOT_AVAILABLE while any is set, reads are never refused:

* ``disk_full``: set (``mark_disk_full``) by the disk check (clean_service.py) above
  ``diskSpaceWarningLevelRatio`` and by the put path when the filesystem cannot back a CommitLog
  write (ENOSPC from ``MappedFile.reserve_blocks``); cleared (``clear_disk_full``) by the disk
  check once the disk is at or below ``diskSpaceCleanForciblyRatio`` (the gap between the two
  keeps it from flapping).  Setting it wakes the disk check (``disk_full_marked``), which then
  measures every 100 ms, so puts resume within a second of space coming back.
* ``logics_queue_error``: set by the reput when a ConsumeQueue write failed (its segment could
  not get blocks); cleared by the reput's next round that gets through.  The record stays in
  the CommitLog and is dispatched by that round, so nothing acknowledged is lost.
"""

from __future__ import annotations

import attrs
import trio


@attrs.define
class RunningFlags:
    disk_full: bool = False
    logics_queue_error: bool = False
    # the used ratio of the CommitLog's filesystem at the last disk check (0..1; -1 unknown)
    disk_ratio: float = -1.0
    # why the disk is full and what the store does about it; "" while disk_full is clear
    disk_full_cause: str = ""
    # set while disk_full is (a fresh, unset one replaces it when the mark clears)
    disk_full_marked: trio.Event = attrs.field(factory=trio.Event)

    @property
    def writeable(self) -> bool:
        return not (self.disk_full or self.logics_queue_error)

    def mark_disk_full(self, cause: str) -> bool:
        """Refuse puts for a full disk; True if they were not refused for it already."""
        if self.disk_full:
            return False
        self.disk_full = True
        self.disk_full_cause = cause
        self.disk_full_marked.set()
        return True

    def clear_disk_full(self) -> bool:
        """Accept puts again as far as the disk goes; True if they were refused for it."""
        if not self.disk_full:
            return False
        self.disk_full = False
        self.disk_full_cause = ""
        self.disk_full_marked = trio.Event()
        return True

    def refusal(self) -> str:
        """Why a put is refused, for its remark (send.py puts it after RocketMQ's text)."""
        if self.disk_full:
            ratio = f"{self.disk_ratio:.2f}" if self.disk_ratio >= 0 else "unknown"
            cause = f": {self.disk_full_cause}" if self.disk_full_cause else ""
            return f"the broker's disk is full [CL: {ratio}]{cause}"
        return "a consume queue write failed; retrying"
