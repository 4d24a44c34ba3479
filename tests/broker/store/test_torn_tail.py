"""A crash that tears already-flushed bytes at the CommitLog's tail (a disk that lost a write).

What a crash leaves is a copy of the live directory taken after an explicit flush (checkpoint
at the log's end), sometimes with a few unflushed writes after it; then the last 1-500 bytes of
written CommitLog data are zeroed, so the tear lies below the checkpoint: bytes the store was
told were on disk.  Several rounds run on the same store, each one recovering from the last.
After each recovery: every acknowledged record that ends before the tear is served unchanged
(queue, queue offset, physical offset, body), none that the tear touched is, no served record
fails its body CRC, and a new send takes the next physical offset and the next queue offset.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import zlib
from pathlib import Path

import pytest
import trio

from broker.store import GetMessageStatus, MessageStoreConfig, run_message_store
from broker.store.checkpoint import StoreCheckpoint
from broker.store.commitlog_scan import check_implementation
from broker.store.message_store import DefaultMessageStore
from common.errors import unwrap_group
from common.message import MessageExtBrokerInner, RecordDecodeError, decode_records

SEG = 16 * 1024
QUEUES = 3
CONFIG = dict(
    mapped_file_size_commit_log=SEG,
    mapped_file_size_consume_queue=20 * 1024,
    max_hash_slot_num=64,
    max_index_num=4096,
    flush_interval_commit_log=3600.0,
    flush_interval_consume_queue=3600.0,
)

# (queue id, queue offset) -> (physical offset, size, body)
Acked = dict[tuple[int, int], tuple[int, int, bytes]]


def mk(i: int) -> MessageExtBrokerInner:
    return MessageExtBrokerInner(
        topic="T",
        queue_id=i % QUEUES,
        body=b"torn-%d-" % i + b"x" * (i * 37 % 300),
        properties={"KEYS": f"k{i}"},
        born_host=("10.0.0.1", 1),
        store_host=("127.0.0.1", 10911),
    )


@contextlib.asynccontextmanager
async def opened(root, **kw):
    cfg = MessageStoreConfig(store_path_root_dir=str(root), **{**CONFIG, **kw})
    async with trio.open_nursery() as nursery:
        store = await nursery.start(run_message_store, cfg)
        try:
            yield store
        finally:
            nursery.cancel_scope.cancel()


def served(store: DefaultMessageStore) -> dict[tuple[int, int], tuple[int, bytes]]:
    """Every record the queues serve, each body's CRC checked."""
    out = {}
    for qid in range(QUEUES):
        off = store.get_min_offset_in_queue("T", qid)
        while True:
            r = store.get_message("g", "T", qid, off, 32)
            if r.status is not GetMessageStatus.FOUND:
                break
            try:
                msgs = decode_records(b"".join(bytes(b) for b in r.buffers))
            except RecordDecodeError as exc:
                pytest.fail(f"served a damaged record: {exc}")
            for m in msgs:
                assert zlib.crc32(m.body) & 0x7FFFFFFF == m.body_crc, (
                    f"served a record with a bad body CRC at {m.commit_log_offset}"
                )
                assert m.queue_id == qid
                out[(qid, m.queue_offset)] = (m.commit_log_offset, m.body)
            off = r.next_begin_offset
        assert sorted(q for k, q in out if k == qid) == list(
            range(len([k for k in out if k[0] == qid]))
        )
    return out


def tear(root: Path, end: int, n: int) -> None:
    """Zero the ``n`` CommitLog bytes before absolute offset ``end``."""
    pos = end - n
    while pos < end:
        start = pos - pos % SEG
        upto = min(end, start + SEG)
        with open(root / "commitlog" / f"{start:020d}", "r+b") as f:
            f.seek(pos - start)
            f.write(bytes(upto - pos))
        pos = upto


def flip(path: Path, pos: int) -> None:
    """Invert the byte at ``pos`` of ``path``."""
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0xFF]))


async def put(store: DefaultMessageStore, i: int, acked: Acked) -> None:
    r = await store.put_message(mk(i))
    assert r.ok
    a = r.append
    assert a is not None
    acked[(i % QUEUES, a.logics_offset)] = (a.wrote_offset, a.wrote_bytes, mk(i).body)


def check(store: DefaultMessageStore, acked: Acked, torn_from: int) -> None:
    got = served(store)
    for key, (phys, size, body) in sorted(acked.items()):
        if phys + size <= torn_from:
            assert got.get(key) == (phys, body), f"acknowledged record {key} at {phys} lost"
        else:
            assert key not in got, f"torn record {key} at {phys} served"
    assert set(got) <= set(acked)


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_torn_flushed_tail_repeated_on_one_store(tmp_path, seed):
    rng = random.Random(seed)
    acked: Acked = {}
    root = tmp_path / "r0"
    torn_from = 0
    i = 0
    for round_no in range(1, 7):
        async with opened(root) as store:
            check(store, acked, torn_from)
            # what the tear cut is gone; new sends follow the survivors
            for key in [k for k, (p, s, _b) in acked.items() if p + s > torn_from]:
                del acked[key]
            for _ in range(rng.randrange(20, 120)):
                await put(store, i, acked)
                i += 1
            await store.flush.flush_all()
            flushed = store.get_max_phy_offset()
            assert store.checkpoint.dispatched == flushed
            for _ in range(rng.choice([0, 0, 1, 3])):  # a few writes the checkpoint does not cover
                await put(store, i, acked)
                i += 1
            end = store.get_max_phy_offset()
            crashed = tmp_path / f"r{round_no}"
            shutil.copytree(root, crashed, ignore=shutil.ignore_patterns("lock"))
        assert StoreCheckpoint.load(str(crashed / "checkpoint")).dispatched == flushed
        # some tears reach only the last record's properties (no CRC covers them)
        n = rng.choice([rng.randint(1, 16), rng.randint(1, 500), rng.randint(1, 500)])
        tear(crashed, end, n)
        # the record the tear starts in is the first one lost
        torn_from = min([p for p, s, _b in acked.values() if p + s > end - n], default=end)
        root = crashed
    async with opened(root) as store:
        check(store, acked, torn_from)
        survivors = {k: v for k, v in acked.items() if v[0] + v[1] <= torn_from}
        assert store.get_max_phy_offset() == torn_from
        # new sends take the next offsets: physical (the cut) and per queue (dense)
        for j in range(QUEUES):
            r = await store.put_message(mk(i + j))
            qid = (i + j) % QUEUES
            assert r.append.logics_offset == len([k for k in survivors if k[0] == qid])
            if j == 0:
                assert r.append.wrote_offset == torn_from


async def test_bad_crc_below_the_checkpoint_cuts_there_and_says_so(tmp_path, caplog):
    root = tmp_path / "live"
    acked: Acked = {}
    async with opened(root) as store:
        for i in range(60):
            await put(store, i, acked)
        await store.flush.flush_all()
        shutil.copytree(root, tmp_path / "crashed", ignore=shutil.ignore_patterns("lock"))
    crashed = tmp_path / "crashed"
    # a record in the middle of the last segment, well below the checkpoint, lost a byte
    last = max(p for p, _s, _b in acked.values()) // SEG * SEG
    victim = sorted(p for p, _s, _b in acked.values() if p >= last)[2]
    flip(
        crashed / "commitlog" / f"{last:020d}", victim - last + 90
    )  # in the body (IPv4 hosts: from +88)
    with caplog.at_level(logging.ERROR):
        async with opened(crashed) as store:
            assert store.get_max_phy_offset() == victim
            assert store.recovery.commit_log_end == victim
            check(store, acked, victim)
            # the checkpoint no longer names bytes past the cut
            assert StoreCheckpoint.load(str(crashed / "checkpoint")).dispatched <= victim
    assert any(
        str(victim) in r.getMessage() and "below the checkpoint" in r.getMessage()
        for r in caplog.records
    )


async def test_the_check_covers_a_bounded_window_below_the_checkpoint(tmp_path):
    """Damage older than ``crc_check_window_on_recover`` below the checkpoint is not looked
    for (start-up stays bounded); within it, it cuts, also when the window starts mid-segment."""
    root = tmp_path / "live"
    acked: Acked = {}
    async with opened(root) as store:
        for i in range(200):
            await put(store, i, acked)
        await store.flush.flush_all()
        end = store.get_max_phy_offset()
        shutil.copytree(root, tmp_path / "a", ignore=shutil.ignore_patterns("lock"))
        shutil.copytree(root, tmp_path / "b", ignore=shutil.ignore_patterns("lock"))
    window = SEG + SEG // 2  # starts in the middle of a segment
    starts = sorted(p for p, _s, _b in acked.values())
    inside = next(p for p in starts if p > end - window + 200)
    outside = max(p for p in starts if p < end - window - 500)
    for name, victim in (("a", inside), ("b", outside)):
        seg = victim // SEG * SEG
        flip(tmp_path / name / "commitlog" / f"{seg:020d}", victim - seg + 90)
    async with opened(tmp_path / "a", crc_check_window_on_recover=window) as store:
        rep = store.recovery
        assert rep.crc_from == end - window and rep.cut_below_checkpoint == end - inside
        assert store.get_max_phy_offset() == inside
        check(store, acked, inside)
    async with opened(tmp_path / "b", crc_check_window_on_recover=window) as store:
        assert store.get_max_phy_offset() == end
        assert store.recovery.crc_bytes == window


async def test_the_whole_last_segment_is_checked_beyond_the_window(tmp_path):
    """RocketMQ checks from the file the checkpoint falls in: damage near the start of a large
    last segment, far below the checkpoint and outside ``crc_check_window_on_recover``, is
    found and cut all the same."""
    big, window = 1 << 20, 16 * 1024
    root = tmp_path / "live"
    acked: Acked = {}
    async with opened(root, mapped_file_size_commit_log=big) as store:
        for i in range(1500):
            await put(store, i, acked)
        await store.flush.flush_all()
        end = store.get_max_phy_offset()
        shutil.copytree(root, tmp_path / "crashed", ignore=shutil.ignore_patterns("lock"))
    assert end > 16 * window  # one segment, far longer than the window
    crashed = tmp_path / "crashed"
    victim = sorted(p for p, _s, _b in acked.values())[3]
    flip(crashed / "commitlog" / f"{0:020d}", victim + 90)  # in the body (IPv4 hosts)
    cfg = {"mapped_file_size_commit_log": big, "crc_check_window_on_recover": window}
    async with opened(crashed, **cfg) as store:
        rep = store.recovery
        assert rep.crc_from == 0 and rep.crc_check == check_implementation()
        assert rep.cut_below_checkpoint == end - victim
        assert store.get_max_phy_offset() == victim
        check(store, acked, victim)


@pytest.mark.parametrize(
    ("start", "window", "expected"),
    [
        (250, 10, 200),  # the whole segment the checkpoint falls in
        (250, 120, 130),  # a window reaching further down, mid-segment
        (200, 10, 100),  # at a segment start: the segment that holds the byte below it
        (250, 10_000, 0),  # never before the first segment
        (0, 10, 0),  # nothing below the checkpoint
    ],
)
def test_where_the_check_below_the_checkpoint_starts(start, window, expected):
    from broker.store.recovery import crc_check_from

    assert crc_check_from(start=start, segment_starts=[0, 100, 200], window=window) == expected


async def test_segment_shorter_than_configured_is_one_clear_error(tmp_path):
    root = tmp_path / "s"
    async with opened(root) as store:
        for i in range(100):
            await store.put_message(mk(i))
    seg = root / "commitlog" / f"{0:020d}"
    os.truncate(seg, 5000)
    with pytest.raises(BaseException) as info:
        async with opened(root):
            pass
    from broker.store.mapped_file_queue import SegmentSizeError

    exc = unwrap_group(info.value)
    assert isinstance(exc, SegmentSizeError)
    # rendered by the CLI as `error: <file>: <what happened and what to do>`
    assert exc.filename == str(seg)
    msg = str(exc.strerror)
    assert "5000" in msg and str(SEG) in msg
    assert "move the file away" in msg
