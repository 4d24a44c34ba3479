"""Reading stores written as Apache RocketMQ 4.9 in DLedger mode writes them
(broker/dledger/broker/dledger_commitlog.py against tests/broker/dledger/apache_store_fixture.py).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import attrs
import pytest

from broker.dledger.broker.dledger_commitlog import (
    DLedgerCommitLogReader,
    DLedgerStoreError,
    DLedgerStorePaths,
    open_dledger_commitlog,
)
from broker.dledger.driver import entry_coder as ec
from tests.broker.dledger.apache_store_fixture import (
    INDEX_FILE_SIZE,
    TOPICS,
    ApacheDLedgerStore,
    Sent,
    data_files,
    fill,
)

pytestmark = pytest.mark.timeout(60)

FILE = 8 * 1024


def check_every_message(reader: DLedgerCommitLogReader, sent: list[Sent]) -> None:
    for s in sent:
        by_queue = reader.message(s.topic, s.queue_id, s.queue_offset)
        by_id = reader.message_by_id(s.msg_id)
        for msg in (by_queue, by_id):
            assert (msg.topic, msg.queue_id, msg.queue_offset) == (
                s.topic,
                s.queue_id,
                s.queue_offset,
            )
            assert msg.body == s.body and msg.commit_log_offset == s.offset
            assert msg.msg_id == s.msg_id and msg.store_size == s.size
    for topic, qid in TOPICS:
        expected = sum(1 for s in sent if (s.topic, s.queue_id) == (topic, qid))
        assert reader.max_queue_offset(topic, qid) == expected


def test_apache_dledger_store_every_message_by_queue_offset_and_msg_id(tmp_path: Path) -> None:
    store = ApacheDLedgerStore(tmp_path, file_size=FILE)
    fill(store, 40)
    store.new_term()
    fill(store, 30, start=40)
    # the leader's tail not yet committed: in the log, in no ConsumeQueue
    tail = [store.send("TopicA", 0, b"x" * 100, commit=False) for _ in range(2)]
    store.close()
    assert len(data_files(tmp_path / "dledger-n0" / "data")) > 4  # blanks closed files
    reader = open_dledger_commitlog(DLedgerStorePaths(str(tmp_path), "n0"))
    try:
        assert (reader.begin_index, reader.end_index, reader.committed_index) == (0, 71, 69)
        assert reader.divided_commitlog_offset == 0 and reader.term == 2
        assert [e.term for e in reader.entries] == [1] * 40 + [2] * 32
        committed = store.committed()
        check_every_message(reader, committed)
        assert [m.msg_id for m in reader.committed_messages()] == [s.msg_id for s in committed]
        last = reader.entry(69)
        assert last is not None and reader.committed_pos == last.pos + last.size
        for s in tail:
            with pytest.raises(DLedgerStoreError, match="committed position"):
                reader.message_at(s.offset)
        with pytest.raises(DLedgerStoreError):
            reader.message_at(committed[3].offset + 48)  # inside a record, not at one
    finally:
        reader.close()


def test_the_fixture_bytes_agree_with_the_codec(tmp_path: Path) -> None:
    """The fixture packs its own bytes; the codec reads them field for field."""
    store = ApacheDLedgerStore(tmp_path, file_size=FILE)
    fill(store, 20)
    store.close()
    files = sorted((tmp_path / "dledger-n0" / "data").iterdir())
    first = files[0].read_bytes()
    assert len(first) == FILE
    header, body = ec.decode_entry(first, 0, at=0)
    assert header == ec.EntryHeader(1, 48 + len(body), 0, 1, 0, 0, 0, 0, len(body))
    assert ec.record_physical_offset(first, 0) == 48
    index = tmp_path / "dledger-n0" / "index" / f"{0:020d}"
    assert os.path.getsize(index) == INDEX_FILE_SIZE
    with open(index, "rb") as f:
        assert ec.decode_index_unit(f.read(32)) == (1, 0, header.size, 0, 1)
    # the first file ends with DLedger's blank, the second starts with the next entry
    end = sum(s.size + 48 for s in store.sent if s.offset - 48 < FILE)
    assert ec.classify(first, end) is ec.Kind.DLEDGER_BLANK
    assert first[end : end + 8] == struct.pack(">ii", -1, FILE - end)
    second = files[1].read_bytes()
    assert ec.decode_entry_header(second).pos == FILE


def test_store_path_dledger_commit_log_holds_the_data_files(tmp_path: Path) -> None:
    data = tmp_path / "elsewhere" / "dledger-data"
    store = ApacheDLedgerStore(tmp_path / "store", file_size=FILE, data_dir=data)
    fill(store, 20)
    store.close()
    assert not (tmp_path / "store" / "dledger-n0" / "data").exists()
    paths = DLedgerStorePaths(
        str(tmp_path / "store"), "n0", store_path_dledger_commit_log=str(data)
    )
    reader = open_dledger_commitlog(paths)
    try:
        check_every_message(reader, store.sent)
    finally:
        reader.close()


def test_a_classic_store_switched_to_dledger_reads_both_sides(tmp_path: Path) -> None:
    """dividedCommitlogOffset: the old CommitLog answers below it, DLedger's files above."""
    store = ApacheDLedgerStore(tmp_path, file_size=FILE)
    fill(store, 25, classic=True)
    fill(store, 25, start=25)
    store.close()
    classic = data_files(tmp_path / "commitlog")
    assert len(classic) >= 2
    divided = store.divided_commitlog_offset
    assert divided == (int(classic[-1]) + FILE) and divided % FILE == 0
    assert data_files(tmp_path / "dledger-n0" / "data")[0] == f"{divided:020d}"
    reader = open_dledger_commitlog(DLedgerStorePaths(str(tmp_path), "n0"))
    try:
        assert reader.divided_commitlog_offset == divided
        assert reader.entries[0].pos == divided and reader.begin_index == 0
        check_every_message(reader, store.sent)
        assert [m.msg_id for m in reader.committed_messages()] == [s.msg_id for s in store.sent]
        assert all(s.offset < divided for s in store.sent[:25])
        assert all(s.offset >= divided + 48 for s in store.sent[25:])
    finally:
        reader.close()


def test_damage_is_named(tmp_path: Path) -> None:
    store = ApacheDLedgerStore(tmp_path, file_size=FILE)
    fill(store, 6)
    store.close()
    index = tmp_path / "dledger-n0" / "index" / f"{0:020d}"
    with open(index, "r+b") as f:
        f.seek(3 * 32 + 4)
        f.write(struct.pack(">q", 12345))  # entry 3's pos in its index unit
    with pytest.raises(DLedgerStoreError, match="index unit of entry 3"):
        open_dledger_commitlog(DLedgerStorePaths(str(tmp_path), "n0"))


def test_our_own_file_log_reads_with_the_same_reader(tmp_path: Path) -> None:
    """The broker's Raft log (FileLog with the append hook) is read by the reader the Apache
    fixture is read with: every record at its entry's pos + 48, PHYSICALOFFSET saying so."""
    from broker.dledger.driver.mmap_file_store import open_file_log
    from broker.dledger.driver.state_files import Checkpoint, save_checkpoint
    from common.message import MessageExtBrokerInner
    from common.message_encoder import encode_record
    from common.message_id import create_offset_msg_id

    member = tmp_path / "dledger-n1"
    flog = open_file_log(
        str(member), data_file_size=FILE, index_file_size=32 * 64, patch_physical_offset=True
    )
    host = ("10.1.1.1", 10911)
    bodies = []
    for i in range(30):
        msg = MessageExtBrokerInner(
            topic="T", queue_id=i % 2, body=bytes([i]) * (100 + 31 * i), store_host=host
        )
        record = encode_record(msg, i // 2, 0, 1_700_000_000_000 + i)
        entry = flog.append(1 + i // 10, record)
        assert ec.record_physical_offset(entry.body, -48) == entry.pos + 48
        bodies.append((entry.pos + 48, msg.body))
    flog.append(3, b"")  # a no-op: not a record, kept as it is
    flog.close()
    save_checkpoint(str(member), Checkpoint(end_index=30, committed_index=29))
    reader = open_dledger_commitlog(DLedgerStorePaths(str(tmp_path), "n1"))
    try:
        assert (reader.end_index, reader.committed_index) == (30, 29)
        for offset, body in bodies:
            got = reader.message_by_id(create_offset_msg_id(host, offset))
            assert got.commit_log_offset == offset and got.body == body
        assert [m.commit_log_offset for m in reader.committed_messages()] == [o for o, _ in bodies]
    finally:
        reader.close()


def test_commitlog_files_at_or_above_the_division_are_never_read(tmp_path: Path) -> None:
    """As DLedgerCommitLog: offsets below dividedCommitlogOffset (here 0) go to the classic
    CommitLog, none other; this broker's classic copy of the records is such a file."""
    store = ApacheDLedgerStore(tmp_path, file_size=FILE)
    fill(store, 10)
    store.close()
    (tmp_path / "commitlog").mkdir()
    (tmp_path / "commitlog" / f"{0:020d}").write_bytes(b"\xff" * FILE)
    reader = open_dledger_commitlog(DLedgerStorePaths(str(tmp_path), "n0"))
    try:
        check_every_message(reader, store.sent)
    finally:
        reader.close()


def test_the_offline_tools_find_the_member_from_the_files(tmp_path: Path) -> None:
    from broker.dledger.broker.dledger_commitlog import find_dledger_store

    store = ApacheDLedgerStore(tmp_path / "s", file_size=FILE)
    fill(store, 5, classic=True)
    fill(store, 5, start=5)
    store.close()
    want = DLedgerStorePaths(str(tmp_path / "s"), "n0")
    assert find_dledger_store(tmp_path / "s") == want
    assert find_dledger_store(tmp_path / "s" / "dledger-n0") == want
    assert find_dledger_store(tmp_path / "s" / "commitlog") == want
    assert find_dledger_store(tmp_path / "s", store_path_dledger_commit_log="/x") == attrs.evolve(
        want, store_path_dledger_commit_log="/x"
    )
    (tmp_path / "classic" / "commitlog").mkdir(parents=True)
    assert find_dledger_store(tmp_path / "classic") is None
    assert find_dledger_store(tmp_path / "nope") is None
    (tmp_path / "s" / "dledger-n1" / "index").mkdir(parents=True)
    with pytest.raises(DLedgerStoreError, match="several DLedger members"):
        find_dledger_store(tmp_path / "s")


def test_committed_position_from_one_index_unit_is_the_walks(tmp_path: Path) -> None:
    """The cheap committed position (checkpoint + one index unit) is the reader's, and the
    reader's walk answers when the unit cannot be trusted."""
    from broker.dledger.broker.dledger_commitlog import committed_position

    store = ApacheDLedgerStore(tmp_path, file_size=FILE)
    paths = DLedgerStorePaths(str(tmp_path), "n0")
    fill(store, 3, classic=True)
    fill(store, 1, start=3)
    store.send("TopicA", 0, b"x" * 50, commit=False)
    store.close()
    # nothing committed in DLedger: the classic end, dividedCommitlogOffset
    (tmp_path / "dledger-n0" / "checkpoint").write_text("committedIndex=-1\nendIndex=1\n")
    assert committed_position(paths) == store.divided_commitlog_offset
    fill(store, 30, start=4)
    store.close()
    reader = open_dledger_commitlog(paths)
    try:
        assert committed_position(paths) == reader.committed_pos
        last = reader.entry(reader.committed_index)
        assert last is not None and reader.committed_pos == last.pos + last.size
        # the committed entry's index unit says another size: the walk answers
        with open(tmp_path / "dledger-n0" / "index" / f"{0:020d}", "r+b") as f:
            f.seek(reader.committed_index * 32 + 12)
            f.write(struct.pack(">i", 9))
        with pytest.raises(DLedgerStoreError, match="index unit of entry"):
            committed_position(paths)
    finally:
        reader.close()
