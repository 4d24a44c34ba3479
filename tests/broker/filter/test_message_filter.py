"""The record side of a SQL92 pull: properties read straight from a CommitLog record."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.filter.consumer_filter_manager import compile_filter
from common.message import (
    MessageExtBrokerInner,
    MessageSysFlag,
    RecordDecodeError,
    record_properties,
)
from common.message_encoder import encode_record

PROPS = {"TAGS": "paid", "amount": "250", "UNIQ_KEY": "U1"}


@pytest.mark.parametrize(
    "sys_flag", [0, MessageSysFlag.BORNHOST_V6 | MessageSysFlag.STOREHOSTADDRESS_V6]
)
def test_properties_of_a_record(sys_flag: int) -> None:
    v6 = bool(sys_flag)
    host = ("::1", 10911) if v6 else ("127.0.0.1", 10911)
    msg = MessageExtBrokerInner(
        topic="T", queue_id=0, body=b"x" * 300, properties=PROPS, sys_flag=sys_flag,
        born_host=host, store_host=host,
    )  # fmt: skip
    rec = encode_record(msg, 7, 1000, 1_700_000_000_000)
    assert record_properties(rec) == PROPS
    assert record_properties(b"pad" + rec, 3) == PROPS
    f = compile_filter("TAGS = 'paid' AND amount > 100")
    assert f.is_matched_by_commit_log(rec)
    assert not compile_filter("amount < 100").is_matched_by_commit_log(rec)


@given(st.binary(max_size=200))
def test_garbage_is_a_decode_error_and_never_matches(data: bytes) -> None:
    try:
        props: dict[str, str] | None = record_properties(data)
    except RecordDecodeError:
        props = None
    matched = compile_filter("a IS NULL").is_matched_by_commit_log(data)
    assert matched == (props is not None and "a" not in props)
