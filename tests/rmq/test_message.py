"""Message validation, wire properties and the UNIQ_KEY format (MessageClientIDSetter.java)."""

from __future__ import annotations

import datetime
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.batch_body import decode_batch_body
from common.batch_body import encode_batch_body as common_encode_batch_body
from common.message_properties import decode_properties, encode_properties
from rmq.errors import InvalidMessageError
from rmq.message import (
    MAX_DELAY_LEVEL,
    RESERVED_PROPERTIES,
    Message,
    UniqueIdGenerator,
    encode_batch_body,
    parse_unique_id,
    record_size_bound,
    stored_record_size,
)


def test_wire_properties_carry_tags_keys_delay_and_wait():
    msg = Message("T", b"x", tags="TagA", keys=["k1", "k2"], properties={"a": "1"}, delay_level=3)
    assert msg.wire_properties() == {
        "a": "1",
        "TAGS": "TagA",
        "KEYS": "k1 k2",
        "DELAY": "3",
        "WAIT": "true",
    }


def test_str_body_is_utf8_and_minimal_message_has_only_wait():
    msg = Message("T", "héllo")
    assert msg.body == "héllo".encode()
    assert msg.wire_properties() == {"WAIT": "true"}


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"topic": ""}, "empty"),
        ({"topic": "a b"}, "characters"),
        ({"topic": "x" * 128}, "127"),
        ({"body": b""}, "body"),
        ({"delay_level": 19}, "delay_level"),
        ({"properties": {"TAGS": "x"}}, "reserved"),
        ({"properties": {"k": "a\x01b"}}, "\\x01"),
    ],
)
def test_invalid_messages_are_refused_before_sending(kwargs, fragment):
    args = {"topic": "T", "body": b"x", **kwargs}
    with pytest.raises(InvalidMessageError, match=re.escape(fragment)):
        Message(**args).validate()


def test_unique_id_layout_matches_message_client_id_setter():
    gen = UniqueIdGenerator(ip=bytes([10, 1, 2, 3]), pid=4321, loader_hash=0x01020304)
    now = datetime.datetime(2024, 5, 17, 12, 0, 0)
    now_ms = int(now.timestamp() * 1000)
    month_start_ms = int(datetime.datetime(2024, 5, 1).timestamp() * 1000)
    first = gen.create(now_ms)
    second = gen.create(now_ms)
    assert re.fullmatch(r"[0-9A-F]{32}", first)
    # fixed prefix: ip, short pid, int class-loader hash
    assert first[:20] == "0A010203" + "10E1" + "01020304"
    info = parse_unique_id(first)
    assert info.ip == "10.1.2.3"
    assert info.pid == 4321
    assert info.ms_since_month_start == now_ms - month_start_ms
    assert parse_unique_id(second).counter == info.counter + 1
    assert first != second


def test_unique_id_counter_wraps_like_a_java_short():
    gen = UniqueIdGenerator(ip=bytes(4), pid=1, loader_hash=1)
    ids = {gen.create(1_700_000_000_000) for _ in range(70_000)}
    # 65536 distinct counter values within one millisecond, then they repeat
    assert len(ids) == 65_536


def test_unique_id_window_moves_to_the_next_month():
    gen = UniqueIdGenerator(ip=bytes(4), pid=1, loader_hash=1)
    may = int(datetime.datetime(2024, 5, 31, 23, 59, 59).timestamp() * 1000)
    june = int(datetime.datetime(2024, 6, 1, 0, 0, 1).timestamp() * 1000)
    # like Java's (int) cast, late-month values wrap negative: 30 days 23:59:59 > 2**31 ms
    elapsed = (30 * 86_400 + 86_399) * 1000
    assert parse_unique_id(gen.create(may)).ms_since_month_start == elapsed - 2**32
    assert parse_unique_id(gen.create(june)).ms_since_month_start == 1000


# --- the send path's fast encoders must say exactly what the general ones say ---------------

_text = st.text(
    alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=["Cs"]),
    max_size=12,
)


@given(
    tags=st.none() | _text,
    keys=st.none() | _text | st.lists(_text, max_size=3),
    props=st.dictionaries(
        _text.filter(lambda k: k and k not in RESERVED_PROPERTIES), _text, max_size=3
    ),
    delay=st.integers(0, MAX_DELAY_LEVEL),
    wait=st.booleans(),
)
def test_wire_properties_string_is_encode_properties_of_wire_properties(
    tags, keys, props, delay, wait
):
    msg = Message(
        "T", b"x", tags=tags, keys=keys, properties=props, delay_level=delay, wait_store_ok=wait
    )
    expected = msg.wire_properties()
    if not expected.get("UNIQ_KEY"):
        expected["UNIQ_KEY"] = "U1"
    s, uniq = msg.wire_properties_string("U1")
    assert s == encode_properties(expected)
    assert uniq == expected["UNIQ_KEY"]


def test_user_uniq_key_wins_in_the_properties_string():
    s, uniq = Message("T", b"x", properties={"UNIQ_KEY": "MINE"}).wire_properties_string("U1")
    assert uniq == "MINE" and decode_properties(s)["UNIQ_KEY"] == "MINE"


@pytest.mark.parametrize("field", ["tags", "keys"])
@pytest.mark.parametrize("sep", ["\x01", "\x02"])
def test_separator_in_tags_or_keys_is_refused(field, sep):
    fields: dict[str, Any] = {field: f"a{sep}b"}
    msg = Message("T", b"x", **fields)
    with pytest.raises(InvalidMessageError, match="x01 or"):
        msg.wire_properties_string("U1")


@given(
    st.lists(
        st.tuples(
            st.integers(-(2**31), 2**31 - 1),
            st.binary(max_size=40),
            st.dictionaries(_text.filter(bool), _text.filter(bool), max_size=3),
        ),
        max_size=5,
    )
)
def test_batch_body_matches_the_common_codec(items):
    ours = encode_batch_body([(f, b, encode_properties(p)) for f, b, p in items])
    assert ours == common_encode_batch_body(items)
    assert decode_batch_body(ours) == [(f, b, p) for f, b, p in items]


def test_batch_body_refuses_oversized_properties():
    with pytest.raises(InvalidMessageError, match="32767"):
        encode_batch_body([(0, b"x", "k\x01" + "v" * 32767)])


def test_create_many_equals_creates_within_one_millisecond():
    a = UniqueIdGenerator(ip=bytes([10, 1, 2, 3]), pid=4321, loader_hash=7)
    b = UniqueIdGenerator(ip=bytes([10, 1, 2, 3]), pid=4321, loader_hash=7)
    now_ms = 1_700_000_000_123
    assert a.create_many(70_000, now_ms) == [b.create(now_ms) for _ in range(70_000)]


# no surrogates: a message with one is refused before any size is taken (not UTF-8)
_chars = st.characters(exclude_categories=["Cs"], exclude_characters="\x01\x02")
_prop_text = st.text(_chars, max_size=12)


@pytest.mark.timeout(60)
@given(
    topic=st.text(_chars, min_size=1, max_size=20),
    body_len=st.integers(0, 1 << 22),
    props=st.dictionaries(_prop_text, _prop_text, max_size=5),
    wait=st.sampled_from([None, "true", "false"]),
)
def test_record_size_bound_is_never_below_the_stored_size(topic, body_len, props, wait):
    # the producer skips the exact size under this bound: it must hold for any text, WAIT or not
    if wait is not None:
        props = {**props, "WAIT": wait}
    wire = "".join(f"{k}\x01{v}\x02" for k, v in props.items())
    assert record_size_bound(topic, body_len, wire) >= stored_record_size(topic, body_len, wire, "")
