"""The offset-table bodies of offset reset and consumer status, in the shapes RocketMQ's peers
write them: fastjson's object-keyed Map<MessageQueue, Long> (Java) and ResetOffsetBodyForC's
list (what rocketmq-client-cpp parses)."""

from __future__ import annotations

import json

import pytest

from common.errors import ProtocolError
from common.model import MessageQueue
from common.mq_map import MqEntries, parse_value
from common.reset_offset_body import (
    decode_consumer_table,
    decode_offset_table,
    encode_consumer_status_body,
    encode_consumer_table,
    encode_reset_offset_body,
    encode_reset_offset_body_for_c,
)

A0, A1 = MessageQueue("T", "a", 0), MessageQueue("T", "a", 1)
TABLE = {A1: 7, A0: 3}


def test_reset_offset_body_is_fastjsons_map_and_reads_back():
    body = encode_reset_offset_body(TABLE)
    assert body == (
        b'{"offsetTable":{{"brokerName":"a","queueId":0,"topic":"T"}:3,'
        b'{"brokerName":"a","queueId":1,"topic":"T"}:7}}'
    )
    assert decode_offset_table(body) == TABLE


def test_for_c_is_a_plain_json_list_and_reads_back():
    body = encode_reset_offset_body_for_c(TABLE)
    assert json.loads(body) == {
        "offsetTable": [
            {"brokerName": "a", "offset": 3, "queueId": 0, "topic": "T"},
            {"brokerName": "a", "offset": 7, "queueId": 1, "topic": "T"},
        ]
    }
    assert decode_offset_table(body) == TABLE


def test_strict_json_keys_are_read_too():
    key = json.dumps({"topic": "T", "brokerName": "a", "queueId": 1})
    assert decode_offset_table(json.dumps({"offsetTable": {key: 9}}).encode()) == {A1: 9}
    assert decode_offset_table(b'{"offsetTable":{}}') == {}
    assert decode_offset_table(b"{}") == {}


def test_consumer_status_bodies():
    client = encode_consumer_status_body(TABLE)
    assert decode_offset_table(client, "messageQueueTable") == TABLE
    merged = encode_consumer_table({"c2": {A0: 1}, "c1": TABLE})
    assert decode_consumer_table(merged) == {"c1": TABLE, "c2": {A0: 1}}
    assert decode_consumer_table(b'{"consumerTable":{}}') == {}


def test_nested_object_keyed_maps_parse_anywhere():
    doc = parse_value(b'{"x":[{{"brokerName":"a","queueId":0,"topic":"T"}:{"k":1}}],"y":null}')
    assert doc["y"] is None
    (inner,) = doc["x"]
    assert isinstance(inner, MqEntries) and list(inner) == [(A0, {"k": 1})]


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"[]",
        b'{"offsetTable":5}',
        b'{"offsetTable":[{"topic":"T"}]}',
        b'{"offsetTable":{{"topic":"T"}:1}}',
        b'{"offsetTable":{{"brokerName":"a","queueId":0,"topic":"T"}:"x"}}',
        b'{"offsetTable":{{"brokerName":"a","queueId":0,"topic":"T"}:1,"s":2}}',
        b'{"offsetTable":{}} trailing',
        b"[" * 100 + b"]" * 100,
    ],
)
def test_bad_bodies_are_protocol_errors(body):
    with pytest.raises(ProtocolError):
        decode_offset_table(body)
