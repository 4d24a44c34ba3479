"""The classic store over the DLedger data files (broker/dledger/broker/commitlog_view.py):
ConsumeQueues point at entry pos + 48, nothing past the visible end is dispatched or served, and
an Apache RocketMQ 4.9 DLedger store (tests/broker/dledger/apache_store_fixture.py) opens in
place and takes new entries after its own.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.dledger.broker.commitlog_view import (
    DLedgerBackedStore,
    DLedgerCommitLogView,
    start_after_classic,
)
from broker.dledger.driver import entry_coder as ec
from broker.dledger.driver.mmap_file_store import FileLog, open_file_log
from broker.store.commitlog import CommitLog
from broker.store.config import MessageStoreConfig
from broker.store.dispatch import BLANK, SKIP, DispatchRequest
from broker.store.results import GetMessageStatus
from common.message import MessageExt, MessageExtBrokerInner, decode_record
from common.message_encoder import encode_record
from common.message_id import decode_offset_msg_id
from tests.broker.dledger.apache_store_fixture import (
    INDEX_FILE_SIZE,
    TOPICS,
    ApacheDLedgerStore,
    Sent,
    fill,
    offset_msg_id,
)

pytestmark = pytest.mark.timeout(60)

FILE = 8 * 1024
CQ_FILE = 20 * 1000
HOST = ("10.0.0.7", 10911)


def config(root: Path) -> MessageStoreConfig:
    return MessageStoreConfig(
        store_path_root_dir=str(root),
        mapped_file_size_commit_log=FILE,
        mapped_file_size_consume_queue=CQ_FILE,
    )


def open_log(root: Path, member: str = "n0") -> FileLog:
    return open_file_log(
        str(root / f"dledger-{member}"),
        data_file_size=FILE,
        index_file_size=INDEX_FILE_SIZE,
        patch_physical_offset=True,
    )


def entry_end(flog: FileLog, index: int) -> int:
    entry = flog.get(index)
    assert entry is not None
    return entry.pos + entry.size


def open_store(
    root: Path, flog: FileLog, visible_index: int | None, *, classic: bool = False
) -> DLedgerBackedStore:
    cfg = config(root)
    old = None
    if classic:
        old = CommitLog(cfg.commit_log_dir, FILE, cfg.delay_level_millis)
        old.load()
    view = DLedgerCommitLogView(flog.data, cfg.delay_level_millis, old)
    if visible_index is not None:
        view.visible_end = entry_end(flog, visible_index)
    store = DLedgerBackedStore(cfg, view)
    store.open_and_recover()
    return store


def by_queue(store: DLedgerBackedStore, topic: str, qid: int, qoff: int) -> MessageExt:
    got = store.get_message("g", topic, qid, qoff, 1)
    assert got.status is GetMessageStatus.FOUND, (topic, qid, qoff, got.status)
    return decode_record(bytes(got.buffers[0]))


def by_id(store: DLedgerBackedStore, msg_id: str) -> MessageExt:
    _host, offset = decode_offset_msg_id(msg_id)
    msg = store.look_message_by_offset(offset)
    assert msg is not None, msg_id
    return msg


def check_every_message(store: DLedgerBackedStore, sent: list[Sent]) -> None:
    for s in sent:
        for msg in (by_queue(store, s.topic, s.queue_id, s.queue_offset), by_id(store, s.msg_id)):
            assert (msg.topic, msg.queue_id, msg.queue_offset) == (
                s.topic,
                s.queue_id,
                s.queue_offset,
            )
            assert msg.body == s.body and msg.commit_log_offset == s.offset
            assert msg.msg_id == s.msg_id
    for topic, qid in TOPICS:
        expected = sum(1 for s in sent if (s.topic, s.queue_id) == (topic, qid))
        assert store.get_max_offset_in_queue(topic, qid) == expected, (topic, qid)


def send_new(
    store: DLedgerBackedStore, flog: FileLog, term: int, n: int, *, seq: int = 0
) -> list[Sent]:
    """New entries as our leader appends them (queue offsets from the store's queues), made
    visible and dispatched as the Applier does."""
    out = []
    next_q: dict[tuple[str, int], int] = {}
    for i in range(n):
        topic, qid = TOPICS[(seq + i) % len(TOPICS)]
        q = next_q.get((topic, qid), store.get_max_offset_in_queue(topic, qid))
        next_q[(topic, qid)] = q + 1
        body = f"new {seq + i}".encode() * (1 + i % 40)
        msg = MessageExtBrokerInner(
            topic=topic,
            queue_id=qid,
            body=body,
            properties={"TAGS": "n", "KEYS": f"new{seq + i}"},
            born_host=("10.0.0.9", 50000),
            store_host=HOST,
        )
        entry = flog.append(term, encode_record(msg, q, 0, 1_800_000_000_000 + i))
        offset = entry.pos + ec.BODY_OFFSET
        assert ec.record_physical_offset(entry.body, -ec.BODY_OFFSET) == offset
        size = len(entry.body)
        out.append(
            Sent(topic, qid, q, body, offset, size, offset_msg_id(HOST, offset), entry.index, True)
        )
    store.view.advance(flog.write_pos)
    store.reput.do_reput(limit=None)
    return out


def test_an_apache_dledger_store_opens_in_place_and_takes_new_entries(tmp_path: Path) -> None:
    apache = ApacheDLedgerStore(tmp_path, file_size=FILE, cq_file_size=CQ_FILE)
    fill(apache, 40)
    apache.new_term()
    fill(apache, 30, start=40)
    apache.close()
    committed = apache.committed()
    flog = open_log(tmp_path)
    store = open_store(tmp_path, flog, 69)
    try:
        assert store.view.divided_commitlog_offset == 0
        assert store.get_max_phy_offset() == entry_end(flog, 69)
        check_every_message(store, committed)
        new = send_new(store, flog, 3, 25)
        assert new[0].offset == entry_end(flog, 69) + ec.BODY_OFFSET
        check_every_message(store, committed + new)
        # the index holds the new entries' keys, at their pos + 48
        found = store.query_message("TopicA", "new4", 4, 0, 2**62)
        assert [decode_record(bytes(b)).commit_log_offset for b in found.buffers] == [new[4].offset]
    finally:
        store.close_files()
        flog.close()
    # restart: the data files recover themselves, the queues are found again
    flog = open_log(tmp_path)
    store = open_store(tmp_path, flog, None)
    try:
        assert store.get_max_phy_offset() == flog.write_pos
        check_every_message(store, committed + new)
        more = send_new(store, flog, 4, 10, seq=25)
        check_every_message(store, committed + new + more)
    finally:
        store.close_files()
        flog.close()


def test_nothing_past_the_visible_end_is_dispatched_or_served(tmp_path: Path) -> None:
    apache = ApacheDLedgerStore(tmp_path, file_size=FILE, cq_file_size=CQ_FILE)
    fill(apache, 20)
    tail = [apache.send("TopicA", 0, b"x" * 300, commit=False) for _ in range(3)]
    apache.close()
    flog = open_log(tmp_path)
    store = open_store(tmp_path, flog, 19)
    try:
        q_end = store.get_max_offset_in_queue("TopicA", 0)
        assert q_end == tail[0].queue_offset  # the tail is in the log, in no queue
        for s in tail:
            assert store.look_message_by_offset(s.offset) is None
            assert store.select_one_message_by_offset(s.offset) is None
        store.reput.do_reput(limit=None)
        assert store.get_max_offset_in_queue("TopicA", 0) == q_end
        # committed one at a time: each is dispatched once visible, not before
        for i, s in enumerate(tail):
            store.view.advance(entry_end(flog, s.entry_index))
            store.reput.do_reput(limit=None)
            assert store.get_max_offset_in_queue("TopicA", 0) == q_end + i + 1
            assert by_id(store, s.msg_id).body == s.body
    finally:
        store.close_files()
        flog.close()


def test_the_reput_framing_skips_noops_and_blanks(tmp_path: Path) -> None:
    """parse_at: records at pos + 48, the legacy empty no-op skipped, the ROLLBACK no-op a
    record no dispatcher indexes, DLedger's blank rolls to the next file."""
    flog = open_log(tmp_path)
    view = DLedgerCommitLogView(flog.data, config(tmp_path).delay_level_millis)
    try:
        flog.append(1, bytes(ec.NOOP_RECORD))
        flog.append(1, b"")
        for i in range(12):
            msg = MessageExtBrokerInner(topic="T", queue_id=0, body=b"b" * 700, store_host=HOST)
            flog.append(1, encode_record(msg, i, 0, 1))
        view.advance(flog.write_pos)
        pos, seen = 0, []
        while pos < view.max_offset:
            parsed, size = view.parse_at(pos)
            if parsed is BLANK:
                seen.append("blank")
                pos = view.roll_next_file(pos)
                continue
            if parsed is SKIP:
                seen.append("skip")
            else:
                assert isinstance(parsed, DispatchRequest)
                assert parsed.commit_log_offset == pos + ec.BODY_OFFSET
                seen.append(parsed.topic)
            pos += size
        assert seen[:3] == [ec.NOOP_TOPIC, "skip", "T"]
        assert seen.count("T") == 12 and "blank" in seen
        # a store over it dispatches the twelve and nothing of the no-ops
        store = DLedgerBackedStore(config(tmp_path), view)
        store.open_and_recover()
        try:
            store.view.visible_end = flog.write_pos
            store.reput.do_reput(limit=None)
            assert store.get_max_offset_in_queue("T", 0) == 12
            assert store.get_max_offset_in_queue(ec.NOOP_TOPIC, 0) == 0
        finally:
            store.close_files()
    finally:
        flog.close()


def test_units_of_replaced_entries_are_cut(tmp_path: Path) -> None:
    """A new leader replaced entries applied before (the unconfirmed prefix): the store goes
    back to the last entry the log still holds and dispatches the replacement."""
    flog = open_log(tmp_path)
    view = DLedgerCommitLogView(flog.data, config(tmp_path).delay_level_millis)
    store = DLedgerBackedStore(config(tmp_path), view)
    store.open_and_recover()
    try:
        first = send_new(store, flog, 1, 10)
        assert store.get_max_offset_in_queue("TopicA", 0) == 3
        cut_at = flog.get(6)
        assert cut_at is not None
        flog.truncate(6)
        dropped = store.cut_dispatched(cut_at.pos)
        assert dropped == 4 and store.get_max_phy_offset() == cut_at.pos
        for s in first[6:]:
            assert store.look_message_by_offset(s.offset) is None
        again = send_new(store, flog, 2, 5, seq=6)
        check_every_message(store, first[:6] + again)
    finally:
        store.close_files()
        flog.close()


def test_a_log_reset_drops_every_queue(tmp_path: Path) -> None:
    flog = open_log(tmp_path)
    view = DLedgerCommitLogView(flog.data, config(tmp_path).delay_level_millis)
    store = DLedgerBackedStore(config(tmp_path), view)
    store.open_and_recover()
    try:
        send_new(store, flog, 1, 8)
        begin = flog.write_pos
        store.on_log_reset(begin)
        assert all(store.get_max_offset_in_queue(t, q) == 0 for t, q in TOPICS)
        assert store.reput_from == begin == store.get_max_phy_offset()
    finally:
        store.close_files()
        flog.close()


def test_a_classic_store_switched_to_dledger_opens_in_place(tmp_path: Path) -> None:
    """dividedCommitlogOffset, both ways: an Apache store switched earlier reads both sides;
    a classic store switching now gets its first data file where RocketMQ puts it."""
    apache = ApacheDLedgerStore(tmp_path, file_size=FILE, cq_file_size=CQ_FILE)
    fill(apache, 25, classic=True)
    fill(apache, 25, start=25)
    apache.close()
    flog = open_log(tmp_path)
    store = open_store(tmp_path, flog, 24, classic=True)
    try:
        assert store.view.divided_commitlog_offset == apache.divided_commitlog_offset
        check_every_message(store, apache.sent)
        new = send_new(store, flog, 2, 10)
        check_every_message(store, apache.sent + new)
    finally:
        store.close_files()
        flog.close()


def test_a_classic_store_switching_now_starts_dledger_after_its_last_file(tmp_path: Path) -> None:
    apache = ApacheDLedgerStore(tmp_path, file_size=FILE, cq_file_size=CQ_FILE)
    fill(apache, 25, classic=True)
    apache.close()
    cfg = config(tmp_path)
    old = CommitLog(cfg.commit_log_dir, FILE, cfg.delay_level_millis)
    old.load()
    end, _scanned, _files = old.recover(0, check_crc=True)
    flog = open_log(tmp_path)
    divided = start_after_classic(old, flog.data)
    old.close()
    assert divided == end - end % FILE + FILE
    flog.close()
    flog = open_log(tmp_path)  # an empty log keeps its first file at the division
    assert flog.write_pos == divided and flog.end_index == -1
    store = open_store(tmp_path, flog, None, classic=True)
    try:
        check_every_message(store, apache.sent)
        new = send_new(store, flog, 1, 10)
        assert new[0].offset == divided + ec.BODY_OFFSET and new[0].entry_index == 0
        check_every_message(store, apache.sent + new)
    finally:
        store.close_files()
        flog.close()
