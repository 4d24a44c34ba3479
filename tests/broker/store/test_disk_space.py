"""A full disk is an answer, not a SIGBUS: blocks reserved ahead of writes, the disk check.

The stores here live on a tmpfs of a few MiB (``tests.support.tmpfs.small_tmpfs``).  Without the
reservation the first store into a hole past the end of the space kills this very process.
"""

from __future__ import annotations

import errno

import pytest
import trio

from broker.store import MessageStoreConfig, PutMessageStatus
from broker.store.clean_service import disk_used_ratio, judge, refuse_puts
from broker.store.mapped_file import ALLOCATION_CHUNK, MappedFile
from broker.store.running_flags import RunningFlags
from common.message import decode_record
from tests.support.tmpfs import grow_tmpfs, small_tmpfs

from .test_file_store import Opened, mk


def test_reserve_blocks_raises_enospc_and_stores_nothing(tmp_path):
    with small_tmpfs(tmp_path / "disk", 2) as disk:
        mf = MappedFile(str(disk / "seg"), 0, 8 << 20)
        try:
            chunk = b"a" * (256 << 10)
            with pytest.raises(OSError) as info:
                while True:
                    mf.append(chunk)
            assert info.value.errno == errno.ENOSPC
            assert mf.wrote % len(chunk) == 0 and 0 < mf.wrote <= mf.allocated
            assert mf.allocated % mf.chunk == 0 and mf.chunk == 32 * 1024  # 8 MiB / 256
            wrote = mf.wrote
            with pytest.raises(OSError):
                mf.write_at(mf.allocated, b"b")
            assert mf.wrote == wrote
            head = mf.slice(0, 4)
            assert head is not None and bytes(head) == b"aaaa"
        finally:
            mf.close()


def test_chunks_scale_with_the_file(tmp_path):
    sizes = {4096: 4096, 6_000_000: 24 * 1024, 1 << 30: ALLOCATION_CHUNK}
    for size, chunk in sizes.items():
        mf = MappedFile(str(tmp_path / f"seg-{size}"), 0, size)
        try:
            assert mf.chunk == chunk, size
            mf.append(b"x")  # one byte takes one chunk, not the file
            assert mf.allocated == chunk
        finally:
            mf.destroy()


def test_judge_refuses_above_the_warning_level_and_resumes_at_the_forced_clean_level(
    tmp_path, caplog
):
    cfg = MessageStoreConfig(store_path_root_dir=str(tmp_path))
    flags = RunningFlags()
    seq = [(0.5, False), (0.88, False), (0.91, True), (0.95, True), (0.87, True), (0.85, False)]
    for ratio, full in seq:
        judge(flags, ratio, cfg)
        assert flags.disk_full is full, ratio
        assert flags.writeable is not full
        if ratio == 0.95:
            refusal = flags.refusal()
            assert "disk is full [CL: 0.95]: over diskSpaceWarningLevelRatio 0.90" in refusal
            assert "nothing unexpired is (cleanFileForciblyEnable=false)" in refusal
    judge(flags, -1.0, cfg)  # unknown keeps the last judgement
    assert not flags.disk_full
    assert "0.91" not in flags.refusal()
    # one line into refusing, one out of it, however many checks in between
    assert caplog.text.count("refusing puts") == 1
    assert "disk 0.91 used: refusing puts (over diskSpaceWarningLevelRatio 0.90)" in caplog.text
    assert caplog.text.count("accepting puts again") == 1
    flags.mark_disk_full("")
    flags.disk_ratio = 0.93
    assert "disk is full [CL: 0.93]" in flags.refusal()


def test_the_refusal_names_the_forced_clean_when_it_is_on(tmp_path):
    cfg = MessageStoreConfig(store_path_root_dir=str(tmp_path), clean_file_forcibly_enable=True)
    flags = RunningFlags()
    judge(flags, 0.97, cfg)
    assert "cleanFileForciblyEnable=true" in flags.refusal()
    assert "expired or not" in flags.refusal()


def test_disk_used_ratio_measures_the_nearest_existing_directory(tmp_path):
    with small_tmpfs(tmp_path / "disk", 4) as disk:
        assert disk_used_ratio(str(disk / "not" / "made")) == 0.0
        (disk / "half").write_bytes(b"\1" * (2 << 20))
        assert disk_used_ratio(str(disk / "not" / "made")) == pytest.approx(0.5)


async def test_the_store_refuses_puts_on_a_full_disk_and_keeps_what_it_acknowledged(tmp_path):
    with small_tmpfs(tmp_path / "disk", 4) as disk:
        ballast = disk / "ballast"
        ballast.write_bytes(b"\1" * (1 << 20))
        async with Opened(
            disk / "store",
            mapped_file_size_commit_log=1 << 20,
            mapped_file_size_consume_queue=20 * 4096,
            max_hash_slot_num=64,
            max_index_num=256,
            disk_space_warning_level_ratio=1.0,  # the ratio check off: ENOSPC must hold
            clean_resource_interval=0.05,
        ) as store:
            acked = []
            result = None
            for i in range(10_000):
                result = await store.put_message(mk(qid=i % 2, body=b"%05d" % i + b"z" * 3000))
                if not result.ok:
                    break
                acked.append((i % 2, result.append.logics_offset, b"%05d" % i))
            assert result is not None and result.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
            assert "disk is full" in (result.remark or "")
            assert store.flags.disk_full and len(acked) > 100
            for qid, qoff, head in acked:
                got = store.get_message("g", "T", qid, qoff, 1)
                assert decode_record(bytes(got.buffers[0])).body.startswith(head)
            # space comes back: the disk check clears the mark and puts go in again
            ballast.unlink()
            with trio.fail_after(5):
                while store.flags.disk_full:  # noqa: ASYNC110 - the disk check polls too
                    await trio.sleep(0.05)
            assert (await store.put_message(mk(body=b"after"))).ok


async def test_a_marked_full_disk_is_checked_every_100_ms_not_every_round(tmp_path):
    """The put path's mark (ENOSPC) wakes the disk check, which clears it within a second once
    the disk has room, though the next round is an hour away."""
    with small_tmpfs(tmp_path / "disk", 4) as disk:
        async with Opened(disk / "store", clean_resource_interval=3600.0) as store:
            await trio.sleep(0.2)  # the first round is done; the next is an hour away
            refuse_puts(store.flags, store.config, "a CommitLog write found no space")
            assert not (await store.put_message(mk(body=b"refused"))).ok
            with trio.fail_after(1.0):
                while store.flags.disk_full:  # noqa: ASYNC110 - the disk check polls too
                    await trio.sleep(0.02)
            assert (await store.put_message(mk(body=b"after"))).ok


async def test_a_slave_on_a_full_disk_refuses_appends_keeps_its_log_and_resumes(tmp_path):
    """A slave's CommitLog (the master's bytes, append_to_commit_log) fills its disk: the append
    that finds no space is refused and marks the disk full; nothing is deleted; once the disk
    grows the mark clears within a second and the appends go on from where they stopped."""
    seg = 1 << 20
    small = dict(
        mapped_file_size_commit_log=seg,
        mapped_file_size_consume_queue=20 * 4096,
        max_hash_slot_num=64,
        max_index_num=256,
        clean_resource_interval=0.2,
    )
    async with Opened(tmp_path / "m", **small) as master:
        for i in range(1800):
            assert (await master.put_message(mk(qid=i % 2, body=b"%05d" % i + b"z" * 3000))).ok
        end = master.get_max_phy_offset()
        with small_tmpfs(tmp_path / "disk", 4) as disk:
            async with Opened(disk / "store", broker_role="SLAVE", **small) as slave:
                off = 0
                while off < end:
                    chunk = bytes(master.get_commit_log_data(off) or b"")[:65536]
                    if not slave.append_to_commit_log(off, chunk):
                        break
                    off += len(chunk)
                assert off < end and slave.flags.disk_full
                assert "replicated append found no space" in slave.flags.refusal()
                await trio.sleep(0.5)  # clean rounds on a full disk delete nothing unexpired
                assert slave.get_min_phy_offset() == 0
                await grow_tmpfs(disk, 16)
                with trio.fail_after(1.0):
                    while slave.flags.disk_full:  # noqa: ASYNC110 - the disk check polls too
                        await trio.sleep(0.02)
                while off < end:
                    chunk = bytes(master.get_commit_log_data(off) or b"")[:65536]
                    assert slave.append_to_commit_log(off, chunk)
                    off += len(chunk)
                await slave.wait_dispatched()
                for qid in range(2):
                    assert slave.get_max_offset_in_queue("T", qid) == 900
                    got = slave.get_message("g", "T", qid, 0, 1)
                    assert decode_record(bytes(got.buffers[0])).body.startswith(b"%05d" % qid)
