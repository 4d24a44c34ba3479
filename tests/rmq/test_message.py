"""Message validation, wire properties and the UNIQ_KEY format (facts §4.4, §4.5)."""

from __future__ import annotations

import datetime
import re

import pytest

from rmq.errors import InvalidMessageError
from rmq.message import Message, UniqueIdGenerator, parse_unique_id


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
