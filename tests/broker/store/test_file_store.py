"""File-store specifics: on-disk layout, restart, crash recovery, SYNC_FLUSH, locking, index files."""

from __future__ import annotations

import contextlib
import os
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
import trio

from broker.store import (
    GetMessageStatus,
    MessageStoreConfig,
    PendingPut,
    PutMessageResult,
    PutMessageStatus,
    StoreLockedError,
    run_message_store,
)
from broker.store.checkpoint import StoreCheckpoint
from common.message import MessageExt, MessageExtBrokerInner, decode_record, decode_records

SMALL: dict[str, Any] = dict(
    mapped_file_size_commit_log=4096,
    mapped_file_size_consume_queue=20 * 8,
    max_hash_slot_num=16,
    max_index_num=12,
)


def mk(topic="T", qid=0, body=b"x", **props):
    return MessageExtBrokerInner(
        topic=topic,
        queue_id=qid,
        body=body,
        properties={k: str(v) for k, v in props.items()},
        born_host=("10.0.0.1", 1),
        store_host=("127.0.0.1", 10911),
    )


@contextlib.asynccontextmanager
async def Opened(root, **kw):
    cfg = MessageStoreConfig(store_path_root_dir=str(root), **kw)
    async with trio.open_nursery() as nursery:
        store = await nursery.start(run_message_store, cfg)
        try:
            yield store
        finally:
            nursery.cancel_scope.cancel()


def size_of(path: str | Path) -> int:
    return os.path.getsize(path)


def damage_file(path: str | Path, pos: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(data)


def read_at(path: str | Path, pos: int, n: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(pos)
        return f.read(n)


def all_records(store, topic, qid):
    out: list[MessageExt] = []
    off = store.get_min_offset_in_queue(topic, qid)
    while True:
        r = store.get_message("g", topic, qid, off, 32)
        if r.status is not GetMessageStatus.FOUND:
            return out
        out.extend(decode_records(b"".join(bytes(b) for b in r.buffers), check_crc=True))
        off = r.next_begin_offset


async def test_layout_and_clean_restart(tmp_path):
    root = tmp_path / "s"
    async with Opened(root, **SMALL) as store:
        for i in range(40):
            await store.put_message(mk(qid=i % 2, body=b"%03d" % i * 30, KEYS=f"k{i}"))
        before = [bytes(b) for b in store.get_message("g", "T", 0, 0, 32).buffers]
        max_phy = store.get_max_phy_offset()
        assert store.last_exit_ok  # fresh directory
        assert "abort" in os.listdir(root)
    assert not (root / "abort").exists()  # clean stop
    names = sorted(os.listdir(root / "commitlog"))
    assert names[0] == "0" * 20 and all(len(n) == 20 for n in names)
    assert [int(n) for n in names] == [i * 4096 for i in range(len(names))]
    assert all(size_of(root / "commitlog" / n) == 4096 for n in names)
    cq_files = sorted(os.listdir(root / "consumequeue" / "T" / "0"))
    assert cq_files[:2] == ["0" * 20, f"{160:020d}"]
    cp = StoreCheckpoint.load(str(root / "checkpoint"))
    assert cp.valid and cp.commit_log_flushed == max_phy and cp.dispatched == max_phy
    assert size_of(root / "checkpoint") == 4096

    async with Opened(root, **SMALL) as store:
        assert store.last_exit_ok
        assert store.get_max_phy_offset() == max_phy
        assert [bytes(b) for b in store.get_message("g", "T", 0, 0, 32).buffers] == before
        assert store.get_max_offset_in_queue("T", 0) == 20
        r = await store.put_message(mk(qid=0, body=b"after"))
        assert r.append.logics_offset == 20 and r.append.wrote_offset >= max_phy
        q = store.query_message("T", "k7", 32, 0, 2**62)
        assert [decode_record(b).body for b in q.buffers] == [b"007" * 30]
        assert len(store.index.files) > 1  # 12-entry index files rolled over
        assert [m.queue_offset for m in all_records(store, "T", 0)] == list(range(21))


async def test_default_sizes(tmp_path):
    cfg = MessageStoreConfig(store_path_root_dir=str(tmp_path))
    assert cfg.mapped_file_size_commit_log == 1024**3
    assert cfg.mapped_file_size_consume_queue == 6_000_000
    async with Opened(tmp_path, max_hash_slot_num=64, max_index_num=64) as store:
        await store.put_message(mk())
    assert size_of(tmp_path / "commitlog" / ("0" * 20)) == 1024**3
    assert size_of(tmp_path / "consumequeue" / "T" / "0" / ("0" * 20)) == 6_000_000


async def test_restart_after_crash_while_creating_a_segment(tmp_path):
    async with Opened(tmp_path, **SMALL) as store:
        r = await store.put_message(mk(body=b"kept"))
    # a kill between open(O_CREAT) and ftruncate leaves an empty newest segment
    (tmp_path / "commitlog" / f"{4096:020d}").touch()
    (tmp_path / "consumequeue" / "T" / "0" / f"{160:020d}").touch()
    async with Opened(tmp_path, **SMALL) as store:
        assert store.look_message_by_offset(r.append.wrote_offset).body == b"kept"
        r2 = await store.put_message(mk(body=b"next"))
        assert r2.append.logics_offset == 1
        assert [m.body for m in all_records(store, "T", 0)] == [b"kept", b"next"]
    assert size_of(tmp_path / "commitlog" / f"{0:020d}") == 4096


async def test_store_directory_lock(tmp_path):
    async with Opened(tmp_path, **SMALL):
        cfg = MessageStoreConfig(store_path_root_dir=str(tmp_path), **SMALL)
        with pytest.raises(StoreLockedError):
            await run_message_store(cfg)


def crash_copy(src, dst):
    """What a kill -9 leaves: the files as they are now (page cache), abort file included."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("lock"))


@pytest.mark.parametrize("damage", ["cut", "crc", "zeros", "garbage_len"])
async def test_crash_recovery_truncates_torn_tail(tmp_path, damage):
    root = tmp_path / "live"
    async with Opened(root, **SMALL) as store:
        res = [await store.put_message(mk(qid=i % 3, body=b"%d" % i * 40)) for i in range(25)]
        crash_copy(root, tmp_path / "crashed")
    crashed = tmp_path / "crashed"
    assert (crashed / "abort").exists()
    last = res[-1].append
    seg_name = f"{last.wrote_offset - last.wrote_offset % 4096:020d}"
    path = crashed / "commitlog" / seg_name
    pos = last.wrote_offset % 4096
    half = last.wrote_bytes // 2
    if damage == "cut":  # the last record only half copied
        damage_file(path, pos + half, bytes(last.wrote_bytes - half))
    elif damage == "crc":
        damage_file(path, pos + last.wrote_bytes - 20, b"\xff")
    elif damage == "zeros":  # header never made it
        damage_file(path, pos, bytes(16))
    else:  # TOTALSIZE pointing past the segment
        damage_file(path, pos, struct.pack(">i", 10**6))
    if damage == "crc":
        # a flipped body byte is only noticed by a CRC scan: force one from before the damage
        cp = StoreCheckpoint.load(str(crashed / "checkpoint"))
        cp.commit_log_flushed = 0
        cp.dispatched = 0
        cp.write(cp.encode())
    async with Opened(crashed, **SMALL) as store:
        assert not store.last_exit_ok
        assert store.get_max_phy_offset() == last.wrote_offset
        qid = 24 % 3
        assert store.get_max_offset_in_queue("T", qid) == last.logics_offset
        assert store.look_message_by_offset(last.wrote_offset) is None
        for q in range(3):
            recs = all_records(store, "T", q)
            assert [m.queue_offset for m in recs] == list(range(len(recs)))
            assert all(m.body == b"%d" % int(m.body[: len(m.body) // 40]) * 40 for m in recs)
        # the store continues exactly at the cut
        r = await store.put_message(mk(qid=qid, body=b"new"))
        assert r.append.wrote_offset == last.wrote_offset
        assert r.append.logics_offset == last.logics_offset
        # the torn record's leftovers after the new, shorter record were zeroed
        rest = read_at(path, pos + r.append.wrote_bytes, last.wrote_bytes - r.append.wrote_bytes)
        assert rest == bytes(len(rest))
    # and after another restart everything is still consistent
    async with Opened(crashed, **SMALL) as store:
        assert store.look_message_by_offset(last.wrote_offset).body == b"new"


async def test_recovery_rebuilds_lost_queues_and_index(tmp_path):
    root = tmp_path / "live"
    async with Opened(root, **SMALL) as store:
        for i in range(30):
            await store.put_message(mk(qid=i % 2, body=b"%d" % i, KEYS=f"key{i}"))
        crash_copy(root, tmp_path / "crashed")
    crashed = tmp_path / "crashed"
    shutil.rmtree(crashed / "consumequeue")
    shutil.rmtree(crashed / "index")
    (crashed / "checkpoint").unlink(missing_ok=True)
    async with Opened(crashed, **SMALL) as store:
        assert store.get_max_offset_in_queue("T", 0) == 15
        assert [m.body for m in all_records(store, "T", 1)] == [b"%d" % i for i in range(1, 30, 2)]
        q = store.query_message("T", "key9", 32, 0, 2**62)
        assert [decode_record(b).body for b in q.buffers] == [b"9"]


async def test_sync_flush_and_timeout(tmp_path):
    async with Opened(
        tmp_path, flush_disk_type="SYNC_FLUSH", sync_flush_timeout=0.3, **SMALL
    ) as store:
        r = await store.put_message(mk())
        assert r.status is PutMessageStatus.PUT_OK
        assert r.append is not None
        assert store.flush.flushed >= r.append.wrote_offset + r.append.wrote_bytes
        # several concurrent puts share flushes (group commit) and all succeed
        results = []

        async def put(i):
            results.append(await store.put_message(mk(body=b"%d" % i)))

        async with trio.open_nursery() as n:
            for i in range(20):
                n.start_soon(put, i)
        assert all(x.status is PutMessageStatus.PUT_OK for x in results)
        # a disk that does not answer: the put times out but the message is stored
        async with store.flush._lock:
            r = await store.put_message(mk(body=b"slow"))
            assert r.status is PutMessageStatus.FLUSH_DISK_TIMEOUT
            assert store.look_message_by_offset(r.append.wrote_offset).body == b"slow"
            # WAIT=false does not wait for the disk
            r = await store.put_message(mk(body=b"nowait", WAIT="false"))
            assert r.status is PutMessageStatus.PUT_OK


async def test_sync_flush_append_returns_pending_put(tmp_path):
    async with Opened(
        tmp_path, flush_disk_type="SYNC_FLUSH", sync_flush_timeout=0.3, **SMALL
    ) as store:
        pending = store.append_message(mk(body=b"p"))
        assert isinstance(pending, PendingPut)
        # appended (and dispatched) before any await; only the flush is outstanding
        assert pending.result.append is not None
        assert store.look_message_by_offset(pending.result.append.wrote_offset).body == b"p"
        assert store.get_max_offset_in_queue("T", 0) == 1
        r = await pending.wait()
        assert r.status is PutMessageStatus.PUT_OK and r.append == pending.result.append
        assert r.append is not None
        assert store.flush.flushed >= r.append.wrote_offset + r.append.wrote_bytes
        batch = store.append_messages([mk(body=b"b1"), mk(body=b"b2")])
        assert isinstance(batch, PendingPut)
        batch_append = (await batch.wait()).append
        assert batch_append is not None and batch_append.msg_num == 2
        async with store.flush._lock:
            slow = store.append_message(mk(body=b"slow"))
            assert (await slow.wait()).status is PutMessageStatus.FLUSH_DISK_TIMEOUT
            # WAIT=false: final at once, no flush wait
            r = store.append_message(mk(body=b"nowait", WAIT="false"))
            assert isinstance(r, PutMessageResult) and r.status is PutMessageStatus.PUT_OK


async def test_async_flush_runs_periodically(tmp_path):
    async with Opened(
        tmp_path, flush_interval_commit_log=0.05, flush_interval_consume_queue=0.05, **SMALL
    ) as store:
        r = await store.put_message(mk())
        end = r.append.wrote_offset + r.append.wrote_bytes
        for _ in range(250):
            if store.flush.flushed >= end and store.checkpoint.dispatched >= end:
                break
            await trio.sleep(0.02)
        assert store.runtime_info()["remainHowManyDataToFlush"] == "0 B"


async def test_delete_topics_removes_files(tmp_path):
    async with Opened(tmp_path, **SMALL) as store:
        await store.put_message(mk(topic="Gone"))
        await store.put_message(mk(topic="Kept"))
        store.delete_topics(["Gone"])
        assert not (tmp_path / "consumequeue" / "Gone").exists()
        assert store.topic_queues() == {"Kept": [0]}
        r = await store.put_message(mk(topic="Gone"))
        assert r.append.logics_offset == 0
    async with Opened(tmp_path, **SMALL) as store:
        assert store.get_max_offset_in_queue("Gone", 0) == 1


def test_index_batch_put_matches_per_key_put(tmp_path):
    from broker.store.index import IndexService, key_hash, topic_key_hash

    keys = [("T", f"{i * 7919:032X}") for i in range(25)] + [("Tó", "k"), ("T", "Aa"), ("T", "BB")]
    a = IndexService(str(tmp_path / "a"), 4, 10)
    b = IndexService(str(tmp_path / "b"), 4, 10)
    for i, (topic, k) in enumerate(keys):
        a.put([f"{topic}#{k}"], 1000 + i, 1_700_000_000_000 + i * 1500)
        assert topic_key_hash(topic, k) == key_hash(f"{topic}#{k}")
    ts = 1_700_000_000_000
    # same keys through the put path's form, grouped like several puts
    for lo, hi in ((0, 1), (1, 12), (12, len(keys))):
        for i in range(lo, hi):
            b.put_entries([(topic_key_hash(*keys[i]), 1000 + i)], ts + i * 1500)
    assert len(a.files) == len(b.files) == 4  # 9 entries per file: the batch spills over
    for fa, fb in zip(a.files, b.files, strict=True):
        fa._write_header()
        fb._write_header()
        assert bytes(fa.mf.view) == bytes(fb.mf.view)
    # "Aa" and "BB" share a hash: the index returns both (the store checks the record)
    assert a.query("T#Aa", 32, 0, 2**62) == b.query("T#Aa", 32, 0, 2**62) == [1027, 1026]
    a.close()
    b.close()
