"""Recovery reads only the store's tail (broker/store/recovery.py).

Stores of many small segments; every record recovery parses is counted (``parse_record`` of
the CommitLog validation and of the re-dispatch), next to the ``RecoveryReport``.  A crash is
a copy of the live directory (what a kill -9 leaves: the page cache, ``abort`` included)
taken after an explicit checkpoint and a few more writes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import trio

from broker.store import (
    AppendMessageResult,
    DefaultMessageStore,
    GetMessageStatus,
    MessageStoreConfig,
    PutMessageResult,
    run_message_store,
)
from broker.store import commitlog as commitlog_mod
from broker.store import reput as reput_mod
from broker.store.checkpoint import StoreCheckpoint
from common.message import MessageExtBrokerInner, decode_record, decode_records

SEG = 4096
CQ_FILE = 20 * 1024
CONFIG = dict(
    mapped_file_size_commit_log=SEG,
    mapped_file_size_consume_queue=CQ_FILE,
    max_hash_slot_num=64,
    max_index_num=4096,
    # no periodic flush: the test places the checkpoint itself
    flush_interval_commit_log=3600.0,
    flush_interval_consume_queue=3600.0,
)


def mk(i: int, qid: int = 0, key: str | None = None) -> MessageExtBrokerInner:
    return MessageExtBrokerInner(
        topic="T",
        queue_id=qid,
        body=b"%05d" % i * 40,
        properties={"KEYS": key or f"k{i}"},
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


@pytest.fixture
def parsed(monkeypatch):
    """Records parsed by recovery: {"validate": n, "dispatch": n}."""
    counts = {"validate": 0, "dispatch": 0}

    def counting(name, real):
        def parse(*args, **kw):
            counts[name] += 1
            return real(*args, **kw)

        return parse

    monkeypatch.setattr(
        commitlog_mod, "parse_record", counting("validate", commitlog_mod.parse_record)
    )
    monkeypatch.setattr(reput_mod, "parse_record", counting("dispatch", reput_mod.parse_record))
    return counts


def appended(r: PutMessageResult) -> AppendMessageResult:
    """What a successful put appended."""
    assert r.append is not None, r.status
    return r.append


def bodies(store: DefaultMessageStore, qid: int = 0) -> list[bytes]:
    out: list[bytes] = []
    off = store.get_min_offset_in_queue("T", qid)
    while True:
        r = store.get_message("g", "T", qid, off, 32)
        if r.status is not GetMessageStatus.FOUND:
            return out
        out.extend(m.body for m in decode_records(b"".join(bytes(b) for b in r.buffers)))
        off = r.next_begin_offset


def write_at(path: str | Path, pos: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(data)


def read_at(path: str | Path, pos: int, n: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(pos)
        return f.read(n)


def segments(root: Path) -> list[int]:
    return sorted(int(n) for n in os.listdir(root / "commitlog"))


async def fill(store: DefaultMessageStore, first: int, n: int, **kw: Any) -> list[PutMessageResult]:
    return [await store.put_message(mk(i, **kw)) for i in range(first, first + n)]


async def test_clean_restart_reads_nothing_before_the_end(tmp_path, parsed):
    root = tmp_path / "s"
    async with opened(root) as store:
        await fill(store, 0, 600)
        end = store.get_max_phy_offset()
    assert len(segments(root)) > 40
    parsed.update(validate=0, dispatch=0)
    async with opened(root) as store:
        rep = store.recovery
        assert (rep.clean, rep.rule, rep.commit_log_from, rep.commit_log_end) == (
            True,
            "checkpoint",
            end,
            end,
        )
        assert rep.bytes_scanned == 0 and rep.files_scanned <= 1 and rep.redispatched_bytes == 0
        assert parsed["dispatch"] == 0 and parsed["validate"] <= 1  # one look at the end
        assert store.get_max_offset_in_queue("T", 0) == 600
        assert bodies(store)[::150] == [b"%05d" % i * 40 for i in (0, 150, 300, 450)]
        r = await store.put_message(mk(600))
        assert appended(r).wrote_offset >= end and appended(r).logics_offset == 600


async def test_clean_restart_without_checkpoint_reads_the_last_3_files(tmp_path, parsed):
    root = tmp_path / "s"
    async with opened(root) as store:
        await fill(store, 0, 600)
        end = store.get_max_phy_offset()
    os.unlink(root / "checkpoint")
    segs = segments(root)
    parsed.update(validate=0, dispatch=0)
    async with opened(root) as store:
        rep = store.recovery
        assert (rep.rule, rep.commit_log_from, rep.commit_log_end) == ("last-files", segs[-3], end)
        assert rep.files_scanned == 3 and rep.bytes_scanned == end - segs[-3]
        per_segment = SEG // len(decode_record(bytes(store.select_one_message_by_offset(0))).body)
        assert parsed["validate"] <= 3 * per_segment + 1
        # the queues already cover the end: nothing is re-dispatched
        assert rep.redispatch_from == end and parsed["dispatch"] == 0
        assert store.get_max_offset_in_queue("T", 0) == 600


async def crashed_store(
    tmp_path: Path, before: int, after: int, **kw: Any
) -> tuple[Path, int, list[PutMessageResult]]:
    """A store with ``before`` records under a checkpoint and ``after`` more, crashed."""
    live = tmp_path / "live"
    async with opened(live) as store:
        first = await fill(store, 0, before, **kw)
        await store.flush.flush_all()
        cp_offset = store.checkpoint.dispatched
        assert cp_offset == store.get_max_phy_offset()
        rest = await fill(store, before, after, **kw)
        shutil.copytree(live, tmp_path / "crashed", ignore=shutil.ignore_patterns("lock"))
    return tmp_path / "crashed", cp_offset, first + rest


async def test_crash_recovery_starts_at_the_checkpoint(tmp_path, parsed):
    root, cp_offset, res = await crashed_store(tmp_path, 600, 30)
    end = appended(res[-1]).wrote_offset + appended(res[-1]).wrote_bytes
    assert StoreCheckpoint.load(str(root / "checkpoint")).dispatched == cp_offset
    assert len([s for s in segments(root) if s < cp_offset]) > 40
    parsed.update(validate=0, dispatch=0)
    async with opened(root) as store:
        rep = store.recovery
        assert (rep.clean, rep.rule, rep.commit_log_from) == (False, "checkpoint", cp_offset)
        assert rep.commit_log_end == end and rep.bytes_scanned == end - cp_offset
        assert rep.files_scanned <= (end - cp_offset) // SEG + 2
        assert (rep.redispatch_from, rep.redispatched_bytes) == (cp_offset, end - cp_offset)
        # 30 records written since the checkpoint: each validated and re-dispatched once
        # (plus a BLANK filler per segment end and one look at the end)
        assert parsed["validate"] <= 31 + rep.files_scanned
        assert parsed["dispatch"] <= 31 + rep.files_scanned
        assert store.get_max_offset_in_queue("T", 0) == 630
        assert bodies(store)[-31:] == [b"%05d" % i * 40 for i in range(599, 630)]


async def test_crash_recovery_truncates_a_torn_tail_after_the_checkpoint(tmp_path):
    root, cp_offset, res = await crashed_store(tmp_path, 300, 20)
    last = appended(res[-1])
    path = root / "commitlog" / f"{last.wrote_offset - last.wrote_offset % SEG:020d}"
    # the last record's body damaged (a flipped byte)
    write_at(path, last.wrote_offset % SEG + last.wrote_bytes - 30, b"\xff")
    async with opened(root) as store:
        rep = store.recovery
        assert rep.commit_log_from == cp_offset and rep.commit_log_end == last.wrote_offset
        assert store.get_max_phy_offset() == last.wrote_offset
        assert store.get_max_offset_in_queue("T", 0) == 319
        r = await store.put_message(mk(999))
        assert (appended(r).wrote_offset, appended(r).logics_offset) == (last.wrote_offset, 319)
    # nothing of the torn record is left after the new one
    rest = read_at(
        path,
        appended(r).wrote_offset % SEG + appended(r).wrote_bytes,
        last.wrote_bytes - appended(r).wrote_bytes,
    )
    assert rest == bytes(len(rest))


async def test_queue_and_index_behind_the_commit_log_are_rebuilt_from_the_checkpoint(
    tmp_path, parsed
):
    # every record shares the key "dup", so each index entry chains to the one before
    root, cp_offset, res = await crashed_store(tmp_path, 200, 25, key="dup")
    # the crash lost the ConsumeQueue units written since the checkpoint
    cq = root / "consumequeue" / "T" / "0" / f"{0:020d}"
    write_at(cq, 200 * 20, bytes(25 * 20))
    parsed.update(validate=0, dispatch=0)
    async with opened(root) as store:
        rep = store.recovery
        assert rep.redispatch_from == cp_offset
        assert parsed["dispatch"] <= 26 + rep.files_scanned  # BLANK fillers included
        # the index lost nothing either: the entries past the checkpoint were cut and re-added
        assert rep.index_entries_dropped == 25
        assert store.get_max_offset_in_queue("T", 0) == 225
        assert bodies(store) == [b"%05d" % i * 40 for i in range(225)]
        # the whole chain of "dup" is intact: the newest entry leads back to the first
        offsets = [appended(r).wrote_offset for r in res]
        assert sorted(store.index.query("T#dup", 1000, 0, 2**62)) == offsets
        q = store.query_message("T", "dup", 64, 0, 2**62)  # the broker's cap: the newest 64
        assert sorted(decode_record(bytes(b)).body for b in q.buffers) == [
            b"%05d" % i * 40 for i in range(161, 225)
        ]
        assert [f.count for f in store.index.files] == [226]
        # a second crash right after recovery finds the same state
        r = await store.put_message(mk(225, key="dup"))
        await store.flush.flush_all()
        shutil.copytree(root, tmp_path / "again", ignore=shutil.ignore_patterns("lock"))
    async with opened(tmp_path / "again") as store:
        assert store.recovery.index_entries_dropped == 0
        chain = sorted(store.index.query("T#dup", 1000, 0, 2**62))
        assert chain == [*offsets, appended(r).wrote_offset]
        assert store.get_max_offset_in_queue("T", 0) == 226
