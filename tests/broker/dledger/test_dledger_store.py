"""The DLedger store (broker/dledger/broker/message_store.py) and its apply (applier.py) on a
fake node.

The fake (conftest.FakeNode) is a one-member group: a proposal commits at once unless the test
holds commits back.  The classic store underneath is the in-memory one, or the file store where
the files matter (restart after a crash).
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import trio

from broker.dledger.broker.applier import Applier, ApplyError, PutDispatchingStore
from broker.dledger.broker.apply_resume import Hint, read_hint, write_hint
from broker.dledger.broker.message_store import (
    DLedgerMessageStore,
    DLedgerPut,
    put_status,
    run_dledger_store,
)
from broker.dledger.raft.messages import Role
from broker.store import (
    DefaultMessageStore,
    GetMessageStatus,
    MemoryMessageStore,
    MessageStoreConfig,
    PutMessageResult,
    PutMessageStatus,
    run_memory_store,
    run_message_store,
)
from broker.store.dirty_files import truncate_dirty_files
from broker.store.put_message import PreparedPut
from common.message import PHYSICAL_OFFSET_POSITION, MessageExtBrokerInner, decode_record
from common.message_id import decode_offset_msg_id
from common.remoting.codes import DLedgerResponseCode
from common.topics import SCHEDULE_TOPIC

if TYPE_CHECKING:
    from tests.broker.dledger.conftest import FakeNode

STORE_HOST = ("127.0.0.1", 10911)  # conftest.make_message's


@pytest.fixture
def open_dledger(tmp_path):
    """``async with open_dledger(node, **store_config) as store``: the DLedger store over a
    running in-memory classic store, master in the node's term."""

    @contextlib.asynccontextmanager
    async def _open(node, *, master=True, file=False, **kw):
        kw.setdefault("mapped_file_size_commit_log", 4096)
        cfg = MessageStoreConfig(store_path_root_dir=str(tmp_path / "store"), **kw)
        async with trio.open_nursery() as nursery:
            classic = await nursery.start(run_message_store if file else run_memory_store, cfg)
            store = await nursery.start(run_dledger_store, classic, node)
            if master:
                store.become_master(node.term)
                store.broker_role = "SYNC_MASTER"
            else:
                store.broker_role = "SLAVE"
            try:
                yield store
            finally:
                nursery.cancel_scope.cancel()

    return _open


async def test_round_trip_msg_id_and_offsets(open_dledger, autojump_clock, new_node, mk):
    node = new_node()
    async with open_dledger(node) as store:
        first = await store.put_message(mk(body=b"one"))
        second = await store.put_message(mk(body=b"two"))
        assert first.status is PutMessageStatus.PUT_OK and second.ok
        a, b = first.append, second.append
        assert (a.wrote_offset, a.logics_offset) == (0, 0)
        assert (b.wrote_offset, b.logics_offset) == (a.wrote_bytes, 1)
        assert decode_offset_msg_id(b.msg_id) == (STORE_HOST, b.wrote_offset)
        got = store.get_message("g", "T", 0, 0, 32)
        assert got.status is GetMessageStatus.FOUND and got.message_count == 2
        m = decode_record(got.buffers[1])
        assert (m.body, m.queue_offset, m.commit_log_offset) == (b"two", 1, b.wrote_offset)
        # the log holds the leader's record (PHYSICALOFFSET 0), the classic store the patched one
        assert node.log.end_index == 1 and store.applied_index == 1
        entry = node.log.get(1).body
        assert entry[PHYSICAL_OFFSET_POSITION : PHYSICAL_OFFSET_POSITION + 8] == bytes(8)
        info = store.runtime_info()
        assert info["dledgerRole"] == "LEADER" and info["dledgerCommittedIndex"] == "1"
        assert info["dledgerPeers"] == node.config.peers and info["dledgerSelfId"] == "n0"


async def test_only_committed_entries_reach_the_queues(open_dledger, autojump_clock, new_node, mk):
    node = new_node(auto_commit=False)
    async with open_dledger(node) as store:
        pending = store.append_message(mk(body=b"a"))
        assert isinstance(pending, DLedgerPut)
        store.append_message(mk(body=b"b"))
        await trio.sleep(1)
        assert node.log.end_index == 1
        assert store.get_max_offset_in_queue("T", 0) == 0
        assert store.get_max_phy_offset() == 0
        node.commit(0)
        result = await pending.wait()
        assert result.ok and result.append is not None and result.append.logics_offset == 0
        assert store.get_max_offset_in_queue("T", 0) == 1  # entry 1 is still not committed
        node.commit(1)
        await store.applier.wait_applied(1)
        assert store.get_max_offset_in_queue("T", 0) == 2


async def test_batch_takes_one_entry_per_record(open_dledger, autojump_clock, new_node, mk):
    node = new_node()
    async with open_dledger(node) as store:
        await store.put_message(mk(qid=1))
        result = await store.put_messages([mk(qid=1, body=bytes([i])) for i in range(3)])
        assert result.ok and result.append.msg_num == 3 and result.append.logics_offset == 1
        ids = result.append.msg_id.split(",")
        phys = [decode_offset_msg_id(i)[1] for i in ids]
        assert phys[0] == result.append.wrote_offset and phys == sorted(phys)
        assert node.log.end_index == 3
        assert store.get_max_offset_in_queue("T", 1) == 4


async def test_batch_with_delay_or_transaction_is_illegal(
    open_dledger, autojump_clock, new_node, mk
):
    node = new_node()
    async with open_dledger(node) as store:
        delayed = [mk(), mk(DELAY=2)]
        assert (await store.put_messages(delayed)).status is PutMessageStatus.MESSAGE_ILLEGAL
        tx = mk()
        tx.sys_flag = 0x4  # TRANSACTION_PREPARED_TYPE
        assert (await store.put_messages([tx])).status is PutMessageStatus.MESSAGE_ILLEGAL
        assert node.log.end_index == -1


async def test_delayed_message_goes_to_the_schedule_topic(
    open_dledger, autojump_clock, new_node, mk
):
    node = new_node()
    async with open_dledger(node) as store:
        result = await store.put_message(mk(DELAY=3))
        assert result.ok
        assert store.get_max_offset_in_queue(SCHEDULE_TOPIC, 2) == 1


async def test_not_master_is_refused_like_a_slave(open_dledger, autojump_clock, new_node, mk):
    node = new_node()
    async with open_dledger(node, master=False) as store:
        r = await store.put_message(mk())
        assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        # master by role, but the table is from an older term: refused, nothing proposed
        store.broker_role = "SYNC_MASTER"
        store.become_master(node.term)
        node.change_role(Role.FOLLOWER, term=2, leader_id="n1")
        node.change_role(Role.LEADER, term=3, leader_id="n0")
        r = await store.put_message(mk())
        assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert "term 3" in r.remark
        assert node.log.end_index == -1
        store.become_master(3)
        assert (await store.put_message(mk())).ok


async def test_becoming_master_again_in_the_same_term_keeps_the_live_table(
    open_dledger, autojump_clock, new_node, mk
):
    """The role handler can hear of one leadership twice (the role the node had at its start,
    then the node's own event for it): the second rebuild, made while a put was in flight,
    must not hand that put's queue offset out again."""
    node = new_node(auto_commit=False)
    async with open_dledger(node) as store:
        first = store.append_message(mk(body=b"first"))  # proposed, not yet committed
        assert not isinstance(first, PutMessageResult)
        store.become_master(node.term)
        second = store.append_message(mk(body=b"second"))
        assert not isinstance(second, PutMessageResult)
        node.commit(node.log.end_index)
        done = [await first.wait(), await second.wait()]
        assert [r.append.logics_offset for r in done if r.append is not None] == [0, 1]
        assert store.get_max_offset_in_queue("T", 0) == 2


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (DLedgerResponseCode.SUCCESS, PutMessageStatus.PUT_OK),
        (DLedgerResponseCode.WAIT_QUORUM_ACK_TIMEOUT, PutMessageStatus.OS_PAGECACHE_BUSY),
        (DLedgerResponseCode.LEADER_PENDING_FULL, PutMessageStatus.OS_PAGECACHE_BUSY),
        (DLedgerResponseCode.NOT_LEADER, PutMessageStatus.SERVICE_NOT_AVAILABLE),
        (DLedgerResponseCode.INCONSISTENT_LEADER, PutMessageStatus.SERVICE_NOT_AVAILABLE),
        (DLedgerResponseCode.LEADER_NOT_READY, PutMessageStatus.SERVICE_NOT_AVAILABLE),
        (DLedgerResponseCode.DISK_FULL, PutMessageStatus.SERVICE_NOT_AVAILABLE),
        (DLedgerResponseCode.TERM_CHANGED, PutMessageStatus.SERVICE_NOT_AVAILABLE),
        (DLedgerResponseCode.LEADER_TRANSFERRING, PutMessageStatus.SERVICE_NOT_AVAILABLE),
    ],
)
async def test_result_codes(open_dledger, autojump_clock, code, status, new_node, mk):
    assert put_status(code) is status
    if code is DLedgerResponseCode.SUCCESS:
        return
    async with open_dledger(new_node(refuse=code)) as store:
        # refused by the append: a final answer, nothing in the log
        r = store.append_message(mk())
        assert isinstance(r, PutMessageResult) and r.status is status
        assert code.name in (r.remark or "")
    async with open_dledger(new_node(outcome=code)) as store:
        # appended, then the wait failed: the pending put answers the mapped status
        r = store.append_message(mk())
        assert isinstance(r, DLedgerPut)
        assert (await r.wait()).status is status
        assert store.applier.landed == {}


async def test_no_op_entries_are_skipped(open_dledger, autojump_clock, new_node, mk):
    node = new_node()
    async with open_dledger(node) as store:
        node.log.append(1, b"")
        node.commit(0)
        await store.applier.wait_applied(0)
        assert store.get_max_phy_offset() == 0
        r = await store.put_message(mk())
        assert r.ok and r.append.wrote_offset == 0 and store.applied_index == 1


async def test_records_land_where_the_classic_store_puts_them(
    open_dledger, autojump_clock, new_node, mk
):
    """Same puts, same CommitLog bytes: the BLANK rollover follows the classic rule."""
    node = new_node()
    clock = 1_700_000_000_000
    cfg = MessageStoreConfig(store_path_root_dir="unused", mapped_file_size_commit_log=1024)
    reference = MemoryMessageStore(cfg, clock=lambda: clock)
    reference.broker_role = "SYNC_MASTER"
    rng = random.Random(7)
    async with open_dledger(node, mapped_file_size_commit_log=1024) as store:
        store.clock = lambda: clock
        for i in range(150):
            body = rng.randbytes(rng.randrange(1, 300))
            mine = await store.put_message(mk(qid=i % 3, body=body))
            ref = await reference.put_message(mk(qid=i % 3, body=body))
            assert mine.append is not None and ref.append is not None
            assert mine.append.wrote_offset == ref.append.wrote_offset
            assert mine.append.msg_id == ref.append.msg_id
        end = reference.get_max_phy_offset()
        assert end > 4 * 1024  # several files, so several BLANKs
        assert store.get_max_phy_offset() == end
        for start in range(0, end, 1024):
            mine_data = store.get_commit_log_data(start)
            ref_data = reference.get_commit_log_data(start)
            assert mine_data is not None and ref_data is not None
            assert bytes(mine_data) == bytes(ref_data)


# --- restart: the apply resumes exactly where the classic store ends --------------------------


def _entries_for(
    node: FakeNode, mk: Callable[..., MessageExtBrokerInner], rng: random.Random, n: int
) -> None:
    """Fill the node's log with n committed entries: records of a few queues, and no-ops."""
    store = MemoryMessageStore(MessageStoreConfig(store_path_root_dir="unused"))
    store.broker_role = "SYNC_MASTER"
    offsets: dict[int, int] = {}
    for _ in range(n):
        if rng.random() < 0.15:
            node.log.append(node.term, b"")
            continue
        qid = rng.randrange(3)
        msg = mk(qid=qid, body=rng.randbytes(rng.randrange(1, 400)), KEYS=f"k{qid}")
        put = store._prepare_put([msg], {("T", qid): offsets.get(qid, 0)}, batch=False)
        assert isinstance(put, PreparedPut), put
        offsets[qid] = offsets.get(qid, 0) + 1
        node.log.append(node.term, bytes(put.buf))
    node.committed_index = node.log.end_index


def _open_file_store(root: Path, file_size: int = 2048) -> DefaultMessageStore:
    cfg = MessageStoreConfig(store_path_root_dir=str(root), mapped_file_size_commit_log=file_size)
    store = DefaultMessageStore(cfg)
    store.open_and_recover()
    return store


def _applied(root: Path, node: FakeNode, end: int) -> tuple[DefaultMessageStore, Applier]:
    """A file store at ``root`` with the node's entries ``0 .. end - 1`` applied."""
    store = _open_file_store(root)
    applier = Applier(store, node)
    _apply(applier, node, 0, end)
    return store, applier


def _apply(applier: Applier, node: FakeNode, first: int, end: int) -> None:
    for i in range(first, end):
        entry = node.log.get(i)
        assert entry is not None, i
        applier.apply_entry(entry)


@pytest.mark.parametrize("seed", range(12))
def test_resume_after_a_crash_is_exact(tmp_path, seed, new_node, mk, commit_log_bytes):
    """Apply, write the hint at random moments, crash (maybe mid-record), restart, resume,
    finish: the classic CommitLog equals one that never crashed."""
    rng = random.Random(seed)
    node = new_node()
    _entries_for(node, mk, rng, 60)

    reference, ref = _applied(tmp_path / "reference", node, node.log.end_index + 1)
    expected = commit_log_bytes(reference)
    reference.close_files()

    root = tmp_path / "crashing"
    for _round in range(3):
        store = _open_file_store(root)
        applier = Applier(store, node)
        report = applier.resume()
        # nothing applied twice, nothing skipped: what is there is a prefix of the reference
        assert expected.startswith(commit_log_bytes(store))
        assert report.applied_offset == store.get_max_phy_offset()
        crash_at = rng.randrange(applier.applied_index + 1, node.log.end_index + 2)
        while applier.applied_index + 1 < crash_at:
            applier.apply_entry(node.log.get(applier.applied_index + 1))
            if rng.random() < 0.1:
                applier.write_hint()
        nxt = node.log.get(applier.applied_index + 1)
        if nxt is not None and nxt.body and rng.random() < 0.5:
            # killed in the middle of copying the next record: a torn tail
            torn = nxt.body[: rng.randrange(8, len(nxt.body))]
            store.append_to_commit_log(applier.applied_offset, torn)
        store.reput.do_reput(limit=None)
        store.close_files(clean=False)  # no checkpoint, `abort` stays: a crash

    store = _open_file_store(root)
    assert not store.last_exit_ok
    applier = Applier(store, node)
    applier.resume()
    while applier.applied_index < node.log.end_index:
        applier.apply_entry(node.log.get(applier.applied_index + 1))
    assert commit_log_bytes(store) == expected
    store.reput.do_reput(limit=None)
    for qid in range(3):
        want = sum(
            1
            for i in range(node.log.end_index + 1)
            if node.log.get(i).body and decode_record(node.log.get(i).body).queue_id == qid
        )
        assert store.get_max_offset_in_queue("T", qid) == want
    store.close_files()


def test_resume_without_a_hint_walks_from_the_start(tmp_path, new_node, mk):
    node = new_node()
    _entries_for(node, mk, random.Random(1), 20)
    store, applier = _applied(tmp_path / "s", node, 13)
    store.close_files(clean=False)
    store = _open_file_store(tmp_path / "s")
    report = Applier(store, node).resume()
    last_record = max(i for i in range(13) if node.log.get(i).body)
    assert report.applied_index == last_record and report.hint_index == -1
    store.close_files()


def test_resume_falls_back_on_the_durable_hint_when_the_hint_is_past_the_end(
    tmp_path, new_node, mk
):
    """A power cut can leave the plain hint (not fsynced) past the classic CommitLog's
    recovered end; resume then starts from the durable hint, which log retention keeps the
    entries after, not from the start (whose entries retention may have deleted)."""
    node = new_node()
    _entries_for(node, mk, random.Random(4), 20)
    store, applier = _applied(tmp_path / "s", node, 8)
    applier.write_durable_hint(
        Hint(applier.applied_index, applier.applied_offset, node.log.term_at(applier.applied_index))
    )
    _apply(applier, node, 8, 13)
    end = applier.applied_offset
    store.close_files(clean=False)
    with open(applier.hint_path, "w") as f:
        f.write(f'{{"appliedIndex": 19, "appliedOffset": {end + 4096}}}')
    store = _open_file_store(tmp_path / "s")
    report = Applier(store, node).resume()
    assert (report.hint_index, report.applied_offset) == (7, end)
    assert report.applied_index == max(i for i in range(13) if node.log.get(i).body)
    store.close_files()


def test_a_hint_naming_an_entry_of_another_term_is_not_used(tmp_path, new_node, mk):
    """The plain hint is not fsynced and names (index, offset, term): one whose entry the log
    now holds in another term (a new leader replaced it) gives way to the durable hint."""
    node = new_node()
    _entries_for(node, mk, random.Random(7), 20)
    store, applier = _applied(tmp_path / "s", node, 8)
    durable = applier.applied_index
    applier.write_durable_hint(Hint(durable, applier.applied_offset, 1))
    _apply(applier, node, 8, 13)
    applier.write_hint()
    store.close_files(clean=False)
    plain = read_hint(applier.hint_path)
    assert plain is not None and plain.term == 1 and plain.entry > durable
    write_hint(applier.hint_path, plain._replace(term=7))
    store = _open_file_store(tmp_path / "s")
    report = Applier(store, node).resume()
    assert report.hint_index == durable  # not the plain hint: its entry is of another term
    assert report.applied_index == applier.applied_index
    store.close_files()


async def test_records_past_a_log_that_lost_its_tail_are_cut(
    tmp_path, new_node, mk, commit_log_bytes
):
    """A power cut can take the Raft log's unflushed tail while the classic store, flushed by
    another task, kept records of those entries: resume reports where they start and
    ``truncate_dirty_files`` cuts the store back, queues and all, to exactly what a store that
    applied only the surviving log holds; the cut store reopens the same."""
    node = new_node()
    _entries_for(node, mk, random.Random(5), 24)
    store, applier = _applied(tmp_path / "s", node, 20)
    applier.write_hint()  # (19, ...): past the log's end once it loses its tail
    store.reput.do_reput(limit=None)
    store.close_files(clean=False)
    node.log.truncate(11)  # the power cut took entries 11.. from the log
    node.committed_index = 10

    reference, ref = _applied(tmp_path / "reference", node, 11)
    reference.reput.do_reput(limit=None)

    store = _open_file_store(tmp_path / "s")
    applier = Applier(store, node)
    report = applier.resume()
    assert report.hint_index == -1  # the hint names an entry the log lost: walked from 0
    assert report.cut_from == ref.applied_offset == applier.applied_offset
    assert applier.applied_index == max(i for i in range(11) if node.log.get(i).body)
    segments = len(store.commit_log.queue.files)
    await truncate_dirty_files(store, report.cut_from)
    # the segments past the cut are gone from the disk too (unlinked off the loop)
    names = [sorted(os.listdir(s.config.commit_log_dir)) for s in (store, reference)]
    assert names[0] == names[1] and len(names[0]) < segments, (names, segments)
    want = [reference.get_max_offset_in_queue("T", qid) for qid in range(3)]
    for reopen in (False, True):
        if reopen:
            store.close_files(clean=False)
            store = _open_file_store(tmp_path / "s")
        assert commit_log_bytes(store) == commit_log_bytes(reference)
        assert [store.get_max_offset_in_queue("T", qid) for qid in range(3)] == want
    store.close_files()
    reference.close_files()


async def test_entries_applied_before_a_restart_that_a_new_leader_replaced_are_cut(
    tmp_path, new_node, mk, commit_log_bytes
):
    """After a whole-group power cut a new leader can be elected without the member that
    applied the last entries: its log replaces them.  Until a leader confirmed them, the
    applier watches them and cuts the classic store back to the last one the log still holds,
    then applies the leader's entries: the member ends with the leader's log in its store."""
    node = new_node(role=Role.FOLLOWER)
    _entries_for(node, mk, random.Random(6), 24)
    store, applier = _applied(tmp_path / "s", node, 16)
    applier.write_hint()
    _apply(applier, node, 16, 24)
    store.reput.do_reput(limit=None)
    store.close_files(clean=False)
    store = _open_file_store(tmp_path / "s")
    node.committed_index = -1  # a restarted member learns it again from a leader
    applier = Applier(store, node)
    assert applier.resume().applied_index == max(i for i in range(24) if node.log.get(i).body)

    # the new leader (term 2) never had entries 18..; its no-op replaces them (real clock: the
    # cut writes the checkpoint in a thread, which an autojump clock would not wait for)
    node.log.truncate(18)
    node.term = 2
    node.log.append(2, b"")
    reference, ref = _applied(tmp_path / "reference", node, node.log.end_index + 1)
    reference.reput.do_reput(limit=None)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(applier.run)
        node.commit(node.log.end_index)
        with trio.fail_after(10):
            while applier.applied_index != node.log.end_index:  # noqa: ASYNC110
                await trio.sleep(0.1)
            await applier.wait_applied(node.log.end_index)
        nursery.cancel_scope.cancel()
    store.reput.do_reput(limit=None)
    assert commit_log_bytes(store) == commit_log_bytes(reference)
    for qid in range(3):
        assert store.get_max_offset_in_queue("T", qid) == reference.get_max_offset_in_queue(
            "T", qid
        )
    store.close_files()
    reference.close_files()


async def test_records_of_entries_the_log_holds_others_of_are_cut(tmp_path, new_node, mk):
    """After a second power cut the classic store can hold the record of a new leader's entry
    whose replacement the log lost (the log went back to the old entry there): past a hint of
    the right term, the first record that is not its entry's is where the store is cut."""
    node = new_node()
    _entries_for(node, mk, random.Random(8), 20)
    store, applier = _applied(tmp_path / "s", node, 8)
    applier.write_hint()
    _apply(applier, node, 8, 20)
    store.close_files(clean=False)
    other = new_node()
    _entries_for(other, mk, random.Random(9), 20)
    node.log.truncate(14)
    for i in range(14, 20):
        node.log.append(2, other.log.get(i).body or b"x")
    store = _open_file_store(tmp_path / "s")
    report = Applier(store, node).resume()
    assert report.cut_from is not None and report.hint_index == 7
    assert report.applied_index == max(i for i in range(14) if node.log.get(i).body)
    await truncate_dirty_files(store, report.cut_from)
    assert store.get_max_phy_offset() == report.cut_from
    store.close_files()


def test_resume_refuses_a_store_that_is_not_the_log(tmp_path, new_node, mk):
    node = new_node()
    _entries_for(node, mk, random.Random(2), 10)
    store, applier = _applied(tmp_path / "s", node, 10)
    store.close_files()
    other = new_node()
    _entries_for(other, mk, random.Random(3), 10)
    store = _open_file_store(tmp_path / "s")
    with pytest.raises(ApplyError, match="is not the record of DLedger entry"):
        Applier(store, other).resume()
    store.close_files()


async def test_restart_resumes_through_run_dledger_store(tmp_path, autojump_clock, new_node, mk):
    """The hint written at shutdown puts a restarted store (in-memory classic: empty again)
    back at the start, and the apply brings it to the same state."""
    node = new_node()
    cfg = MessageStoreConfig(store_path_root_dir=str(tmp_path / "s"))
    for round_ in range(2):
        async with trio.open_nursery() as nursery:
            classic = await nursery.start(run_memory_store, cfg)
            store: DLedgerMessageStore = await nursery.start(run_dledger_store, classic, node)
            await store.applier.wait_applied(node.committed_index)
            assert store.get_max_offset_in_queue("T", 0) == round_ * 3
            store.become_master(node.term)
            store.broker_role = "SYNC_MASTER"
            for _ in range(3):
                assert (await store.put_message(mk())).ok
            nursery.cancel_scope.cancel()
        assert (tmp_path / "s" / "dledger_applied").exists()


async def test_the_leader_dispatches_its_own_puts_as_a_parse_would(
    open_dledger, tmp_path, autojump_clock, new_node, mk, commit_log_bytes
):
    """A leader on a file store dispatches the records it proposed from their messages (no
    re-parse); a member that parses the same entries ends with the same queues and index."""
    node = new_node()
    rng = random.Random(3)
    async with open_dledger(node, file=True, mapped_file_size_commit_log=2048) as store:
        assert isinstance(store.classic, PutDispatchingStore)
        for i in range(60):
            props = {"KEYS": f"k{i} shared", "TAGS": f"t{i % 4}"}
            if i % 6 == 0:  # (one message per put: a batch cannot be delayed)
                props["DELAY"] = "2"
            msgs = [
                mk(qid=(i + j) % 3, body=rng.randbytes(rng.randrange(1, 200)), **props)
                for j in range(1 + i % 3)
            ]
            r = await (store.put_messages(msgs) if len(msgs) > 1 else store.put_message(msgs[0]))
            assert r.ok, r
        assert not store.applier.hints  # every hint was taken by its entry
        leader = store.classic
        assert isinstance(leader, DefaultMessageStore)
        await leader.wait_dispatched()
        parsed = _open_file_store(tmp_path / "parsed", 2048)
        try:
            applier = Applier(parsed, node)
            for index in range(node.log.end_index + 1):
                applier.apply_entry(node.log.get(index))
            parsed.reput.do_reput(limit=None)
            assert commit_log_bytes(parsed) == commit_log_bytes(leader)
            assert set(parsed.consume_queues) == set(leader.consume_queues)
            for key, cq in leader.consume_queues.items():
                other = parsed.consume_queues[key]
                assert (cq.min_offset, cq.max_offset) == (other.min_offset, other.max_offset)
                units = [cq.unit(o) for o in range(cq.min_offset, cq.max_offset)]
                assert units == [other.unit(o) for o in range(cq.min_offset, cq.max_offset)]
            for keys in ("k5", "k33", "shared"):
                mine = leader.query_message("T", keys, 100, 0, 1 << 62)
                theirs = parsed.query_message("T", keys, 100, 0, 1 << 62)
                mine_b = [bytes(b) for b in mine.buffers]
                assert mine_b == [bytes(b) for b in theirs.buffers] and mine_b
        finally:
            parsed.close_files()


@pytest.mark.parametrize("seed", range(4))
def test_a_full_disk_stalls_the_apply_and_it_resumes_exactly(
    tmp_path, seed, new_node, mk, commit_log_bytes
):
    """The classic store refuses records for lack of space: the applier goes back before them
    (ApplyStalled), and applying again once there is room gives the CommitLog of a store that
    never ran out."""
    from broker.dledger.broker.applier import ApplyStalled
    from tests.support.tmpfs import small_tmpfs

    rng = random.Random(seed)
    node = new_node()
    _entries_for(node, mk, rng, 200)
    reference = _open_file_store(tmp_path / "reference", file_size=4096)
    _apply(Applier(reference, node), node, 0, node.log.end_index + 1)
    expected = commit_log_bytes(reference)
    reference.close_files()

    with small_tmpfs(tmp_path / "disk", 1) as disk:
        ballast = disk / "ballast"
        ballast.write_bytes(b"\1" * ((1 << 20) - 4096 * 6))
        store = _open_file_store(disk / "store", file_size=4096)
        applier = Applier(store, node)
        stalled = False
        while applier.applied_index < node.log.end_index:
            first = applier.applied_index + 1
            try:
                applier.apply_entries(
                    [node.log.get(i) for i in range(first, min(first + 7, node.log.end_index + 1))]
                )
            except ApplyStalled:
                stalled = True
                assert applier.applied_offset == store.get_max_phy_offset()
                ballast.unlink()  # space comes back
                store.flags.disk_full = False  # (the disk check would clear it)
        assert stalled, "the disk never filled: the test proves nothing"
        got = commit_log_bytes(store)
        store.close_files()
    assert got == expected


def test_a_hint_the_full_disk_refuses_is_logged_once_and_written_once_there_is_room(
    tmp_path, new_node, mk, caplog
):
    """The periodic hint write on a full disk is not a crash: the hint on disk stays an earlier
    point (a restart resumes from it as well) until the write gets through."""
    from tests.support.tmpfs import small_tmpfs

    node = new_node()
    _entries_for(node, mk, random.Random(1), 20)
    with small_tmpfs(tmp_path / "disk", 1) as disk:
        store = _open_file_store(disk / "store", file_size=4096)
        applier = Applier(store, node)
        _apply(applier, node, 0, 10)
        applier._write_hint_or_log()
        assert read_hint(applier.hint_path) is not None
        _apply(applier, node, 10, node.log.end_index + 1)
        ballast = disk / "ballast"
        fd = os.open(ballast, os.O_WRONLY | os.O_CREAT, 0o644)
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\1" * 4096)
        os.close(fd)
        for _ in range(3):
            applier._write_hint_or_log()
        assert caplog.text.count("could not write the apply hint") == 1
        hint = read_hint(applier.hint_path)
        assert hint is not None and hint.entry < applier.applied_index
        ballast.unlink()
        applier._write_hint_or_log()
        hint = read_hint(applier.hint_path)
        assert hint is not None and hint.entry == applier.applied_index
        store.close_files()
