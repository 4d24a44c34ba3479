"""The vectorized decoder agrees with common.message.decode_record on every field."""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.message import (
    BLANK_MAGIC_CODE,
    MessageExtBrokerInner,
    MessageSysFlag,
    RecordDecodeError,
    decode_record,
)
from common.message_encoder import encode_record
from common.message_id import create_offset_msg_id
from common.message_properties import decode_properties
from pipeline import numpy_decoder, properties_map, record_batch
from pipeline.record_batch import decode_records, walk_records
from pipeline.schema import COLUMNS, arrow_schema

# Spark's timestamp range, in milliseconds
_MS = st.integers(min_value=-62135596800000, max_value=253402300799999)
_TEXT = st.text(
    alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x01\x02"),
    max_size=12,
)
_HOSTS = st.sampled_from(
    [("127.0.0.1", 10911), ("10.1.2.3", 0), ("::1", 10911), ("fe80::1:2", 65535), ("1.2.3.4", 7)]
)


_TOPICS = st.text(min_size=1, max_size=20)
_IPV4_HOSTS = st.sampled_from([("127.0.0.1", 10911), ("10.1.2.3", 0), ("1.2.3.4", 7)])


@st.composite
def messages(draw, hosts=_HOSTS, topics=_TOPICS):
    props = draw(st.dictionaries(_TEXT, _TEXT, max_size=5))
    for name in ("TAGS", "KEYS", "UNIQ_KEY"):
        if draw(st.booleans()):
            props[name] = draw(_TEXT)
    body = draw(st.binary(max_size=64))
    sys_flag = draw(st.sampled_from([0, MessageSysFlag.COMPRESSED, MessageSysFlag.MULTI_TAGS]))
    if sys_flag & MessageSysFlag.COMPRESSED:
        body = zlib.compress(body)
    return MessageExtBrokerInner(
        topic=draw(topics),
        queue_id=draw(st.integers(0, 2**31 - 1)),
        flag=draw(st.integers(-(2**31), 2**31 - 1)),
        body=body,
        properties=props,
        sys_flag=sys_flag,
        born_timestamp=draw(_MS),
        born_host=draw(hosts),
        store_host=draw(hosts),
        reconsume_times=draw(st.integers(0, 2**31 - 1)),
    )


def _encode(msgs, stamps, blank_every=0):
    buf = bytearray()
    for i, (m, ts) in enumerate(zip(msgs, stamps, strict=True)):
        buf += encode_record(m, i * 3, len(buf), ts)
        if blank_every and i % blank_every == blank_every - 1:
            buf += (16).to_bytes(4, "big") + BLANK_MAGIC_CODE.to_bytes(4, "big", signed=True)
            buf += bytes(8)
    return bytes(buf)


def _expected(buf, broker_name):
    rows = []
    pos = 0
    for start in walk_records(buf):
        pos = int(start)
        m = decode_record(buf, pos)
        body = m.body
        if m.sys_flag & MessageSysFlag.COMPRESSED:
            body = zlib.decompress(body)
        rows.append(
            {
                "topic": m.topic,
                "brokerName": broker_name,
                "queueId": m.queue_id,
                "queueOffset": m.queue_offset,
                "body": body,
                "tags": m.tags,
                "keys": m.keys,
                "properties": m.properties,
                "msgId": m.uniq_key or create_offset_msg_id(m.store_host, m.commit_log_offset),
                "bornTimestamp": m.born_timestamp * 1000,
                "storeTimestamp": m.store_timestamp * 1000,
                "reconsumeTimes": m.reconsume_times,
            }
        )
    return rows


def _actual(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    assert batch.schema == arrow_schema()
    out = []
    cols = {name: batch.column(name) for name in COLUMNS}
    born = cols["bornTimestamp"].cast(pa.int64()).to_pylist()
    store = cols["storeTimestamp"].cast(pa.int64()).to_pylist()
    for i in range(batch.num_rows):
        row = {name: cols[name][i].as_py() for name in COLUMNS}
        row["properties"] = dict(row["properties"])
        row["bornTimestamp"] = born[i]
        row["storeTimestamp"] = store[i]
        out.append(row)
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(messages(), _MS), min_size=1, max_size=12), st.integers(0, 4))
def test_agrees_with_decode_record(items, blank_every):
    msgs = [m for m, _ in items]
    buf = _encode(msgs, [ts for _, ts in items], blank_every)
    batch = decode_records(buf, broker_name="broker-x")
    assert _actual(batch) == _expected(buf, "broker-x")
    # given starts (what a segment scan hands over) decode the same
    again = decode_records(buf, broker_name="broker-x", starts=walk_records(buf))
    assert again.equals(batch)


def test_duplicate_property_names_keep_the_last_value():
    # a hand-made properties string repeating TAGS: Java's HashMap keeps the last value
    m = MessageExtBrokerInner(
        topic="T", queue_id=0, body=b"b", properties_string="TAGS\x01a\x02x\x01y\x02TAGS\x01b"
    )
    buf = encode_record(m, 0, 0, 1) + encode_record(
        MessageExtBrokerInner(topic="T", queue_id=0), 1, 0, 1
    )
    batch = decode_records(buf, broker_name="b")
    assert batch.column("tags").to_pylist() == ["b", None]
    assert dict(batch.column("properties")[0].as_py()) == decode_properties(
        "TAGS\x01a\x02x\x01y\x02TAGS\x01b"
    )


def test_java_tolerance_of_malformed_property_segments():
    raw = "\x02k\x01\x02\x01v\x02ok\x01v\x01w\x02solo\x02\x02TAGS\x01t"
    m = MessageExtBrokerInner(topic="T", queue_id=0, properties_string=raw)
    batch = decode_records(encode_record(m, 0, 0, 1), broker_name="b")
    assert (
        dict(batch.column("properties")[0].as_py())
        == decode_properties(raw)
        == {
            "ok": "v\x01w",
            "TAGS": "t",
        }
    )
    assert batch.column("tags").to_pylist() == ["t"]


def test_empty_buffer_gives_an_empty_batch_of_the_schema():
    batch = decode_records(b"", broker_name="b")
    assert batch.num_rows == 0 and batch.schema == arrow_schema()


def test_timestamps_outside_sparks_range_become_null():
    m = MessageExtBrokerInner(topic="T", queue_id=0, born_timestamp=2**62)
    batch = decode_records(encode_record(m, 0, 0, 5), broker_name="b")
    assert batch.column("bornTimestamp").to_pylist() == [None]
    assert batch.column("storeTimestamp").cast(pa.int64()).to_pylist() == [5000]


def _one(**kw):
    return encode_record(
        MessageExtBrokerInner(topic="Topic", queue_id=1, body=b"hello", **kw), 0, 0, 1
    )


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda b: b[:-1], "truncated"),
        (lambda b: b[:4] + b"\x00\x00\x00\x01" + b[8:], "bad magic"),
        (lambda b: (10).to_bytes(4, "big") + b[4:], "impossible size"),
        # body length larger than the record
        (lambda b: b[:84] + (500).to_bytes(4, "big") + b[88:], "body length"),
        # properties length off by one
        (lambda b: b[:-2] + b"\x00\x01", "TOTALSIZE"),
    ],
)
def test_corrupt_records_raise_naming_the_offset(mutate, match):
    good = _one()
    buf = good + mutate(bytearray(good))
    with pytest.raises(RecordDecodeError, match=match):
        decode_records(bytes(buf), broker_name="b")
    # the reference decoder refuses the same bytes
    with pytest.raises(RecordDecodeError):
        decode_record(bytes(buf), len(good))


def test_invalid_utf8_topic_raises():
    good = bytearray(_one())
    topic_at = 88 + 5 + 1
    good[topic_at] = 0xFF
    with pytest.raises(RecordDecodeError, match="record at 0: topic is not UTF-8"):
        decode_records(bytes(good), broker_name="b")


def test_corrupt_compressed_body_raises():
    m = MessageExtBrokerInner(
        topic="T", queue_id=0, body=b"not zlib", sys_flag=MessageSysFlag.COMPRESSED
    )
    with pytest.raises(RecordDecodeError, match="inflate"):
        decode_records(encode_record(m, 0, 0, 1), broker_name="b")


def test_decodes_from_a_memoryview_slice_of_a_larger_buffer():
    recs = _encode(
        [MessageExtBrokerInner(topic="T", queue_id=i, body=bytes([i]) * i) for i in range(5)],
        [7] * 5,
    )
    big = bytearray(b"\x00" * 13) + recs + b"\xff" * 9
    view = memoryview(big)[13 : 13 + len(recs)]
    batch = decode_records(view, broker_name="b")
    assert batch.column("queueId").to_pylist() == [0, 1, 2, 3, 4]
    assert batch.column("body").to_pylist() == [bytes([i]) * i for i in range(5)]
    starts = walk_records(recs)
    assert isinstance(starts, np.ndarray) and starts.dtype == np.int64


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            messages(hosts=_IPV4_HOSTS, topics=st.sampled_from(["T", "TopicB", "Ü" * 9])), _MS
        ),
        min_size=1,
        max_size=12,
    )
)
def test_fast_path_agrees_with_decode_record_and_the_general_path(items):
    # IPv4 hosts: the one-gather fast path must take these (shared or mixed topics alike)
    buf = _encode([m for m, _ in items], [ts for _, ts in items])
    starts = walk_records(buf)
    arr = np.frombuffer(buf, dtype=np.uint8)
    fast = numpy_decoder.decode_fast(arr, "broker-x", starts)
    assert fast is not None
    assert _actual(fast) == _expected(buf, "broker-x")
    assert fast.equals(numpy_decoder.decode_general(buf, "broker-x", starts))


_PROP_TEXT = st.text(alphabet=st.sampled_from(["a", "b", "\x01", "\x02", "é", "\x00"]), max_size=24)


@settings(max_examples=300, deadline=None)
@given(st.lists(_PROP_TEXT, min_size=1, max_size=8))
def test_properties_fast_path_agrees_with_java_parser(strings):
    arr = pa.array(strings, pa.string())
    props, lookups = properties_map.parse_properties(arr, len(strings))
    assert [dict(r) for r in props.to_pylist()] == [decode_properties(x) for x in strings]
    for r in props.to_pylist():
        assert len({k for k, _ in r}) == len(r)  # no repeated names in a map
    fast = properties_map._properties_fast(arr, len(strings))
    if fast is not None:
        slow = properties_map._properties_general(arr, len(strings))
        assert fast[0].equals(slow[0])
        for name in fast[1]:
            assert fast[1][name].equals(slow[1][name])


@pytest.mark.parametrize("trailing", ["", "\x02"])
def test_regular_properties_take_the_fast_path_with_or_without_javas_trailing_separator(trailing):
    rows = [f"TAGS\x01t{i}\x02KEYS\x01k{i}\x02UNIQ_KEY\x01U{i}{trailing}" for i in range(50)]
    rows.append("")
    fast = properties_map._properties_fast(pa.array(rows), len(rows))
    assert fast is not None
    props, lookups = fast
    assert props.to_pylist()[3] == [("TAGS", "t3"), ("KEYS", "k3"), ("UNIQ_KEY", "U3")]
    assert props.to_pylist()[-1] == []
    assert lookups["TAGS"].to_pylist() == [f"t{i}" for i in range(50)] + [None]
    assert lookups["UNIQ_KEY"].to_pylist()[7] == "U7"


# ------------------------------------------------------------------ compiled (numba) decoder


def test_the_compiled_decoder_is_in_use():
    # numba is in the "spark" extra: without it every test above would only cover the numpy path
    assert record_batch._kernels is not None


_RAW_PROPS = st.lists(
    st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "a", "bb", "\x01", "\x02", "é", "\x00"]),
    max_size=16,
).map("".join)


@st.composite
def raw_messages(draw):
    """Messages whose properties string is written verbatim: repeats, empty parts, stray \\x01."""
    m = draw(messages())
    m.properties_string = draw(_RAW_PROPS)
    return m


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(raw_messages(), _MS), min_size=1, max_size=10), st.integers(0, 3))
def test_compiled_path_agrees_with_decode_record_and_the_numpy_path(items, blank_every):
    buf = _encode([m for m, _ in items], [ts for _, ts in items], blank_every)
    starts = walk_records(buf)
    assert starts.tolist() == record_batch._walk_python(buf).tolist()
    compiled = record_batch._decode_compiled(np.frombuffer(buf, np.uint8), "broker-x", starts)
    assert compiled is not None
    assert _actual(compiled) == _expected(buf, "broker-x")
    general = numpy_decoder.decode_general(buf, "broker-x", starts)
    assert compiled.equals(general)
    # map entries in the order a dict built from the string has them (first position, last value)
    for row, m in zip(compiled.column("properties").to_pylist(), items, strict=True):
        assert row == list(decode_properties(m[0].properties_string).items())


def test_a_repeated_name_takes_the_last_value_at_the_first_position():
    raw = "a\x01x\x02b\x01yy\x02a\x01zzzz\x02c\x01w\x02b\x01q"
    m = MessageExtBrokerInner(topic="T", queue_id=0, properties_string=raw)
    buf = encode_record(m, 0, 0, 1) * 3
    starts = walk_records(buf)
    assert len(starts) == 3
    batch = record_batch._decode_compiled(np.frombuffer(buf, np.uint8), "b", starts)
    assert batch is not None
    assert batch.column("properties").to_pylist() == [[("a", "zzzz"), ("b", "q"), ("c", "w")]] * 3


def test_invalid_utf8_in_a_skipped_property_segment_still_raises():
    # "\xff" alone is a segment Java skips, but the string as a whole is not UTF-8
    m = MessageExtBrokerInner(topic="T", queue_id=0, properties_string="TAGS\x01t\x02Z")
    buf = bytearray(encode_record(m, 0, 0, 1))
    buf[-1] = 0xFF
    with pytest.raises(RecordDecodeError, match="properties is not UTF-8"):
        decode_records(bytes(buf), broker_name="b")


def test_walk_errors_are_worded_by_the_plain_walk():
    good = _one()
    with pytest.raises(RecordDecodeError, match=f"truncated record at {len(good)}: needs"):
        walk_records(good + good[:-1])
    with pytest.raises(RecordDecodeError, match="bad magic"):
        walk_records(good + b"\x00" * 16)


def test_offset_msgids_of_ipv6_store_hosts_without_uniq_key():
    m = MessageExtBrokerInner(topic="T", queue_id=0, store_host=("fe80::1:2", 10911))
    buf = encode_record(m, 0, 1234, 1)
    batch = decode_records(buf, broker_name="b")
    assert batch.column("msgId").to_pylist() == [create_offset_msg_id(("fe80::1:2", 10911), 1234)]
