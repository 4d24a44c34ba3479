"""``parse_record`` reads back what the put path dispatches from the message itself.

The two paths of dispatch.py must agree on every record: a slave, a DLedger member or a
recovery (parse) must build the same ConsumeQueue unit and index keys as the master's put
(``request_for_put``).  Hypothesis draws the fields the rules look at: tags, keys, UNIQ_KEY,
the schedule topic's delay level, IPv6 hosts (which move the later fields).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.store.dispatch import BLANK, PARTIAL, DispatchRequest, parse_record, request_for_put
from common.message import MessageExtBrokerInner, RecordDecodeError
from common.message_encoder import encode_record
from common.message_properties import MessageConst
from common.topics import SCHEDULE_TOPIC

DELAYS = (1000, 5000, 10000)
_text = st.text(
    st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00\x01\x02"),
    max_size=12,
)
_hosts = st.sampled_from([("127.0.0.1", 10911), ("::1", 10911), ("fe80::2", 7)])


@st.composite
def messages(draw: st.DrawFn) -> MessageExtBrokerInner:
    topic = draw(st.sampled_from(["T", "TopicWithé", SCHEDULE_TOPIC]))
    props: dict[str, str] = {}
    for name, values in (
        (MessageConst.TAGS, _text),
        (MessageConst.KEYS, st.lists(_text, max_size=3).map(" ".join)),
        (MessageConst.UNIQ_KEY, _text),
        (MessageConst.DELAY, st.sampled_from(["0", "1", "3", "9", "x"])),
    ):
        value = draw(st.none() | values)
        if value:
            props[name] = value
    return MessageExtBrokerInner(
        topic=topic,
        queue_id=draw(st.integers(0, 17)),
        body=draw(st.binary(max_size=40)),
        properties=props,
        sys_flag=draw(st.sampled_from([0, 0x2, 0x4, 0x8, 0xC])),
        born_host=draw(_hosts),
        store_host=draw(_hosts),
    )


@settings(max_examples=300, deadline=None)
@given(messages(), st.integers(0, 2**40), st.integers(0, 2**40), st.integers(0, 2**41))
def test_parse_record_agrees_with_the_put_path(
    msg: MessageExtBrokerInner, qoff: int, phys: int, store_ts: int
) -> None:
    record = encode_record(msg, qoff, phys, store_ts)
    buf = b"\0" * 5 + record + b"\0" * 3
    got, size = parse_record(memoryview(buf), 5, 5 + len(record), DELAYS, check_crc=True)
    assert size == len(record)
    want = request_for_put(msg, phys, len(record), qoff, store_ts, DELAYS)
    # the record's own sys_flag carries the v6 bits the encoder set
    assert isinstance(got, DispatchRequest)
    assert got == want._replace(sys_flag=got.sys_flag)
    assert got.sys_flag & ~0x30 == msg.sys_flag & ~0x30
    # every shorter view is a partial record, never a wrong one
    for cut in (8, len(record) // 2, len(record) - 1):
        assert parse_record(buf, 5, 5 + cut, DELAYS, check_crc=True) == (PARTIAL, 0)


def test_parse_record_rejects_what_can_never_be_a_record() -> None:
    msg = MessageExtBrokerInner(topic="T", queue_id=0, body=b"abc")
    record = bytearray(encode_record(msg, 0, 0, 1))
    assert parse_record(bytes(record), 0, len(record), DELAYS, check_crc=True)[1] == len(record)
    bad = bytearray(record)
    bad[bytes(record).rindex(b"abc")] ^= 0xFF  # a body byte
    with pytest.raises(RecordDecodeError, match="CRC"):
        parse_record(bytes(bad), 0, len(bad), DELAYS, check_crc=True)
    bad = bytearray(record)
    bad[4:8] = b"\x12\x34\x56\x78"
    with pytest.raises(RecordDecodeError, match="magic"):
        parse_record(bytes(bad), 0, len(bad), DELAYS, check_crc=False)
    blank = (64).to_bytes(4, "big") + (0xCBD43194).to_bytes(4, "big", signed=False)
    assert parse_record(blank, 0, 8, DELAYS, check_crc=False) == (BLANK, 64)
