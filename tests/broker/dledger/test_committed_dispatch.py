"""The write-once apply (broker/dledger/broker/committed_dispatch.py): committed entries made
visible and dispatched in place, resumed exactly after a restart, taken back when a new leader
replaces unconfirmed ones, dropped on a log reset; the store opened over a classic store being
switched, and over this broker's earlier two-copy layout.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import attrs
import pytest
import trio

from broker.dledger.broker import log_retention
from broker.dledger.broker.applier import PutHint
from broker.dledger.broker.apply_resume import HINT_FILE
from broker.dledger.broker.commitlog_view import DLedgerBackedStore
from broker.dledger.broker.committed_dispatch import (
    CommittedDispatch,
    LegacyStoreError,
    entry_ending_at,
    open_dledger_backed_store,
    run_dledger_backed_store,
)
from broker.dledger.broker.message_store import run_dledger_store
from broker.dledger.driver import entry_coder as ec
from broker.dledger.driver.mmap_file_store import FileLog, open_file_log
from broker.dledger.driver.state_files import Checkpoint, save_checkpoint
from broker.dledger.raft.messages import Role
from broker.store.config import MessageStoreConfig
from broker.store.results import GetMessageStatus, PutMessageStatus
from common.message import MessageExt, MessageExtBrokerInner, decode_record
from common.message_encoder import encode_record
from common.message_id import decode_offset_msg_id
from tests.broker.dledger.apache_store_fixture import ApacheDLedgerStore

if TYPE_CHECKING:
    from tests.broker.dledger.conftest import FakeNode

pytestmark = pytest.mark.timeout(60)

FILE = 4096
INDEX = 32 * 1024
HOST = ("10.0.0.7", 10911)
QUEUES = [("A", 0), ("A", 1), ("B", 0)]


def cfg(root: Path) -> MessageStoreConfig:
    return MessageStoreConfig(
        store_path_root_dir=str(root),
        mapped_file_size_commit_log=FILE,
        mapped_file_size_consume_queue=20 * 64,
    )


def member(root: Path) -> str:
    return str(root / "dledger-n0")


def open_log(root: Path) -> FileLog:
    return open_file_log(
        member(root), data_file_size=FILE, index_file_size=INDEX, patch_physical_offset=True
    )


class Writer:
    """A leader's puts: records with consecutive queue offsets, appended to the log."""

    def __init__(self) -> None:
        self.next_q: dict[tuple[str, int], int] = {}
        self.n = 0

    def record(self, store: DLedgerBackedStore) -> tuple[MessageExtBrokerInner, bytes, int, int]:
        topic, qid = QUEUES[self.n % len(QUEUES)]
        q = self.next_q.get((topic, qid), store.get_max_offset_in_queue(topic, qid))
        self.next_q[(topic, qid)] = q + 1
        ts = 1_700_000_000_000 + self.n
        msg = MessageExtBrokerInner(
            topic=topic,
            queue_id=qid,
            body=f"m{self.n}".encode() * (1 + self.n % 50),
            properties={"TAGS": f"t{self.n % 3}", "KEYS": f"key{self.n}"},
            born_host=("10.0.0.9", 1),
            store_host=HOST,
        )
        self.n += 1
        return msg, encode_record(msg, q, 0, ts), q, ts


def propose(
    node: FakeNode, applier: CommittedDispatch, writer: Writer, n: int, *, hinted: bool
) -> None:
    for _ in range(n):
        msg, record, q, ts = writer.record(applier.store)
        entry = node.log.append(node.term, record)
        if hinted:
            applier.hints[entry.index] = PutHint(entry.term, msg, len(record), q, ts)


def apply_committed(node: FakeNode, applier: CommittedDispatch) -> None:
    node.commit(node.log.end_index)
    entries = [node.log.get(i) for i in range(applier.applied_index + 1, node.committed_index + 1)]
    applier.apply_entries([e for e in entries if e is not None])
    applier.store.reput.do_reput(limit=None)


def messages(store: DLedgerBackedStore) -> list[tuple[str, int, int, int, bytes]]:
    """(topic, qid, queue offset, CommitLog offset, body) of every message by queue offset."""
    out = []
    for topic, qid in QUEUES:
        for q in range(
            store.get_min_offset_in_queue(topic, qid), store.get_max_offset_in_queue(topic, qid)
        ):
            got = store.get_message("g", topic, qid, q, 1)
            assert got.status is GetMessageStatus.FOUND, (topic, qid, q)
            m: MessageExt = decode_record(bytes(got.buffers[0]))
            assert (m.topic, m.queue_id, m.queue_offset) == (topic, qid, q)
            out.append((topic, qid, q, m.commit_log_offset, m.body))
    return out


def check_in_place(store: DLedgerBackedStore, flog: FileLog) -> None:
    """Every served record is an entry's body at pos + 48, PHYSICALOFFSET included."""
    for _t, _q, _o, offset, body in messages(store):
        index = entry_ending_at(flog, offset + len(encode_size(store, offset)))
        entry = flog.get(index)
        assert entry is not None and entry.pos + ec.BODY_OFFSET == offset
        assert decode_record(entry.body).body == body


def encode_size(store: DLedgerBackedStore, offset: int) -> bytes:
    size = store.commit_log.read_size(offset)
    data = store.commit_log.read(offset, size)
    assert data is not None
    return bytes(data)


def open_all(
    tmp_path: Path, new_node: Callable[..., FakeNode]
) -> tuple[FileLog, FakeNode, DLedgerBackedStore, CommittedDispatch]:
    flog = open_log(tmp_path)
    node = new_node(log=flog, auto_commit=False)
    store = open_dledger_backed_store(cfg(tmp_path), flog, member(tmp_path))
    applier = CommittedDispatch(store, node)
    applier.resume()
    flog.truncate_listeners.append(applier.on_truncate)
    return flog, node, store, applier


def close_all(flog: FileLog, node: FakeNode, store: DLedgerBackedStore) -> None:
    store.close_files()
    save_checkpoint(
        member(Path(store.root)),
        Checkpoint(end_index=flog.end_index, committed_index=node.committed_index),
    )
    flog.close()


def test_the_leaders_hints_dispatch_as_a_parse_would(
    tmp_path: Path, new_node: Callable[..., FakeNode]
) -> None:
    """Same entries, with and without the put hints: the same units, offsets and keys."""
    seen = []
    for hinted in (True, False):
        root = tmp_path / str(hinted)
        flog, node, store, applier = open_all(root, new_node)
        writer = Writer()
        for n in (1, 7, 30, 2):
            propose(node, applier, writer, n, hinted=hinted)
            apply_committed(node, applier)
        assert not applier.hints
        assert store.get_max_phy_offset() == flog.write_pos == store.reput_from
        check_in_place(store, flog)
        keys = [
            [
                decode_record(bytes(b)).commit_log_offset
                for b in store.query_message("A", f"key{i}", 4, 0, 2**62).buffers
            ]
            for i in range(0, 40, 3)
        ]
        seen.append((messages(store), keys))
        close_all(flog, node, store)
    assert seen[0] == seen[1]
    assert len(seen[0][0]) == 40


def test_nothing_uncommitted_is_served_and_a_restart_resumes_exactly(
    tmp_path: Path, new_node: Callable[..., FakeNode]
) -> None:
    flog, node, store, applier = open_all(tmp_path, new_node)
    writer = Writer()
    propose(node, applier, writer, 20, hinted=True)
    apply_committed(node, applier)
    before = messages(store)
    propose(node, applier, writer, 5, hinted=True)  # appended, not committed
    store.reput.do_reput(limit=None)
    assert messages(store) == before
    assert applier.applied_index == 19
    close_all(flog, node, store)
    # restart: the checkpoint says 19 committed; the tail is in the log, in no queue
    flog, node, store, applier = open_all(tmp_path, new_node)
    assert applier.applied_index == 19 and messages(store) == before
    writer.next_q.clear()
    node.committed_index = 19
    apply_committed(node, applier)  # the leader commits the tail
    assert applier.applied_index == 24 and len(messages(store)) == 25
    check_in_place(store, flog)
    close_all(flog, node, store)


def test_a_restart_with_a_stale_checkpoint_keeps_what_the_queues_point_to(
    tmp_path: Path, new_node: Callable[..., FakeNode]
) -> None:
    """The member checkpoint is older than the dispatch: entries a queue points to stay
    served (and applied), the resume goes on after them."""
    flog, node, store, applier = open_all(tmp_path, new_node)
    writer = Writer()
    propose(node, applier, writer, 12, hinted=False)
    apply_committed(node, applier)
    before = messages(store)
    store.close_files()
    save_checkpoint(member(tmp_path), Checkpoint(end_index=11, committed_index=3))
    flog.close()
    flog, node, store, applier = open_all(tmp_path, new_node)
    assert messages(store) == before
    last = max(before, key=lambda m: m[3])
    assert applier.applied_index == entry_ending_at(flog, store.get_max_phy_offset())
    assert store.get_max_phy_offset() >= last[3]
    close_all(flog, node, store)


def test_entries_a_new_leader_replaced_are_taken_back(
    tmp_path: Path, new_node: Callable[..., FakeNode]
) -> None:
    """Applied before a restart, never confirmed: the log takes a new leader's entries in
    their place and the queues follow the log at once."""
    flog, node, store, applier = open_all(tmp_path, new_node)
    writer = Writer()
    propose(node, applier, writer, 15, hinted=False)
    apply_committed(node, applier)
    kept = [m for m in messages(store)]
    close_all(flog, node, store)
    flog, node, store, applier = open_all(tmp_path, new_node)
    node.committed_index = -1  # learned again from a leader
    cut_entry = flog.get(9)
    assert cut_entry is not None
    flog.truncate(9)  # a new leader's TRUNCATE
    assert applier.applied_index == 8 and applier.cuts == 1
    assert store.get_max_phy_offset() == cut_entry.pos
    survivors = [m for m in kept if m[3] < cut_entry.pos]
    assert messages(store) == survivors
    for m in kept:
        if m[3] >= cut_entry.pos:
            assert store.look_message_by_offset(m[3]) is None
    writer = Writer()
    node.term = 2
    propose(node, applier, writer, 4, hinted=False)
    apply_committed(node, applier)
    assert applier.applied_index == 12 and len(messages(store)) == len(survivors) + 4
    check_in_place(store, flog)
    close_all(flog, node, store)


def test_a_log_reset_drops_every_queue(tmp_path: Path, new_node: Callable[..., FakeNode]) -> None:
    flog, node, store, applier = open_all(tmp_path, new_node)
    writer = Writer()
    propose(node, applier, writer, 6, hinted=True)
    apply_committed(node, applier)
    applier.on_log_reset(6, flog.write_pos)
    assert messages(store) == [] and applier.applied_index == 5
    assert store.reput_from == flog.write_pos
    writer.next_q.clear()
    propose(node, applier, writer, 3, hinted=False)
    apply_committed(node, applier)
    assert len(messages(store)) == 3
    close_all(flog, node, store)


def test_a_classic_store_switched_now_reads_both_sides(
    tmp_path: Path, new_node: Callable[..., FakeNode]
) -> None:
    apache = ApacheDLedgerStore(tmp_path, file_size=FILE, cq_file_size=20 * 64)
    for i in range(30):
        topic, qid = QUEUES[i % len(QUEUES)]
        apache.send_classic(topic, qid, bytes([65 + i % 26]) * (30 + i * 7))
    apache.close()
    flog, node, store, applier = open_all(tmp_path, new_node)
    divided = store.view.divided_commitlog_offset
    assert divided > 0 and divided % FILE == 0 and flog.write_pos == divided
    assert len(messages(store)) == 30
    writer = Writer()
    propose(node, applier, writer, 10, hinted=True)
    apply_committed(node, applier)
    got = messages(store)
    assert len(got) == 40
    assert sorted(m[3] for m in got)[30] == divided + ec.BODY_OFFSET
    close_all(flog, node, store)
    flog, node, store, applier = open_all(tmp_path, new_node)
    assert messages(store) == got
    close_all(flog, node, store)


def test_the_earlier_two_copy_layout_is_rebuilt_from_the_log(
    tmp_path: Path, new_node: Callable[..., FakeNode]
) -> None:
    flog, node, store, applier = open_all(tmp_path, new_node)
    writer = Writer()
    propose(node, applier, writer, 9, hinted=False)
    apply_committed(node, applier)
    want = messages(store)
    close_all(flog, node, store)
    # what the two-copy broker left beside the log: its hint and a classic copy at offset 0
    (tmp_path / HINT_FILE).write_text('{"appliedIndex": 8, "appliedOffset": 1}')
    (tmp_path / "commitlog").mkdir()
    (tmp_path / "commitlog" / f"{0:020d}").write_bytes(bytes(FILE))
    flog, node, store, applier = open_all(tmp_path, new_node)
    assert messages(store) == want
    aside = [n for n in os.listdir(tmp_path) if n.startswith("legacy-two-copy-")]
    assert len(aside) == 1
    assert sorted(os.listdir(tmp_path / aside[0])) == [
        "checkpoint",
        "commitlog",
        "consumequeue",
        HINT_FILE,
        "index",
    ]
    close_all(flog, node, store)


def test_the_two_copy_layout_is_refused_when_the_log_lost_its_head(
    tmp_path: Path, new_node: Callable[..., FakeNode]
) -> None:
    flog = open_log(tmp_path)
    for i in range(6):
        flog.append(1, b"entry %d" % i)
    flog._begin = 5  # as after retention dropped the head files
    (tmp_path / HINT_FILE).write_text("{}")
    try:
        with pytest.raises(LegacyStoreError, match="no longer begins at entry 0"):
            open_dledger_backed_store(cfg(tmp_path), flog, member(tmp_path))
    finally:
        flog.close()


async def test_the_run_function_serves_and_stops_cleanly(
    tmp_path: Path, new_node: Callable[..., FakeNode]
) -> None:
    # the real clock: the final flush runs in a worker thread, which an autojump clock would
    # cut short by the shutdown's time bound
    flog = open_log(tmp_path)
    node = new_node(log=flog, auto_commit=False)
    async with trio.open_nursery() as nursery:
        store = await nursery.start(run_dledger_backed_store, cfg(tmp_path), flog, member(tmp_path))
        applier = CommittedDispatch(store, node)
        applier.resume()
        nursery.start_soon(applier.run)
        writer = Writer()
        propose(node, applier, writer, 25, hinted=True)
        node.commit(flog.end_index)
        with trio.fail_after(5):
            await applier.wait_applied(24)
            await store.wait_dispatched(flog.write_pos)
        assert len(messages(store)) == 25
        nursery.cancel_scope.cancel()
    save_checkpoint(member(tmp_path), Checkpoint(end_index=24, committed_index=24))
    flog.close()
    flog, node, store, applier = open_all(tmp_path, new_node)
    assert applier.applied_index == 24 and len(messages(store)) == 25
    assert store.recovery is not None and store.recovery.redispatched_bytes == 0
    close_all(flog, node, store)


def test_a_log_that_lost_its_tail_loses_its_queue_units(
    tmp_path: Path, new_node: Callable[..., FakeNode]
) -> None:
    """A power cut took the log's tail but not the queues' (they are synced apart): on open the
    units past the log go, and the entries written again in their place are dispatched."""
    flog, node, store, applier = open_all(tmp_path, new_node)
    writer = Writer()
    propose(node, applier, writer, 12, hinted=True)
    apply_committed(node, applier)
    kept = [m for m in messages(store)]
    close_all(flog, node, store)
    flog = open_log(tmp_path)
    cut = flog.get(7)
    assert cut is not None
    flog.truncate(7)  # what recovery keeps of a log whose tail the disk lost
    flog.close()
    save_checkpoint(member(tmp_path), Checkpoint(end_index=6, committed_index=6))
    flog, node, store, applier = open_all(tmp_path, new_node)
    assert applier.applied_index == 6
    assert messages(store) == [m for m in kept if m[3] < cut.pos]
    assert store.recovery is not None and store.recovery.cq_units_dropped == 5
    writer.next_q.clear()
    propose(node, applier, writer, 3, hinted=False)
    apply_committed(node, applier)
    assert len(messages(store)) == 10
    check_in_place(store, flog)
    close_all(flog, node, store)


@attrs.define
class RetNode:
    """What retention reads of a follower (log_retention.RetentionNode)."""

    log: FileLog
    committed_index: int
    role: Role = Role.FOLLOWER

    def peer_watermarks(self) -> dict[str, int]:
        return {}


async def test_dropping_head_data_files_is_commitlog_retention(
    tmp_path: Path, new_node: Callable[..., FakeNode], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The queues follow the data files retention drops (their min offsets move to the first
    unit still in the log, their wholly dropped files go), and nothing goes past the store
    checkpoint's durable dispatch."""
    flog, node, store, applier = open_all(tmp_path, new_node)
    writer = Writer()
    propose(node, applier, writer, 150, hinted=True)
    apply_committed(node, applier)
    sent = messages(store)
    assert len(flog.data.files) > 8
    flog.flush()  # a head goes only once the new first entry is on disk
    now = time.time()
    for mf in flog.data.files:
        os.utime(mf.path, (now - 3 * 3600,) * 2)  # expired for fileReservedTime=1
    monkeypatch.setattr(log_retention, "disk_used_ratio", lambda path: 0.8)  # over 75 %: due
    store.config = attrs.evolve(
        store.config,
        file_reserved_time=1,
        delete_when=f"{(time.localtime(now).tm_hour + 12) % 24:02d}",
    )
    ret = log_retention.retention_for(store, applier, RetNode(flog, node.committed_index))
    assert isinstance(ret, log_retention.WriteOnceRetention)
    # the durable dispatch is the bound: here the middle of the fourth file
    bound_entry = flog.get(40)
    assert bound_entry is not None
    store.checkpoint.dispatched = bound_entry.pos + bound_entry.size
    assert await ret.once() > 0
    assert 0 < flog.begin_index <= 40
    first = flog.get(flog.begin_index)
    assert first is not None and store.get_min_phy_offset() == first.pos
    left = messages(store)
    assert left == [m for m in sent if m[3] > first.pos]
    for topic, qid in QUEUES:
        assert store.get_min_offset_in_queue(topic, qid) > 0
    # the whole dispatch durable: everything but the last file may go
    store.checkpoint.dispatched = store.reput_from
    await ret.once()
    assert flog.begin_index > 40
    first = flog.get(flog.begin_index)
    assert first is not None
    assert messages(store) == [m for m in sent if m[3] > first.pos]
    close_all(flog, node, store)


async def test_puts_answer_entry_positions_and_truncations_reach_the_store(
    tmp_path: Path,
    new_node: Callable[..., FakeNode],
    mk: Callable[..., MessageExtBrokerInner],
) -> None:
    """DLedgerMessageStore over the write-once store: a put's offsets and msgIds are its
    entries' pos + 48, read back by queue offset and msgId; run_dledger_store hooks the log's
    truncations to the apply (and unhooks it when it stops)."""
    flog = open_log(tmp_path)
    node = new_node(log=flog)
    try:
        async with trio.open_nursery() as nursery:
            store = await nursery.start(
                run_dledger_backed_store, cfg(tmp_path), flog, member(tmp_path)
            )
            dledger = await nursery.start(run_dledger_store, store, node)
            assert isinstance(dledger.applier, CommittedDispatch)
            assert flog.truncate_listeners == [dledger.applier.on_truncate]
            dledger.become_master(node.term)
            dledger.broker_role = "SYNC_MASTER"
            with trio.fail_after(10):
                one = await dledger.put_message(mk("A", 0, b"one"))
                batch = await dledger.put_messages([mk("A", 1, b"b%d" % i) for i in range(3)])
            for result, first in ((one, 0), (batch, 1)):
                assert result.status is PutMessageStatus.PUT_OK and result.append is not None
                ids = result.append.msg_id.split(",")
                for k, msg_id in enumerate(ids):
                    entry = flog.get(first + k)
                    assert entry is not None
                    _host, offset = decode_offset_msg_id(msg_id)
                    assert offset == entry.pos + ec.BODY_OFFSET
                    assert dledger.look_message_by_offset(offset) is not None
                assert result.append.wrote_offset == decode_offset_msg_id(ids[0])[1]
            got = dledger.get_message("g", "A", 1, 0, 8)
            assert [decode_record(bytes(b)).body for b in got.buffers] == [b"b0", b"b1", b"b2"]
            # an (unconfirmed) applied entry cut by the log: the store follows at once
            flog.truncate(2)
            assert dledger.applier.applied_index == 1
            assert dledger.get_max_offset_in_queue("A", 1) == 1
            nursery.cancel_scope.cancel()
        assert flog.truncate_listeners == []
    finally:
        flog.close()
