"""CleanCommitLogService's disk check: the store refuses puts before its filesystem is full.

Theory of operation
-------------------
Every ``cleanResourceInterval`` (10 s) the service measures the used ratio of the CommitLog's
filesystem, as RocketMQ does (``UtilAll.getDiskPartitionSpaceUsedPercent``: blocks not free over
all blocks), and judges it (``judge``, no I/O):

* above ``diskSpaceWarningLevelRatio`` (0.90) the store is marked disk-full and every put is
  answered SERVICE_NOT_AVAILABLE with the ratio and the cause in the remark; reads go on, and so
  do the broker's small config and offset writes (a failed one is logged and tried again);
* at or below ``diskSpaceCleanForciblyRatio`` (0.85) the mark is cleared and writes resume by
  themselves; in between the mark stays as it was, so a disk near the line does not flap.

While the mark is set the service measures every ``DISK_FULL_POLL`` (100 ms; one ``statvfs`` in a
worker thread), not every round, so puts resume within a second of space coming back; setting
the mark wakes it (running_flags.py).  The transition into refusing and the one out of it are
logged once each, with the ratio, the cause and what retention will do about it.

The check alone cannot keep a fast producer from filling a small disk between two checks, and a
store through a mapped hole on a full filesystem is a SIGBUS, so the segments take their blocks
ahead of the writes (mapped_file.py, ``reserve_blocks``): the put that finds the disk full gets
ENOSPC, is refused, and sets the same mark (running_flags.py).

Retention (``clean_expired``), in the same round, as RocketMQ's CleanCommitLogService and
CleanConsumeQueueService do it:

* CommitLog segments go from the oldest on, each once its last write (the file's mtime) is
  ``fileReservedTime`` hours old, when the hour is one of ``deleteWhen`` ("04", or "04;16") or
  the disk is over ``diskMaxUsedSpaceRatio`` percent.  The first one that must stay ends the
  round, and at most ``DELETE_FILES_BATCH_MAX`` go per round.
* A full disk is not a retention policy: over ``diskSpaceCleanForciblyRatio`` only expired
  segments go, and the store refuses puts until the operator makes room.  RocketMQ instead
  deletes the oldest segments there, expired or not, consumed or not (its
  ``cleanFileForciblyEnable`` defaults to true, ``store/DefaultMessageStore.java``
  CleanCommitLogService); ``cleanFileForciblyEnable=true`` asks for that here, and each such
  round logs a warning naming the unexpired segments it deleted.
* Never deleted: the segment being written, and any segment holding bytes not dispatched yet
  (at or past ``reput_from``), so every record still in the CommitLog has its queue units.
* Then each ConsumeQueue drops its head segments whose units all point below the CommitLog's
  new start and moves its min offset to the first unit that still points into it; a consumer
  behind it is answered OFFSET_TOO_SMALL (PULL_OFFSET_MOVED) with the new min, as in RocketMQ.
  Index files whose entries all point below it go too.

A segment leaves its queue in the loop thread, so no new reader can find it, and is unmapped
there (a reader still holding a view keeps the mapping until it lets go, mapped_file.py); only
the unlink runs in a worker thread.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

import trio

from broker.store.commitlog import CommitLog
from broker.store.config import MessageStoreConfig
from broker.store.consumequeue import ConsumeQueue
from broker.store.index import IndexService
from broker.store.mapped_file import MappedFile
from broker.store.running_flags import RunningFlags

log = logging.getLogger(__name__)

# CommitLog segments deleted per round at most (RocketMQ MappedFileQueue.DELETE_FILES_BATCH_MAX)
DELETE_FILES_BATCH_MAX = 10
# seconds between two disk checks while puts are refused for a full disk
DISK_FULL_POLL = 0.1


class CleanableStore(Protocol):
    """What the clean service needs of the file store (message_store.DefaultMessageStore)."""

    config: MessageStoreConfig
    flags: RunningFlags
    commit_log: CommitLog
    consume_queues: dict[tuple[str, int], ConsumeQueue]
    index: IndexService
    # wall clock in ms (tests replace it)
    clock: Callable[[], int]

    @property
    def reput_from(self) -> int: ...


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


def retention_on_full_disk(config: MessageStoreConfig) -> str:
    """What retention does about a disk over the forced-clean ratio (module docstring)."""
    if config.clean_file_forcibly_enable:
        return (
            f"cleanFileForciblyEnable=true: over diskSpaceCleanForciblyRatio "
            f"{config.disk_space_clean_forcibly_ratio:.2f} the oldest CommitLog segments are "
            "deleted, expired or not"
        )
    return (
        f"only files older than fileReservedTime ({config.file_reserved_time} h) are deleted; "
        "nothing unexpired is (cleanFileForciblyEnable=false)"
    )


def refuse_puts(
    flags: RunningFlags, config: MessageStoreConfig, why: str, ratio: float | None = None
) -> None:
    """Mark the store disk-full for ``why`` (at a just measured ``ratio``, if there is one);
    the first mark logs it (module docstring)."""
    policy = retention_on_full_disk(config)
    if flags.mark_disk_full(f"{why}; {policy}"):
        log.error(
            "%s: refusing puts (%s) until it is at or below %.2f; %s",
            "disk full" if ratio is None else f"disk {ratio:.2f} used",
            why,
            config.disk_space_clean_forcibly_ratio,
            policy,
        )


def judge(flags: RunningFlags, ratio: float, config: MessageStoreConfig) -> None:
    """Set or clear ``flags.disk_full`` from a measured ratio (module docstring)."""
    flags.disk_ratio = ratio
    if ratio < 0:
        return  # unknown: keep what we had
    if ratio > config.disk_space_warning_level_ratio:
        refuse_puts(
            flags,
            config,
            f"over diskSpaceWarningLevelRatio {config.disk_space_warning_level_ratio:.2f}",
            ratio,
        )
    elif ratio <= config.disk_space_clean_forcibly_ratio and flags.clear_disk_full():
        log.warning(
            "disk %.2f used, at or below %.2f: accepting puts again",
            ratio,
            config.disk_space_clean_forcibly_ratio,
        )


def is_time_to_delete(delete_when: str, hour: int) -> bool:
    """``deleteWhen`` lists hours ("04", "04;16"); true during any of them (UtilAll.isItTimeToDo)."""
    for part in delete_when.split(";"):
        part = part.strip()
        if part.isdigit() and int(part) == hour:
            return True
    return False


def mtimes_ms(paths: Iterable[str]) -> dict[str, float]:
    """Each file's last write (mtime) in ms; a file already gone is left out.  Blocking: a
    ``stat`` can wait on a slow or busy disk, so the services call it in a worker thread."""
    out = {}
    for path in paths:
        try:
            out[path] = os.stat(path).st_mtime * 1000
        except FileNotFoundError:
            pass
    return out


def take_expired_segments(
    store: CleanableStore,
    ratio: float,
    cleaned_below: int = -1,
    *,
    mtimes: Mapping[str, float],
) -> list[MappedFile]:
    """Remove from the store what retention deletes now (module docstring); the caller
    destroys the returned files.  The queues and the index are looked at only when the
    CommitLog's start is past ``cleaned_below`` (where the last round left them).  No I/O:
    ``mtimes`` holds the head segments' last writes (``mtimes_ms`` of ``head_paths``), and a
    segment without one is not expired."""
    config = store.config
    now_ms = store.clock()
    hour = time.localtime(now_ms / 1000).tm_hour
    over = ratio > config.disk_space_clean_forcibly_ratio
    forced = over and config.clean_file_forcibly_enable
    due = (
        over
        or ratio > config.disk_max_used_space_ratio / 100
        or is_time_to_delete(config.delete_when, hour)
    )
    taken: list[MappedFile] = []
    if due:
        reserved_ms = config.file_reserved_time * 3600 * 1000
        queue = store.commit_log.queue
        count = unexpired = 0
        for mf in queue.files[:-1][:DELETE_FILES_BATCH_MAX]:
            if mf.file_from_offset + mf.file_size > store.reput_from or mf.flushed < mf.wrote:
                break  # not all dispatched yet, or a flush job may still hold its descriptor
            mtime = mtimes.get(mf.path)
            if mtime is None or now_ms < mtime + reserved_ms:
                if not forced:
                    break
                unexpired += 1
            count += 1
        taken = queue.take_head(count)
        if unexpired:
            log.warning(
                "cleanFileForciblyEnable=true and disk %.2f used, over "
                "diskSpaceCleanForciblyRatio %.2f: deleting %d CommitLog segments below %d, "
                "%d of them unexpired; their messages are gone, consumed or not",
                ratio,
                config.disk_space_clean_forcibly_ratio,
                len(taken),
                queue.min_offset,
                unexpired,
            )
        elif taken:
            log.info(
                "deleting %d expired CommitLog segments below %d (disk %.2f used)",
                len(taken),
                queue.min_offset,
                ratio,
            )
    cl_min = store.commit_log.min_offset
    if cl_min > cleaned_below:
        for cq in store.consume_queues.values():
            taken.extend(cq.take_expired(cl_min))
        taken.extend(f.mf for f in store.index.take_expired(cl_min))
    return taken


def head_paths(store: CleanableStore) -> list[str]:
    """The CommitLog segments one round may look at, oldest first."""
    return [mf.path for mf in store.commit_log.queue.files[:-1][:DELETE_FILES_BATCH_MAX]]


def _unlink_all(paths: Iterable[str]) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


async def unlink_segments(files: Iterable[MappedFile]) -> None:
    """Unmap segments already out of their queue (in the loop's thread, so no reader finds a
    closed one), then unlink them in a worker thread."""
    paths = []
    for mf in files:
        mf.close()
        paths.append(mf.path)
    if paths:
        await trio.to_thread.run_sync(_unlink_all, paths)


async def check_disk(store: CleanableStore) -> float:
    """Measure the CommitLog's filesystem (in a worker thread) and judge it; the ratio."""
    config = store.config
    ratio = await trio.to_thread.run_sync(disk_used_ratio, config.commit_log_dir)
    judge(store.flags, ratio, config)
    return ratio


async def clean_once(store: CleanableStore, cleaned_below: int = -1) -> int:
    """One round: measure, judge, delete what retention lets go; the CommitLog's start, which
    the next round passes back as ``cleaned_below``."""
    ratio = await check_disk(store)
    mtimes = await trio.to_thread.run_sync(mtimes_ms, head_paths(store))
    await unlink_segments(take_expired_segments(store, ratio, cleaned_below, mtimes=mtimes))
    return store.commit_log.min_offset


async def run_clean_service(
    store: CleanableStore,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """A round now, then one every ``clean_resource_interval`` until cancelled; between
    rounds, a disk check every ``DISK_FULL_POLL`` while puts are refused for a full disk."""
    cleaned_below = await clean_once(store)
    task_status.started()
    flags = store.flags
    while True:
        next_round = trio.current_time() + store.config.clean_resource_interval
        while trio.current_time() < next_round:
            if flags.disk_full:
                await trio.sleep(max(0.0, min(DISK_FULL_POLL, next_round - trio.current_time())))
                if flags.disk_full:
                    await check_disk(store)
                continue
            if flags.disk_full_marked.is_set():
                flags.disk_full_marked = trio.Event()  # cleared by a hand other than judge's
            with trio.move_on_at(next_round):
                await flags.disk_full_marked.wait()
        try:
            cleaned_below = await clean_once(store, cleaned_below)
        except OSError:
            log.exception("clean round failed")


def disk_runtime_info(path: str, flags: RunningFlags) -> dict[str, str]:
    """The disk lines of GET_BROKER_RUNTIME_INFO (RocketMQ's names) for the store at ``path``."""
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        st = os.statvfs(path)
        ratio = (st.f_blocks - st.f_bfree) / st.f_blocks if st.f_blocks else 0.0
        cap = f"Total : {st.f_blocks * st.f_frsize} B, Free : {st.f_bavail * st.f_frsize} B."
    except OSError:
        ratio, cap = 0.0, "unknown"
    return {
        "commitLogDirCapacity": cap,
        "commitLogDiskRatio": f"{ratio:.4f}",
        "consumeQueueDiskRatio": f"{ratio:.4f}",
        # ours: why puts are refused now, if they are ("" when the store takes writes)
        "putRefusedReason": "" if flags.writeable else flags.refusal(),
    }
