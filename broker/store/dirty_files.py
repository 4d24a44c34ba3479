"""Cutting a running store back to a CommitLog offset (RocketMQ 5's ``truncateDirtyFiles``).

Theory of operation
-------------------
A store's own recovery only ever cuts a torn tail.  Something outside the store can know better:
in DLedger mode the Raft log is the truth and the classic store is its state machine, and after
a power cut the classic CommitLog can hold records of entries the Raft log no longer has (the
two files are synced by different tasks; the applier finds this on resume, applier.py).  Those
records must go before the store serves again, queue units and index entries with them.

``truncate_dirty_files(store, offset)`` holds the flush service's lock (no flush thread is
syncing a file while it is cut or deleted) and then, in the loop's thread:

* zeroes the CommitLog from ``offset`` (a record boundary) and deletes later segments (out of
  the queue at once, unlinked in a worker thread last);
* drops every ConsumeQueue unit of a record that ends after it, and the index entries at or
  past it;
* moves the dispatch point (and drops what the put path left for the dispatch past it), the
  flushed point and the checkpoint back to it, after syncing the zeroed tail (the checkpoint
  is written again at once, so a crash right after does not trust the old one).

Invariant after the call: the store looks as if nothing at or past ``offset`` was ever put.
"""

from __future__ import annotations

import contextlib
import logging

import trio

from broker.store.clean_service import unlink_segments
from broker.store.message_store import DefaultMessageStore

log = logging.getLogger(__name__)

__all__ = ["truncate_dirty_files"]


async def truncate_dirty_files(store: DefaultMessageStore, offset: int) -> None:
    """Cut ``store`` back to CommitLog ``offset`` (module docstring)."""
    flush = store.flush
    async with flush.lock if flush is not None else contextlib.nullcontext():
        cl = store.commit_log
        if offset >= cl.max_offset:
            return
        log.warning(
            "store %s: cutting the CommitLog back from %d to %d", store.root, cl.max_offset, offset
        )
        # out of the queues here, unlinked in a worker thread below (a big file's unlink can
        # take a while): no reader finds them after this step
        gone = cl.queue.truncate_dirty(offset, destroy=False)
        for cq in store.consume_queues.values():
            cq.truncate_dirty(offset, gone)
        cl.topic_queue_table = {k: cq.max_offset for k, cq in store.consume_queues.items()}
        store.index.recover(offset)
        store.reput.cut(offset)
        cut = cl.queue.find(offset - 1) if offset > 0 else None
        if cut is not None:
            # the zeroed tail must be on disk before a checkpoint that no longer covers it
            await trio.to_thread.run_sync(cut.sync)
        # and the dropped units before the records written at the cut next: one a power cut
        # brought back would point at one of those
        queues = [cq.queue for cq in store.consume_queues.values()]
        await trio.to_thread.run_sync(lambda: [q.sync_cuts() for q in queues])
        cp = store.checkpoint
        if flush is not None:
            flush.flushed = min(flush.flushed, offset)
        cp.commit_log_flushed = min(cp.commit_log_flushed, offset)
        cp.dispatched = min(cp.dispatched, offset)
        await trio.to_thread.run_sync(cp.write, cp.encode())
        await unlink_segments(gone)
