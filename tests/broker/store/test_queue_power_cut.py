"""ConsumeQueues after a power cut: units past the checkpoint are rebuilt, and cuts are durable.

A power cut keeps whichever pages written since the last fdatasync the kernel wrote back, in
any order.  What a crash leaves is modelled here as a copy of the live directory after an
explicit flush (the checkpoint) and some unflushed sends, with the queue's tail past the
checkpoint damaged the way such a cut damages it: one unit lost (zero) while later ones were
kept.  Recovery must serve every record the CommitLog kept, each at its queue offset, and
never a unit that points at nothing (broker/store/recovery.py, "ConsumeQueue units past the
checkpoint").  And whatever recovery zeroes must reach the disk before the store takes
writes: a dropped unit that a second power cut brings back would point at the next record
written at its offset.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from broker.store.checkpoint import StoreCheckpoint
from broker.store.consumequeue import CQ_UNIT_SIZE
from tests.broker.store.test_torn_tail import QUEUES, Acked, mk, opened, put, served, tear

pytestmark = pytest.mark.timeout(60)


async def crashed_store(tmp_path: Path, flushed: int, unflushed: int) -> tuple[Path, Acked, int]:
    """A store killed after ``flushed`` sends and a flush, then ``unflushed`` more sends:
    (its directory as the crash left it, the acknowledged sends, the checkpoint)."""
    live = tmp_path / "live"
    acked: Acked = {}
    async with opened(live) as store:
        for i in range(flushed):
            await put(store, i, acked)
        await store.flush.flush_all()
        checkpoint = store.checkpoint.dispatched
        for i in range(flushed, flushed + unflushed):
            await put(store, i, acked)
        crashed = tmp_path / "crashed"
        shutil.copytree(live, crashed, ignore=shutil.ignore_patterns("lock"))
    assert StoreCheckpoint.load(str(crashed / "checkpoint")).dispatched == checkpoint
    return crashed, acked, checkpoint


def queue_file(root: Path, qid: int) -> Path:
    (path,) = (root / "consumequeue" / "T" / str(qid)).iterdir()
    return path


async def test_a_hole_in_a_queue_past_the_checkpoint_is_rebuilt_not_served(tmp_path):
    crashed, acked, checkpoint = await crashed_store(tmp_path, flushed=30, unflushed=45)
    first_unflushed = len(
        [1 for (q, _o), (p, _s, _b) in acked.items() if q == 0 and p < checkpoint]
    )
    last = len([k for k in acked if k[0] == 0])
    assert last - first_unflushed >= 10
    want = {k: (p, b) for k, (p, _s, b) in acked.items()}
    # each unit of queue 0 past the checkpoint, in turn, is the one a power cut lost
    for hole in range(first_unflushed, last):
        root = tmp_path / f"hole{hole}"
        shutil.copytree(crashed, root)
        with open(queue_file(root, 0), "r+b") as f:  # noqa: ASYNC230 (a small test file)
            f.seek(hole * CQ_UNIT_SIZE)
            f.write(bytes(CQ_UNIT_SIZE))
        async with opened(root) as store:
            assert served(store) == want, f"hole at queue offset {hole}"
            # and the next send takes the next queue offset
            r = await store.put_message(mk(QUEUES * 1000))
            assert r.ok
            assert r.append is not None and r.append.logics_offset == last


async def test_units_recovery_drops_are_on_disk_before_it_returns(tmp_path, monkeypatch):
    crashed, acked, checkpoint = await crashed_store(tmp_path, flushed=30, unflushed=45)
    end = max(p + s for p, s, _b in acked.values())
    # the last records never reached the disk: the queues hold units past the CommitLog's end
    tear(crashed, end, end - checkpoint - 10)
    synced: set[str] = set()
    real = os.fdatasync

    def spy(fd: int) -> None:
        synced.add(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fdatasync", spy)
    async with opened(crashed) as store:
        assert store.recovery.cq_units_dropped > 0
        assert store.recovery.files_synced >= QUEUES
        for qid in range(QUEUES):
            assert str(queue_file(crashed, qid).resolve()) in synced, f"queue {qid} cut unsynced"
        kept = {k: (p, b) for k, (p, s, b) in acked.items() if p + s <= checkpoint}
        assert served(store) == kept
