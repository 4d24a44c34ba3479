"""A full disk is an answer, not a SIGBUS: blocks reserved ahead of writes, the disk check.

The stores here live on a tmpfs of a few MiB (``tests.support.tmpfs.small_tmpfs``).  Without the
reservation the first store into a hole past the end of the space kills this very process.
"""

from __future__ import annotations

import errno

import pytest
import trio

from broker.store import MessageStoreConfig, PutMessageStatus
from broker.store.clean_service import disk_used_ratio, judge
from broker.store.mapped_file import ALLOCATION_CHUNK, MappedFile
from broker.store.running_flags import RunningFlags
from common.message import decode_record
from tests.support.tmpfs import small_tmpfs

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


def test_judge_refuses_above_the_warning_level_and_resumes_at_the_forced_clean_level(tmp_path):
    cfg = MessageStoreConfig(store_path_root_dir=str(tmp_path))
    flags = RunningFlags()
    for ratio, full in [(0.5, False), (0.88, False), (0.91, True), (0.87, True), (0.85, False)]:
        judge(flags, ratio, cfg)
        assert flags.disk_full is full, ratio
        assert flags.writeable is not full
    judge(flags, -1.0, cfg)  # unknown keeps the last judgement
    assert not flags.disk_full
    assert "0.91" not in flags.refusal()
    flags.disk_full = True
    flags.disk_ratio = 0.93
    assert "disk is full [CL: 0.93]" in flags.refusal()


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
