"""RunningFlags: why the store refuses writes right now (RocketMQ ``store/RunningFlags``).

Each flag has one writer and clears itself when its cause goes away; a put is refused with
SERVICE_NOT_AVAILABLE while any is set, reads are never refused:

* ``disk_full``: set by the disk check (clean_service.py) above ``diskSpaceWarningLevelRatio``
  and by the put path when the filesystem cannot back a CommitLog write (ENOSPC from
  ``MappedFile.reserve_blocks``); cleared by the disk check once the disk is at or below
  ``diskSpaceCleanForciblyRatio`` (the gap between the two keeps it from flapping).
* ``logics_queue_error``: set by the reput when a ConsumeQueue write failed (its segment could
  not get blocks); cleared by the reput's next round that gets through.  The record stays in
  the CommitLog and is dispatched by that round, so nothing acknowledged is lost.
"""

from __future__ import annotations

import attrs


@attrs.define
class RunningFlags:
    disk_full: bool = False
    logics_queue_error: bool = False
    # the used ratio of the CommitLog's filesystem at the last disk check (0..1; -1 unknown)
    disk_ratio: float = -1.0

    @property
    def writeable(self) -> bool:
        return not (self.disk_full or self.logics_queue_error)

    def refusal(self) -> str:
        """Why a put is refused, for its remark (send.py puts it after RocketMQ's text)."""
        if self.disk_full:
            ratio = f"{self.disk_ratio:.2f}" if self.disk_ratio >= 0 else "unknown"
            return f"the broker's disk is full [CL: {ratio}]"
        return "a consume queue write failed; retrying"
