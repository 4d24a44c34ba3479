"""FlushService: gets CommitLog, ConsumeQueue and index bytes to disk (Flush*Service, GroupCommit).

Theory of operation
-------------------
One task.  It wakes every ``flush_interval_commit_log`` (ASYNC_FLUSH) or as soon as a put asks
for a flush (SYNC_FLUSH group commit), snapshots the written end of the CommitLog, and fdatasyncs
every segment up to it in a worker thread (``trio.to_thread.run_sync``) so the event loop never
waits on the disk.  Puts that arrived while a flush ran are covered by the next one: that is the
group commit, one fdatasync for many puts.  ``wait_flushed(end)`` returns True once ``flushed >= end``
or False when ``sync_flush_timeout`` passed first (-> FLUSH_DISK_TIMEOUT; the message is stored).

Every ``flush_interval_consume_queue`` it also flushes ConsumeQueues and the index and then
writes the checkpoint.  Recovery starts reading at the checkpoint's ``dispatched`` and trusts
every byte below it (recovery.py), so: ``dispatched`` is ``reput_from`` captured *before* those
flushes (a record boundary; it never claims units that were not yet on disk), and the CommitLog
is flushed past it before the checkpoint is written (``dispatched <= commit_log_flushed``).

RSS: after each flush, flushed pages are released from the process's page tables
(``MappedFile.release``) to keep RSS flat; the logic flush also drops the CommitLog pages that
pulls faulted back in.  The slot table of the index file being written stays mapped while
puts come (index.py).  When the store goes quiet (the first wake that finds the CommitLog end
where the previous wake left it) the logic flush runs at once instead of at its next interval,
releases that slot table too, and freed heap goes back to the OS (broker/store/heap.py): an
idle broker holds what it needs to serve, not the peak of the burst that just ended.

``flush_all`` is the shutdown path (the store runs it shielded and bounded).
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Iterable, Mapping
from typing import Protocol

import trio

from broker.store.checkpoint import StoreCheckpoint
from broker.store.commitlog import CommitLog
from broker.store.config import MessageStoreConfig
from broker.store.consumequeue import ConsumeQueue
from broker.store.heap import trim_heap
from broker.store.index import IndexService
from broker.store.mapped_file import MappedFile

log = logging.getLogger(__name__)


class FlushTarget(Protocol):
    """What the flush service reads of its store (``DefaultMessageStore`` keeps it)."""

    @property
    def config(self) -> MessageStoreConfig: ...

    @property
    def commit_log(self) -> CommitLog: ...

    @property
    def consume_queues(self) -> Mapping[tuple[str, int], ConsumeQueue]: ...

    @property
    def index(self) -> IndexService: ...

    @property
    def checkpoint(self) -> StoreCheckpoint: ...

    # CommitLog offset below which every record is dispatched (a record boundary)
    @property
    def reput_from(self) -> int: ...

    # store timestamp of the newest record
    @property
    def last_store_timestamp(self) -> int: ...


def _flush_files(jobs: Iterable[tuple[MappedFile, int | None]], release: bool) -> None:
    """Worker thread: fdatasync each (file, upto), then drop the flushed pages from RSS."""
    for mf, upto in jobs:
        try:
            mf.flush_range(upto)
            if release:
                mf.release()
        except ValueError:  # closed meanwhile (topic deleted): nothing left to flush
            continue


def _release_files(files: Iterable[MappedFile], keep_pinned: bool = True) -> None:
    """Worker thread: drop pages that readers faulted back in (older segments) from RSS."""
    for mf in files:
        try:
            mf.release(keep_pinned=keep_pinned)
        except ValueError:
            continue


class FlushService:
    def __init__(self, store: FlushTarget):
        self.store = store
        cfg = store.config
        self.sync = cfg.flush_disk_type == "SYNC_FLUSH"
        self.interval = cfg.flush_interval_commit_log
        self.logic_interval = cfg.flush_interval_consume_queue
        self.release = cfg.release_flushed_pages
        # CommitLog offset below which everything is on disk
        self.flushed = store.commit_log.max_offset
        self._request = trio.Event()
        # replaced after every CommitLog flush; waiters re-check ``flushed`` when it fires
        self._progress = trio.Event()
        # serializes flushes (the periodic task and shutdown)
        self._lock = trio.Lock()

    @property
    def lock(self) -> trio.Lock:
        """Held by every flush; whoever cuts or deletes files takes it (dirty_files.py)."""
        return self._lock

    def request(self) -> None:
        self._request.set()

    async def wait_flushed(self, end: int, timeout: float) -> bool:
        with trio.move_on_after(timeout):
            while self.flushed < end:
                ev = self._progress
                self.request()
                await ev.wait()
            return True
        return self.flushed >= end

    async def flush_commit_log(self) -> None:
        async with self._lock:
            await self._flush_commit_log()

    async def _flush_commit_log(self) -> None:
        cl = self.store.commit_log
        target = cl.max_offset
        jobs = [(mf, mf.wrote) for mf in cl.queue.flush_jobs()]
        if jobs:
            await trio.to_thread.run_sync(_flush_files, jobs, self.release)
        if target > self.flushed:
            self.flushed = target
        ev, self._progress = self._progress, trio.Event()
        ev.set()

    async def flush_logics(self, *, quiet: bool = False) -> None:
        """Flush the ConsumeQueues and the index, then write the checkpoint; ``quiet``: the
        store has stopped taking writes, so the index slot table kept mapped for the puts
        (index.py) is released too."""
        async with self._lock:
            store = self.store
            # a record boundary: everything below it has its units and entries written now
            dispatched = store.reput_from
            if dispatched > self.flushed:
                # the checkpoint may only name CommitLog bytes that are on disk (recovery
                # does not read below it), so flush the records dispatched meanwhile first
                await self._flush_commit_log()
            jobs: list[tuple[MappedFile, int | None]] = []
            for cq in list(store.consume_queues.values()):
                jobs.extend((mf, mf.wrote) for mf in cq.flush_jobs())
            jobs.extend((mf, None) for mf in store.index.flush_jobs())
            if jobs:
                await trio.to_thread.run_sync(_flush_files, jobs, self.release)
            if self.release:
                await trio.to_thread.run_sync(_release_files, list(store.commit_log.queue.files))
                if quiet:
                    slots = [f.mf for f in store.index.files]
                    await trio.to_thread.run_sync(_release_files, slots, False)
            cp = store.checkpoint
            cp.commit_log_flushed = self.flushed
            cp.dispatched = dispatched
            cp.physic_msg_timestamp = store.last_store_timestamp
            cp.logics_msg_timestamp = store.last_store_timestamp
            cp.index_msg_timestamp = store.last_store_timestamp
            await trio.to_thread.run_sync(cp.write, cp.encode())

    async def flush_all(self) -> None:
        await self.flush_commit_log()
        await self.flush_logics()

    async def run(self) -> None:
        last_logic = trio.current_time()
        # the CommitLog end at the previous wake, and whether the store was released since it
        # last moved: the first wake that finds it unmoved is the quiet one (module doc)
        seen = self.store.commit_log.max_offset
        settled = True
        while True:
            with trio.move_on_after(self.interval):
                await self._request.wait()
            self._request = trio.Event()
            try:
                await self.flush_commit_log()
                now = trio.current_time()
                end = self.store.commit_log.max_offset
                quiet = end == seen and not settled
                if end != seen:
                    seen, settled = end, False
                if quiet or now - last_logic >= self.logic_interval:
                    last_logic = now
                    await self.flush_logics(quiet=quiet)
                if quiet:
                    settled = True
                    if self.release:
                        await trio.to_thread.run_sync(trim_heap)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    # a full disk is the disk check's business (clean_service.py), not a bug
                    log.error("flush failed, the disk is full; retrying: %s", exc)
                else:
                    log.exception("flush failed; retrying")
