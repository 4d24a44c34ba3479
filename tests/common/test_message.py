"""Record codec, properties, hashes, msgIds and batch bodies (common/message.py)."""

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.batch_body import decode_batch_body, encode_batch_body
from common.message import (
    BLANK_MAGIC_CODE,
    MESSAGE_MAGIC_CODE,
    PHYSICAL_OFFSET_POSITION,
    QUEUE_OFFSET_POSITION,
    SYSFLAG_POSITION,
    MessageExt,
    MessageExtBrokerInner,
    MessageSysFlag,
    RecordDecodeError,
    _decode_record_checked,
    decode_record,
    decode_records,
    record_size,
    store_timestamp_position,
    tags_code,
)
from common.message_encoder import encode_record, encode_records
from common.message_id import create_offset_msg_id, decode_offset_msg_id
from common.message_properties import MessageConst, decode_properties, encode_properties
from common.string_hash import java_string_hash, java_string_hash_concat

# ----------------------------------------------------------------------------------- strategies

prop_text = st.text(
    alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=["Cs"]),
    min_size=1,
    max_size=12,
)
props_st = st.dictionaries(prop_text, prop_text, max_size=6)
ipv4 = st.ip_addresses(v=4).map(str)
ipv6 = st.ip_addresses(v=6).map(str)
hosts = st.tuples(st.one_of(ipv4, ipv6), st.integers(0, 65535))
topic_st = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABC%_-|0123456789", min_size=1, max_size=127)
i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)


@st.composite
def messages(draw):
    return MessageExtBrokerInner(
        topic=draw(topic_st),
        queue_id=draw(st.integers(0, 2**31 - 1)),
        flag=draw(i32),
        body=draw(st.binary(max_size=300)),
        properties=draw(props_st),
        sys_flag=draw(st.integers(0, 0xFFFF)),
        born_timestamp=draw(i64),
        born_host=draw(hosts),
        store_host=draw(hosts),
        reconsume_times=draw(i32),
        prepared_transaction_offset=draw(i64),
    )


def _check_same(msg, dec, qoff, poff, sts):
    assert dec.topic == msg.topic
    assert dec.queue_id == msg.queue_id
    assert dec.flag == msg.flag
    assert dec.body == msg.body
    assert dec.properties == msg.properties
    assert dec.born_timestamp == msg.born_timestamp
    assert dec.store_timestamp == sts
    assert dec.queue_offset == qoff
    assert dec.commit_log_offset == poff
    assert dec.reconsume_times == msg.reconsume_times
    assert dec.prepared_transaction_offset == msg.prepared_transaction_offset
    # hosts round-trip in canonical text form
    assert decode_offset_msg_id(create_offset_msg_id(msg.born_host, 0))[0] == dec.born_host
    assert decode_offset_msg_id(create_offset_msg_id(msg.store_host, 0))[0] == dec.store_host
    v6bits = MessageSysFlag.BORNHOST_V6 | MessageSysFlag.STOREHOSTADDRESS_V6
    assert dec.sys_flag & ~v6bits == msg.sys_flag & ~v6bits
    assert bool(dec.sys_flag & MessageSysFlag.BORNHOST_V6) == (":" in msg.born_host[0])
    assert bool(dec.sys_flag & MessageSysFlag.STOREHOSTADDRESS_V6) == (":" in msg.store_host[0])


# --------------------------------------------------------------------------------- record codec


@settings(max_examples=200)
@given(messages(), st.integers(0, 2**62), st.integers(0, 2**62), st.integers(0, 2**62))
def test_record_round_trip(msg, qoff, poff, sts):
    rec = encode_record(msg, qoff, poff, sts)
    dec = decode_record(rec, check_crc=True)
    assert dec.store_size == len(rec)
    assert dec.store_size == record_size(
        len(msg.body),
        len(msg.topic.encode()),
        len(encode_properties(msg.properties).encode()),
        dec.sys_flag,
    )
    _check_same(msg, dec, qoff, poff, sts)
    # fixed positions used by the store and HA code
    assert struct.unpack_from(">q", rec, QUEUE_OFFSET_POSITION)[0] == qoff
    assert struct.unpack_from(">q", rec, PHYSICAL_OFFSET_POSITION)[0] == poff
    assert struct.unpack_from(">i", rec, SYSFLAG_POSITION)[0] == dec.sys_flag
    assert struct.unpack_from(">q", rec, store_timestamp_position(dec.sys_flag))[0] == sts


@settings(max_examples=200)
@given(messages(), st.integers(0, 2**62), st.integers(0, 2**62), st.booleans())
def test_fast_decode_equals_checked_decode(msg, qoff, sts, in_view):
    rec = b"junk" + encode_record(msg, qoff, 77, sts)
    buf = memoryview(rec) if in_view else rec
    fast = decode_record(buf, 4, check_crc=True)
    slow = _decode_record_checked(buf, 4, True)
    assert fast == slow
    assert (fast.born_host, fast.store_host, fast.properties) == (
        slow.born_host,
        slow.store_host,
        slow.properties,
    )
    assert fast.msg_id == create_offset_msg_id(fast.store_host, 77)


def test_message_ext_lazy_fields_and_value_semantics():
    msg = MessageExtBrokerInner(
        "T",
        1,
        body=b"b",
        properties={"TAGS": "t", "KEYS": "k1 k2", "UNIQ_KEY": "U"},
        born_host=("10.0.0.1", 7),
        store_host=("127.0.0.1", 10911),
    )
    m = decode_record(encode_record(msg, 3, 1000, 5))
    assert type(m._properties) is str and type(m._born_host) is bytes  # not decoded yet
    assert m.tags == "t" and m.keys == "k1 k2" and m.uniq_key == "U"
    assert m.properties == {"TAGS": "t", "KEYS": "k1 k2", "UNIQ_KEY": "U"}
    assert m.properties is m.properties  # parsed once
    assert m.born_host == ("10.0.0.1", 7) and m.store_host == ("127.0.0.1", 10911)
    assert m.tags_code == tags_code("t")
    eager = MessageExt(
        store_size=m.store_size,
        body_crc=m.body_crc,
        queue_id=1,
        flag=0,
        queue_offset=3,
        commit_log_offset=1000,
        sys_flag=m.sys_flag,
        born_timestamp=0,
        born_host=("10.0.0.1", 7),
        store_timestamp=5,
        store_host=("127.0.0.1", 10911),
        reconsume_times=0,
        prepared_transaction_offset=0,
        body=b"b",
        topic="T",
        properties={"TAGS": "t", "KEYS": "k1 k2", "UNIQ_KEY": "U"},
    )
    assert eager == m and not (eager != m)
    assert decode_record(encode_record(msg, 4, 1000, 5)) != m
    assert m != "not a message"
    assert repr(m).startswith("MessageExt(store_size=") and "topic='T'" in repr(m)
    with pytest.raises(TypeError):
        hash(m)


@settings(max_examples=50)
@given(messages(), st.binary(min_size=1, max_size=50))
def test_record_with_trailing_bytes_and_at_offset(msg, junk):
    rec = encode_record(msg, 1, 2, 3)
    dec = decode_record(junk + rec + junk, len(junk))
    _check_same(msg, dec, 1, 2, 3)


@settings(max_examples=30)
@given(messages())
def test_every_truncation_raises(msg):
    rec = encode_record(msg, 7, 8, 9)
    for cut in range(len(rec)):
        with pytest.raises(RecordDecodeError):
            decode_record(rec[:cut])
        with pytest.raises(RecordDecodeError):
            decode_record(memoryview(rec)[:cut])
    for cut in range(1, len(rec)):
        with pytest.raises(RecordDecodeError):
            decode_records(rec + rec[:cut])


@settings(max_examples=30)
@given(st.lists(messages(), min_size=1, max_size=5))
def test_decode_records_concatenated(msgs):
    recs = [encode_record(m, i, 1000 * i, 5) for i, m in enumerate(msgs)]
    decs = decode_records(memoryview(b"".join(recs)))
    assert len(decs) == len(msgs)
    for i, (m, d) in enumerate(zip(msgs, decs, strict=True)):
        _check_same(m, d, i, 1000 * i, 5)


@given(st.lists(st.tuples(messages(), i64, st.booleans()), min_size=1, max_size=5), i64)
def test_encode_records_equals_encode_record(items, sts):
    msgs = []
    for msg, _, use_string in items:
        if use_string:
            msg.properties_string = encode_properties(msg.properties)
        msgs.append(msg)
    qoffs = [q for _, q, _ in items]
    buf, sizes = encode_records(msgs, qoffs, sts)
    want = [encode_record(m, q, 0, sts) for m, q in zip(msgs, qoffs, strict=True)]
    assert bytes(buf) == b"".join(want)
    assert sizes == [len(w) for w in want]


def test_encode_records_limits():
    with pytest.raises(ValueError):
        encode_records([MessageExtBrokerInner("T" * 128, 0)], [0], 0)
    with pytest.raises(ValueError):
        encode_records([MessageExtBrokerInner("T", 0, properties={"K": "v" * 40000})], [0], 0)
    assert encode_records([], [], 0) == (bytearray(), [])


def test_known_layout_ipv4():
    """Build the record by hand from the field table in common/message.py, compare byte for byte."""
    body = b"hello"
    props = "TAGS\x01TagA\x02KEYS\x01k1 k2"
    msg = MessageExtBrokerInner(
        topic="TopicTest",
        queue_id=3,
        flag=7,
        body=body,
        properties={"TAGS": "TagA", "KEYS": "k1 k2"},
        sys_flag=0,
        born_timestamp=1700000000000,
        born_host=("10.1.2.3", 50000),
        store_host=("127.0.0.1", 10911),
    )
    rec = encode_record(msg, 42, 4096, 1700000000123)
    expect = b"".join(
        [
            struct.pack(">i", 91 + len(body) + len("TopicTest") + len(props)),
            struct.pack(">i", -626843481),
            struct.pack(">i", zlib.crc32(body) & 0x7FFFFFFF),
            struct.pack(">iiqqiq", 3, 7, 42, 4096, 0, 1700000000000),
            bytes([10, 1, 2, 3]) + struct.pack(">i", 50000),
            struct.pack(">q", 1700000000123),
            bytes([127, 0, 0, 1]) + struct.pack(">i", 10911),
            struct.pack(">iqi", 0, 0, len(body)) + body,
            bytes([9]) + b"TopicTest",
            struct.pack(">h", len(props)) + props.encode(),
        ]
    )
    assert rec == expect
    d = decode_record(rec)
    assert d.tags == "TagA" and d.keys == "k1 k2"
    assert d.msg_id == "7F00000100002A9F0000000000001000"


def test_bad_magic_blank_and_crc():
    rec = bytearray(encode_record(MessageExtBrokerInner("T", 0, body=b"abc"), 0, 0, 0))
    with pytest.raises(RecordDecodeError, match="BLANK"):
        decode_record(struct.pack(">ii", 100, BLANK_MAGIC_CODE) + bytes(92))
    bad = bytearray(rec)
    struct.pack_into(">i", bad, 4, 12345)
    with pytest.raises(RecordDecodeError, match="magic"):
        decode_record(bad)
    body_at = len(rec) - 7  # tail: body "abc", topic length byte, "T", props length short
    bad = bytearray(rec)
    bad[body_at] ^= 0xFF
    decode_record(bad)  # CRC not checked by default
    with pytest.raises(RecordDecodeError, match="CRC"):
        decode_record(bad, check_crc=True)
    # a TOTALSIZE that disagrees with the field lengths
    bad = bytearray(rec) + b"\0"
    struct.pack_into(">i", bad, 0, len(rec) + 1)
    with pytest.raises(RecordDecodeError):
        decode_record(bad)
    bad = bytearray(rec)
    struct.pack_into(">i", bad, 0, 10)
    with pytest.raises(RecordDecodeError, match="impossible"):
        decode_record(bad)
    assert MESSAGE_MAGIC_CODE == struct.unpack(">i", bytes.fromhex("DAA320A7"))[0]
    assert BLANK_MAGIC_CODE == struct.unpack(">i", bytes.fromhex("CBD43194"))[0]


def test_random_garbage_never_returns_silently():
    # zeros are not a record
    with pytest.raises(RecordDecodeError):
        decode_record(bytes(200))


@given(st.binary(max_size=300))
def test_garbage_raises_or_is_consistent(data):
    try:
        d = decode_record(data)
    except RecordDecodeError:
        return
    assert d.store_size <= len(data)


def test_limits():
    with pytest.raises(ValueError, match="topic"):
        encode_record(MessageExtBrokerInner("T" * 128, 0), 0, 0, 0)
    with pytest.raises(ValueError, match="properties"):
        encode_record(MessageExtBrokerInner("T", 0, properties={"K": "v" * 40000}), 0, 0, 0)


def test_properties_string_override():
    msg = MessageExtBrokerInner("T", 0, properties={"WAIT": "true", "TAGS": "x"})
    msg.properties_string = encode_properties({"TAGS": "x"})
    d = decode_record(encode_record(msg, 0, 0, 0))
    assert d.properties == {"TAGS": "x"}


# ------------------------------------------------------------------------------------ properties


@given(props_st)
def test_properties_round_trip(props):
    s = encode_properties(props)
    assert not s.endswith("\x02")
    assert decode_properties(s) == props
    assert decode_properties(s + "\x02") == props


def _reference_decode_properties(s):
    # Java string2messageProperties, written out plainly
    out = {}
    for seg in s.split("\x02"):
        if len(seg) >= 3:
            i = seg.find("\x01")
            if 0 < i < len(seg) - 1:
                out[seg[:i]] = seg[i + 1 :]
    return out


@settings(max_examples=300)
@given(st.text(alphabet="\x01\x02abK", max_size=30))
def test_decode_properties_matches_java_rules(s):
    got = decode_properties(s)
    want = _reference_decode_properties(s)
    assert got == want and list(got) == list(want)


def test_properties_java_tolerance():
    assert decode_properties("") == {}
    assert decode_properties("a\x01b") == {"a": "b"}
    assert decode_properties("\x01b\x02ab\x02k\x01v\x02x\x01\x02\x01xx") == {"k": "v"}
    assert decode_properties("k\x01v\x01w") == {"k": "v\x01w"}
    assert encode_properties({"A": "1", "B": "2"}) == "A\x011\x02B\x012"
    assert encode_properties({"A": None, "B": "2"}) == "B\x012"
    with pytest.raises(ValueError):
        encode_properties({"A\x01": "1"})
    with pytest.raises(ValueError):
        encode_properties({"A": "1\x02"})


# ----------------------------------------------------------------------------------- hash / tags


def test_java_string_hash_known_values():
    assert java_string_hash("") == 0
    assert java_string_hash("hello world") == 1794106052
    assert java_string_hash("Aa") == java_string_hash("BB") == 2112
    assert java_string_hash("polygenelubricants") == -(2**31)
    assert java_string_hash("TagA") == 2598919
    # UTF-16 code units: a non-BMP char counts as two surrogates
    assert java_string_hash("\U0001f600") == 0xD83D * 31 + 0xDE00
    assert java_string_hash("é") == 0xE9


@given(st.text(max_size=40))
def test_java_string_hash_matches_reference(s):
    units = s.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(units), 2):
        h = (h * 31 + int.from_bytes(units[i : i + 2], "big")) % 2**32
    assert java_string_hash(s) == (h - 2**32 if h >= 2**31 else h)


def _reference_java_hash(s):
    units = s.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(units), 2):
        h = (h * 31 + int.from_bytes(units[i : i + 2], "big")) % 2**32
    return h - 2**32 if h >= 2**31 else h


@given(st.text(max_size=20), st.one_of(st.text(max_size=300), st.text("0123456789ABCDEF")))
def test_java_string_hash_concat_matches_reference(prefix, s):
    assert java_string_hash_concat(prefix, s) == _reference_java_hash(prefix + s)


def test_java_string_hash_concat_uniq_keys():
    for i in range(200):
        key = f"{i * 0x9E3779B97F4A7C15:032X}"[-32:]
        topic = f"Topic{i % 7}#"
        assert java_string_hash_concat(topic, key) == _reference_java_hash(topic + key)


def test_tags_code():
    assert tags_code(None) == 0
    assert tags_code("") == 0
    assert tags_code("TagA") == 2598919
    msg = MessageExtBrokerInner("T", 0, properties={MessageConst.TAGS: "polygenelubricants"})
    assert msg.tags_code == -(2**31)


# ------------------------------------------------------------------------------------- msg ids


@given(hosts, st.integers(0, 2**63 - 1))
def test_offset_msg_id_round_trip(host, off):
    mid = create_offset_msg_id(host, off)
    assert len(mid) == (56 if ":" in host[0] else 32)
    assert mid == mid.upper()
    (ip, port), o = decode_offset_msg_id(mid)
    assert port == host[1] and o == off
    assert create_offset_msg_id((ip, port), o) == mid


def test_offset_msg_id_known_and_bad():
    assert create_offset_msg_id(("192.168.0.1", 10911), 255) == "C0A8000100002A9F00000000000000FF"
    for bad in ("", "XYZ", "C0A800010000", "G" * 32):
        with pytest.raises(ValueError):
            decode_offset_msg_id(bad)


# ------------------------------------------------------------------------------------- batches

batch_st = st.lists(st.tuples(i32, st.binary(max_size=100), props_st), max_size=6)


@given(batch_st)
def test_batch_round_trip(msgs):
    body = encode_batch_body(msgs)
    assert decode_batch_body(body) == [(f, b, dict(p)) for f, b, p in msgs]
    assert decode_batch_body(memoryview(body)) == decode_batch_body(body)


def test_batch_known_layout():
    body = encode_batch_body([(5, b"ab", {"K": "v"})])
    assert (
        body
        == struct.pack(">iiiii", 20 + 2 + 2 + 3, 0, 0, 5, 2)
        + b"ab"
        + struct.pack(">h", 3)
        + b"K\x01v"
    )


@given(st.lists(st.tuples(i32, st.binary(max_size=40), props_st), min_size=1, max_size=4))
def test_batch_truncation_raises(msgs):
    body = encode_batch_body(msgs)
    for cut in range(1, len(body)):
        try:
            got = decode_batch_body(body[:cut])
        except RecordDecodeError:
            continue
        # a cut exactly at a message boundary is a valid shorter batch: it must be a prefix
        assert got == [(f, b, dict(p)) for f, b, p in msgs][: len(got)]
        assert encode_batch_body(got) == body[:cut]
