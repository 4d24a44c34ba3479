"""`rmq store verify` on hand-built master/slave stores."""

from __future__ import annotations

import json
import shutil
import struct

import pytest
from typer.testing import CliRunner

from cli.main import app
from common.message import BLANK_MAGIC_CODE, MessageExtBrokerInner
from common.message_encoder import encode_record

SEG = 2048


def write_log(root, n, *, torn_at=None):
    d = root / "commitlog"
    d.mkdir(parents=True)
    phys, segs, buf, base = 0, {}, bytearray(), 0
    for i in range(n):
        rec = encode_record(
            MessageExtBrokerInner(topic="T", queue_id=0, body=b"m%d" % i), i, phys, 1
        )
        if len(buf) + len(rec) + 8 > SEG:
            rem = SEG - len(buf)
            buf += (
                rem.to_bytes(4, "big")
                + BLANK_MAGIC_CODE.to_bytes(4, "big", signed=True)
                + bytes(rem - 8)
            )
            segs[base] = buf
            base += SEG
            phys = base
            buf = bytearray()
            rec = encode_record(
                MessageExtBrokerInner(topic="T", queue_id=0, body=b"m%d" % i), i, phys, 1
            )
        buf += rec
        phys += len(rec)
    segs[base] = buf + bytes(SEG - len(buf))
    for off, data in segs.items():
        (d / f"{off:020d}").write_bytes(bytes(data))
    return d


def run(*args):
    return CliRunner().invoke(app, ["store", "verify", *map(str, args)])


def test_slave_prefix_is_ok_and_json_says_who_is_ahead(tmp_path):
    write_log(tmp_path / "m", 60)
    write_log(tmp_path / "s", 45)
    r = run(tmp_path / "m", tmp_path / "s")
    assert r.exit_code == 0, r.output
    assert r.output.startswith("OK: slave is a byte-identical prefix of master (45 records")
    doc = json.loads(run(tmp_path / "m", tmp_path / "s", "--json").output)
    assert doc["ok"] and doc["ahead"] == "master" and doc["commonRecords"] == 45
    assert doc["master"]["records"] == 60


def test_identical_logs(tmp_path):
    write_log(tmp_path / "m", 30)
    shutil.copytree(tmp_path / "m", tmp_path / "s")
    r = run(tmp_path / "m", tmp_path / "s")
    assert r.exit_code == 0 and "0 bytes behind" in r.output


def test_a_flipped_byte_is_reported_at_its_offset(tmp_path):
    write_log(tmp_path / "m", 60)
    d = write_log(tmp_path / "s", 60)
    seg = d / f"{SEG:020d}"
    data = bytearray(seg.read_bytes())
    size = int.from_bytes(data[0:4], "big")
    data[size + 88] ^= 0x01  # the body of the segment's second record
    seg.write_bytes(bytes(data))
    r = run(tmp_path / "m", tmp_path / "s")
    assert r.exit_code == 2
    assert r.output.strip() == (
        f"DIFFERENT at offset {SEG + size + 88}: bytes differ inside the record at {SEG + size}"
    )
    data[size + 88] ^= 0x01
    data[size + 4] ^= 0x01  # its magic: the slave's log is torn in the middle
    seg.write_bytes(bytes(data))
    r = run(tmp_path / "m", tmp_path / "s")
    assert r.exit_code == 2
    assert r.output.startswith(f"DIFFERENT at offset {SEG + size}: slave's log is torn there")


def test_slave_ahead_fails(tmp_path):
    write_log(tmp_path / "m", 20)
    write_log(tmp_path / "s", 25)
    r = run(tmp_path / "m", tmp_path / "s")
    assert r.exit_code == 2 and r.output.startswith("slave is AHEAD of master")


def test_not_a_store(tmp_path):
    write_log(tmp_path / "m", 1)
    r = run(tmp_path / "m", tmp_path / "missing")
    assert r.exit_code == 1 and "is not a store directory" in r.output


# ------------------------------------------------------------------ RocketMQ's DLedger layout
pytestmark = pytest.mark.timeout(120)

# Stores built byte by byte as Apache RocketMQ 4.9 writes them (tests/broker/dledger/
# apache_store_fixture.py); `rmq store verify` tells the layout from the files.

DL_FILE = 8 * 1024
DL_QUEUES = [("TopicA", 0), ("TopicA", 1), ("TopicB", 0)]


def dledger_store(root, n, *, classic=0, tail=0, body=None):
    from tests.broker.dledger.apache_store_fixture import ApacheDLedgerStore

    store = ApacheDLedgerStore(root, file_size=DL_FILE)
    for i in range(classic + n):
        topic, qid = DL_QUEUES[i % len(DL_QUEUES)]
        data = (body or {}).get(i, bytes([i % 251]) * (60 + (i * 37) % 700))
        send = store.send_classic if i < classic else store.send
        send(topic, qid, data, tags=f"t{i % 2}")
    for _ in range(tail):
        store.send("TopicA", 0, b"uncommitted", commit=False)
    store.close()
    return store


def test_a_clean_apache_dledger_store_verifies_clean_alone_and_in_json(tmp_path):
    dledger_store(tmp_path / "a", 50, tail=2)
    r = run(tmp_path / "a")
    assert r.exit_code == 0, r.output
    assert r.output.startswith(f"OK: {tmp_path / 'a'} (DLedger member n0): 52 entries (52 records")
    assert "committed up to index 49" in r.output and "50 queue units checked" in r.output
    doc = json.loads(run(tmp_path / "a", "--json").output)
    assert doc["ok"] and doc["layout"] == "dledger" and doc["problems"] == []
    assert doc["entries"] == 52 and doc["committed_index"] == 49 and doc["queue_units"] == 50
    # the member's own directory names the same store
    r = run(tmp_path / "a" / "dledger-n0")
    assert r.exit_code == 0 and "52 entries" in r.output


def test_a_classic_store_switched_to_dledger_verifies_both_sides(tmp_path):
    store = dledger_store(tmp_path / "a", 30, classic=25)
    # this broker's classic copy of the records, at or above the division: never read
    (tmp_path / "a" / "commitlog" / f"{store.divided_commitlog_offset:020d}").write_bytes(
        b"\xff" * DL_FILE
    )
    r = run(tmp_path / "a")
    assert r.exit_code == 0, r.output
    assert "25 classic records below dividedCommitlogOffset" in r.output
    assert "55 queue units checked" in r.output


def _entry_pos(store, i):
    return store.sent[i].offset - 48


def _patch(store, offset, data):
    from tests.broker.dledger.apache_store_fixture import data_files

    start = offset - offset % DL_FILE
    assert f"{start:020d}" in data_files(store.dledger_data_dir)
    with open(store.dledger_data_dir / f"{start:020d}", "r+b") as f:
        f.seek(offset - start)
        f.write(data)


def test_a_torn_entry_is_named(tmp_path):
    store = dledger_store(tmp_path / "a", 30)
    s = store.sent[17]
    _patch(store, s.offset + s.size - 40, bytes(40))  # the end of its record never written
    r = run(tmp_path / "a")
    assert r.exit_code == 2
    assert r.output.startswith(f"DAMAGED: {tmp_path / 'a'}: ")
    assert f"  entry 17 at pos {_entry_pos(store, 17)}: " in r.output


def test_a_wrong_physicaloffset_is_named(tmp_path):
    store = dledger_store(tmp_path / "a", 30)
    s = store.sent[9]
    _patch(store, s.offset + 28, struct.pack(">q", s.offset + 8))
    r = run(tmp_path / "a")
    assert r.exit_code == 2
    assert (
        f"  entry 9 at pos {s.offset - 48}: PHYSICALOFFSET {s.offset + 8}, not its offset "
        f"{s.offset} (entry pos + 48)" in r.output.splitlines()
    )


def test_a_flipped_body_byte_fails_its_crc(tmp_path):
    store = dledger_store(tmp_path / "a", 30)
    s = store.sent[4]
    _patch(store, s.offset + 88, bytes([s.body[0] ^ 0x40]))  # the body's first byte
    r = run(tmp_path / "a")
    assert r.exit_code == 2
    assert f"entry 4 at pos {s.offset - 48}: BODYCRC" in r.output


def _patch_unit(root, topic, qid, qoff, offset, size):
    path = root / "consumequeue" / topic / str(qid) / f"{0:020d}"
    with open(path, "r+b") as f:
        f.seek(qoff * 20)
        f.write(struct.pack(">qi", offset, size))


def test_consume_queue_units_pointing_nowhere_or_elsewhere_are_named(tmp_path):
    store = dledger_store(tmp_path / "a", 30)
    a0 = [s for s in store.sent if (s.topic, s.queue_id) == ("TopicA", 0)]
    b0 = [s for s in store.sent if (s.topic, s.queue_id) == ("TopicB", 0)]
    _patch_unit(tmp_path / "a", "TopicA", 0, 2, a0[2].offset + 5, a0[2].size)  # nowhere
    _patch_unit(tmp_path / "a", "TopicA", 0, 3, b0[1].offset, b0[1].size)  # another queue's
    r = run(tmp_path / "a")
    assert r.exit_code == 2
    lines = r.output.splitlines()
    assert lines[0] == f"DAMAGED: {tmp_path / 'a'}: 2 problem(s)"
    assert lines[1].startswith(
        f"  consumequeue TopicA/0 unit at queue offset 2 (offset {a0[2].offset + 5}, "
        f"{a0[2].size} bytes): points at no record"
    )
    assert lines[2] == (
        f"  consumequeue TopicA/0 unit at queue offset 3 (offset {b0[1].offset}, {b0[1].size} "
        f"bytes): the record there is TopicB/0 at queue offset 1, {b0[1].size} bytes"
    )


def test_an_index_unit_that_disagrees_with_its_entry_is_named(tmp_path):
    dledger_store(tmp_path / "a", 10)
    with open(tmp_path / "a" / "dledger-n0" / "index" / f"{0:020d}", "r+b") as f:
        f.seek(3 * 32 + 4)
        f.write(struct.pack(">q", 12345))
    r = run(tmp_path / "a")
    assert r.exit_code == 2 and "  DLedger log: index unit of entry 3 is " in r.output


def test_two_dledger_members_compared(tmp_path):
    dledger_store(tmp_path / "m", 40)
    dledger_store(tmp_path / "s", 33)
    r = run(tmp_path / "m", tmp_path / "s")
    assert r.exit_code == 0, r.output
    assert "(33 entries compared, slave 7 entries behind)" in r.output
    r = run(tmp_path / "s", tmp_path / "m")
    assert r.exit_code == 2
    assert r.output.startswith(
        "slave is AHEAD of master: slave ends at entry 39, master at entry 32"
    )
    # a different message at the same place: each store consistent, the two not the same
    other = bytes([21 % 251]) * (60 + (21 * 37) % 700)
    dledger_store(tmp_path / "d", 40, body={21: bytes([7]) + other[1:]})
    r = run(tmp_path / "m", tmp_path / "d")
    assert r.exit_code == 2
    assert r.output.startswith("DIFFERENT at entry 21 (offset ")
    doc = json.loads(run(tmp_path / "m", tmp_path / "d", "--json").output)
    assert not doc["ok"] and doc["comparedEntries"] == 21


def test_our_own_log_with_no_ops_verifies(tmp_path):
    """The broker's Raft log (FileLog, the append hook on) is checked by the same rules."""
    from broker.dledger.driver import entry_coder as ec
    from broker.dledger.driver.mmap_file_store import open_file_log
    from broker.dledger.driver.state_files import Checkpoint, save_checkpoint

    member = tmp_path / "ours" / "dledger-n1"
    flog = open_file_log(
        str(member), data_file_size=DL_FILE, index_file_size=32 * 64, patch_physical_offset=True
    )
    flog.append(1, ec.NOOP_RECORD)
    for i in range(20):
        msg = MessageExtBrokerInner(topic="T", queue_id=0, body=bytes([i]) * (100 + 31 * i))
        flog.append(1 + i // 10, encode_record(msg, i, 0, 1_700_000_000_000 + i))
        if i == 9:
            flog.append(2, ec.NOOP_RECORD)
    flog.close()
    save_checkpoint(str(member), Checkpoint(end_index=21, committed_index=21))
    r = run(tmp_path / "ours")
    assert r.exit_code == 0, r.output
    assert "22 entries (20 records, 2 no-ops, committed up to index 21)" in r.output


def test_a_classic_store_alone_and_a_mixed_pair_are_errors(tmp_path):
    write_log(tmp_path / "c", 3)
    dledger_store(tmp_path / "a", 3)
    r = run(tmp_path / "c")
    assert r.exit_code == 1 and "give SLAVE_STORE" in r.output
    for args in ((tmp_path / "a", tmp_path / "c"), (tmp_path / "c", tmp_path / "a")):
        r = run(*args)
        assert r.exit_code == 1 and "is not a DLedger store, the other one is" in r.output


def test_units_of_deleted_files_are_expired_and_offset_zero_is_no_record(tmp_path):
    store = dledger_store(tmp_path / "a", 20, classic=30)
    first = sorted((tmp_path / "a" / "commitlog").iterdir())[0]
    gone = [s for s in store.sent if s.offset < DL_FILE]
    assert first.name == f"{0:020d}" and gone
    first.unlink()  # retention deleted the head of the classic CommitLog
    r = run(tmp_path / "a")
    assert r.exit_code == 0, r.output
    assert f", {len(gone)} expired queue units" in r.output
    # in a store whose DLedger data start at 0, offset 0 is an entry's header, not a record
    store = dledger_store(tmp_path / "b", 10)
    _patch_unit(tmp_path / "b", "TopicA", 0, 1, 0, store.sent[0].size)
    r = run(tmp_path / "b")
    assert r.exit_code == 2
    assert "  consumequeue TopicA/0 unit at queue offset 1 (offset 0, " in r.output
    assert "points at no record" in r.output


def test_a_garbled_checkpoint_is_named(tmp_path):
    dledger_store(tmp_path / "a", 5)
    (tmp_path / "a" / "dledger-n0" / "checkpoint").write_text("committedIndex=four\n")
    r = run(tmp_path / "a")
    assert r.exit_code == 2
    assert "  DLedger state file: " in r.output and "committedIndex='four'" in r.output
