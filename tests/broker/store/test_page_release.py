"""What the stores give back to the OS: flushed pages of their maps, and freed heap when quiet.

RSS is read from /proc/self/smaps (the resident KiB of the mappings of one file), so these tests
see exactly what ``VmRSS`` counts: pages that are in our page tables, not the page cache.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from broker.dledger.driver import entry_json as entry_json_module
from broker.dledger.driver import mmap_file_store
from broker.dledger.driver.entry_json import entry_json
from broker.dledger.driver.mmap_file_store import open_file_log
from broker.store import MessageStoreConfig, run_message_store
from broker.store.index import HEADER_SIZE, IndexService
from broker.store.mapped_file import PAGE_SIZE, MappedFile
from broker.store.mapped_file_queue import MappedFileQueue
from common.message import MessageExtBrokerInner

MiB = 1 << 20


def record_trim(trims: list[bool]) -> bool:
    """A stand-in for trim_heap that records the call (and says it trimmed)."""
    trims.append(True)
    return True


def resident_kib(path: Path | str) -> int:
    """Resident KiB of this process's mappings of ``path`` (0 when unmapped)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
            inside = len(head) >= 6 and head[5] == str(path)
        elif inside and line.startswith("Rss:"):
            total += int(head[1])
    return total


def test_release_behind_drops_flushed_pages_and_keeps_the_bytes(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000"
    mf = MappedFile(str(path), 0, 8 * MiB)
    try:
        data = bytes(range(256)) * (6 * MiB // 256)
        mf.append(data)
        mf.flush_range()
        assert resident_kib(path) >= 6 * 1024
        assert mf.release_behind(4 * MiB + 100) == 4 * MiB  # whole pages only
        assert 2 * 1024 <= resident_kib(path) <= 2 * 1024 + 4
        assert mf.release_behind(4 * MiB + 100) == 0  # nothing twice
        # never past what is flushed: new bytes stay mapped until their flush
        mf.append(b"z" * MiB)
        assert mf.release_behind(mf.wrote) == 2 * MiB
        assert resident_kib(path) >= 1024
        mf.flush_range()
        assert mf.release_behind(mf.wrote) == MiB
        assert resident_kib(path) <= 4
        # the bytes are all still there (the page cache and the file keep them)
        assert bytes(mf.view[: len(data)]) == data
        assert bytes(mf.view[len(data) : mf.wrote]) == b"z" * MiB
    finally:
        mf.close()


def test_truncation_lowers_the_release_mark(tmp_path: Path) -> None:
    """Pages rewritten after a cut are faulted in again, so a later step must drop them."""
    queue = MappedFileQueue(str(tmp_path), 4 * MiB)
    mf = queue.create(0)
    try:
        mf.append(b"a" * (3 * MiB))
        mf.flush_range()
        mf.release_behind(mf.flushed)
        queue.truncate_dirty(MiB + 10)
        assert mf.released == MiB
        mf.append(b"b" * (2 * MiB))
        mf.flush_range()
        assert mf.release_behind(mf.flushed) == (3 * MiB + 10) // PAGE_SIZE * PAGE_SIZE - MiB
    finally:
        queue.close()


def test_file_log_keeps_recent_bodies_within_the_byte_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mmap_file_store, "RECENT_BYTES", 10_000)
    flog = open_file_log(str(tmp_path), data_file_size=4 * MiB, index_file_size=32 * 1024)
    try:
        written = [flog.append(1, bytes([i]) * 3_000) for i in range(20)]
        recent = flog._recent
        assert list(recent) == [17, 18, 19]  # the newest, in index order
        assert flog._recent_bytes == 9_000
        # an entry larger than the bound is still cached alone: its readers come next
        written.append(flog.append(1, b"L" * 20_000))
        assert list(recent) == [20] and flog._recent_bytes == 20_000
        flog.truncate(20)
        assert not recent and flog._recent_bytes == 0
        written[20:] = [flog.append(2, bytes([i]) * 1_000) for i in range(5)]
        assert flog._recent_bytes == sum(len(e.body) for e in recent.values()) == 5_000
        assert [flog.get(i) for i in range(25)] == written
    finally:
        flog.close()


async def test_file_log_releases_pages_cache_and_heap_once_quiet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the node's flush (FileStorage.flush_log): nothing is released while entries
    come; the first flush after QUIET_S without writes drops the log's pages, the fresh-entry
    cache and freed heap, once."""
    from broker.dledger.driver.node_storage import FileStorage

    trims: list[bool] = []
    monkeypatch.setattr(mmap_file_store, "trim_heap", lambda: record_trim(trims))
    monkeypatch.setattr(mmap_file_store, "QUIET_S", 3600.0)
    flog = open_file_log(str(tmp_path), data_file_size=16 * MiB, index_file_size=32 * 1024)
    data = tmp_path / "data" / "00000000000000000000"
    storage = FileStorage(str(tmp_path))
    try:
        written = [flog.append(1, bytes([i % 251]) * 4_000) for i in range(1_000)]  # ~4 MiB
        newest = flog.get(999)
        assert newest is not None
        entry_json(newest)  # a push rendered the newest entry
        await storage.flush_log(flog)
        await storage.flush_log(flog)  # not quiet for long enough yet
        assert resident_kib(data) >= 3_900 and len(flog._recent) == 1_000 and not trims
        assert entry_json_module._RENDERED
        monkeypatch.setattr(mmap_file_store, "QUIET_S", 0.0)
        await storage.flush_log(flog)
        assert resident_kib(data) <= 4 and not flog._recent and flog._recent_bytes == 0
        assert not entry_json_module._RENDERED and entry_json_module._held == 0
        assert trims == [True]
        await storage.flush_log(flog)  # still quiet: released already, no second trim
        assert trims == [True]
        assert [flog.get(i) for i in range(1_000)] == written  # read back from the files
        written.append(flog.append(1, b"new"))  # a write ends the quiet spell
        await storage.flush_log(flog)
        assert trims == [True, True] and flog.get(1_000) == written[-1]
    finally:
        flog.close()


def test_push_renderings_are_bounded_in_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    from broker.dledger.raft.messages import Entry

    monkeypatch.setattr(entry_json_module, "_RENDERED", type(entry_json_module._RENDERED)())
    monkeypatch.setattr(entry_json_module, "_held", 0)
    monkeypatch.setattr(entry_json_module, "_RENDERED_MAX_BYTES", 100_000)
    entries = [Entry(index=i, term=1, pos=i * 10_048, body=bytes(10_000)) for i in range(30)]
    texts = [entry_json(e) for e in entries]
    table = entry_json_module._RENDERED
    # each costs its body and its base64 rendering, ~23 KB: the newest four fit in 100 KB
    assert [e.index for e, _ in table.values()] == [26, 27, 28, 29]
    assert entry_json_module._held == sum(len(e.body) + len(t) for e, t in table.values())
    assert entry_json(entries[29]) is texts[29]  # a hit: the same bytes object
    entry_json_module.forget_renderings()
    assert not table and entry_json_module._held == 0


async def test_flush_service_releases_and_trims_once_when_the_store_goes_quiet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the logic flush's interval far away, the quiet wake alone flushes the queues and
    the index (the checkpoint moves), releases the index's slot table, kept mapped while puts
    come, and trims the heap, once per quiet spell."""
    from broker.store import flush

    trims: list[bool] = []
    monkeypatch.setattr(flush, "trim_heap", lambda: record_trim(trims))
    cfg = MessageStoreConfig(
        store_path_root_dir=str(tmp_path),
        flush_interval_commit_log=0.05,
        flush_interval_consume_queue=3600.0,
        mapped_file_size_commit_log=4 * MiB,
        mapped_file_size_consume_queue=20 * 1024,
    )

    def msg(body: bytes) -> MessageExtBrokerInner:
        return MessageExtBrokerInner(
            topic="T",
            queue_id=0,
            body=body,
            properties={"KEYS": body.decode()},  # an index entry: a slot page touched
            born_host=("10.0.0.1", 1),
            store_host=("127.0.0.1", 1),
        )

    async def settle(count: int, end: int) -> None:
        with trio.fail_after(10):
            while not (len(trims) >= count and store.checkpoint.dispatched >= end):  # noqa: ASYNC110 - set in a worker thread
                await trio.sleep(0.01)
        await trio.sleep(0.3)  # six more wakes: no further trim while nothing is put
        assert len(trims) == count

    async with trio.open_nursery() as nursery:
        store = await nursery.start(run_message_store, cfg)
        r = await store.put_message(msg(b"one"))
        (index,) = store.index.files
        assert index.mf.pinned > 0 and resident_kib(index.path) >= 4
        await settle(1, r.append.wrote_offset + r.append.wrote_bytes)
        assert resident_kib(index.path) == 0
        r = await store.put_message(msg(b"two"))
        await settle(2, r.append.wrote_offset + r.append.wrote_bytes)
        nursery.cancel_scope.cancel()


def test_trim_heap_reaches_glibc() -> None:
    """On this (glibc) machine the call resolves and runs; elsewhere it is a no-op."""
    from broker.store.heap import _resolve, trim_heap

    assert _resolve() is not None
    assert trim_heap() in (True, False)


def test_an_index_file_keeps_its_slot_table_mapped_until_it_is_full(tmp_path: Path) -> None:
    # every put reads and writes a slot at random: a released table would fault back at once
    slots, entries = PAGE_SIZE, 2_000  # a 16 KiB slot table, 40 KB of entries
    index = IndexService(str(tmp_path), slots, entries)
    table_kib = (HEADER_SIZE + slots * 4) // 1024

    def logic_flush() -> None:  # what the flush service does with the index (flush.py)
        for mf in index.flush_jobs():
            mf.flush_range(None)
            mf.release()

    try:
        index.put_entries([((i * 7919) % slots, i * 100) for i in range(entries - 100)], 1_000)
        (first,) = index.files
        logic_flush()
        assert table_kib <= resident_kib(first.path) <= table_kib + 8  # the entries went
        index.put_entries([(i, 1) for i in range(200)], 2_000)  # fills it, starts the next
        assert first.is_full and len(index.files) == 2
        logic_flush()
        assert resident_kib(first.path) <= 4  # a full file's table goes with its entries
    finally:
        index.close()
