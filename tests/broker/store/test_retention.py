"""Retention: expired CommitLog segments are deleted as RocketMQ does, and the queues follow.

Time is the store's clock (``store.clock``, ms) and the segments' mtimes, both set by the test:
a segment is "written 100 hours ago" because its mtime says so, with ``fileReservedTime`` 72.
"""

from __future__ import annotations

import os
import time

import trio

from broker.store import DefaultMessageStore, GetMessageStatus
from broker.store.clean_service import (
    clean_once,
    head_paths,
    is_time_to_delete,
    mtimes_ms,
    take_expired_segments,
)
from common.message import decode_record

from .test_file_store import SMALL, Opened, mk

NOW_MS = 1_800_000_000_000  # a fixed "now"
HOUR = time.localtime(NOW_MS / 1000).tm_hour
OTHER_HOUR = f"{(HOUR + 3) % 24:02d}"


def _age_segments(store: DefaultMessageStore, hours: float) -> None:
    t = NOW_MS / 1000 - hours * 3600
    for mf in store.commit_log.queue.files:
        os.utime(mf.path, (t, t))


def _commit_log_files(taken):
    return [mf for mf in taken if os.sep + "commitlog" + os.sep in mf.path]


async def _fill(store: DefaultMessageStore, n: int = 60) -> list[int]:
    offsets = []
    for i in range(n):
        r = await store.put_message(mk(qid=0, body=b"r%03d-" % i + b"y" * 250, KEYS=f"k{i}"))
        assert r.ok
        assert r.append is not None
        offsets.append(r.append.logics_offset)
    assert store.flush is not None
    await store.flush.flush_all()  # retention takes flushed segments only
    return offsets


def _take(store, ratio):
    return take_expired_segments(store, ratio, mtimes=mtimes_ms(head_paths(store)))


def test_delete_when_lists_hours():
    assert is_time_to_delete("04", 4)
    assert not is_time_to_delete("04", 5)
    assert is_time_to_delete("04;16", 16)
    assert not is_time_to_delete("", 0)


async def test_expired_segments_wait_for_the_hour_or_a_full_disk(tmp_path):
    async with Opened(tmp_path / "s", **SMALL, delete_when=OTHER_HOUR) as store:
        store.clock = lambda: NOW_MS
        await _fill(store)
        segments = len(store.commit_log.queue.files)
        assert segments > 4
        _age_segments(store, 100)
        assert _take(store, 0.5) == []  # expired, but not the hour
        taken = _take(store, 0.76)  # over diskMaxUsedSpaceRatio 75
        assert len(_commit_log_files(taken)) == segments - 1  # never the one being written
        for mf in taken:
            mf.destroy()


async def test_only_expired_segments_go_and_the_queues_follow(tmp_path):
    async with Opened(tmp_path / "s", **SMALL, delete_when=f"{HOUR:02d}") as store:
        store.clock = lambda: NOW_MS
        await _fill(store)
        files = store.commit_log.queue.files
        _age_segments(store, 10)  # all fresh ...
        old = files[:3]
        t = NOW_MS / 1000 - 73 * 3600
        for mf in old:  # ... but the first three
            os.utime(mf.path, (t, t))
        paths = [mf.path for mf in old]
        new_min = files[3].file_from_offset

        await clean_once(store)

        assert store.commit_log.min_offset == new_min
        assert not any(os.path.exists(p) for p in paths)  # noqa: ASYNC240
        cq_min = store.get_min_offset_in_queue("T", 0)
        assert cq_min > 0
        # the first unit left points into the CommitLog, the one before it did not
        first = store.get_message("g", "T", 0, cq_min, 1)
        assert first.status is GetMessageStatus.FOUND
        assert decode_record(bytes(first.buffers[0])).commit_log_offset >= new_min
        # a consumer behind the new start is told where the queue starts now
        behind = store.get_message("g", "T", 0, 0, 1)
        assert behind.status is GetMessageStatus.OFFSET_TOO_SMALL
        assert behind.next_begin_offset == cq_min
        # the consume queue lost its head files too (8 units each here)
        assert store.consume_queues[("T", 0)].queue.min_offset > 0


async def test_forced_clean_deletes_unexpired_segments_but_nothing_undispatched(tmp_path, caplog):
    async with Opened(
        tmp_path / "s", **SMALL, delete_when=OTHER_HOUR, clean_file_forcibly_enable=True
    ) as store:
        store.clock = lambda: NOW_MS
        await _fill(store)
        _age_segments(store, 0)
        files = store.commit_log.queue.files
        keep_from = files[2].file_from_offset
        store.reput.reput_from = keep_from + 1  # pretend the third segment is not dispatched
        taken = _take(store, 0.86)  # over diskSpaceCleanForciblyRatio
        taken_cl = _commit_log_files(taken)
        assert [mf.file_from_offset for mf in taken_cl] == [0, files[0].file_size]
        assert store.commit_log.min_offset == keep_from
        assert "cleanFileForciblyEnable=true" in caplog.text
        assert "2 of them unexpired" in caplog.text
        store.reput.reput_from = store.commit_log.max_offset
        for mf in taken:
            mf.destroy()


async def test_a_store_restarts_after_retention_and_serves_what_is_left(tmp_path):
    root = tmp_path / "s"
    async with Opened(root, **SMALL, delete_when=f"{HOUR:02d}") as store:
        store.clock = lambda: NOW_MS
        offsets = await _fill(store)
        _age_segments(store, 100)
        await clean_once(store)
        cl_min = store.commit_log.min_offset
        cq_min = store.get_min_offset_in_queue("T", 0)
    async with Opened(root, **SMALL, delete_when=OTHER_HOUR) as store:
        assert store.commit_log.min_offset == cl_min
        assert store.get_min_offset_in_queue("T", 0) == cq_min
        assert store.get_max_offset_in_queue("T", 0) == offsets[-1] + 1
        offset, read = cq_min, 0
        while offset < offsets[-1] + 1:  # a read stops at a consume queue segment's end
            got = store.get_message("g", "T", 0, offset, 64)
            assert got.status is GetMessageStatus.FOUND
            read += got.message_count
            offset = got.next_begin_offset
        assert read == offsets[-1] + 1 - cq_min
        assert (await store.put_message(mk(body=b"after"))).ok


async def test_the_service_cleans_by_itself(tmp_path):
    async with Opened(
        tmp_path / "s", **SMALL, delete_when=f"{HOUR:02d}", clean_resource_interval=0.02
    ) as store:
        store.clock = lambda: NOW_MS
        await _fill(store)
        _age_segments(store, 100)
        with trio.fail_after(5):
            while len(store.commit_log.queue.files) > 1:  # noqa: ASYNC110 - it polls too
                await trio.sleep(0.02)


async def test_by_default_a_full_disk_keeps_unexpired_segments(tmp_path):
    async with Opened(tmp_path / "s", **SMALL, delete_when=OTHER_HOUR) as store:
        store.clock = lambda: NOW_MS
        await _fill(store)
        _age_segments(store, 1)
        assert _commit_log_files(_take(store, 0.99)) == []
        await clean_once(store)  # the service's round, on whatever this disk holds
        assert store.commit_log.min_offset == 0
        _age_segments(store, 100)  # expired ones still go when the disk is that full
        taken = _take(store, 0.99)
        assert len(_commit_log_files(taken)) > 0
        for mf in taken:
            mf.destroy()


async def test_a_slave_keeps_unexpired_segments_unless_told_otherwise(tmp_path):
    """A slave's CommitLog is the master's bytes (append_to_commit_log), under the same rule."""
    async with Opened(tmp_path / "m", **SMALL) as master:
        await _fill(master)
        end = master.get_max_phy_offset()
        for forced in (False, True):
            async with Opened(
                tmp_path / f"s-{forced}",
                **SMALL,
                delete_when=OTHER_HOUR,
                broker_role="SLAVE",
                clean_file_forcibly_enable=forced,
            ) as slave:
                slave.clock = lambda: NOW_MS
                off = 0
                while off < end:
                    chunk = bytes(master.get_commit_log_data(off) or b"")
                    assert slave.append_to_commit_log(off, chunk)
                    off += len(chunk)
                await slave.wait_dispatched()
                await slave.flush.flush_all()
                _age_segments(slave, 1)
                taken = _commit_log_files(_take(slave, 0.99))
                assert bool(taken) is forced
                for mf in taken:
                    mf.destroy()
