"""REGISTER_BROKER body decoding: JSON, fastjson-flavoured JSON, compressed, legacy, bad input."""

from __future__ import annotations

import json
import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.model import DataVersion
from namesrv.register_body import (
    MAX_INFLATED_SIZE,
    RegisterBodyError,
    data_version_json,
    decode_register_body,
    encode_compressed_register_body,
)
from namesrv.routeinfo import TopicQueueConfig

JAVA_BODY = (
    b'{"filterServerList":[],"topicConfigSerializeWrapper":{"dataVersion":{"counter":3,'
    b'"timestamp":1690000000000},"topicConfigTable":{"TopicTest":{"order":false,"perm":6,'
    b'"readQueueNums":4,"topicFilterType":"SINGLE_TAG","topicName":"TopicTest","topicSysFlag":1,'
    b'"writeQueueNums":8},"TBW102":{"order":false,"perm":7,"readQueueNums":8,'
    b'"topicFilterType":"SINGLE_TAG","topicName":"TBW102","topicSysFlag":0,"writeQueueNums":8}}}}'
)


def test_json_body_as_java_sends_it():
    reg = decode_register_body(JAVA_BODY, compressed=False, version=407)
    assert reg.data_version == DataVersion(1690000000000, 3)
    assert reg.filter_server_list == []
    assert reg.topic_configs["TopicTest"] == TopicQueueConfig("TopicTest", 4, 8, 6, 1)
    assert reg.topic_configs["TBW102"] == TopicQueueConfig("TBW102", 8, 8, 7, 0)


def test_fastjson_lenient_body_and_missing_fields():
    body = b"{topicConfigSerializeWrapper:{'topicConfigTable':{'T':{'topicName':'T'}}},filterServerList:['f:1']}"
    reg = decode_register_body(body, compressed=False, version=407)
    assert reg.data_version == DataVersion(0, 0)
    assert reg.topic_configs["T"] == TopicQueueConfig("T", 16, 16, 6, 0)
    assert reg.filter_server_list == ["f:1"]


def test_empty_body_is_version_zero_no_topics():
    reg = decode_register_body(b"", compressed=False, version=407)
    assert (reg.data_version, reg.topic_configs, reg.filter_server_list) == (
        DataVersion(0, 0),
        {},
        [],
    )


def test_legacy_body_is_a_bare_wrapper():
    wrapper = json.loads(JAVA_BODY)["topicConfigSerializeWrapper"]
    reg = decode_register_body(json.dumps(wrapper).encode(), compressed=False, version=36)
    assert reg.data_version == DataVersion(1690000000000, 3)
    assert set(reg.topic_configs) == {"TopicTest", "TBW102"}


def _java_compressed(version: bytes, lines: list[bytes], filters: bytes) -> bytes:
    """Built by hand the way RegisterBrokerBody.encode(true) lays it out."""
    raw = struct.pack(">i", len(version)) + version + struct.pack(">i", len(lines))
    for line in lines:
        raw += struct.pack(">i", len(line)) + line
    raw += struct.pack(">i", len(filters)) + filters
    return zlib.compress(raw, 9)


def test_compressed_body_layout():
    body = _java_compressed(
        b'{"counter":5,"timestamp":42}',
        [b"TopicTest 4 4 6 SINGLE_TAG", b'Other 2 1 4 MULTI_TAG {"a":"b"}'],
        b'["fs:1"]',
    )
    reg = decode_register_body(body, compressed=True, version=407)
    assert reg.data_version == DataVersion(42, 5)
    assert reg.topic_configs == {
        "TopicTest": TopicQueueConfig("TopicTest", 4, 4, 6),
        "Other": TopicQueueConfig("Other", 2, 1, 4),
    }
    assert reg.filter_server_list == ["fs:1"]


@given(
    st.builds(DataVersion, st.integers(0, 2**62), st.integers(0, 2**62)),
    st.lists(
        st.builds(
            TopicQueueConfig,
            st.from_regex(r"[A-Za-z0-9%_|-]{1,30}", fullmatch=True),
            st.integers(0, 1024),
            st.integers(0, 1024),
            st.integers(0, 15),
        ),
        unique_by=lambda t: t.topic_name,
        max_size=20,
    ),
    st.lists(st.from_regex(r"[0-9.]{1,15}:[0-9]{1,5}", fullmatch=True), max_size=3),
)
def test_compressed_round_trip(version, topics, filters):
    body = encode_compressed_register_body(version, topics, filters)
    reg = decode_register_body(body, compressed=True, version=407)
    assert reg.data_version == version
    assert reg.topic_configs == {t.topic_name: t for t in topics}
    assert reg.filter_server_list == filters


@pytest.mark.parametrize(
    ("body", "compressed"),
    [
        (b"not json at all", False),
        (b"[1,2]", False),
        (
            b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":{"readQueueNums":"x"}}}}',
            False,
        ),
        (b'{"topicConfigSerializeWrapper":{"dataVersion":"nope"}}', False),
        (b'{"topicConfigSerializeWrapper":[]}', False),
        (b"\x00\x01\x02 not zlib", True),
        (zlib.compress(struct.pack(">i", 100) + b"short"), True),
        (
            zlib.compress(
                struct.pack(">i", 2) + b"{}" + struct.pack(">i", 1) + struct.pack(">i", 3) + b"a b"
            ),
            True,
        ),
        (JAVA_BODY, True),
    ],
)
def test_bad_bodies_raise_register_body_error(body, compressed):
    with pytest.raises(RegisterBodyError):
        decode_register_body(body, compressed=compressed, version=407)


def test_compressed_bomb_is_refused():
    body = zlib.compress(b"\x00" * (MAX_INFLATED_SIZE + 1), 9)
    with pytest.raises(RegisterBodyError, match="size limit"):
        decode_register_body(body, compressed=True, version=407)


def test_data_version_json_shape():
    assert json.loads(data_version_json(DataVersion(7, 3))) == {"counter": 3, "timestamp": 7}
