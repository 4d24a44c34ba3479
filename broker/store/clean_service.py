"""CleanCommitLogService's disk check: the store refuses puts before its filesystem is full.

Theory of operation
-------------------
Every ``cleanResourceInterval`` (10 s) the service measures the used ratio of the CommitLog's
filesystem, as RocketMQ does (``UtilAll.getDiskPartitionSpaceUsedPercent``: blocks not free over
all blocks), and judges it (``judge``, no I/O):

* above ``diskSpaceWarningLevelRatio`` (0.90) the store is marked disk-full and every put is
  answered SERVICE_NOT_AVAILABLE with the ratio in the remark; reads go on;
* at or below ``diskSpaceCleanForciblyRatio`` (0.85) the mark is cleared and writes resume by
  themselves; in between the mark stays as it was, so a disk near the line does not flap.

The check alone cannot keep a fast producer from filling a small disk between two checks, and a
store through a mapped hole on a full filesystem is a SIGBUS, so the segments take their blocks
ahead of the writes (mapped_file.py, ``reserve_blocks``): the put that finds the disk full gets
ENOSPC, is refused, and sets the same mark (running_flags.py).
"""

from __future__ import annotations

import logging
import os

import trio

from broker.store.config import MessageStoreConfig
from broker.store.running_flags import RunningFlags

log = logging.getLogger(__name__)


def disk_used_ratio(path: str) -> float:
    """Used / total of the filesystem holding ``path`` (0..1), -1 when it cannot be measured.
    A directory not made yet (the CommitLog's, before the first put) is measured at its
    nearest existing parent."""
    while True:
        try:
            st = os.statvfs(path)
            break
        except FileNotFoundError:
            parent = os.path.dirname(path)
            if parent == path:
                return -1.0
            path = parent
        except OSError:
            return -1.0
    if st.f_blocks <= 0:
        return -1.0
    return (st.f_blocks - st.f_bfree) / st.f_blocks


def judge(flags: RunningFlags, ratio: float, config: MessageStoreConfig) -> None:
    """Set or clear ``flags.disk_full`` from a measured ratio (module docstring)."""
    flags.disk_ratio = ratio
    if ratio < 0:
        return  # unknown: keep what we had
    if ratio > config.disk_space_warning_level_ratio:
        if not flags.disk_full:
            log.error(
                "disk %.2f used, over %.2f: refusing puts until it is back at %.2f",
                ratio,
                config.disk_space_warning_level_ratio,
                config.disk_space_clean_forcibly_ratio,
            )
        flags.disk_full = True
    elif ratio <= config.disk_space_clean_forcibly_ratio and flags.disk_full:
        log.warning("disk %.2f used: accepting puts again", ratio)
        flags.disk_full = False


async def run_clean_service(
    flags: RunningFlags,
    config: MessageStoreConfig,
    path: str,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Check the disk of ``path`` now and then every ``clean_resource_interval`` until cancelled."""
    judge(flags, await trio.to_thread.run_sync(disk_used_ratio, path), config)
    task_status.started()
    while True:
        await trio.sleep(config.clean_resource_interval)
        judge(flags, await trio.to_thread.run_sync(disk_used_ratio, path), config)
