"""DLedger's entry, blank and index-unit bytes (broker/dledger/driver/entry_coder.py).

The expected bytes are written out field by field, in the order ``DLedgerEntryCoder.encode`` /
``encodeIndex`` put them (openmessaging/dledger 0.3.1.2) and the offsets RocketMQ's
``DLedgerCommitLog`` append hook writes at (apache/rocketmq 4.9), not with the codec's own
struct formats: a field swapped in the codec fails here."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.dledger.driver import entry_coder as ec
from broker.dledger.driver.mmap_file_store import open_file_log
from broker.store.dispatch import takes_index_entries, takes_queue_unit
from common.message import BLANK_MAGIC_CODE as COMMITLOG_BLANK
from common.message import (
    MESSAGE_MAGIC_CODE,
    MessageExtBrokerInner,
    MessageSysFlag,
    decode_record,
)
from common.message_encoder import encode_record
from common.message_id import create_offset_msg_id

pytestmark = pytest.mark.timeout(60)


def h(text: str) -> bytes:
    return bytes.fromhex(text.replace(" ", ""))


# index 5, term 3, pos 1000, body "abc"
ENTRY_5 = h(
    "00000001"  # magic: MAGIC_1
    "00000033"  # size: 48 + 3
    "0000000000000005"  # index
    "0000000000000003"  # term
    "00000000000003e8"  # pos 1000
    "00000000"  # channel
    "00000000"  # chainCrc
    "00000000"  # bodyCrc
    "00000003"  # body length
    "616263"  # body
)
UNIT_5 = h(
    "00000001"  # magic
    "00000000000003e8"  # pos
    "00000033"  # size
    "0000000000000005"  # index
    "0000000000000003"  # term
)


def test_entry_bytes_field_by_field() -> None:
    assert ec.encode_entry(5, 3, 1000, b"abc") == ENTRY_5
    header, body = ec.decode_entry(ENTRY_5, at=1000)
    assert header == ec.EntryHeader(1, 51, 5, 3, 1000, 0, 0, 0, 3) and body == b"abc"
    assert (ec.POS_OFFSET, ec.HEADER_SIZE, ec.BODY_OFFSET) == (24, 44, 48)
    assert ENTRY_5[ec.POS_OFFSET : ec.POS_OFFSET + 8] == h("00000000000003e8")


def test_channel_and_crcs_are_kept_where_java_puts_them() -> None:
    raw = ec.encode_entry(0, 1, 0, b"x", channel=7, chain_crc=-2, body_crc=0x01020304)
    assert raw[32:44] == h("00000007 fffffffe 01020304")
    header = ec.decode_entry_header(raw)
    assert (header.channel, header.chain_crc, header.body_crc) == (7, -2, 0x01020304)


def test_index_unit_bytes_field_by_field() -> None:
    assert ec.encode_index_unit(1, 1000, 51, 5, 3) == UNIT_5
    assert ec.decode_index_unit(b"\0" * 32 + UNIT_5, 32) == ec.IndexUnit(1, 1000, 51, 5, 3)
    assert ec.INDEX_UNIT_SIZE == 32


def test_blank_is_minus_one_remaining_then_zeros() -> None:
    assert ec.encode_blank(20) == h("ffffffff 00000014") + bytes(12)
    assert ec.encode_blank(8) == h("ffffffff 00000008")
    with pytest.raises(ValueError):
        ec.encode_blank(7)


def test_what_dledger_recovery_refuses() -> None:
    header = ec.decode_entry_header(ENTRY_5)
    assert ec.entry_problem(header, at=1000) is None
    assert "pos" in str(ec.entry_problem(header, at=1048))
    # DLedger 0.4's NOOP magic: 0.3.1.2 (RocketMQ 4.9) ends its log at such an entry
    noop = ec.encode_entry(6, 3, 1051, b"", magic=ec.NOOP_MAGIC_0_4)
    assert "magic" in str(ec.entry_problem(ec.decode_entry_header(noop)))
    bad_size = bytearray(ENTRY_5)
    bad_size[4:8] = h("00000034")
    with pytest.raises(ec.EntryFormatError, match="size"):
        ec.decode_entry(bad_size)
    with pytest.raises(ec.EntryFormatError, match="past the buffer"):
        ec.decode_entry(ENTRY_5[:-1])
    with pytest.raises(ec.EntryFormatError):
        ec.decode_entry_header(ENTRY_5[:47])


def message(body: bytes = b"hello") -> MessageExtBrokerInner:
    return MessageExtBrokerInner(
        topic="T",
        queue_id=2,
        body=body,
        properties={"TAGS": "a"},
        born_timestamp=1_700_000_000_000,
        born_host=("10.0.0.1", 5555),
        store_host=("10.0.0.2", 10911),
    )


def test_the_append_hook_writes_pos_plus_48_at_record_byte_28() -> None:
    """DLedgerCommitLog's hook: ``buffer.position(bodyOffset + PHY_POS_POSITION);
    buffer.putLong(entry.getPos() + bodyOffset)`` on the encoded entry."""
    record = encode_record(message(), 7, 0, 1_700_000_000_123)
    raw = bytearray(ec.encode_entry(4, 2, 4096, record))
    assert ec.patch_physical_offset(raw) == 4144
    assert raw[48 + 28 : 48 + 36] == h("0000000000001030")  # 4096 + 48
    assert raw[:76] == ec.encode_entry(4, 2, 4096, record)[:76]
    assert raw[84:] == record[36:]
    msg = decode_record(raw, 48)
    assert msg.commit_log_offset == 4144 == ec.record_physical_offset(raw)
    assert msg.msg_id == create_offset_msg_id(("10.0.0.2", 10911), 4144)
    assert msg.queue_offset == 7 and msg.body == b"hello"
    with pytest.raises(ec.EntryFormatError):
        ec.patch_physical_offset(bytearray(ec.encode_entry(0, 1, 0, b"short")))


def test_classify_in_dledger_commitlog_order() -> None:
    record = encode_record(message(), 0, 0, 1)
    assert ec.classify(record) is ec.Kind.RECORD
    assert ec.classify(h("00000100 cbd43194")) is ec.Kind.RECORD_BLANK
    assert ec.classify(ec.encode_blank(64)) is ec.Kind.DLEDGER_BLANK
    assert ec.classify(ENTRY_5) is ec.Kind.ENTRY
    assert ec.classify(bytes(16)) is ec.Kind.END
    assert ec.classify(ENTRY_5, len(ENTRY_5) - 4) is ec.Kind.END


@settings(max_examples=200, deadline=None)
@given(
    index=st.integers(0, 2**63 - 1),
    term=st.integers(0, 2**63 - 1),
    pos=st.integers(0, 2**63 - 1),
    body=st.binary(max_size=300),
)
def test_round_trip(index: int, term: int, pos: int, body: bytes) -> None:
    raw = ec.encode_entry(index, term, pos, body)
    assert len(raw) == 48 + len(body)
    if body:
        header, got = ec.decode_entry(raw, at=pos)
        assert (header.entry_index, header.term, header.pos, got) == (index, term, pos, body)
    unit = ec.encode_index_unit(1, pos, len(raw), index, term)
    assert ec.decode_index_unit(unit) == (1, pos, len(raw), index, term)


def test_our_file_log_decodes_with_the_same_decoder(tmp_path: Path) -> None:
    """Our own FileLog's files, read back with the codec alone: every entry where its index
    unit says, with pos == where it was read, blanks at file ends, zeros after the end."""
    size = 1024
    flog = open_file_log(str(tmp_path), data_file_size=size, index_file_size=32 * 16)
    bodies = [bytes([i]) * (100 + 37 * i) for i in range(9)]
    for i, body in enumerate(bodies):
        flog.append(1 + i // 4, body)
    flog.close()
    files = sorted((tmp_path / "data").iterdir())
    index = b"".join(p.read_bytes() for p in sorted((tmp_path / "index").iterdir()))
    seen = []
    for path in files:
        data = path.read_bytes()
        base = int(path.name)
        at = 0
        while True:
            kind = ec.classify(data, at)
            if kind is not ec.Kind.ENTRY:
                break
            header, body = ec.decode_entry(data, at, at=base + at)
            unit = ec.decode_index_unit(index, header.entry_index * 32)
            assert unit == (1, base + at, header.size, header.entry_index, header.term)
            seen.append((header.entry_index, header.term, body))
            at += header.size
        if kind is ec.Kind.DLEDGER_BLANK:
            assert data[at:] == ec.encode_blank(size - at)
        else:
            assert kind is ec.Kind.END and data[at:] == bytes(size - at)
    assert seen == [(i, 1 + i // 4, b) for i, b in enumerate(bodies)]
    assert ec.decode_index_unit(index, len(bodies) * 32).magic == 0


# --- the no-op entry a Java member can read -------------------------------------------------


def java_reput(data: bytes) -> list[tuple[str, int]]:
    """What a RocketMQ 4.9 member's reput dispatches from one read of its DLedger data (from
    the first entry to the committed position): ``ReputMessageService.doReput`` around
    ``DLedgerCommitLog.checkMessageAndReturnSize`` around ``CommitLog.checkMessageAndReturnSize``,
    reduced to the branches these bytes reach.  Returns the (topic, queue offset) of each
    ConsumeQueue unit written."""
    out: list[tuple[str, int]] = []
    at = 0
    while at < len(data):
        try:
            magic, size_or_old = struct.unpack_from(">ii", data, at)
            if magic == -1:  # MmapFileList.BLANK_MAGIC_CODE: roll to the next file
                break
            total, code = struct.unpack_from(">ii", data, at + 48)
        except struct.error:  # the Java code's BufferUnderflowException: DispatchRequest(-1)
            break  # size -1: doNext = false, the rest of this read is skipped
        if code == COMMITLOG_BLANK:
            raise AssertionError("would dispatch DispatchRequest(0, true): topic '' queue 0")
        if code != MESSAGE_MAGIC_CODE:
            break  # "found a illegal magic code": size -1, the rest of this read skipped
        msg = decode_record(data, at + 48)
        if msg.sys_flag & MessageSysFlag.TRANSACTION_MASK in (0, MessageSysFlag.TRANSACTION_COMMIT):
            out.append((msg.topic, msg.queue_offset))  # CommitLogDispatcherBuildConsumeQueue
        at += total + 48  # bufferSize = msgSize + BODY_OFFSET
    return out


def entries_of(bodies: list[bytes]) -> bytes:
    out = bytearray()
    for i, b in enumerate(bodies):
        raw = bytearray(ec.encode_entry(i, 1, len(out), b))
        if len(b) >= 36:
            ec.patch_physical_offset(raw)
        out += raw
    return bytes(out)


def test_a_java_member_skips_messages_after_an_empty_no_op_but_not_after_ours() -> None:
    a, b, c = (encode_record(message(bytes([i]) * 20), i, 0, 5) for i in range(3))
    assert java_reput(entries_of([a, b, c])) == [("T", 0), ("T", 1), ("T", 2)]
    # the empty no-op: b and c never reach a ConsumeQueue on a 4.9 member
    assert java_reput(entries_of([a, b"", b, c])) == [("T", 0)]
    # ours: a record every dispatcher skips
    assert java_reput(entries_of([a, ec.NOOP_RECORD, b, c])) == [("T", 0), ("T", 1), ("T", 2)]


def test_the_no_op_record() -> None:
    msg = decode_record(ec.NOOP_RECORD)
    assert (msg.topic, msg.queue_id, msg.body) == (ec.NOOP_TOPIC, 0, b"")
    assert msg.sys_flag & MessageSysFlag.TRANSACTION_MASK == MessageSysFlag.TRANSACTION_ROLLBACK
    assert not takes_queue_unit(msg.sys_flag) and not takes_index_entries(msg.sys_flag)
    patched = bytearray(ec.encode_entry(3, 2, 640, ec.NOOP_RECORD))
    ec.patch_physical_offset(patched)
    assert ec.is_noop_body(bytes(patched[48:])) and ec.is_noop_body(b"")
    assert decode_record(patched, 48).commit_log_offset == 688
    assert not ec.is_noop_body(encode_record(message(b""), 0, 0, 0))
    # DLedger's own recovery takes it: magic 1, a body
    assert ec.entry_problem(ec.decode_entry_header(patched), at=640) is None
